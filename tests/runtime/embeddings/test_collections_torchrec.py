"""EmbeddingBagCollection and EmbeddingCollection against TorchRec 1.8's, on the same tables and batch.

One feature read by two tables (outputs `feature@table`, in TorchRec's order),
per-id weights, mean pooling and `need_indices`: the output keys, widths,
values, the ids beside sequence rows, and the gradients (of the per-id
weights, and of the tables: ours apply SGD at lr 1 in backward, so a table's
change is minus its gradient) are compared with TorchRec's modules run in
their venv (tests/torchrec_anchor.py) on the same weights.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from runtime.config.embeddings import EmbeddingBagConfig, EmbeddingConfig, EmbeddingOptimizer
from runtime.embeddings.bag_collection import EmbeddingBagCollection
from runtime.embeddings.sequence_collection import EmbeddingCollection
from runtime.sparse.jagged import KeyedJaggedTensor
from tests import torchrec_anchor

SGD = EmbeddingOptimizer("sgd", lr=1.0)
KEYS = ["h", "g", "f"]
LENGTHS = torch.tensor([1, 0, 2, 2, 1, 0, 3, 1, 0])  # h, g, f x a batch of 3
VALUES = torch.tensor([4, 0, 1, 9, 7, 2, 5, 5, 3, 1])  # f's (the last 4) fit both of its tables (6 rows)
WEIGHTS = torch.tensor([0.5, 1.5, 2.0, 0.25, 1.0, 3.0, 0.75, 1.25, 0.5, 2.5])
# name -> (tables (name, rows, dim, features, pooling), weighted)
BAGS: dict[str, tuple[list[tuple[str, int, int, list[str], str]], bool]] = {
    "weighted": ([("a", 10, 4, ["f", "g"], "sum"), ("b", 6, 8, ["f"], "sum"), ("c", 5, 4, ["h"], "sum")], True),
    "plain": ([("a", 10, 4, ["f", "g"], "sum"), ("b", 6, 8, ["f"], "mean"), ("c", 5, 4, ["h"], "sum")], False),
}
SEQUENCES = [("a", 10, 4, ["f", "g"]), ("b", 6, 4, ["f"])]

TORCHREC_SIDE = """
    import sys, torch
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig, PoolingType
    from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    def bags(inputs, tables, weighted, weights, grad):
        pooling = {"sum": PoolingType.SUM, "mean": PoolingType.MEAN}
        configs = [EmbeddingBagConfig(num_embeddings=rows, embedding_dim=dim, name=name, feature_names=features,
                                      pooling=pooling[mode]) for name, rows, dim, features, mode in tables]
        ebc = EmbeddingBagCollection(configs, is_weighted=weighted)
        for name, weight in weights.items():
            ebc.embedding_bags[name].weight.data.copy_(weight)
        per_id = inputs["weights"].clone().requires_grad_()
        kjt = KeyedJaggedTensor.from_lengths_sync(inputs["keys"], inputs["values"], inputs["lengths"], weights=per_id)
        kt = ebc(kjt)
        (kt.values() * grad).sum().backward()
        return {
            "keys": kt.keys(), "length_per_key": kt.length_per_key(), "values": kt.values().detach(),
            "weights_grad": per_id.grad,
            "table_grads": {name: ebc.embedding_bags[name].weight.grad for name in weights},
        }

    def sequences(inputs, need_indices, tables, weights, grads):
        configs = [EmbeddingConfig(num_embeddings=rows, embedding_dim=dim, name=name, feature_names=features)
                   for name, rows, dim, features in tables]
        ec = EmbeddingCollection(configs, None, need_indices)
        for name, weight in weights.items():
            ec.embeddings[name].weight.data.copy_(weight)
        kjt = KeyedJaggedTensor.from_lengths_sync(inputs["keys"], inputs["values"], inputs["lengths"])
        jts = ec(kjt)
        sum((jt.values() * grads[key]).sum() for key, jt in jts.items()).backward()
        return {
            "keys": list(jts), "need_indices": ec.need_indices(),
            "jts": {key: [jt.values().detach(), jt.lengths(), jt.weights_or_none()] for key, jt in jts.items()},
            "table_grads": {name: ec.embeddings[name].weight.grad for name in weights},
        }

    def differences():  # docs/torchrec_differences.md's rows about the collections
        out = {}
        def attempt(name, call):
            try:
                call()
                out[name] = "ok"
            except Exception as error:
                out[name] = type(error).__name__
        mean = [EmbeddingBagConfig(num_embeddings=5, embedding_dim=4, name="t", feature_names=["f"],
                                   pooling=PoolingType.MEAN)]
        kjt = KeyedJaggedTensor.from_lengths_sync(["f"], torch.tensor([1, 2]), torch.tensor([2]), weights=torch.ones(2))
        attempt("weighted_mean", lambda: EmbeddingBagCollection(mean, is_weighted=True)(kjt))
        widths = [EmbeddingConfig(num_embeddings=5, embedding_dim=4, name="a", feature_names=["f"]),
                  EmbeddingConfig(num_embeddings=5, embedding_dim=8, name="b", feature_names=["g"])]
        attempt("two_widths", lambda: EmbeddingCollection(widths))
        return out

    results = {"differences": differences()}
    for kernel, inputs in torch.load(sys.argv[1]).items():  # the tables each of our kernels started from
        out = results[kernel] = {case: bags(inputs, *args) for case, args in inputs["bags"].items()}
        for need_indices in (False, True):
            out[f"sequences_{need_indices}"] = sequences(inputs, need_indices, *inputs["sequences"])
    torch.save(results, sys.argv[2])
"""


def _kjt(per_id: torch.Tensor | None = None) -> KeyedJaggedTensor:
    return KeyedJaggedTensor.from_lengths_sync(KEYS, VALUES, LENGTHS, weights=per_id)


def _grad(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _bags(case: str, kernel: str) -> tuple[dict[str, Any], dict[str, torch.Tensor], torch.Tensor]:
    """Our side of a bag case, the tables it started from, and the output's gradient."""
    tables, weighted = BAGS[case]
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(
        [EmbeddingBagConfig(name, rows, dim, features, pooling=mode) for name, rows, dim, features, mode in tables],
        is_weighted=weighted,
        compute_kernel=kernel,
        optimizer=SGD,
        lookup_threads=1,
    )
    before = {name: weight.detach().clone() for name, weight in ebc.embedding_parameters().items()}
    per_id = WEIGHTS.clone().requires_grad_()
    kt = ebc(_kjt(per_id))
    grad = _grad(tuple(kt.values().shape), seed=1)
    (kt.values() * grad).sum().backward()
    after = ebc.embedding_parameters()
    ours = {
        "keys": kt.keys(),
        "length_per_key": kt.length_per_key(),
        "values": kt.values().detach(),
        "weights_grad": per_id.grad,
        "table_grads": {name: before[name] - after[name] for name in before},
    }
    return ours, before, grad


def _sequences(
    need_indices: bool, kernel: str
) -> tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    ec = EmbeddingCollection(
        [EmbeddingConfig(name, rows, dim, features) for name, rows, dim, features in SEQUENCES],
        None,
        need_indices,
        compute_kernel=kernel,
        optimizer=SGD,
        lookup_threads=1,
    )
    before = {name: weight.detach().clone() for name, weight in ec.embedding_parameters().items()}
    jts = ec(_kjt())
    grads = {key: _grad(tuple(jt.values().shape), seed=i) for i, (key, jt) in enumerate(jts.items())}
    sum((jt.values() * grads[key]).sum() for key, jt in jts.items()).backward()
    after = ec.embedding_parameters()
    ours = {
        "keys": list(jts),
        "need_indices": ec.need_indices(),
        "jts": {key: [jt.values().detach(), jt.lengths(), jt.weights_or_none()] for key, jt in jts.items()},
        "table_grads": {name: before[name] - after[name] for name in before},
    }
    return ours, before, grads


@pytest.fixture(scope="module")
def sides(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict]:
    """Ours and TorchRec's results by kernel of ours (TorchRec run once, on each kernel's tables)."""
    ours, inputs = {}, {}
    for kernel in ("fused", "dense"):
        ours[kernel] = {}
        inputs[kernel] = {"keys": KEYS, "values": VALUES, "lengths": LENGTHS, "weights": WEIGHTS, "bags": {}}
        for case, (tables, weighted) in BAGS.items():
            ours[kernel][case], weights, grad = _bags(case, kernel)
            inputs[kernel]["bags"][case] = (tables, weighted, weights, grad)
        for need_indices in (False, True):
            ours[kernel][f"sequences_{need_indices}"], weights, grads = _sequences(need_indices, kernel)
            inputs[kernel]["sequences"] = (SEQUENCES, weights, grads)  # the same tables and gradients either way
    return ours, torchrec_anchor.torchrec_script(TORCHREC_SIDE, inputs, tmp_path_factory.mktemp("torchrec"))


@pytest.fixture(params=["fused", "dense"])
def both_sides(request: pytest.FixtureRequest, sides: tuple[dict, dict]) -> tuple[dict, dict]:
    ours, theirs = sides
    return ours[request.param], theirs[request.param]


@pytest.mark.parametrize("case", [*BAGS, "sequences_False", "sequences_True"])
def test_outputs_and_gradients_are_torchrecs(case: str, both_sides: tuple[dict, dict]) -> None:
    ours, theirs = both_sides
    if case == "plain":
        assert ours[case]["weights_grad"] is None and theirs[case]["weights_grad"] is None
    torchrec_anchor.assert_same(ours[case], theirs[case], case, exact=False)


def test_the_shared_feature_is_named_per_table_in_torchrecs_order(both_sides: tuple[dict, dict]) -> None:
    ours, theirs = both_sides
    assert ours["weighted"]["keys"] == theirs["weighted"]["keys"] == ["f@a", "g", "f@b", "h"]
    assert ours["sequences_True"]["keys"] == ["f@a", "g", "f@b"]
    ids = ours["sequences_True"]["jts"]["f@b"][2]
    assert torch.equal(ids, VALUES[6:]) and ours["sequences_False"]["jts"]["f@b"][2] is None


def test_an_id_past_the_smaller_of_a_features_tables_is_refused_naming_it() -> None:
    ebc = EmbeddingBagCollection([EmbeddingBagConfig("a", 10, 4, ["f"]), EmbeddingBagConfig("b", 6, 4, ["f"])])
    batch = KeyedJaggedTensor.from_lengths_sync(["f"], torch.tensor([3, 7]), torch.tensor([1, 1]))
    with pytest.raises(ValueError) as refused:
        ebc(batch)
    assert str(refused.value) == "feature 'f' at sample 1: id 7 out of range for table 'b' with 6 rows"


def test_the_output_names_by_table() -> None:
    ec = EmbeddingCollection([EmbeddingConfig(name, rows, dim, features) for name, rows, dim, features in SEQUENCES])
    assert ec.embedding_names_by_table() == [["f@a", "g"], ["f@b"]]
    assert ec.feature_names() == ["f@a", "g", "f@b"] and not ec.need_indices()


def test_the_differences_in_the_docs_are_true(sides: tuple[dict, dict]) -> None:
    """docs/torchrec_differences.md's rows about the collections: TorchRec refuses, ours compute."""
    theirs = sides[1]["differences"]
    assert theirs == {"weighted_mean": "NotImplementedError", "two_widths": "ValueError"}

    ebc = EmbeddingBagCollection([EmbeddingBagConfig("t", 5, 4, ["f"], pooling="mean")], is_weighted=True)
    weights = torch.tensor([0.5, 3.0])
    pooled = ebc(KeyedJaggedTensor.from_lengths_sync(["f"], torch.tensor([1, 2]), torch.tensor([2]), weights=weights))
    table = ebc.embedding_parameters()["t"]
    torch.testing.assert_close(pooled.values()[0], (0.5 * table[1] + 3.0 * table[2]) / 2)
    ec = EmbeddingCollection([EmbeddingConfig("a", 5, 4, ["f"]), EmbeddingConfig("b", 5, 8, ["g"])])
    jts = ec(KeyedJaggedTensor.from_lengths_sync(["f", "g"], torch.tensor([1, 2]), torch.tensor([1, 1])))
    assert [jt.values().shape[1] for jt in jts.values()] == [4, 8]
