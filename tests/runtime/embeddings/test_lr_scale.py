"""`set_lr_scale` of the embedding collections: the fused optimizer trains at the scheduled rate.

One step's update of each table is compared with the SGD formula
w[r] -= lr * scale * g[r], the gradient g taken by autograd through plain
F.embedding_bag on a copy of the weights; every table keeps its own
optimizer's base lr (per-table optimizers), on fbgemm's TBE and on the dense
kernel's optimizer hook alike, and the rate can change from step to step.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from runtime.config.embeddings import EmbeddingBagConfig, EmbeddingConfig, EmbeddingOptimizer
from runtime.embeddings.bag_collection import EmbeddingBagCollection
from runtime.embeddings.sequence_collection import EmbeddingCollection
from runtime.sparse.jagged import KeyedJaggedTensor

ATOL = 1e-6
TABLES = {"t0": (30, 8, EmbeddingOptimizer("sgd", lr=0.1)), "t1": (20, 4, EmbeddingOptimizer("sgd", lr=0.4))}


def batch(seed: int) -> KeyedJaggedTensor:
    """Four bags per feature f0 (table t0) and f1 (t1), 1-3 ids each, repeats included."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 4, (8,), generator=gen)
    counts = lengths.view(2, 4).sum(1).tolist()
    values = torch.cat(
        [torch.randint(0, 5, (counts[0],), generator=gen), torch.randint(0, 5, (counts[1],), generator=gen)]
    )
    return KeyedJaggedTensor.from_lengths_sync(["f0", "f1"], values, lengths)


def sgd_expectation(weights: dict[str, torch.Tensor], kjt: KeyedJaggedTensor, upstream: torch.Tensor, scale: float):
    """Each table after one SGD step at lr x scale, by the formula (autograd for the gradient)."""
    expected, column = {}, 0
    for (name, (_, dim, optimizer)), feature in zip(TABLES.items(), ["f0", "f1"]):
        jagged = kjt[feature]
        weight = weights[name].clone().requires_grad_()
        pooled = F.embedding_bag(jagged.values(), weight, jagged.offsets()[:-1], mode="sum")
        (pooled * upstream[:, column : column + dim]).sum().backward()
        expected[name] = weights[name] - optimizer.lr * scale * weight.grad
        column += dim
    return expected


@pytest.mark.parametrize("kernel", ["fused", "dense"])
def test_each_table_steps_at_its_own_lr_times_the_scale(kernel: str) -> None:
    configs = [
        EmbeddingBagConfig(name, rows, dim, [f"f{i}"], optimizer=optimizer)
        for i, (name, (rows, dim, optimizer)) in enumerate(TABLES.items())
    ]
    collection = EmbeddingBagCollection(configs, compute_kernel=kernel, lookup_threads=1)
    for step, scale in enumerate([0.25, 1.0, 0.0]):
        kjt = batch(step)
        upstream = torch.randn(4, 12, generator=torch.Generator().manual_seed(10 + step))
        before = {name: w.detach().clone() for name, w in collection.embedding_parameters().items()}
        collection.set_lr_scale(scale)
        (collection(kjt).values() * upstream).sum().backward()
        expected = sgd_expectation(before, kjt, upstream, scale)
        for name, weight in collection.embedding_parameters().items():
            torch.testing.assert_close(weight, expected[name], atol=ATOL, rtol=0)
            if scale > 0:
                assert not torch.equal(weight, before[name])  # the step did move the rows


def test_the_tbe_holds_the_scaled_rate_of_each_group() -> None:
    configs = [
        EmbeddingBagConfig(name, rows, dim, [f"f{i}"], optimizer=optimizer)
        for i, (name, (rows, dim, optimizer)) in enumerate(TABLES.items())
    ]
    collection = EmbeddingBagCollection(configs, compute_kernel="fused", lookup_threads=1)
    collection.set_lr_scale(0.5)
    assert [group.tbe.get_learning_rate() for group in collection._groups] == pytest.approx([0.05, 0.2])


def test_the_sequence_collection_scales_its_tables_too() -> None:
    config = EmbeddingConfig("t0", 30, 8, ["f0"], optimizer=EmbeddingOptimizer("sgd", lr=0.1))
    collection = EmbeddingCollection([config], lookup_threads=1)
    kjt = KeyedJaggedTensor.from_lengths_sync(["f0"], torch.tensor([3, 1, 3, 7]), torch.tensor([3, 1]))
    before = collection.embedding_parameters()["t0"].detach().clone()
    collection.set_lr_scale(0.5)
    collection(kjt)["f0"].values().sum().backward()
    grad = torch.zeros_like(before)
    grad[3], grad[1], grad[7] = 2.0, 1.0, 1.0  # each id's row gets one gradient of ones per occurrence
    torch.testing.assert_close(collection.embedding_parameters()["t0"], before - 0.05 * grad, atol=ATOL, rtol=0)
