"""The `l2` embedding penalty against its formula: torch optimizers on a plain loss term.

One training step of a collection with `EmbeddingOptimizer(embedding_l2=...)` must
equal, on every row of every table, a torch optimizer's step on the weights
(`torch.optim.SGD`, `Adagrad`, `Adam`; row-wise Adagrad, which torch lacks,
by its formula) with the gradient autograd takes of

    sum(upstream * F.embedding_bag(ids, W)) + (l2 / 2) * sum over the distinct ids r of ||W[r]||^2

and the collection must report that penalty, before the update. Random
ids with repeats, a table two features read, sum and mean pooling, per-id
weights, the fused (fbgemm TBE, C row-wise Adagrad) and dense kernels, and
the sequence collection, which runs the same groups with one id per bag.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from runtime.config.embeddings import EmbeddingBagConfig, EmbeddingConfig, EmbeddingOptimizer
from runtime.embeddings.bag_collection import EmbeddingBagCollection
from runtime.embeddings.l2_penalty import with_penalty_bags
from runtime.embeddings.sequence_collection import EmbeddingCollection
from runtime.sparse.jagged import KeyedJaggedTensor

L2 = 0.3
BATCH = 5
# table -> (rows, dim, features)
TABLES = {"t0": (40, 8, ("f0", "f1")), "t1": (25, 4, ("f2",))}
FEATURES = ["f0", "f1", "f2"]


def optimizer(kind: str, l2: float = L2) -> EmbeddingOptimizer:
    return EmbeddingOptimizer(kind, lr=0.05, eps=1e-8, embedding_l2=l2)


def random_batch(seed: int, weighted: bool) -> KeyedJaggedTensor:
    """BATCH bags per feature, 0-4 ids each from the first 12 rows (repeats likely)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 5, (len(FEATURES) * BATCH,), generator=gen)
    values = torch.randint(0, 12, (int(lengths.sum()),), generator=gen)
    weights = torch.rand(values.numel(), generator=gen) + 0.5 if weighted else None
    return KeyedJaggedTensor.from_lengths_sync(FEATURES, values, lengths, weights=weights)


def torch_step(kind: str, weights: dict[str, torch.Tensor], loss_of) -> tuple[dict[str, torch.Tensor], float]:
    """One torch optimizer step on copies of `weights` for the loss `loss_of(params)`; (new weights, penalty)."""
    params = {name: w.clone().requires_grad_() for name, w in weights.items()}
    data_loss, penalty = loss_of(params)
    (data_loss + penalty).backward()
    if kind == "rowwise_adagrad":
        with torch.no_grad():
            for p in params.values():
                m = p.grad.square().mean(dim=1, keepdim=True)
                p -= 0.05 * p.grad / (m.sqrt() + 1e-8)
    else:
        make = {"sgd": torch.optim.SGD, "adagrad": torch.optim.Adagrad, "adam": torch.optim.Adam}[kind]
        extra = {"eps": 1e-8} if kind != "sgd" else {}
        make(list(params.values()), lr=0.05, **extra).step()
    return {name: p.detach() for name, p in params.items()}, float(penalty.detach())


def penalty_of(params: dict[str, torch.Tensor], ids: dict[str, list[torch.Tensor]]) -> torch.Tensor:
    """(l2 / 2) * sum ||W[r]||^2 over each table's distinct ids."""
    return sum((L2 / 2) * params[t][torch.unique(torch.cat(ids[t]))].square().sum() for t in params)


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "rowwise_adagrad", "adam"])
@pytest.mark.parametrize("kernel", ["fused", "dense"])
@pytest.mark.parametrize("pooling,weighted", [("sum", False), ("mean", False), ("sum", True)])
def test_bag_step_equals_torch_on_the_loss_plus_penalty(kind: str, kernel: str, pooling: str, weighted: bool) -> None:
    configs = [
        EmbeddingBagConfig(name, rows, dim, features, pooling=pooling, optimizer=optimizer(kind))
        for name, (rows, dim, features) in TABLES.items()
    ]
    collection = EmbeddingBagCollection(configs, is_weighted=weighted, compute_kernel=kernel, lookup_threads=1)
    width = sum(dim * len(features) for _, dim, features in TABLES.values())
    # sgd keeps no state, so a second step checks the penalty step after step; the others take one step
    # (torch's optimizers would need the carried state, and torch's Adam moves rows a batch does not read)
    for step in range(2 if kind == "sgd" else 1):
        kjt = random_batch(step, weighted)
        upstream = torch.randn(BATCH, width, generator=torch.Generator().manual_seed(10 + step))
        before = {name: w.detach().clone() for name, w in collection.embedding_parameters().items()}
        expected, penalty = torch_step(kind, before, functools.partial(bag_loss, kjt, upstream, pooling, weighted))
        (collection(kjt).values() * upstream).sum().backward()
        reported = collection.embedding_penalty()
        assert reported is not None and float(reported) == pytest.approx(penalty, rel=1e-5)
        for name, weight in collection.embedding_parameters().items():
            torch.testing.assert_close(weight.detach(), expected[name], atol=1e-5, rtol=1e-5)


def bag_loss(
    kjt: KeyedJaggedTensor, upstream: torch.Tensor, pooling: str, weighted: bool, params: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """sum(upstream * pooled) through F.embedding_bag on `params`, and the penalty of the ids read."""
    pooled, ids = [], {t: [] for t in TABLES}
    for name, (_, _, features) in TABLES.items():
        for feature in features:
            jagged = kjt[feature]
            ids[name].append(jagged.values())
            weights = jagged.weights() if weighted else None
            pooled.append(
                F.embedding_bag(
                    jagged.values(), params[name], jagged.offsets()[:-1], mode=pooling, per_sample_weights=weights
                )
            )
    return (torch.cat(pooled, dim=1) * upstream).sum(), penalty_of(params, ids)


@pytest.mark.parametrize("kernel", ["fused", "dense"])
def test_sequence_step_equals_torch_on_the_loss_plus_penalty(kernel: str) -> None:
    configs = [
        EmbeddingConfig(name, rows, dim, features, optimizer=optimizer("rowwise_adagrad"))
        for name, (rows, dim, features) in TABLES.items()
    ]
    collection = EmbeddingCollection(configs, compute_kernel=kernel, lookup_threads=1)
    kjt = random_batch(3, weighted=False)
    before = {name: w.detach().clone() for name, w in collection.embedding_parameters().items()}
    out = collection(kjt)
    gen = torch.Generator().manual_seed(4)
    upstream = {f: torch.randn(out[f].values().shape, generator=gen) for f in FEATURES}

    def loss_of(params: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        data, ids = 0, {t: [] for t in TABLES}
        for name, (_, _, features) in TABLES.items():
            for feature in features:
                ids[name].append(kjt[feature].values())
                data = data + (F.embedding(kjt[feature].values(), params[name]) * upstream[feature]).sum()
        return data, penalty_of(params, ids)

    expected, penalty = torch_step("rowwise_adagrad", before, loss_of)
    sum((out[f].values() * upstream[f]).sum() for f in FEATURES).backward()
    assert float(collection.embedding_penalty()) == pytest.approx(penalty, rel=1e-5)
    for name, weight in collection.embedding_parameters().items():
        torch.testing.assert_close(weight.detach(), expected[name], atol=1e-5, rtol=1e-5)


def test_no_penalty_outside_training_and_without_l2() -> None:
    configs = [EmbeddingBagConfig("t", 10, 4, ("f",), optimizer=optimizer("sgd", l2=0.0))]
    kjt = KeyedJaggedTensor.from_lengths_sync(["f"], torch.tensor([1, 2]), torch.tensor([1, 1]))
    collection = EmbeddingBagCollection(configs, lookup_threads=1)
    collection(kjt).values().sum().backward()
    assert collection.embedding_penalty() is None
    penalised = EmbeddingBagCollection(
        [EmbeddingBagConfig("t", 10, 4, ("f",), optimizer=optimizer("sgd"))], lookup_threads=1
    )
    before = penalised.embedding_parameters()["t"].detach().clone()
    with torch.no_grad():
        penalised(kjt)
    assert penalised.embedding_penalty() is None
    torch.testing.assert_close(penalised.embedding_parameters()["t"], before, atol=0, rtol=0)


def test_penalty_bags_layout() -> None:
    """Two features of table 0 and one of table 1, two bags each: the distinct rows follow the batch."""
    values = torch.tensor([3, 3, 1, 7, 2, 2, 5])
    offsets = torch.tensor([0, 2, 3, 4, 4, 6, 7])  # f0: [3 3] [1]; f1: [7] []; f2: [2 2] [5]
    out_values, out_offsets, _, value_offsets, batch = with_penalty_bags(values, offsets, None, [0, 0, 1])
    assert batch == 2
    # each feature: its 2 bags, then 3 extra bags (table 0's distinct rows 1 3 7 on f0 only)
    assert out_values.tolist() == [3, 3, 1, 1, 3, 7, 7, 2, 2, 5, 2, 5]
    assert out_offsets.tolist() == [0, 2, 3, 4, 5, 6, 7, 7, 7, 7, 7, 9, 10, 11, 12, 12]
    assert value_offsets == [0, 6, 7, 12]
