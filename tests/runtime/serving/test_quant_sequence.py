"""Tests for runtime/serving/quant_sequence.py against the fp32 training EmbeddingCollection.

As for the bag collection (tests/runtime/serving/test_quant_embedding.py):
fp32 gives the training rows bit for bit; at fp16, int8 and int4 every
returned value is within the stated bound of the training value (fp16
|err| <= |x| * 2**-11, int8/int4 |err| <= step / 2, up to float rounding
1 + 1e-3), and the kernel returns exactly the dequantized rows.
"""

from __future__ import annotations

import re

import pytest
import torch

from runtime.config.embeddings import EmbeddingConfig
from runtime.embeddings.sequence_collection import EmbeddingCollection
from runtime.serving.quant_embedding import PRECISIONS
from runtime.serving.quant_sequence import QuantEmbeddingCollection
from runtime.sparse.jagged import KeyedJaggedTensor

BATCH = 16
KEYS = ("target", "history", "genres")


def make_tables() -> list[EmbeddingConfig]:
    """An item table read by a target and a history, a narrower genre table, a wider one."""
    return [
        EmbeddingConfig("item", 50, 8, ["target", "history"]),
        EmbeddingConfig("genre", 12, 4, ["genres"], weight_init_min=-2.0, weight_init_max=3.0),
        EmbeddingConfig("wide", 20, 32, ["tags"], weight_init_min=-0.5, weight_init_max=0.5),
    ]


def make_kjt(seed: int, keys: tuple[str, ...] = (*KEYS, "tags")) -> KeyedJaggedTensor:
    """Histories of 0-7 ids (sample 1 empty), one target each, 0-3 genres and tags; `other` is not looked up."""
    gen = torch.Generator().manual_seed(seed)
    history = torch.randint(0, 8, (BATCH,), generator=gen)
    history[1] = 0
    lengths = {
        "target": torch.ones(BATCH, dtype=torch.long),
        "history": history,
        "genres": torch.randint(0, 4, (BATCH,), generator=gen),
        "tags": torch.randint(0, 4, (BATCH,), generator=gen),
        "other": torch.ones(BATCH, dtype=torch.long),
    }
    rows = {"target": 50, "history": 50, "genres": 12, "tags": 20, "other": 1000}
    values = {k: torch.randint(0, rows[k], (int(lengths[k].sum()),), generator=gen) for k in keys}
    return KeyedJaggedTensor.from_lengths_sync(
        list(keys), torch.cat([values[k] for k in keys]), torch.cat([lengths[k] for k in keys])
    )


def trained_collection() -> EmbeddingCollection:
    torch.manual_seed(0)
    return EmbeddingCollection(make_tables())


def quantized(ec: EmbeddingCollection, precision: str | dict[str, str], **kwargs) -> QuantEmbeddingCollection:
    return QuantEmbeddingCollection(make_tables(), precision, **kwargs).quantize_from(ec.embedding_parameters())


def table_of(feature: str) -> str:
    return next(t.name for t in make_tables() if feature in t.feature_names)


def value_bound(precision: str, weight: torch.Tensor, step: torch.Tensor | None) -> torch.Tensor:
    slack = 1 + 1e-3
    if precision == "fp32":
        return torch.zeros_like(weight)
    if precision == "fp16":
        return weight.abs() * 2.0**-11 * slack + 2.0**-24
    return (step / 2 * slack).expand_as(weight)


def test_fp32_equals_training_collection_exactly() -> None:
    ec = trained_collection()
    qec = quantized(ec, "fp32")
    assert qec.feature_names() == ["target", "history", "genres", "tags"]
    for keys in ((*KEYS, "tags"), ("other", "tags", "genres", "history", "target")):
        kjt = make_kjt(seed=1, keys=keys)
        with torch.no_grad():
            expected = ec(kjt)
        actual = qec(kjt)
        assert list(actual) == list(expected) == qec.feature_names()
        for name in expected:
            assert torch.equal(actual[name].values(), expected[name].values()), name
            assert torch.equal(actual[name].lengths(), kjt[name].lengths()), name


@pytest.mark.parametrize("precision", ["fp16", "int8", "int4"])
def test_rows_within_the_stated_bound_and_equal_to_the_dequantized_rows(precision: str) -> None:
    ec = trained_collection()
    qec = quantized(ec, precision)
    kjt = make_kjt(seed=2)
    with torch.no_grad():
        reference = ec(kjt)
    actual = qec(kjt)
    steps = qec.quantization_steps()
    dequantized = qec.dequantized_weights()
    for feature, jt in actual.items():
        table = table_of(feature)
        ids = kjt[feature].values()
        weight = ec.embedding_parameters()[table].detach()
        step = None if steps[table] is None else steps[table][ids]
        error = (jt.values() - reference[feature].values()).abs()
        assert bool((error <= value_bound(precision, weight[ids], step)).all()), feature
        torch.testing.assert_close(jt.values(), dequantized[table][ids], rtol=0, atol=1e-7)


def test_mixed_precisions_match_fbgemms_own_module() -> None:
    """The layout read by fbgemm's IntNBit module, one id per bag, gives the same rows."""
    ec = trained_collection()
    precisions = {"item": "int4", "genre": "fp16", "wide": "int8"}
    qec = quantized(ec, precisions)
    assert qec.precisions() == precisions
    tbe = qec.to_fbgemm()
    kjt = make_kjt(seed=3)
    actual = qec(kjt)
    ids = {t.name: torch.cat([kjt[f].values() for f in t.feature_names]) for t in make_tables()}
    bags = max(v.numel() for v in ids.values())
    columns = 0
    for table in make_tables():
        table_ids = ids[table.name]
        # fbgemm's module gets every table's slot; only this table's has ids.
        lengths = torch.cat(
            [
                (torch.arange(bags) < table_ids.numel()).long()
                if t.name == table.name
                else torch.zeros(bags, dtype=torch.long)
                for t in make_tables()
            ]
        )
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
        pooled = tbe(table_ids, offsets)[: table_ids.numel(), columns : columns + table.embedding_dim]
        expected = torch.split(pooled, [kjt[f].values().numel() for f in table.feature_names])
        for feature, rows in zip(table.feature_names, expected):
            assert torch.equal(actual[feature].values(), rows), feature
        columns += table.embedding_dim


@pytest.mark.parametrize("precision", PRECISIONS)
def test_native_and_fbgemm_kernels_give_the_same_rows(precision: str, monkeypatch, native_kernels) -> None:
    from runtime.cpu import choice, native

    monkeypatch.setenv(choice.ENV, "quant_pool=native")
    qec = quantized(trained_collection(), precision)
    kjt = make_kjt(seed=4)
    with torch.inference_mode():
        mine = qec(kjt)
        monkeypatch.setattr(native, "applies", lambda *args, **kwargs: False)
        theirs = qec(kjt)
    for name in mine:
        assert torch.equal(mine[name].values(), theirs[name].values()), name


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_bfloat16_rows_are_the_fp32_rows_rounded(precision: str) -> None:
    """fp32 tables: the fp32 rows rounded to bfloat16 once; int8: fbgemm's bfloat16 path dequantizes
    on its own, so within one bfloat16 step (relative 2**-8) of the fp32 rows."""
    ec = trained_collection()
    qec = quantized(ec, precision, output_dtype=torch.bfloat16)
    fp32 = quantized(ec, precision)
    kjt = make_kjt(seed=5)
    for name, jt in qec(kjt).items():
        rows, reference = jt.values(), fp32(kjt)[name].values()
        assert rows.dtype == torch.bfloat16
        if precision == "fp32":
            assert torch.equal(rows, reference.to(torch.bfloat16)), name
        else:
            assert bool(((rows.float() - reference).abs() <= reference.abs() * 2.0**-8).all()), name


def test_all_sequences_empty_gives_empty_rows() -> None:
    qec = QuantEmbeddingCollection([EmbeddingConfig("item", 30, 8, ["history"])], "int8")
    kjt = KeyedJaggedTensor.from_lengths_sync(
        ["history"], torch.zeros(0, dtype=torch.long), torch.zeros(BATCH, dtype=torch.long)
    )
    jt = qec(kjt)["history"]
    assert jt.values().shape == (0, 8)
    assert jt.lengths().tolist() == [0] * BATCH


def test_state_dict_round_trip_and_layout() -> None:
    qec = quantized(trained_collection(), {"item": "int4", "wide": "int8"})
    state = qec.state_dict()
    assert sorted(state) == ["genre.packed", "item.packed", "wide.packed"]
    fresh = QuantEmbeddingCollection(make_tables(), {"item": "int4", "wide": "int8"})
    fresh.load_state_dict(state)
    kjt = make_kjt(seed=6)
    for name, jt in fresh(kjt).items():
        assert torch.equal(jt.values(), qec(kjt)[name].values()), name
    layout = qec.layout()
    assert [(t["name"], t["pooling"], t["precision"], t["features"]) for t in layout["tables"]] == [
        ("item", "none", "int4", [{"name": "target"}, {"name": "history"}]),
        ("genre", "none", "fp32", [{"name": "genres"}]),
        ("wide", "none", "int8", [{"name": "tags"}]),
    ]
    assert qec.table_bytes() == {"item": 50 * (4 + 4), "genre": 12 * 16, "wide": 20 * (32 + 4)}
    assert repr(qec) == "QuantEmbeddingCollection(tables=[item(50x8, int4), genre(12x4, fp32), wide(20x32, int8)])"


@pytest.mark.parametrize("bad_id", [50, -1])
def test_an_id_out_of_range_names_feature_and_table(bad_id: int) -> None:
    qec = quantized(trained_collection(), "int8")
    kjt = KeyedJaggedTensor.from_lengths_sync(
        ["history", "genres", "target", "tags"],
        torch.tensor([1, bad_id, 0, 0, 5, 6, 7]),
        torch.tensor([2, 0, 1, 1, 1, 1, 1, 0]),
    )
    message = f"feature 'history' at sample 0: id {bad_id} out of range for table 'item' with 50 rows"
    with pytest.raises(IndexError, match=f"^{re.escape(message)}$"):
        qec(kjt)


def test_lengths_that_do_not_fit_the_ids_are_refused() -> None:
    qec = quantized(trained_collection(), "int8")
    kjt = KeyedJaggedTensor(
        ["history", "genres", "target", "tags"],
        torch.tensor([1, 2, 0, 5, 6, 7]),
        lengths=torch.tensor([2, 3, 1, 1, 1, 1, 1, 0]),
    )
    message = "KeyedJaggedTensor: sum(lengths)=10 but values has 6 entries"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        qec(kjt)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: QuantEmbeddingCollection([]), "QuantEmbeddingCollection needs at least one table"),
        (
            lambda: QuantEmbeddingCollection([EmbeddingConfig("a", 5, 4, ["f"]), EmbeddingConfig("b", 5, 4, ["f"])]),
            "feature 'f' is looked up by tables 'a' and 'b'",
        ),
        (
            lambda: QuantEmbeddingCollection(make_tables(), {"items": "int8"}),
            "precision given for unknown table 'items'",
        ),
    ],
)
def test_construction_errors(build, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        build()


def test_tables_whose_dim_is_not_a_multiple_of_4_give_the_training_rows_exactly() -> None:
    """Stored padded to 12 and 8 columns (runtime/serving/quant_embedding.py); read at 10 and 6."""
    tables = [
        EmbeddingConfig("item", 50, 10, ["target", "history"]),
        EmbeddingConfig("genre", 12, 4, ["genres"]),
        EmbeddingConfig("wide", 20, 6, ["tags"], weight_init_min=-0.5, weight_init_max=0.5),
    ]
    torch.manual_seed(3)
    trained = EmbeddingCollection(tables, compute_kernel="dense")
    served = QuantEmbeddingCollection(tables, "fp32").quantize_from(trained.embedding_parameters())
    for seed in range(3):
        kjt = make_kjt(seed)
        with torch.no_grad():
            expected = trained(kjt)
        actual = served(kjt)
        assert list(actual) == list(expected) == ["target", "history", "genres", "tags"]
        for name, rows in actual.items():
            assert rows.values().shape[1] == {"target": 10, "history": 10, "genres": 4, "tags": 6}[name]
            assert torch.equal(rows.values(), expected[name].values())
            assert torch.equal(rows.lengths(), expected[name].lengths())
