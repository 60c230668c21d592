"""Tests for runtime/serving/quant_embedding.py against the fp32 training collection.

Bounds asserted (the module docstring states them), per stored value x:
fp32 exact; fp16 |err| <= |x| * 2**-11; int8 and int4 |err| <= step / 2
with step the row's scale (range / 255 or range / 15), up to float
rounding (factor 1 + 1e-3). A pooled bag's error is at most the sum of its
ids' per-row bounds times |weight| (1/L for mean). Separately the kernel
must equal pooling the dequantized rows in plain torch (to 1e-5 relative:
only the summation order differs).
"""

from __future__ import annotations

import ctypes
import mmap
import re

import pytest
import torch
import torch.nn.functional as F

from runtime.config.embeddings import EmbeddingBagConfig
from runtime.embeddings.bag_collection import EmbeddingBagCollection
from runtime.serving.quant_embedding import (
    PRECISIONS,
    QuantEmbeddingBagCollection,
    UnstorableTable,
    row_bytes,
    stored_dim,
)
from runtime.sparse.jagged import KeyedJaggedTensor

BATCH = 16


def make_tables() -> list[EmbeddingBagConfig]:
    """A shared sum table (two features), a mean table, and a wider sum table."""
    return [
        EmbeddingBagConfig("t0", 50, 8, ["f0", "f1"], pooling="sum"),
        EmbeddingBagConfig("t1", 30, 16, ["f2"], pooling="mean", weight_init_min=-2.0, weight_init_max=3.0),
        EmbeddingBagConfig("t2", 40, 32, ["f3"], pooling="sum", weight_init_min=-0.5, weight_init_max=0.5),
    ]


def make_kjt(tables: list[EmbeddingBagConfig], seed: int, order: list[str] | None = None) -> KeyedJaggedTensor:
    """0-5 ids per bag, random per-id weights, keys in `order` (default: the tables' order)."""
    gen = torch.Generator().manual_seed(seed)
    rows = {f: t.num_embeddings for t in tables for f in t.feature_names}
    keys = order or list(rows)
    lengths = torch.randint(0, 6, (len(keys) * BATCH,), generator=gen)
    per_key = lengths.view(len(keys), BATCH).sum(1).tolist()
    values = torch.cat([torch.randint(0, rows[k], (n,), generator=gen) for k, n in zip(keys, per_key)])
    weights = torch.rand(values.numel(), generator=gen) * 2
    return KeyedJaggedTensor.from_lengths_sync(keys, values, lengths, weights=weights)


def trained_collection(weighted: bool) -> EmbeddingBagCollection:
    torch.manual_seed(0)
    return EmbeddingBagCollection(make_tables(), is_weighted=weighted)


def quantized(
    ebc: EmbeddingBagCollection, precision: str | dict[str, str], weighted: bool
) -> QuantEmbeddingBagCollection:
    return QuantEmbeddingBagCollection(make_tables(), precision, is_weighted=weighted).quantize_from(
        ebc.embedding_parameters()
    )


def value_bound(precision: str, weight: torch.Tensor, step: torch.Tensor | None) -> torch.Tensor:
    """The stated bound per stored value (rows x dim)."""
    slack = 1 + 1e-3
    if precision == "fp32":
        return torch.zeros_like(weight)
    if precision == "fp16":
        return weight.abs() * 2.0**-11 * slack + 2.0**-24
    return (step / 2 * slack).expand_as(weight)


@pytest.mark.parametrize("weighted", [False, True])
def test_fp32_equals_training_collection_exactly(weighted: bool) -> None:
    ebc = trained_collection(weighted)
    qebc = quantized(ebc, "fp32", weighted)
    for order in (None, ["f3", "f2", "f1", "f0"]):
        kjt = make_kjt(make_tables(), seed=1, order=order)
        with torch.no_grad():
            expected = ebc(kjt)
        actual = qebc(kjt)
        assert actual.keys() == expected.keys()
        assert torch.equal(actual.values(), expected.values())


@pytest.mark.parametrize("precision", ["fp16", "int8", "int4"])
def test_stored_values_within_the_stated_bound(precision: str) -> None:
    ebc = trained_collection(False)
    qebc = quantized(ebc, precision, False)
    steps = qebc.quantization_steps()
    for name, dequantized in qebc.dequantized_weights().items():
        weight = ebc.embedding_parameters()[name].detach()
        error = (dequantized - weight).abs()
        assert bool((error <= value_bound(precision, weight, steps[name])).all()), name
        if precision != "fp16":
            span = weight.max(1, keepdim=True).values - weight.min(1, keepdim=True).values
            levels = 255 if precision == "int8" else 15
            torch.testing.assert_close(steps[name], span / levels, rtol=2**-10, atol=1e-7)


@pytest.mark.parametrize("precision", ["fp16", "int8", "int4"])
@pytest.mark.parametrize("weighted", [False, True])
def test_pooled_error_within_the_sum_of_row_bounds(precision: str, weighted: bool) -> None:
    ebc = trained_collection(weighted)
    qebc = quantized(ebc, precision, weighted)
    kjt = make_kjt(make_tables(), seed=2)
    with torch.no_grad():
        reference = ebc(kjt).to_dict()
    actual = qebc(kjt).to_dict()
    steps = qebc.quantization_steps()
    dequantized = qebc.dequantized_weights()
    for table in make_tables():
        weight = ebc.embedding_parameters()[table.name].detach()
        bound = value_bound(precision, weight, steps[table.name])
        for feature in table.feature_names:
            jt = kjt[feature]
            offsets = jt.offsets()
            ids, lengths = jt.values(), jt.lengths()
            ids_weights = jt.weights() if weighted else torch.ones(ids.numel())
            if table.pooling == "mean":
                ids_weights = ids_weights / lengths.clamp(min=1).repeat_interleave(lengths)
            allowed = F.embedding_bag(ids, bound, offsets[:-1], mode="sum", per_sample_weights=ids_weights.abs())
            error = (actual[feature] - reference[feature]).abs()
            assert bool((error <= allowed * 1.001 + 1e-6).all()), (table.name, feature)
            # The kernel reads exactly the dequantized rows.
            pooled = F.embedding_bag(
                ids, dequantized[table.name], offsets[:-1], mode="sum", per_sample_weights=ids_weights
            )
            torch.testing.assert_close(actual[feature], pooled, rtol=1e-5, atol=1e-6)


def test_mixed_precisions_match_fbgemms_own_module() -> None:
    ebc = trained_collection(False)
    precisions = {"t0": "int4", "t1": "fp16", "t2": "int8"}
    qebc = quantized(ebc, precisions, False)
    tbe = qebc.to_fbgemm()
    kjt = make_kjt(make_tables(), seed=3)
    lengths = kjt.lengths()
    # Mean tables run as sum pooling with weights 1/L: give fbgemm's module the same weights.
    mean_bags = torch.tensor([False, False, True, False]).repeat_interleave(BATCH)
    scale = torch.where(mean_bags, lengths.clamp(min=1).float().reciprocal(), 1.0)
    expected = tbe(kjt.values(), kjt.offsets(), scale.repeat_interleave(lengths))
    assert torch.equal(qebc(kjt).values(), expected)
    assert qebc.precisions() == precisions


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("precision", PRECISIONS)
def test_native_pooling_is_bitwise_fbgemms(precision: str, weighted: bool, monkeypatch, native_kernels) -> None:
    """runtime/cpu/native/quant_pool.c against fbgemm's kernel: widths of whole vectors (8 or 16 lanes),
    with a partial last vector (12, 24 with 16 lanes), and wider than one pass's registers (200)."""
    from runtime.cpu import choice, native

    monkeypatch.setenv(choice.ENV, "quant_pool=native")

    tables = [
        EmbeddingBagConfig("w8", 40, 8, ["a"]),
        EmbeddingBagConfig("w64", 300, 64, ["b", "c"], pooling="mean"),
        EmbeddingBagConfig("w128", 50, 128, ["d"]),
        EmbeddingBagConfig("w24", 30, 24, ["e"]),
        EmbeddingBagConfig("w12", 20, 12, ["g"]),
        EmbeddingBagConfig("w200", 25, 200, ["h"]),
    ]
    torch.manual_seed(1)
    source = EmbeddingBagCollection(tables, is_weighted=weighted)
    collection = QuantEmbeddingBagCollection(tables, precision, is_weighted=weighted)
    collection.quantize_from(source.embedding_parameters())
    for seed in range(3):
        kjt = make_kjt(tables, seed=seed)
        with torch.inference_mode():
            mine = collection(kjt).values()
            monkeypatch.setattr(native, "applies", lambda *args, **kwargs: False)
            theirs = collection(kjt).values()
            monkeypatch.undo()
        assert torch.equal(mine, theirs)


@pytest.mark.parametrize("threads", [1, 2, 3, 5])
def test_native_pooling_shares_bags_between_threads_across_features(threads: int, monkeypatch, native_kernels) -> None:
    """Each thread pools one contiguous share of the 7 x 16 bags, which starts and ends inside
    features for 3 and 5 threads: every bag is pooled once, with its own feature's table."""
    from runtime.cpu import choice, native

    monkeypatch.setenv(choice.ENV, "quant_pool=native")
    monkeypatch.setattr(native, "IDS_PER_THREAD", 1)  # a team of `threads` even for this small batch
    tables = [
        EmbeddingBagConfig("w8", 40, 8, ["a"]),
        EmbeddingBagConfig("w64", 300, 64, ["b", "c"]),
        EmbeddingBagConfig("w128", 50, 128, ["d"]),
        EmbeddingBagConfig("w24", 30, 24, ["e"]),
        EmbeddingBagConfig("w12", 20, 12, ["g"]),
        EmbeddingBagConfig("w200", 25, 200, ["h"]),
    ]
    torch.manual_seed(2)
    source = EmbeddingBagCollection(tables)
    collection = QuantEmbeddingBagCollection(tables, {"w8": "int8", "w64": "int4", "w128": "fp16"})
    collection.quantize_from(source.embedding_parameters())
    kjt = make_kjt(tables, seed=7)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            mine = collection(kjt).values()
            monkeypatch.setattr(native, "applies", lambda *args, **kwargs: False)
            theirs = collection(kjt).values()
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(mine, theirs)


@pytest.mark.parametrize("threads", [2, 3])
def test_a_small_batch_pools_on_a_team_where_measured_faster_with_the_same_bits(
    threads: int, monkeypatch, native_kernels, tmp_path
) -> None:
    """'pool_team' either way gives fbgemm's bits, and the team is the size asked; unforced, it is
    measured once at these shapes, recorded, and not asked where the rule already takes a team."""
    from runtime.cpu import choice, native

    monkeypatch.setenv("RECCOMPILE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(choice, "_core_held_since", lambda before: False)  # recorded, whatever the load
    tables = [
        EmbeddingBagConfig("w8", 40, 8, ["a"]),
        EmbeddingBagConfig("w64", 300, 64, ["b", "c"], pooling="mean"),
        EmbeddingBagConfig("w200", 25, 200, ["h"]),
    ]
    torch.manual_seed(3)
    source = EmbeddingBagCollection(tables)
    collection = QuantEmbeddingBagCollection(tables, {"w8": "int8", "w64": "int4", "w200": "fp16"})
    collection.quantize_from(source.embedding_parameters())
    kjt = make_kjt(tables, seed=5)
    teams: list[int | None] = []
    pool = native.quant_pool
    monkeypatch.setattr(native, "quant_pool", lambda *args: teams.append(args[-1]) or pool(*args))
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            outputs = {}
            for team in ("one", "team"):
                monkeypatch.setenv(choice.ENV, f"quant_pool=native,pool_team={team}")
                outputs[team] = collection(kjt).values()
            monkeypatch.setenv(choice.ENV, "quant_pool=fbgemm")
            theirs = collection(kjt).values()
            monkeypatch.setenv(choice.ENV, "quant_pool=native")
            collection(kjt)
            collection(kjt)
            recorded = [(c.kernel, c.winner) for c in choice.recorded()]
            monkeypatch.setattr(native, "IDS_PER_THREAD", 1)  # the rule's own team: nothing to ask
            collection(make_kjt(tables, seed=6))
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(outputs["one"], theirs) and torch.equal(outputs["team"], theirs)
    assert teams[:2] == [1, threads]
    assert len(recorded) == 1 and recorded[0][0] == "pool_team" and recorded[0][1] in ("one", "team")
    assert teams[-1] == threads and [c.kernel for c in choice.recorded()] == ["pool_team"]


def test_a_small_batch_pools_on_one_thread() -> None:
    """A team only from IDS_PER_THREAD ids per thread on: a batch-1 predict of dlrm-bench (26 ids)
    pools on the calling thread, a large batch on torch's threads."""
    from runtime.cpu import native

    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert [native.pool_threads(n) for n in (0, 26, 1_664, 2_047, 2_048, 13_312)] == [1, 1, 1, 1, 2, 2]
    finally:
        torch.set_num_threads(previous)


def test_stored_sizes_follow_fbgemms_row_layout() -> None:
    assert [row_bytes(64, p) for p in PRECISIONS] == [256, 128, 68, 36]
    qebc = QuantEmbeddingBagCollection(make_tables(), {"t0": "int8", "t1": "int4", "t2": "fp16"})
    assert qebc.table_bytes() == {"t0": 50 * (8 + 4), "t1": 30 * (8 + 4), "t2": 40 * 64}
    assert {name: tuple(rows.shape) for name, rows in qebc.table_rows().items()} == {
        "t0": (50, 12),
        "t1": (30, 12),
        "t2": (40, 64),
    }
    layout = qebc.layout()
    assert [t["byte_offset"] for t in layout["tables"]] == [0, 640, 1024]  # 128-byte aligned tables
    assert layout["tables"][0]["features"] == [{"name": "f0", "columns": [0, 8]}, {"name": "f1", "columns": [8, 16]}]


def test_state_dict_round_trip() -> None:
    ebc = trained_collection(True)
    qebc = quantized(ebc, {"t0": "int4", "t2": "int8"}, True)
    state = qebc.state_dict()
    assert sorted(state) == ["t0.packed", "t1.packed", "t2.packed"]
    fresh = QuantEmbeddingBagCollection(make_tables(), {"t0": "int4", "t2": "int8"}, is_weighted=True)
    fresh.load_state_dict(state)
    kjt = make_kjt(make_tables(), seed=4)
    assert torch.equal(fresh(kjt).values(), qebc(kjt).values())
    wrong = QuantEmbeddingBagCollection(make_tables(), "int8", is_weighted=True)
    with pytest.raises(
        RuntimeError,
        match=re.escape(
            "size mismatch for t1.packed: copying stored rows of torch.uint8 (30, 64) from the checkpoint, "
            "the shape in the current model is torch.uint8 (30, 20)."
        ),
    ):
        wrong.load_state_dict(state)


def test_an_id_out_of_range_names_feature_and_table() -> None:
    qebc = QuantEmbeddingBagCollection(make_tables(), "int8")
    kjt = make_kjt(make_tables(), seed=5)
    values = kjt.values().clone()
    start = kjt.offset_per_key()[2]
    values[start] = 30
    sample = int(kjt["f2"].lengths().nonzero()[0, 0])  # the first sample with an f2 id
    bad = KeyedJaggedTensor.from_lengths_sync(kjt.keys(), values, kjt.lengths())
    message = f"feature 'f2' at sample {sample}: id 30 out of range for table 't1' with 30 rows"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        qebc(bad)
    values[start] = -1
    bad = KeyedJaggedTensor.from_lengths_sync(kjt.keys(), values, kjt.lengths())
    message = f"feature 'f2' at sample {sample}: id -1 out of range for table 't1' with 30 rows"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        qebc(bad)


@pytest.mark.parametrize("kernel", ["native", "fbgemm"])
def test_offsets_that_do_not_fit_the_ids_are_refused(kernel: str, monkeypatch, request) -> None:
    from runtime.cpu import choice, native

    if kernel == "native":
        request.getfixturevalue("native_kernels")
        monkeypatch.setenv(choice.ENV, "quant_pool=native")
    else:
        monkeypatch.setattr(native, "applies", lambda *args, **kwargs: False)
    tables = [t for t in make_tables() if t.pooling == "sum"]
    qebc = QuantEmbeddingBagCollection(tables, "int8")
    kjt = make_kjt(tables, seed=5)
    offsets = kjt.offsets().clone()
    offsets[-1] += 7  # the last bag claims ids past the end
    ids = kjt.values().numel()
    message = f"KeyedJaggedTensor: sum(lengths)={ids + 7} but values has {ids} entries"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        qebc.lookup(kjt.values(), offsets, None)


def _ids_before_a_guard_page(ids: torch.Tensor) -> tuple[torch.Tensor, mmap.mmap]:
    """A copy of `ids` whose last element ends where an unreadable page begins: the C kernel
    reading one id past them ends the process (SIGSEGV)."""
    page = mmap.PAGESIZE
    size = -(-ids.numel() * 8 // page) * page
    region = mmap.mmap(-1, size + page)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    address = ctypes.addressof(ctypes.c_char.from_buffer(region))
    assert libc.mprotect(address + size, page, 0) == 0, ctypes.get_errno()  # PROT_NONE
    guarded = torch.frombuffer(region, dtype=torch.int64, offset=size - ids.numel() * 8, count=ids.numel())
    guarded.copy_(ids)
    return guarded, region


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_native_pooling_prefetches_no_id_past_the_last(threads: int, monkeypatch, native_kernels) -> None:
    """quant_pool.c prefetches the rows of ids ahead of the bag it sums, across features: the ids end
    at an unreadable page, the batch's last features are empty (the cursor runs out of features with
    ids to spare in its reach), and the bags are shared out to threads: the pooled rows are fbgemm's.
    Offsets that claim ids past the end are refused without reading them."""
    from runtime.cpu import native

    monkeypatch.setattr(native, "IDS_PER_THREAD", 1)  # a team of `threads` even for this small batch
    tables = [
        EmbeddingBagConfig("w8", 40, 8, ["a"]),
        EmbeddingBagConfig("w64", 300, 64, ["b", "c"]),
        EmbeddingBagConfig("w24", 30, 24, ["e", "g"]),
    ]
    torch.manual_seed(4)
    source = EmbeddingBagCollection(tables)
    collection = QuantEmbeddingBagCollection(tables, {"w8": "int8", "w64": "int4", "w24": "fp16"})
    collection.quantize_from(source.embedding_parameters())
    kjt = make_kjt(tables, seed=9)
    lengths = kjt.lengths().clone()
    lengths[3 * BATCH :] = 0  # features e and g: no ids
    ids = kjt.values()[: int(lengths.sum())]
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    guarded, region = _ids_before_a_guard_page(ids)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        mine = native.quant_pool(
            collection.weights, collection._native_layout, guarded, offsets, None, collection.rows_per_feature
        )
        past = offsets.clone()
        past[-1] += 5  # the last bag claims ids past the end
        refused = native.quant_pool(
            collection.weights, collection._native_layout, guarded, past, None, collection.rows_per_feature
        )
    finally:
        torch.set_num_threads(previous)
    theirs = collection._fbgemm_pool(ids, offsets, None, None, check=True)
    del guarded
    region.close()
    assert mine is not None and torch.equal(mine, theirs)
    assert refused is None


@pytest.mark.parametrize("kernel", ["native", "measured", "fbgemm"])
@pytest.mark.parametrize("precision", PRECISIONS)
def test_an_empty_batch_pools_to_no_rows(precision: str, kernel: str, monkeypatch, request) -> None:
    """The C kernel divided by the batch: an empty one killed the process (SIGFPE), even unforced,
    because the measurement runs it."""
    from runtime.cpu import choice, native

    if kernel == "fbgemm":
        monkeypatch.setattr(native, "applies", lambda *args, **kwargs: False)
    else:
        request.getfixturevalue("native_kernels")
        if kernel == "native":
            monkeypatch.setenv(choice.ENV, "quant_pool=native")
    tables = make_tables()
    qebc = quantized(trained_collection(weighted=False), precision, weighted=False)
    keys = [f for t in tables for f in t.feature_names]
    empty = KeyedJaggedTensor.from_lengths_sync(
        keys, torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64)
    )
    with torch.inference_mode():
        pooled = qebc(empty)
    assert pooled.values().shape == (0, sum(t.embedding_dim * len(t.feature_names) for t in tables))


def test_unstorable_tables_are_refused_with_the_table_named() -> None:
    big = EmbeddingBagConfig("big", 4, 8, ["f"])
    qebc = QuantEmbeddingBagCollection([big], "fp16")
    large = torch.full((4, 8), 1.0)
    large[1, 2] = -7e4  # int8 and int4 rows keep their minimum (the bias) and scale in float16
    for precision, held in (
        ("fp16", "its values"),
        ("int8", "each row's scale and bias"),
        ("int4", "each row's scale and bias"),
    ):
        with pytest.raises(
            UnstorableTable,
            match="^"
            + re.escape(
                f"table 'big': a value of magnitude 70000 is beyond float16's range (±65504), in which {precision} "
                f"stores {held}; export the table at fp32"
            )
            + "$",
        ):
            QuantEmbeddingBagCollection([big], precision).quantize_from({"big": large})
    QuantEmbeddingBagCollection([big], "fp32").quantize_from({"big": large})
    edge = torch.full((4, 8), 65504.0)  # the largest float16 is still stored
    edge[:, 0] = -65504.0
    for precision in ("fp16", "int8", "int4"):
        stored = QuantEmbeddingBagCollection([big], precision)
        stored.quantize_from({"big": edge})
        assert bool(torch.isfinite(stored.dequantized_weights()["big"]).all()), precision
    nan = torch.zeros(4, 8)
    nan[2, 3] = float("nan")
    with pytest.raises(
        ValueError, match=re.escape("table 'big': row 2 holds a non-finite value; it cannot be exported")
    ):
        QuantEmbeddingBagCollection([big], "int8").quantize_from({"big": nan})


ODD = [
    EmbeddingBagConfig("d50", 60, 50, ["a", "b"]),
    EmbeddingBagConfig("d8", 40, 8, ["c"], pooling="mean"),
    EmbeddingBagConfig("d6", 30, 6, ["d"], weight_init_min=-2.0, weight_init_max=3.0),
]


def _stored_as(table: EmbeddingBagConfig) -> EmbeddingBagConfig:
    """`table` at its stored width, as a table of its own."""
    return EmbeddingBagConfig(
        table.name, table.num_embeddings, stored_dim(table.embedding_dim), table.feature_names, table.pooling
    )


@pytest.mark.parametrize("kernel", ["native", "fbgemm"])
@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_dim_that_is_not_a_multiple_of_4_is_stored_padded_and_read_at_its_own_width(
    precision: str, kernel: str, monkeypatch, request
) -> None:
    """Against the same rows padded by hand (copies of each row's last value) in tables of the stored
    width: the same stored bytes, and the same pooled sums in the table's own columns, bit for bit."""
    from runtime.cpu import choice, native

    if kernel == "native":
        request.getfixturevalue("native_kernels")
        monkeypatch.setenv(choice.ENV, "quant_pool=native")
    else:
        monkeypatch.setattr(native, "applies", lambda *args, **kwargs: False)
    torch.manual_seed(2)
    weights = EmbeddingBagCollection(ODD, compute_kernel="dense").embedding_parameters()
    padded = {
        name: torch.cat([w, w[:, -1:].expand(-1, stored_dim(w.shape[1]) - w.shape[1])], dim=1)
        for name, w in weights.items()
    }
    odd = QuantEmbeddingBagCollection(ODD, precision, is_weighted=True).quantize_from(weights)
    wide = QuantEmbeddingBagCollection([_stored_as(t) for t in ODD], precision, is_weighted=True)
    wide.quantize_from(padded)
    assert {n: tuple(r.shape) for n, r in odd.table_rows().items()} == {
        "d50": (60, row_bytes(52, precision)),
        "d8": (40, row_bytes(8, precision)),
        "d6": (30, row_bytes(8, precision)),
    }
    for name, rows in odd.table_rows().items():
        assert torch.equal(rows, wide.table_rows()[name])
    for name, values in odd.dequantized_weights().items():
        assert torch.equal(values, wide.dequantized_weights()[name][:, : weights[name].shape[1]])
    if precision == "fp32":
        assert all(torch.equal(odd.dequantized_weights()[n], w) for n, w in weights.items())
    own = torch.cat([torch.arange(0, 50), torch.arange(52, 102), torch.arange(104, 112), torch.arange(112, 118)])
    for seed in range(3):
        kjt = make_kjt(ODD, seed=seed)
        out = odd(kjt)
        assert out.keys() == ["a", "b", "c", "d"] and out.length_per_key() == [50, 50, 8, 6]
        assert torch.equal(out.values(), wide(kjt).values()[:, own])
    assert odd.layout()["output_width"] == 114
    assert [t.get("stored_dim") for t in odd.layout()["tables"]] == [52, None, 8]
