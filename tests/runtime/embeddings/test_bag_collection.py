"""Tests for runtime/embeddings/bag_collection.py and runtime/embeddings/optim.py.

Both kernels are checked against a plain-torch reference written here
(F.embedding_bag + the optimizer formulas of fbgemm's exact CPU kernels), and
against each other, to an absolute tolerance of 1e-5 after several steps.
"""

from __future__ import annotations

import copy
import io
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from runtime.config.embeddings import EmbeddingBagConfig, EmbeddingOptimizer
from runtime.embeddings.bag_collection import EmbeddingBagCollection
from runtime.sparse.jagged import KeyedJaggedTensor

ATOL = 1e-5
BATCH = 5
STEPS = 3
OPTIMIZERS = {
    "sgd": EmbeddingOptimizer("sgd", lr=0.1),
    "adagrad": EmbeddingOptimizer("adagrad", lr=0.1),
    "rowwise_adagrad": EmbeddingOptimizer("rowwise_adagrad", lr=0.1),
    "adam": EmbeddingOptimizer("adam", lr=0.05, beta1=0.8, beta2=0.95, weight_decay=0.01),
}


def make_tables(pooling: str = "sum", dims: tuple[int, int, int] = (4, 8, 12)) -> list[EmbeddingBagConfig]:
    """A shared table (two features) and two tables of other shapes."""
    return [
        EmbeddingBagConfig("t0", 20, dims[0], ["f0", "f1"], pooling=pooling),
        EmbeddingBagConfig("t1", 13, dims[1], ["f2"], pooling=pooling),
        EmbeddingBagConfig("t2", 7, dims[2], ["f3"], pooling=pooling, weight_init_min=-0.5, weight_init_max=0.5),
    ]


def make_kjt(rows: dict[str, int], weighted: bool, seed: int, extra: dict[str, int] | None = None) -> KeyedJaggedTensor:
    """Random batch over `rows` (feature -> table rows), 0-3 ids per bag, in the given key order."""
    gen = torch.Generator().manual_seed(seed)
    features = {**rows, **(extra or {})}
    lengths = torch.randint(0, 4, (len(features) * BATCH,), generator=gen)
    per_key = lengths.view(len(features), BATCH).sum(1).tolist()
    values = torch.cat([torch.randint(0, n, (count,), generator=gen) for n, count in zip(features.values(), per_key)])
    weights = torch.rand(values.numel(), generator=gen) + 0.5 if weighted else None
    return KeyedJaggedTensor.from_lengths_sync(list(features), values, lengths, weights=weights)


def feature_rows(tables: list[EmbeddingBagConfig]) -> dict[str, int]:
    return {f: t.num_embeddings for t in tables for f in t.feature_names}


class Reference:
    """Plain-torch EmbeddingBagCollection: autograd for gradients, formulas written out."""

    def __init__(self, tables: list[EmbeddingBagConfig], optimizer: EmbeddingOptimizer, state: dict) -> None:
        self.tables = tables
        self.opt = optimizer
        self.weight = {t.name: state[f"{t.name}.weight"].clone().requires_grad_() for t in tables}
        self.state = {k: v.clone() for k, v in state.items() if not k.endswith(".weight")}

    def forward(self, kjt: KeyedJaggedTensor, weighted: bool) -> torch.Tensor:
        features = kjt.to_dict()
        pooled = []
        for t in self.tables:
            for f in t.feature_names:
                jt = features[f]
                lengths = jt.lengths()
                offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])[:-1]
                w = jt.weights() if weighted else None
                out = F.embedding_bag(jt.values(), self.weight[t.name], offsets, mode="sum", per_sample_weights=w)
                if t.pooling == "mean":
                    out = out / lengths.clamp(min=1).unsqueeze(1)
                pooled.append(out)
        return torch.cat(pooled, dim=1)

    @torch.no_grad()
    def step(self, kjt: KeyedJaggedTensor) -> None:
        o, features = self.opt, kjt.to_dict()
        for t in self.tables:
            w, name = self.weight[t.name], t.name
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


def assert_state_close(actual: dict, expected: dict) -> None:
    assert list(actual) == list(expected)
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], atol=ATOL, rtol=0, msg=key)


def train_and_compare(
    tables: list[EmbeddingBagConfig],
    optimizer: EmbeddingOptimizer,
    weighted: bool,
    kernels: tuple[str, ...],
) -> None:
    """Runs STEPS steps of each kernel and the reference and compares every output and state."""
    models = []
    for kernel in kernels:
        torch.manual_seed(0)
        models.append(EmbeddingBagCollection(tables, weighted, compute_kernel=kernel, optimizer=optimizer))
    reference = Reference(tables, optimizer, models[0].state_dict())
    rows = feature_rows(tables)
    for step in range(STEPS):
        kjt = make_kjt(rows, weighted, seed=step)
        expected = reference.forward(kjt, weighted)
        coef = torch.randn(expected.shape, generator=torch.Generator().manual_seed(100 + step))
        (expected * coef).sum().backward()
        reference.step(kjt)
        for model in models:
            out = model(kjt)
            assert out.keys() == list(rows)
            torch.testing.assert_close(out.values(), expected, atol=ATOL, rtol=0)
            (out.values() * coef).sum().backward()
    ref_state = {}
    for t in tables:
        ref_state[f"{t.name}.weight"] = reference.weight[t.name].detach()
        ref_state.update({k: v for k, v in reference.state.items() if k.startswith(f"{t.name}.")})
    for model in models:
        assert_state_close(model.state_dict(), ref_state)


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("pooling", ["sum", "mean"])
@pytest.mark.parametrize("opt", list(OPTIMIZERS))
def test_kernels_match_reference(opt: str, pooling: str, weighted: bool) -> None:
    train_and_compare(make_tables(pooling), OPTIMIZERS[opt], weighted, ("fused", "dense"))


@pytest.mark.parametrize("opt", list(OPTIMIZERS))
def test_dense_kernel_any_dim_matches_reference(opt: str) -> None:
    train_and_compare(make_tables("mean", dims=(3, 5, 1)), OPTIMIZERS[opt], True, ("dense",))


def test_mixed_groups_match_reference_in_table_order() -> None:
    """Per-table optimizers and poolings make interleaved groups; output stays in table order."""
    rowwise = OPTIMIZERS["rowwise_adagrad"]
    tables = [
        EmbeddingBagConfig("a", 11, 4, ["fa"], optimizer=OPTIMIZERS["sgd"]),
        EmbeddingBagConfig("b", 9, 8, ["fb1", "fb2"], pooling="mean"),
        EmbeddingBagConfig("c", 6, 4, ["fc"], optimizer=OPTIMIZERS["sgd"]),
        EmbeddingBagConfig("d", 8, 4, ["fd"]),
    ]
    models = []
    for kernel in ("fused", "dense"):
        torch.manual_seed(0)
        models.append(EmbeddingBagCollection(tables, compute_kernel=kernel, optimizer=rowwise, lookup_threads=1))
    assert len(models[0]._groups) == 3
    # The per-table optimizer decides the state: sgd tables have none.
    assert list(models[0].state_dict()) == [
        "a.weight",
        "b.weight",
        "b.momentum1",
        "c.weight",
        "d.weight",
        "d.momentum1",
    ]
    initial = models[0].state_dict()
    per_table = {t.name: Reference([t], t.optimizer or rowwise, initial) for t in tables}
    rows = feature_rows(tables)
    for step in range(STEPS):
        kjt = make_kjt(rows, weighted=False, seed=step)
        expected = torch.cat([per_table[t.name].forward(kjt, False) for t in tables], dim=1)
        coef = torch.randn(expected.shape)
        (expected * coef).sum().backward()
        for ref in per_table.values():
            ref.step(kjt)
        for model in models:
            out = model(kjt)
            assert out.keys() == ["fa", "fb1", "fb2", "fc", "fd"]
            assert out.length_per_key() == [4, 8, 8, 4, 4]
            torch.testing.assert_close(out.values(), expected, atol=ATOL, rtol=0)
            (out.values() * coef).sum().backward()
    for model in models:
        for t in tables:
            expected = per_table[t.name].weight[t.name].detach()
            actual = model.embedding_parameters()[t.name]
            torch.testing.assert_close(actual, expected, atol=ATOL, rtol=0)


def test_input_order_and_extra_keys_do_not_change_output() -> None:
    tables = make_tables()
    rows = feature_rows(tables)
    shuffled = {k: rows[k] for k in ["f3", "f1", "f2", "f0"]}
    for kernel in ("fused", "dense"):
        torch.manual_seed(0)
        ebc = EmbeddingBagCollection(tables, compute_kernel=kernel, optimizer=OPTIMIZERS["sgd"])
        kjt = make_kjt(shuffled, weighted=False, seed=3, extra={"unused": 1000})
        ordered = kjt.permute([kjt.keys().index(k) for k in rows])
        with torch.no_grad():
            out, expected = ebc(kjt), ebc(ordered)
        assert out.keys() == ["f0", "f1", "f2", "f3"]
        torch.testing.assert_close(out.values(), expected.values(), atol=0, rtol=0)
        for key in rows:
            expected_key = ordered_lookup(ebc, ordered, key)
            torch.testing.assert_close(out[key], expected_key, atol=ATOL, rtol=0)


def ordered_lookup(ebc: EmbeddingBagCollection, kjt: KeyedJaggedTensor, key: str) -> torch.Tensor:
    table = next(t for t in ebc.embedding_bag_configs() if key in t.feature_names)
    jt = kjt[key]
    offsets = torch.cat([jt.lengths().new_zeros(1), jt.lengths().cumsum(0)])[:-1]
    return F.embedding_bag(jt.values(), ebc.embedding_parameters()[table.name], offsets, mode="sum")


def test_fused_output_is_the_tbe_output(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RECCOMPILE_KERNELS", "embedding_update=fbgemm")  # not the C update, if it measured faster
    tables = make_tables()
    ebc = EmbeddingBagCollection(tables, lookup_threads=1)
    kjt = make_kjt(feature_rows(tables), weighted=False, seed=0)
    out = ebc(kjt).values()
    assert len(ebc._groups) == 1
    assert "SplitLookupFunction" in out.grad_fn.name()


@pytest.mark.parametrize("kernel", ["fused", "dense"])
@pytest.mark.parametrize("bad_id", [100412, -1])
def test_out_of_range_id_names_feature_and_table(kernel: str, bad_id: int) -> None:
    tables = [
        EmbeddingBagConfig("cat_2", 10, 4, ["cat_2"]),
        EmbeddingBagConfig("cat_3", 100000, 4, ["cat_3"]),
    ]
    ebc = EmbeddingBagCollection(tables, compute_kernel=kernel)
    kjt = KeyedJaggedTensor.from_lengths_sync(
        ["cat_2", "cat_3"], torch.tensor([9, 0, 99999, bad_id, 5]), torch.tensor([1, 0, 2, 2])
    )
    message = f"feature 'cat_3' at sample 1: id {bad_id} out of range for table 'cat_3' with 100000 rows"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        ebc(kjt)


def test_missing_feature_and_missing_weights_are_errors() -> None:
    ebc = EmbeddingBagCollection(make_tables(), is_weighted=True)
    kjt = make_kjt({"f0": 20, "f1": 20, "f2": 13}, weighted=True, seed=0)
    message = "KeyedJaggedTensor has no feature 'f3' (keys: ['f0', 'f1', 'f2'])"
    with pytest.raises(ValueError, match=re.escape(message)):
        ebc(kjt)
    message = "is_weighted=True) needs a KeyedJaggedTensor with weights"
    with pytest.raises(ValueError, match=re.escape(message)):
        ebc(make_kjt(feature_rows(make_tables()), weighted=False, seed=0))


def test_construction_errors() -> None:
    message = (
        "table 't0': embedding_dim 3 is not a multiple of 4, which the fused (fbgemm) kernel "
        "requires; use compute_kernel='dense'"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        EmbeddingBagCollection(make_tables(dims=(3, 8, 12)))
    message = "table 'a' names feature 'f0' twice"
    with pytest.raises(ValueError, match=re.escape(message)):
        EmbeddingBagCollection([EmbeddingBagConfig("a", 4, 4, ["f0", "f1", "f0"])])
    with pytest.raises(ValueError, match=re.escape("unknown embedding optimizer 'lamb'")):
        EmbeddingOptimizer("lamb")
    message = "'sgd': weight_decay is only supported for 'adam'"
    with pytest.raises(ValueError, match=re.escape(message)):
        EmbeddingOptimizer("sgd", weight_decay=0.1)
    with pytest.raises(ValueError, match=re.escape("table 'x': unknown pooling 'max'")):
        EmbeddingBagConfig("x", 4, 4, ["f"], pooling="max")


def test_default_init_range_is_torchrec() -> None:
    table = EmbeddingBagConfig("t", 400, 8, ["f"])
    assert table.init_range() == (-0.05, 0.05)
    for kernel in ("fused", "dense"):
        weight = EmbeddingBagCollection([table], compute_kernel=kernel).embedding_parameters()["t"]
        assert -0.05 <= weight.min() < -0.04 and 0.04 < weight.max() <= 0.05


class Parent(nn.Module):
    def __init__(self, kernel: str, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.sparse = EmbeddingBagCollection(
            make_tables(), compute_kernel=kernel, optimizer=OPTIMIZERS["rowwise_adagrad"]
        )
        self.dense = nn.Linear(4, 1)


@pytest.mark.parametrize("source,target", [("fused", "dense"), ("dense", "fused")])
def test_state_dict_round_trip_across_kernels(source: str, target: str) -> None:
    rows = feature_rows(make_tables())
    trained = Parent(source, seed=0)
    for step in range(2):
        trained.sparse(make_kjt(rows, False, seed=step)).values().sum().backward()
    state = trained.state_dict()
    assert {k: tuple(v.shape) for k, v in state.items() if k.startswith("sparse.")} == {
        "sparse.t0.weight": (20, 4),
        "sparse.t0.momentum1": (20,),
        "sparse.t1.weight": (13, 8),
        "sparse.t1.momentum1": (13,),
        "sparse.t2.weight": (7, 12),
        "sparse.t2.momentum1": (7,),
    }
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    restored = Parent(target, seed=1)
    restored.load_state_dict(torch.load(buffer))
    assert_state_close(restored.state_dict(), trained.state_dict())
    for model in (trained, restored):
        model.sparse(make_kjt(rows, False, seed=7)).values().sum().backward()
    assert_state_close(restored.state_dict(), trained.state_dict())

    del state["sparse.t1.momentum1"]
    state["sparse.t9.weight"] = torch.zeros(1)
    result = restored.load_state_dict(state, strict=False)
    assert result.missing_keys == ["sparse.t1.momentum1"]
    assert result.unexpected_keys == ["sparse.t9.weight"]


@pytest.mark.parametrize("kernel", ["fused", "dense"])
def test_embeddings_are_not_module_parameters(kernel: str) -> None:
    model = Parent(kernel, seed=0)
    assert model.sparse.optimizer_in_backward
    assert [name for name, _ in model.named_parameters()] == ["dense.weight", "dense.bias"]
    assert sorted(model.sparse.embedding_parameters()) == ["t0", "t1", "t2"]
    model.sparse(make_kjt(feature_rows(make_tables()), False, seed=0)).values().sum().backward()
    assert all(w.grad is None for w in model.sparse.embedding_parameters().values())


@pytest.mark.parametrize("kernel", ["fused", "dense"])
def test_deepcopy_trains_independently(kernel: str) -> None:
    original = EmbeddingBagCollection(make_tables(), compute_kernel=kernel)
    before = copy.deepcopy(original.state_dict())
    clone = copy.deepcopy(original)
    clone(make_kjt(feature_rows(make_tables()), False, seed=0)).values().sum().backward()
    assert_state_close(original.state_dict(), before)
    changed = clone.state_dict()
    assert not torch.equal(changed["t0.weight"], before["t0.weight"])
    assert changed["t0.momentum1"].sum() > 0


@pytest.mark.parametrize("values_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("lengths_dtype", [torch.int32, torch.int64])
def test_index_dtypes(values_dtype: torch.dtype, lengths_dtype: torch.dtype) -> None:
    tables = make_tables("mean")
    kjt = make_kjt(feature_rows(tables), weighted=False, seed=0)
    kjt = KeyedJaggedTensor.from_lengths_sync(
        kjt.keys(), kjt.values().to(values_dtype), kjt.lengths().to(lengths_dtype)
    )
    outputs = []
    for kernel in ("fused", "dense"):
        torch.manual_seed(0)
        ebc = EmbeddingBagCollection(tables, compute_kernel=kernel)
        outputs.append(ebc(kjt).values())
        outputs[-1].sum().backward()
    torch.testing.assert_close(outputs[0], outputs[1], atol=ATOL, rtol=0)
