"""Tests for runtime/embeddings/native_update.py and runtime/cpu/native/rowwise_adagrad.c.

The C update must leave a TBE's weights and row-wise state where fbgemm's own
backward leaves them (up to float rounding: the sums run in another order),
for tables of several widths and sizes, a table read by two features,
weighted ids and mean pooling; measuring the choice must change nothing.
"""

from __future__ import annotations

import pytest
import torch

from runtime.config.embeddings import EmbeddingBagConfig, EmbeddingOptimizer
from runtime.cpu import choice
from runtime.embeddings import native_update
from runtime.embeddings.bag_collection import EmbeddingBagCollection
from runtime.sparse.jagged import KeyedJaggedTensor

pytest.importorskip("fbgemm_gpu")

BATCH = 24
TABLES = [
    EmbeddingBagConfig("t0", 70_000, 8, ["f0", "f1"]),  # two features, rows past one radix digit
    EmbeddingBagConfig("t1", 40, 16, ["f2"]),
    EmbeddingBagConfig("t2", 30, 64, ["f3"], pooling="mean"),
    EmbeddingBagConfig("t3", 3, 4, ["f4"]),
]
ROWS = {"f0": 70_000, "f1": 70_000, "f2": 40, "f3": 30, "f4": 3}
# The C update keeps a row's sum in registers for widths of 1 to 8 vectors (16 lanes with AVX-512,
# 8 with AVX2) and loops over the columns for any other: every one of those, past them, and odd ones.
WIDTHS = {16: 3, 32: 500, 48: 70, 64: 1000, 80: 90, 96: 2000, 112: 400, 128: 65_537, 136: 50, 8: 300, 12: 7, 20: 40}
WIDE_TABLES = [EmbeddingBagConfig(f"w{d}", rows, d, [f"g{d}"]) for d, rows in WIDTHS.items()]


def _batch(seed: int, weighted: bool, rows: dict[str, int] = ROWS, batch: int = BATCH) -> KeyedJaggedTensor:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 6, (len(rows) * batch,), generator=gen)
    per_key = lengths.view(len(rows), batch).sum(1).tolist()
    # ids drawn from few rows too, so rows repeat within and across bags and features
    values = torch.cat(
        [torch.randint(0, min(n, 50), (k,), generator=gen) * (n // min(n, 50)) for n, k in zip(rows.values(), per_key)]
    )
    weights = torch.rand(values.numel(), generator=gen) if weighted else None
    return KeyedJaggedTensor.from_lengths_sync(list(rows), values, lengths, weights=weights)


def _train(
    kernel: str,
    weighted: bool,
    monkeypatch: pytest.MonkeyPatch,
    steps: int = 4,
    tables: list[EmbeddingBagConfig] = TABLES,
    batch: int = BATCH,
):
    monkeypatch.setenv(choice.ENV, f"embedding_update={kernel}")
    torch.manual_seed(0)
    collection = EmbeddingBagCollection(
        tables, is_weighted=weighted, optimizer=EmbeddingOptimizer("rowwise_adagrad", lr=0.1), lookup_threads=1
    )
    rows = {feature: table.num_embeddings for table in tables for feature in table.feature_names}
    outputs = []
    for step in range(steps):
        pooled = collection(_batch(step, weighted, rows, batch)).values()
        weight = torch.randn(pooled.shape, generator=torch.Generator().manual_seed(100 + step))
        (pooled * weight).sum().backward()
        outputs.append(pooled.detach())
    return outputs, collection.state_dict()


@pytest.mark.parametrize("weighted", [False, True])
def test_native_update_trains_like_fbgemms_backward(weighted: bool, monkeypatch, native_kernels) -> None:
    native_out, native_state = _train("native", weighted, monkeypatch)
    fbgemm_out, fbgemm_state = _train("fbgemm", weighted, monkeypatch)
    for native_pooled, fbgemm_pooled in zip(native_out, fbgemm_out):
        torch.testing.assert_close(native_pooled, fbgemm_pooled, atol=1e-6, rtol=1e-5)
    assert native_state.keys() == fbgemm_state.keys()
    for key in fbgemm_state:
        torch.testing.assert_close(native_state[key], fbgemm_state[key], atol=1e-6, rtol=1e-5, msg=key)
    changed = native_state["t0.momentum1"] != 0
    assert 50 <= int(changed.sum()) <= 100  # the rows the batches touched, in both features of t0


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("weighted", [False, True])
def test_every_width_trains_like_fbgemms_backward(
    weighted: bool, threads: int, monkeypatch, torch_threads, native_kernels
) -> None:
    """Twelve tables of widths 8 to 136 in one group, an odd batch, on 1 and 2 threads (the tables
    split over them): the same outputs, weights and state as fbgemm's, up to the sums' order."""
    torch_threads(threads)
    native_out, native_state = _train("native", weighted, monkeypatch, 3, WIDE_TABLES, 13)
    fbgemm_out, fbgemm_state = _train("fbgemm", weighted, monkeypatch, 3, WIDE_TABLES, 13)
    for native_pooled, fbgemm_pooled in zip(native_out, fbgemm_out, strict=True):
        torch.testing.assert_close(native_pooled, fbgemm_pooled, atol=1e-6, rtol=1e-5)
    for key in fbgemm_state:
        torch.testing.assert_close(native_state[key], fbgemm_state[key], atol=1e-6, rtol=1e-5, msg=key)
        if key.endswith("momentum1"):
            assert int((native_state[key] != 0).sum()) >= 2, key  # every table was updated


def test_the_native_update_is_used_where_forced(monkeypatch, native_kernels) -> None:
    monkeypatch.setenv(choice.ENV, "embedding_update=native")
    collection = EmbeddingBagCollection(TABLES[:2], optimizer=EmbeddingOptimizer("rowwise_adagrad"), lookup_threads=1)
    pooled = collection(_batch(0, False)).values()  # one group, output in lookup order: its own output
    assert pooled.grad_fn is not None and "_NativeUpdate" in type(pooled.grad_fn).__name__


def test_measuring_the_choice_leaves_weights_and_state_unchanged(tmp_path, monkeypatch, native_kernels) -> None:
    monkeypatch.setenv("RECCOMPILE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(choice.ENV, "embedding_update=fbgemm")
    torch.manual_seed(0)
    collection = EmbeddingBagCollection(TABLES, optimizer=EmbeddingOptimizer("rowwise_adagrad"), lookup_threads=1)
    (collection(_batch(0, False)).values() * 3).sum().backward()  # non-zero state first, nothing measured
    before = {key: value.clone() for key, value in collection.state_dict().items()}
    monkeypatch.delenv(choice.ENV)
    collection(_batch(1, False))  # each group measures both backwards on a zero gradient
    recorded = [c for c in choice.recorded() if c.kernel == "embedding_update"]
    assert len(recorded) == 2  # the sum group (t0, t1, t3) and the mean group (t2)
    for made in recorded:
        assert made.winner in ("fbgemm", "native") and dict(made.times_ms).keys() == {"fbgemm", "native"}
    for key, value in collection.state_dict().items():
        assert torch.equal(value, before[key]), key


def test_an_id_outside_its_table_is_refused_without_a_change(monkeypatch, native_kernels) -> None:
    monkeypatch.setenv(choice.ENV, "embedding_update=native")
    collection = EmbeddingBagCollection(
        TABLES, optimizer=EmbeddingOptimizer("rowwise_adagrad"), lookup_threads=1, bounds_check=False
    )
    group = collection._groups[0]
    batch = _batch(0, False)
    pooled = collection(batch).values()
    before = group.tbe.weights_host.detach().clone()
    values = batch.values().clone()
    values[0] = 1 << 40  # only the kernel's own check stands between it and memory
    layout = native_update.layout(group.tbe)
    status = native_update.native.rowwise_adagrad_backward(
        group.tbe.weights_host.detach(),
        group.tbe.momentum1_host.detach(),
        layout,
        values,
        batch.offsets(),
        None,
        torch.ones_like(pooled),
        0.1,
        1e-8,
    )
    assert status == 1
    assert torch.equal(group.tbe.weights_host.detach()[: 70_000 * 8], before[: 70_000 * 8])


def test_only_cpu_rowwise_adagrad_without_weight_decay_is_supported(native_kernels) -> None:
    for optimizer, supported in [("rowwise_adagrad", True), ("adagrad", False), ("sgd", False)]:
        collection = EmbeddingBagCollection(TABLES[:1], optimizer=EmbeddingOptimizer(optimizer), lookup_threads=1)
        assert (collection._groups[0]._native_layout is not None) is supported, optimizer


def test_a_table_of_more_rows_than_its_sort_keys_hold_takes_fbgemms_backward(native_kernels) -> None:
    """The C sort packs a row into 32 bits: a row 2**32 + 1 would update row 1 (no such table fits here,
    so the check is shown on the one TBE with its row count raised)."""
    tbe = (
        EmbeddingBagCollection(TABLES[:1], optimizer=EmbeddingOptimizer("rowwise_adagrad"), lookup_threads=1)
        ._groups[0]
        .tbe
    )
    assert native_update.supports(tbe, "rowwise_adagrad", 0.0)
    tbe.rows_per_table = torch.full_like(tbe.rows_per_table, native_update.ROW_LIMIT)
    assert native_update.supports(tbe, "rowwise_adagrad", 0.0)
    tbe.rows_per_table = torch.full_like(tbe.rows_per_table, native_update.ROW_LIMIT + 1)
    assert not native_update.supports(tbe, "rowwise_adagrad", 0.0)


def test_a_gradient_with_rows_further_apart_is_read_in_place(monkeypatch, native_kernels) -> None:
    """A table group's columns of the batch's gradient (as the backward of the groups' concatenation
    hands it over) update the tables exactly as the same gradient copied to its own rows."""
    monkeypatch.setenv(choice.ENV, "embedding_update=native")
    batch = _batch(3, False)
    states = []
    for strided in (False, True):
        torch.manual_seed(0)
        collection = EmbeddingBagCollection(
            TABLES[:2], optimizer=EmbeddingOptimizer("rowwise_adagrad"), lookup_threads=1
        )
        group = collection._groups[0]
        width = int(group.tbe.D_offsets[-1])
        whole = torch.randn(BATCH, width + 40, generator=torch.Generator().manual_seed(5))
        grad = whole[:, 7 : 7 + width] if strided else whole[:, 7 : 7 + width].contiguous()
        assert grad.is_contiguous() is not strided
        status = native_update.native.rowwise_adagrad_backward(
            group.tbe.weights_host.detach(),
            group.tbe.momentum1_host.detach(),
            native_update.layout(group.tbe),
            batch.values()[: int(batch.offset_per_key()[3])],
            batch.offsets()[: 3 * BATCH + 1],
            None,
            grad,
            0.1,
            1e-8,
        )
        assert status == 0
        states.append(collection.state_dict())
    for key in states[0]:
        assert torch.equal(states[0][key], states[1][key]), key
    assert bool((states[1]["t0.momentum1"] != 0).any())


@pytest.fixture
def torch_threads():
    """Sets torch's thread count for one test, then puts it back."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.fixture
def pool_on_two_threads(monkeypatch: pytest.MonkeyPatch, torch_threads):
    """The C pooling on 2 threads, as a batch of 2,048+ ids takes it: one id per thread suffices here."""
    monkeypatch.setattr(native_update.native, "IDS_PER_THREAD", 1)
    torch_threads(2)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("weighted", [False, True])
def test_the_native_forward_gives_fbgemms_bits(
    weighted: bool, threads: int, monkeypatch, torch_threads, native_kernels
) -> None:
    """The C pooling (quant_pool.c's float32 rows) sums each bag as fbgemm's forward does: the same
    bits, for a table read by two features, sum and mean (weighted) groups, on one thread (as it
    pools even there) and split over 2."""
    monkeypatch.setenv(choice.ENV, "embedding_update=native")
    monkeypatch.setattr(native_update.native, "IDS_PER_THREAD", 1)
    torch_threads(threads)
    collection = EmbeddingBagCollection(
        TABLES, is_weighted=weighted, optimizer=EmbeddingOptimizer("rowwise_adagrad"), lookup_threads=1
    )
    batch = collection._select(_batch(7, weighted))
    first = 0
    for group, size in zip(collection._groups, collection._group_sizes, strict=True):  # f0 f1 f2 f4 | f3
        last = first + size
        start, end = batch.offset_per_key()[first], batch.offset_per_key()[last]
        values, offsets = batch.values()[start:end], batch.offsets()[first * BATCH : last * BATCH + 1] - start
        weights = torch.rand(values.numel(), generator=torch.Generator().manual_seed(1)) if weighted else None
        assert native_update.native.pool_threads(values.numel()) == threads
        native = native_update._NativeUpdate.apply(
            group.tbe, group._native_layout, values, offsets, weights, group.tbe.weights_host
        )
        with torch.no_grad():
            assert torch.equal(native, group.tbe(values, offsets, weights))
        first = last


@pytest.mark.usefixtures("pool_on_two_threads")
def test_the_native_forward_refuses_an_id_outside_its_table(native_kernels) -> None:
    collection = EmbeddingBagCollection(TABLES[1:2], optimizer=EmbeddingOptimizer("rowwise_adagrad"), lookup_threads=1)
    group = collection._groups[0]
    values, offsets = torch.tensor([3, 40]), torch.tensor([0, 1, 2])
    with pytest.raises(ValueError) as err:
        native_update._NativeUpdate.apply(
            group.tbe, group._native_layout, values, offsets, None, group.tbe.weights_host
        )
    assert str(err.value) == "embedding lookup: an id is outside its table's rows (the batch was not checked)"
