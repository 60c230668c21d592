"""Tests for runtime/embeddings/sequence_collection.py.

Both kernels are checked against torch.nn.Embedding lookups and the
optimizer formulas of fbgemm's exact CPU kernels written out here in plain
torch: the rows and optimizer state after three steps agree to 1e-6.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from runtime.config.embeddings import EmbeddingConfig, EmbeddingOptimizer
from runtime.embeddings.sequence_collection import EmbeddingCollection
from runtime.sparse.jagged import KeyedJaggedTensor

ATOL = 1e-6
BATCH = 4
STEPS = 3
OPTIMIZERS = {
    "sgd": EmbeddingOptimizer("sgd", lr=0.1),
    "adagrad": EmbeddingOptimizer("adagrad", lr=0.1),
    "rowwise_adagrad": EmbeddingOptimizer("rowwise_adagrad", lr=0.1),
    "adam": EmbeddingOptimizer("adam", lr=0.05, beta1=0.8, beta2=0.95, weight_decay=0.01),
}


def make_tables() -> list[EmbeddingConfig]:
    """An item table read by a target and a history, and a narrower category table."""
    return [
        EmbeddingConfig("item", 30, 8, ["target", "history"]),
        EmbeddingConfig("category", 6, 4, ["categories"], weight_init_min=-0.5, weight_init_max=0.5),
    ]


def make_kjt(seed: int, keys: tuple[str, ...] = ("history", "categories", "target")) -> KeyedJaggedTensor:
    """Histories of 0-5 ids (some empty), one target each, categories as long as the history."""
    gen = torch.Generator().manual_seed(seed)
    history = torch.randint(0, 6, (BATCH,), generator=gen)
    history[1] = 0
    ones = torch.ones(BATCH, dtype=torch.long)
    lengths = {"history": history, "categories": history, "target": ones, "other": ones}
    rows = {"history": 30, "categories": 6, "target": 30, "other": 1000}
    values = {k: torch.randint(0, n, (int(lengths[k].sum()),), generator=gen) for k, n in rows.items()}
    return KeyedJaggedTensor.from_lengths_sync(
        list(keys), torch.cat([values[k] for k in keys]), torch.cat([lengths[k] for k in keys])
    )


def loss_of(rows: dict[str, torch.Tensor], seed: int) -> torch.Tensor:
    """A loss whose gradient differs per position and column."""
    gen = torch.Generator().manual_seed(seed)
    return sum((v * torch.randn(v.shape, generator=gen)).sum() for _, v in sorted(rows.items()))


class Reference:
    """nn.Embedding per table, gradients by autograd, the optimizer written out."""

    def __init__(self, tables: list[EmbeddingConfig], opt: EmbeddingOptimizer, state: dict) -> None:
        self.tables, self.opt = tables, opt
        self.embeddings = {
            t.name: nn.Embedding.from_pretrained(state[f"{t.name}.weight"].clone(), freeze=False) for t in tables
        }
        self.state = {k: v.clone() for k, v in state.items() if not k.endswith(".weight")}

    def forward(self, kjt: KeyedJaggedTensor) -> dict[str, torch.Tensor]:
        features = kjt.to_dict()
        return {f: self.embeddings[t.name](features[f].values()) for t in self.tables for f in t.feature_names}

    @torch.no_grad()
    def step(self, kjt: KeyedJaggedTensor) -> None:
        o, features = self.opt, kjt.to_dict()
        for t in self.tables:
            name, w = t.name, self.embeddings[t.name].weight
            rows = torch.cat([features[f].values() for f in t.feature_names]).unique()
            g = w.grad[rows]
            if o.type == "sgd":
                w[rows] -= o.lr * g
            elif o.type == "adagrad":
                m = self.state[f"{name}.momentum1"]
                m[rows] += g * g
                w[rows] -= o.lr * g / (m[rows].sqrt() + o.eps)
            elif o.type == "rowwise_adagrad":
                m = self.state[f"{name}.momentum1"]
                m[rows] += (g * g).mean(1)
                w[rows] -= o.lr * g / (m[rows].sqrt() + o.eps).unsqueeze(1)
            else:
                self.state[f"{name}.iter"] += 1
                step = int(self.state[f"{name}.iter"])
                m1, m2 = self.state[f"{name}.momentum1"], self.state[f"{name}.momentum2"]
                m1[rows] = o.beta1 * m1[rows] + (1 - o.beta1) * g
                m2[rows] = o.beta2 * m2[rows] + (1 - o.beta2) * g * g
                m_hat = m1[rows] / (1 - o.beta1**step)
                v_hat = m2[rows] / (1 - o.beta2**step)
                w[rows] -= o.lr * (m_hat / (v_hat.sqrt() + o.eps) + o.weight_decay * w[rows])
            w.grad = None


@pytest.mark.parametrize("kernel", ["fused", "dense"])
@pytest.mark.parametrize("opt", list(OPTIMIZERS))
def test_rows_and_state_match_reference_after_three_steps(kernel: str, opt: str) -> None:
    tables = make_tables()
    torch.manual_seed(0)
    ec = EmbeddingCollection(tables, compute_kernel=kernel, optimizer=OPTIMIZERS[opt])
    reference = Reference(tables, OPTIMIZERS[opt], ec.state_dict())
    for step in range(STEPS):
        kjt = make_kjt(seed=step)
        out = ec(kjt)
        expected = reference.forward(kjt)
        assert list(out) == ["target", "history", "categories"]
        for name, jt in out.items():
            torch.testing.assert_close(jt.values(), expected[name], atol=ATOL, rtol=0)
            torch.testing.assert_close(jt.lengths(), kjt[name].lengths())
        loss_of({k: jt.values() for k, jt in out.items()}, seed=100 + step).backward()
        loss_of(expected, seed=100 + step).backward()
        reference.step(kjt)
    state = ec.state_dict()
    for t in tables:
        torch.testing.assert_close(
            state[f"{t.name}.weight"], reference.embeddings[t.name].weight.detach(), atol=ATOL, rtol=0
        )
    for key, value in reference.state.items():
        torch.testing.assert_close(state[key], value, atol=ATOL, rtol=0)


@pytest.mark.parametrize("threads", [1, 2])
def test_mixed_widths_in_fused_groups_give_the_table_rows(threads: int) -> None:
    # One thread: both widths in one TBE, the category slot padded with empty bags.
    ec = EmbeddingCollection(make_tables(), lookup_threads=threads)
    assert len(ec._groups) == threads
    kjt = make_kjt(seed=7)
    out = ec(kjt)
    weights = ec.embedding_parameters()
    assert out["categories"].values().shape == (int(kjt["categories"].lengths().sum()), 4)
    for name, table in [("target", "item"), ("history", "item"), ("categories", "category")]:
        torch.testing.assert_close(out[name].values(), weights[table][kjt[name].values()], atol=0, rtol=0)


def test_all_sequences_empty_gives_empty_rows() -> None:
    ec = EmbeddingCollection([EmbeddingConfig("item", 30, 8, ["history"])])
    kjt = KeyedJaggedTensor.from_lengths_sync(
        ["history"], torch.zeros(0, dtype=torch.long), torch.zeros(BATCH, dtype=torch.long)
    )
    jt = ec(kjt)["history"]
    assert jt.values().shape == (0, 8)
    assert jt.lengths().tolist() == [0] * BATCH


def test_input_key_order_and_extra_keys_do_not_change_output() -> None:
    ec = EmbeddingCollection(make_tables(), compute_kernel="dense")
    plain = ec(make_kjt(seed=3))
    shuffled = ec(make_kjt(seed=3, keys=("other", "target", "history", "categories")))
    for name in plain:
        torch.testing.assert_close(plain[name].values(), shuffled[name].values(), atol=0, rtol=0)


@pytest.mark.parametrize("kernel", ["fused", "dense"])
@pytest.mark.parametrize("bad_id", [30, -1])
def test_out_of_range_id_names_feature_and_table(kernel: str, bad_id: int) -> None:
    ec = EmbeddingCollection(make_tables(), compute_kernel=kernel)
    kjt = KeyedJaggedTensor.from_lengths_sync(
        ["history", "categories", "target"],
        torch.tensor([1, bad_id, 0, 0, 5, 6]),
        torch.tensor([2, 0, 1, 1, 1, 1]),
    )
    message = f"feature 'history' at sample 0: id {bad_id} out of range for table 'item' with 30 rows"
    with pytest.raises(IndexError, match=f"^{re.escape(message)}$"):
        ec(kjt)


def test_missing_feature_is_an_error() -> None:
    ec = EmbeddingCollection(make_tables())
    kjt = KeyedJaggedTensor.from_lengths_sync(["target"], torch.tensor([1]), torch.tensor([1]))
    with pytest.raises(ValueError, match=re.escape("KeyedJaggedTensor has no feature 'history'")):
        ec(kjt)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: EmbeddingCollection([]), "EmbeddingCollection needs at least one table"),
        (
            lambda: EmbeddingCollection(make_tables(), compute_kernel="sparse"),
            "unknown compute_kernel 'sparse'; expected one of fused, dense",
        ),
        (
            lambda: EmbeddingCollection([EmbeddingConfig("t", 5, 6, ["f"])]),
            "table 't': embedding_dim 6 is not a multiple of 4, which the fused (fbgemm) "
            "kernel requires; use compute_kernel='dense'",
        ),
        (
            lambda: EmbeddingCollection([EmbeddingConfig("a", 5, 4, ["f", "f"])]),
            "table 'a' names feature 'f' twice",
        ),
        (lambda: EmbeddingConfig("t", 0, 4, ["f"]), "table 't': num_embeddings and embedding_dim must be >= 1"),
        (lambda: EmbeddingConfig("t", 5, 4, []), "table 't': needs at least one feature name"),
        (
            lambda: EmbeddingConfig("t", 5, 4, ["f"], weight_init_min=1.0, weight_init_max=0.0),
            "table 't': weight_init_min 1.0 is greater than weight_init_max 0.0",
        ),
    ],
)
def test_construction_errors(build, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        build()


def test_dense_kernel_takes_any_width_and_embeddings_are_not_parameters() -> None:
    ec = EmbeddingCollection([EmbeddingConfig("t", 5, 6, ["f"])], compute_kernel="dense")
    assert list(ec.parameters()) == []
    assert ec(KeyedJaggedTensor.from_lengths_sync(["f"], torch.tensor([4]), torch.tensor([1])))["f"].values().shape == (
        1,
        6,
    )


def test_state_dict_round_trip_across_kernels() -> None:
    fused = EmbeddingCollection(make_tables(), optimizer=OPTIMIZERS["rowwise_adagrad"])
    loss_of({k: jt.values() for k, jt in fused(make_kjt(seed=1)).items()}, seed=5).backward()
    dense = EmbeddingCollection(make_tables(), compute_kernel="dense", optimizer=OPTIMIZERS["rowwise_adagrad"])
    dense.load_state_dict(fused.state_dict())
    assert sorted(dense.state_dict()) == ["category.momentum1", "category.weight", "item.momentum1", "item.weight"]
    for key, value in fused.state_dict().items():
        torch.testing.assert_close(dense.state_dict()[key], value, atol=0, rtol=0)
