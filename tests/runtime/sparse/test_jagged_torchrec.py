"""Jagged tensors against TorchRec 1.8: the same calls (torchrec_jagged_cases.py) give the same results.

Every result is compared exactly (dtype, shape, values, which lazily derived
tensors are held, None where TorchRec returns None). The deliberate
differences of docs/torchrec_differences.md are tested to be what the table says.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from runtime.sparse.jagged import JaggedTensor, KeyedJaggedTensor, KeyedTensor
from tests import torchrec_anchor

CASES = Path(__file__).with_name("torchrec_jagged_cases.py")
CLASSES = {name: f"torchrec.sparse.jagged_tensor.{name}" for name in ("JaggedTensor", "KeyedJaggedTensor", "KeyedTensor")}


def _ours() -> dict[str, Any]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("torchrec_jagged_cases", CASES)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.cases(JaggedTensor=JaggedTensor, KeyedJaggedTensor=KeyedJaggedTensor, KeyedTensor=KeyedTensor)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    theirs = torchrec_anchor.torchrec_results(CASES, CLASSES, tmp_path_factory.mktemp("torchrec") / "jagged.pt")
    return _ours(), theirs


@pytest.mark.parametrize("case", list(_ours()))
def test_the_same_calls_give_torchrecs_results(case: str, results: tuple[dict[str, Any], dict[str, Any]]) -> None:
    ours, theirs = results
    assert list(ours) == list(theirs)
    torchrec_anchor.assert_same(ours[case], theirs[case], case)


def _torchrec(script: str) -> Any:
    """What `script` (TorchRec's names in scope) prints as JSON, run in TorchRec's venv."""
    if not torchrec_anchor.TORCHREC_PYTHON.exists():
        pytest.skip(f"no TorchRec venv at {torchrec_anchor.TORCHREC_PYTHON}: the difference is checked against it")
    prelude = "import json, torch\nfrom torchrec.sparse.jagged_tensor import JaggedTensor, KeyedJaggedTensor, KeyedTensor\n"
    done = subprocess.run(
        [str(torchrec_anchor.TORCHREC_PYTHON), "-c", prelude + textwrap.dedent(script)],
        capture_output=True, text=True, timeout=300, check=True,
    )
    return json.loads(done.stdout)


def test_the_differences_in_the_docs_are_true() -> None:
    """Each row of docs/torchrec_differences.md's table about jagged tensors, on both sides."""
    theirs = _torchrec("""
        out = {}
        def attempt(name, call):
            try:
                out[name] = ["ok", call()]
            except Exception as error:
                out[name] = ["raises", type(error).__name__]
        empty = JaggedTensor(values=torch.empty(0), lengths=torch.empty(0, dtype=torch.int32))
        attempt("padded_of_empty", lambda: list(empty.to_padded_dense().shape))
        attempt("padded_weights_of_empty", lambda: list(JaggedTensor.empty(True).to_padded_dense_weights().shape))
        attempt("empty_offsets", lambda: JaggedTensor.empty().offsets().tolist())
        a = JaggedTensor(values=torch.tensor([1, 2]), lengths=torch.tensor([1, 1]))
        b = JaggedTensor(values=torch.tensor([3]), lengths=torch.tensor([1]))
        attempt("variable_batch", lambda: KeyedJaggedTensor.from_jt_dict({"a": a, "b": b}).stride_per_key())
        w = JaggedTensor(values=torch.tensor([1, 2]), weights=torch.tensor([0.5, 0.5]), lengths=torch.tensor([1, 1]))
        attempt("mixed_weights", lambda: KeyedJaggedTensor.from_jt_dict({"a": a, "w": w}).weights().tolist())
        kjt = KeyedJaggedTensor.from_lengths_sync(["a"], torch.tensor([1, 2]), torch.tensor([2, 0]))
        attempt("to_dict_offsets_held", lambda: kjt.to_dict()["a"].offsets_or_none() is not None)
        kt = KeyedTensor(keys=["a"], length_per_key=[2], values=torch.ones(1, 2))
        attempt("regroup_as_dict_names", lambda: list(KeyedTensor.regroup_as_dict([kt], [["a"]], ["x", "y"])))
        print(json.dumps(out))
    """)
    assert theirs == {
        "padded_of_empty": ["raises", "RuntimeError"],
        "padded_weights_of_empty": ["raises", "RuntimeError"],
        "empty_offsets": ["ok", []],
        "variable_batch": ["ok", [2, 1]],
        "mixed_weights": ["ok", [0.5, 0.5]],  # only `w`'s weights, for the ids of both keys
        "to_dict_offsets_held": ["ok", True],
        "regroup_as_dict_names": ["raises", "AssertionError"],
    }

    empty = JaggedTensor(values=torch.empty(0), lengths=torch.empty(0, dtype=torch.int32))
    assert empty.to_padded_dense().shape == (0, 0)
    assert JaggedTensor.empty(True).to_padded_dense_weights().shape == (0, 0)
    kjt = KeyedJaggedTensor.from_lengths_sync(["a"], torch.tensor([1, 2]), torch.tensor([2, 0]))
    assert kjt.to_dict()["a"].offsets_or_none() is None
    assert JaggedTensor.empty().offsets().tolist() == [0]
    a = JaggedTensor(values=torch.tensor([1, 2]), lengths=torch.tensor([1, 1]))
    b = JaggedTensor(values=torch.tensor([3]), lengths=torch.tensor([1]))
    w = JaggedTensor(values=torch.tensor([1, 2]), weights=torch.tensor([0.5, 0.5]), lengths=torch.tensor([1, 1]))
    kt = KeyedTensor(keys=["a"], length_per_key=[2], values=torch.ones(1, 2))
    refusals = [
        (lambda: KeyedJaggedTensor.from_jt_dict({"a": a, "b": b}),
         "KeyedJaggedTensor.from_jt_dict: key 'b' has 1 samples but key 'a' has 2 (variable batch sizes per key "
         "are not supported)"),
        (lambda: KeyedJaggedTensor.from_jt_dict({"a": a, "w": w}),
         "KeyedJaggedTensor.from_jt_dict: key 'w' and key 'a' disagree on weights (all JaggedTensors need "
         "weights, or none)"),
        (lambda: KeyedJaggedTensor.from_jt_dict({}), "KeyedJaggedTensor.from_jt_dict: needs at least one JaggedTensor"),
        (lambda: KeyedTensor.regroup_as_dict([kt], [["a"]], ["x", "y"]),
         "KeyedTensor.regroup_as_dict: 1 groups but 2 keys to name them"),
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
