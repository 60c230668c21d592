"""Every compiler IR type that reaches the runtime is pinned to its twin in runtime.config, field by field.

The lowering (compiler/lowering/calls.py) writes each IR value into the
generated module as a call of its runtime twin; a field added on one side
only would be dropped silently there. Each pair below says which fields
correspond (renamed where the two sides name them differently), which exist
on one side only and why; a field on neither list fails with its name. The
types of corresponding fields agree (an IR `Literal` holds exactly the
values the runtime accepts, a `Location` is the runtime's `where` string, an
IR type is its runtime twin; the runtime may also take None where the IR,
fully resolved, always holds a value), and so do their defaults where both
have one.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Union

import pytest

from compiler import ir
from runtime.config import data, embeddings, heads, lr_schedule, retrieval, training
from runtime.data.reader_names import READERS
from runtime.sparse.sequence import KEEP_SIDES

RENAMED_LOC = {"loc": "where"}


@dataclass(frozen=True)
class Twin:
    """`compiler` (an IR type) and `runtime` (its runtime.config twin).

    `renamed`: IR field -> runtime field; `ir_only` and `runtime_only`: the
    fields with no counterpart, each with the reason; `values`: runtime
    field -> the runtime's tuple of accepted values, which an IR Literal must equal.
    """

    compiler: type
    runtime: type
    renamed: dict[str, str] = field(default_factory=dict)
    ir_only: dict[str, str] = field(default_factory=dict)
    runtime_only: dict[str, str] = field(default_factory=dict)
    values: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.compiler.__name__}-{self.runtime.__name__}"


TABLE_NAMES = {
    "dim": "embedding_dim",
    "features": "feature_names",
    "init_min": "weight_init_min",
    "init_max": "weight_init_max",
    **RENAMED_LOC,
}

OPTIMIZER_TYPES = (*embeddings.OPTIMIZER_TYPES, *training.DENSE_OPTIMIZER_TYPES)

TWINS = (
    # One IR optimizer type for tables and dense parameters: its types are both runtimes' together.
    Twin(ir.Optimizer, embeddings.EmbeddingOptimizer, values={"type": OPTIMIZER_TYPES}),
    Twin(
        ir.Optimizer,
        training.DenseOptimizerConfig,
        runtime_only={"where": "the training section's location (the IR's Training.loc)"},
        ir_only={"embedding_l2": "a penalty on table rows: on the dense optimizer it is an error (semantic.py)"},
        values={"type": OPTIMIZER_TYPES},
    ),
    Twin(
        ir.DenseFeature,
        data.DenseFeatureConfig,
        RENAMED_LOC,
        ir_only={"embed_dim": "the model's NumericEmbedding block", "embed_bias": "the model's NumericEmbedding block"},
    ),
    Twin(
        ir.SparseFeature,
        data.SparseFeatureConfig,
        RENAMED_LOC,
        ir_only={
            "hashed": "resolved into the transform / the readers' id hashing at compile time",
            "position_weighted": "the model's PositionWeights module",
        },
        runtime_only={"num_embeddings": "its table's rows (the IR's Table.num_embeddings)"},
        values={"keep": KEEP_SIDES},
    ),
    Twin(ir.TimestampsFeature, data.TimestampsConfig, RENAMED_LOC),
    Twin(
        ir.Table,
        embeddings.EmbeddingBagConfig,
        TABLE_NAMES,
        values={"pooling": embeddings.POOLING_TYPES},
    ),
    Twin(
        ir.Table,
        embeddings.EmbeddingConfig,
        TABLE_NAMES,
        ir_only={"pooling": "a sequence table is read as rows, never pooled"},
    ),
    Twin(
        ir.Head,
        heads.HeadConfig,
        RENAMED_LOC,
        ir_only={"input": "the graph's wiring", "retrieval": "the model's retrieval loss (SampledSoftmaxConfig)"},
        runtime_only={"mask_seen": "Retrieval.mask_seen, the one retrieval setting the metrics read"},
        values={"loss": heads.LOSSES, "output": heads.OUTPUTS},
    ),
    Twin(
        ir.Retrieval,
        retrieval.Negatives,
        ir_only={
            "item": "the graph's wiring",
            "item_feature": "the graph's wiring",
            "item_table": "the graph's wiring",
            "logq": "SampledSoftmaxConfig",
            "temperature": "SampledSoftmaxConfig",
            "normalize": "SampledSoftmaxConfig",
            "ks": "the heads' metrics",
            "next_item": "the graph's wiring",
            "mask_seen": "HeadConfig",
            "attributes": "the model's ItemAttributes catalogue",
            "on_conflict": "the model's ItemAttributes catalogue",
        },
    ),
    Twin(
        ir.Retrieval,
        retrieval.SampledSoftmaxConfig,
        ir_only={
            "item": "the graph's wiring",
            "item_feature": "the graph's wiring",
            "item_table": "the graph's wiring",
            "in_batch": "Negatives",
            "uniform": "Negatives",
            "per_query": "Negatives",
            "ks": "the heads' metrics",
            "next_item": "the graph's wiring",
            "mask_seen": "HeadConfig",
            "attributes": "the model's ItemAttributes catalogue",
            "on_conflict": "the model's ItemAttributes catalogue",
        },
        runtime_only={
            "negatives": "Negatives, from the IR's in_batch, uniform and per_query",
            "num_items": "the item table's rows",
            "first_id": "no spec option: ids start at 0",
            "frequency": "no spec option: the streaming estimate",
            "frequency_slots": "the item table's rows",
            "frequency_alpha": "no spec option",
            "seed": "the training section's seed",
        },
        values={"frequency": retrieval.FREQUENCIES},
    ),
    Twin(
        ir.AuxLoss,
        retrieval.NextBehaviourConfig,
        runtime_only={
            "num_items": "the rows of the table of the sparse feature the gru reads",
            "max_length": "the max_length of the sparse feature the gru reads",
            "seed": "the training section's seed",
        },
    ),
    Twin(
        ir.LrSchedule,
        lr_schedule.LrSchedule,
        RENAMED_LOC,
        values={"type": lr_schedule.LR_SCHEDULE_TYPES},
    ),
    Twin(ir.LrPlateau, training.PlateauConfig, RENAMED_LOC),
    Twin(
        ir.Training,
        training.TrainingConfig,
        RENAMED_LOC,
        ir_only={
            "dense_optimizer": "the module's DENSE_OPTIMIZER",
            "sparse_optimizer": "the tables' optimizers",
            "lr_schedule": "the module's LR_SCHEDULE",
            "early_stopping": "best_metric, patience, early_stopping_where",
            "precision_loc": "precision_where",
        },
        runtime_only={
            "best_metric": "EarlyStopping.metric",
            "patience": "EarlyStopping.patience",
            "early_stopping_where": "EarlyStopping.loc",
            "precision_where": "precision_loc",
        },
    ),
    Twin(ir.Data, data.DataConfig, RENAMED_LOC, values={"reader": READERS}),
)

# IR types whose runtime twin is another type (a field typed with one is typed with the other).
TWIN_OF = {
    ir.Location: str,
    ir.Optimizer: embeddings.EmbeddingOptimizer,
    ir.LrPlateau: training.PlateauConfig,
}


def _fields(cls: type) -> dict[str, dataclasses.Field[Any]]:
    return {f.name: f for f in dataclasses.fields(cls)}


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _runtime_view(hint: Any) -> Any:
    """An IR field's type as the runtime spells it: Literals are str, IR types their twins."""
    origin = typing.get_origin(hint)
    if origin is Literal:
        return str
    if origin in (Union, types.UnionType):
        return Union[tuple(_runtime_view(arg) for arg in typing.get_args(hint))]  # noqa: UP007
    if origin is not None:
        return origin[tuple(_runtime_view(arg) for arg in typing.get_args(hint))]
    return TWIN_OF.get(hint, hint)


def _plain(hint: Any) -> Any:
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        return Union[tuple(_plain(arg) for arg in typing.get_args(hint))]  # noqa: UP007
    if origin is not None:
        return origin[tuple(_plain(arg) for arg in typing.get_args(hint))]
    return hint


def _literal_values(hint: Any) -> tuple[str, ...] | None:
    for arg in (hint, *typing.get_args(hint)):
        if typing.get_origin(arg) is Literal:
            return typing.get_args(arg)
    return None


@pytest.mark.parametrize("twin", TWINS, ids=lambda twin: twin.id)
def test_every_field_has_its_twin_or_a_reason(twin: Twin) -> None:
    compiler_fields, runtime_fields = _fields(twin.compiler), _fields(twin.runtime)
    mapped = {name: twin.renamed.get(name, name) for name in compiler_fields if name not in twin.ir_only}
    unmatched_ir = [f"compiler.ir.{twin.compiler.__name__}.{n}" for n, r in mapped.items() if r not in runtime_fields]
    assert not unmatched_ir, f"no twin in {twin.runtime.__module__}.{twin.runtime.__name__}: {unmatched_ir}"
    unmatched_runtime = [
        f"{twin.runtime.__module__}.{twin.runtime.__name__}.{name}"
        for name in runtime_fields
        if name not in mapped.values() and name not in twin.runtime_only
    ]
    assert not unmatched_runtime, f"no twin in compiler.ir.{twin.compiler.__name__}: {unmatched_runtime}"
    stale = [n for n in twin.ir_only if n not in compiler_fields] + [
        n for n in twin.runtime_only if n not in runtime_fields
    ]
    assert not stale, f"{twin.id}: listed as one-sided but no such field: {stale}"


@pytest.mark.parametrize("twin", TWINS, ids=lambda twin: twin.id)
def test_twin_fields_have_the_same_types_and_defaults(twin: Twin) -> None:
    compiler_hints, runtime_hints = _hints(twin.compiler), _hints(twin.runtime)
    runtime_fields = _fields(twin.runtime)
    for name, compiler_field in _fields(twin.compiler).items():
        if name in twin.ir_only:
            continue
        other = twin.renamed.get(name, name)
        where = f"compiler.ir.{twin.compiler.__name__}.{name} / {twin.runtime.__name__}.{other}"
        wanted, got = _runtime_view(compiler_hints[name]), _plain(runtime_hints[other])
        if compiler_hints[name] in (ir.Location, ir.Location | None):
            assert got is str, where  # a location travels as its text, "" when unknown
            continue
        assert got in (wanted, Union[wanted, None]), f"{where}: {compiler_hints[name]} against {runtime_hints[other]}"  # noqa: UP007
        literal = _literal_values(compiler_hints[name])
        if literal is not None:
            assert other in twin.values, f"{where}: name the runtime's accepted values in the twin's `values`"
            assert set(literal) == set(twin.values[other]), f"{where}: {literal} against {twin.values[other]}"
        runtime_field = runtime_fields[other]
        both = compiler_field.default is not dataclasses.MISSING and runtime_field.default is not dataclasses.MISSING
        if both:
            assert compiler_field.default == runtime_field.default, where


def test_a_field_added_on_one_side_is_named() -> None:
    """The check above fails naming the field, not with a generic inequality."""

    @dataclass(frozen=True)
    class Grown:
        name: str
        sequence: str
        loc: ir.Location
        stride: int = 1

    grown = Twin(Grown, data.TimestampsConfig, RENAMED_LOC)
    with pytest.raises(AssertionError) as raised:
        test_every_field_has_its_twin_or_a_reason(grown)
    assert str(raised.value).startswith("no twin in runtime.config.data.TimestampsConfig: ['compiler.ir.Grown.stride']")
