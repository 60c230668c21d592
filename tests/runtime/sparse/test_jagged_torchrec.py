"""Jagged tensors against TorchRec 1.8: the same calls (torchrec_jagged_cases.py) give the same results.

Every result is compared exactly (dtype, shape, values, which lazily derived
tensors are held, None where TorchRec returns None). The deliberate
differences of docs/torchrec_differences.md are tested to be what the table says.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch

from runtime.sparse.jagged import JaggedTensor, KeyedJaggedTensor, KeyedTensor
from tests import torchrec_anchor

CASES = Path(__file__).with_name("torchrec_jagged_cases.py")
CLASSES = {
    name: f"torchrec.sparse.jagged_tensor.{name}" for name in ("JaggedTensor", "KeyedJaggedTensor", "KeyedTensor")
}


def _cases_module() -> Any:
    spec = importlib.util.spec_from_file_location("torchrec_jagged_cases", CASES)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _ours(function: str = "cases") -> dict[str, Any]:
    classes = {"JaggedTensor": JaggedTensor, "KeyedJaggedTensor": KeyedJaggedTensor, "KeyedTensor": KeyedTensor}
    return getattr(_cases_module(), function)(**classes)


@pytest.fixture(scope="module")
def theirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return torchrec_anchor.torchrec_results(CASES, CLASSES, tmp_path_factory.mktemp("torchrec") / "jagged.pt")


@pytest.fixture(scope="module")
def ours() -> dict[str, Any]:
    return _ours()


@pytest.mark.parametrize("case", list(_ours()))
def test_the_same_calls_give_torchrecs_results(case: str, ours: dict[str, Any], theirs: dict[str, Any]) -> None:
    assert list(ours) == list(theirs["cases"])
    torchrec_anchor.assert_same(ours[case], theirs["cases"][case], case)


def test_the_differences_in_the_docs_are_true(theirs: dict[str, Any]) -> None:
    """Each row of docs/torchrec_differences.md's table about jagged tensors, on both sides."""
    assert theirs["differences"] == {
        "padded_of_empty": ["raises", "RuntimeError"],
        "padded_weights_of_empty": ["raises", "RuntimeError"],
        "empty_offsets": ["ok", []],
        "variable_batch": ["ok", [2, 1]],
        "mixed_weights": ["ok", [0.5, 0.5]],  # only `w`'s weights, for the ids of both keys
        "no_jts": ["raises", "ValueError"],
        "to_dict_offsets_held": ["ok", True],
        "regroup_as_dict_names": ["raises", "AssertionError"],
    }


def test_our_side_of_the_differences() -> None:
    """What the runtime does instead (checked without TorchRec's venv too)."""
    assert _ours("differences") == {
        "padded_of_empty": ["ok", [0, 0]],
        "padded_weights_of_empty": ["ok", [0, 0]],
        "empty_offsets": ["ok", [0]],
        "variable_batch": ["raises", "ValueError"],
        "mixed_weights": ["raises", "ValueError"],
        "no_jts": ["raises", "ValueError"],
        "to_dict_offsets_held": ["ok", False],
        "regroup_as_dict_names": ["raises", "ValueError"],
    }


def test_the_refusals_name_what_is_wrong() -> None:
    a = JaggedTensor(values=torch.tensor([1, 2]), lengths=torch.tensor([1, 1]))
    b = JaggedTensor(values=torch.tensor([3]), lengths=torch.tensor([1]))
    w = JaggedTensor(values=torch.tensor([1, 2]), weights=torch.tensor([0.5, 0.5]), lengths=torch.tensor([1, 1]))
    kt = KeyedTensor(keys=["a"], length_per_key=[2], values=torch.ones(1, 2))
    refusals = [
        (
            lambda: KeyedJaggedTensor.from_jt_dict({"a": a, "b": b}),
            (
                "KeyedJaggedTensor.from_jt_dict: key 'b' has 1 samples but key 'a' has 2 (variable batch sizes per key "
                "are not supported)"
            ),
        ),
        (
            lambda: KeyedJaggedTensor.from_jt_dict({"a": a, "w": w}),
            (
                "KeyedJaggedTensor.from_jt_dict: key 'w' and key 'a' disagree on weights (all JaggedTensors need "
                "weights, or none)"
            ),
        ),
        (lambda: KeyedJaggedTensor.from_jt_dict({}), "KeyedJaggedTensor.from_jt_dict: needs at least one JaggedTensor"),
        (
            lambda: KeyedTensor.regroup_as_dict([kt], [["a"]], ["x", "y"]),
            "KeyedTensor.regroup_as_dict: 1 groups but 2 keys to name them",
        ),
    ]
    for call, message in refusals:
        with pytest.raises(ValueError) as refused:
            call()
        assert str(refused.value) == message


def test_from_dense_lengths_refuses_lengths_of_another_batch() -> None:
    with pytest.raises(ValueError) as refused:
        JaggedTensor.from_dense_lengths(torch.zeros(4, 3), torch.tensor([1, 2]))
    assert str(refused.value) == (
        "JaggedTensor.from_dense_lengths: values of shape (4, 3) need lengths of shape (4,), got (2,)"
    )
