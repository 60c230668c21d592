"""Semantic checks of the spec's features, tables and settings, producing their IR parts.

Called by `compiler.spec.build` after the schema pass. The `Checker` (compiler.spec.checker) reads
only nodes the schema accepted (a rejected node reads as `INVALID` and every
check that needs it is skipped), so one mistake gives one diagnostic. The
rules here: `count` expansion, unique feature and table names, each sparse
feature in exactly one table (its own, or a shared one that alone sets the
sizes), sequence features (`pooling: none` with `max_length`) and their
timestamps, size arithmetic within int64, optimizer hyper-parameters that fit
the optimizer, and the training / sharding / data cross-checks.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from compiler.ir import (
    INT64_MAX,
    Constraint,
    Data,
    DenseFeature,
    Location,
    Optimizer,
    Sharding,
    SparseFeature,
    Table,
    TimestampsFeature,
    Training,
)
from compiler.spec import feature_sources, transforms
from compiler.spec.checker import INVALID, Checker, _Sparse, _TableSpec, known, where
from compiler.spec.load import Node
from runtime.config.transforms import Aggregate
from runtime.data.reader_names import READERS

MAX_SPARSE_FEATURES = 100_000
MAX_NAME_LENGTH = 64  # as the schema's `name`
FLOAT_BYTES = 4


DEFAULT_LR = 0.01
DEFAULT_DENSE_OPTIMIZER = Optimizer(type="adagrad", lr=DEFAULT_LR)
DEFAULT_SPARSE_OPTIMIZER = Optimizer(type="rowwise_adagrad", lr=DEFAULT_LR)
# Hyper-parameters each optimizer type reads (lr and weight_decay are read by all).
_OPTIMIZER_PARAMS = {
    "sgd": set(),
    "adagrad": {"eps"},
    "rowwise_adagrad": {"eps"},
    "adam": {"eps", "beta1", "beta2"},
    "adamw": {"eps", "beta1", "beta2"},
}
_SIZE_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_SIZE_UNITS.update({"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40})


@dataclass(slots=True)
class Features:
    """Resolved features and tables; the dicts hold every declared name (None: width unknown)."""

    dense: list[DenseFeature]
    sparse: list[SparseFeature]
    tables: list[Table]
    dense_sizes: dict[str, int | None]
    sparse_dims: dict[str, int | None]
    table_names: set[str]  # every table, including those with errors
    counted: set[str]  # the names of `count` entries (prefixes of the expanded names)
    sequence_lengths: dict[str, int | None] = field(default_factory=dict)  # sequence feature -> max_length
    timestamps: list[TimestampsFeature] = field(default_factory=list)
    timestamps_names: set[str] = field(default_factory=set)  # every timestamps feature, even broken ones
    dense_embed_dims: dict[str, int | None] = field(default_factory=dict)  # dense features with `embed`: their D
    groups: dict[str, list[tuple[str, str]] | None] = field(default_factory=dict)  # compiler/spec/groups.py


def resolve_features(checker: Checker, root: Node) -> Features:
    """Expand, name-check and table-resolve the features; build their IR parts."""
    features = checker.child(root, "features")
    names: dict[str, tuple[Node, str]] = {}
    dense, dense_sizes = _dense(checker, features, names)
    sparse = _expand_sparse(checker, features, names)
    sources = feature_sources.resolve_columns(checker, sparse, dense_sizes)
    tables = _tables(checker, root, sparse)
    feature_sources.check_column_rows(checker, sparse, sources, tables)
    transformed = {feature.name for feature in dense if feature.transform is not None}
    aggregates = frozenset(f.name for f in dense if isinstance(f.transform, Aggregate))
    transforms.check_links(checker, sparse, transformed, tables, aggregates)
    transforms.check_reader(checker, root, sparse, transformed)
    transforms.check_where(checker, root, sparse)
    transforms.check_dense_histories(checker, root, dense, sparse)
    by_feature = {name: spec for spec in tables.values() for name in spec.features}
    sparse_ir = [ir for ir in (_sparse_ir(s, by_feature.get(s.name), sources.get(s.name)) for s in sparse) if ir]
    position = {s.name: i for i, s in enumerate(sparse)}
    ordered = sorted(tables.values(), key=lambda t: min((position[f] for f in t.features), default=0))
    tables_ir = [ir for ir in (_table_ir(checker, spec) for spec in ordered) if ir]
    sparse_dims = {}
    for s in sparse:
        spec = by_feature.get(s.name)
        sparse_dims[s.name] = spec.dim if spec is not None and isinstance(spec.dim, int) else None
    counted = {s.written for s in sparse if s.written != s.name}
    sequences = {s.name: s.fields["max_length"] for s in sparse if s.fields["pooling"] == "none"}
    sequences = {name: length if isinstance(length, int) else None for name, length in sequences.items()}
    timestamps, timestamps_names = _timestamps(checker, features, names, sequences, set(sparse_dims))
    return Features(
        dense,
        sparse_ir,
        tables_ir,
        dense_sizes,
        sparse_dims,
        set(tables),
        counted,
        sequences,
        timestamps,
        timestamps_names,
        _embed_dims(checker, features),
    )


def _timestamps(
    checker: Checker,
    features: Node | None,
    names: dict[str, tuple[Node, str]],
    sequences: dict[str, int | None],
    sparse: set[str],
) -> tuple[list[TimestampsFeature], set[str]]:
    """The timestamps features: each names a sequence feature, at most one per sequence."""
    out: list[TimestampsFeature] = []
    seen: set[str] = set()
    owner: dict[str, Node] = {}
    for entry in checker.entries(features, "timestamps"):
        name = checker.name(entry)
        if name is None or not _register(checker, names, name, checker.child(entry, "name") or entry, ""):
            continue
        seen.add(name)
        sequence, node = checker.value(entry, "sequence"), checker.child(entry, "sequence")
        if not isinstance(sequence, str) or node is None:
            continue
        if sequence not in sparse:
            checker.error(node, f"unknown sequence feature '{sequence}'{checker.suggest(sequence, sequences)}")
        elif sequence not in sequences:
            checker.error(node, f"'{sequence}' is a pooled feature; timestamps belong to a sequence (pooling: none)")
        elif sequence in owner:
            first = owner[sequence]
            checker.error(node, f"sequence '{sequence}' already has timestamps (at {where(first)})")
        else:
            owner[sequence] = node
            out.append(TimestampsFeature(name, sequence, entry.loc))
    return out, seen


def _register(checker: Checker, names: dict[str, tuple[Node, str]], name: str, node: Node, origin: str) -> bool:
    """Record a feature name; report it if taken. `origin` says how a `count` made it."""
    if name in names:
        first, first_origin = names[name]
        mine = f" ({origin})" if origin else ""
        also = f"also {first_origin or 'defined'} at {where(first)}"
        checker.error(node, f"duplicate feature name '{name}'{mine}; {also}")
        return False
    names[name] = (node, origin)
    return True


def _dense(
    checker: Checker, features: Node | None, names: dict[str, tuple[Node, str]]
) -> tuple[list[DenseFeature], dict[str, int | None]]:
    dense: list[DenseFeature] = []
    sizes: dict[str, int | None] = {}
    for entry in checker.entries(features, "dense"):
        name, size = checker.name(entry), checker.value(entry, "size")
        if name is None or not _register(checker, names, name, checker.child(entry, "name") or entry, ""):
            continue
        sizes[name] = size if isinstance(size, int) else None
        embed = checker.child(entry, "embed")
        dim, bias = checker.value(embed, "dim"), checker.value(embed, "bias", False)
        transform = transforms.check_dense(checker, entry)
        if isinstance(size, int) and embed is None:
            dense.append(DenseFeature(name=name, size=size, loc=entry.loc, transform=transform))
        elif isinstance(size, int) and isinstance(dim, int) and known(bias):
            dense.append(
                DenseFeature(name=name, size=size, loc=entry.loc, embed_dim=dim, embed_bias=bias, transform=transform)
            )
    return dense, sizes


def _embed_dims(checker: Checker, features: Node | None) -> dict[str, int | None]:
    """The dense features with `embed` (each a field stack [B, size, dim]) and their dim (None: invalid)."""
    dims: dict[str, int | None] = {}
    for entry in checker.entries(features, "dense"):
        name, embed = checker.name(entry), checker.child(entry, "embed")
        if name is not None and embed is not None and name not in dims:
            dim = checker.value(embed, "dim")
            dims[name] = dim if isinstance(dim, int) else None
    return dims


_SPARSE_FIELDS = (
    "num_embeddings",
    "dim",
    "pooling",
    "table",
    "ids_per_sample",
    "max_ids_per_sample",
    "weighted",
    "hash",
    "max_length",
    "keep",
    "column",
    "boundaries",
    "position_weights",
    *transforms.KEYS,
)
_POOLED_ONLY = {  # keys a sequence feature must not have, and why
    "ids_per_sample": "a sequence's length is bounded by max_length",
    "max_ids_per_sample": "a sequence's length is bounded by max_length",
    "weighted": "a sequence's rows are not pooled, so there is nothing to weight",
}


def _expand_sparse(checker: Checker, features: Node | None, names: dict[str, tuple[Node, str]]) -> list[_Sparse]:
    out: list[_Sparse] = []
    for entry in checker.entries(features, "sparse"):
        name, count = checker.name(entry), checker.value(entry, "count")
        if name is None or not known(count):
            continue
        if count is not None and len(out) + count > MAX_SPARSE_FEATURES:
            checker.error(entry, f"more than {MAX_SPARSE_FEATURES} sparse features after count expansion")
            break
        fields = {key: checker.value(entry, key) for key in _SPARSE_FIELDS}
        _check_ids(checker, entry)
        feature_sources.check_entry(checker, entry, fields)
        transforms.check_sparse(checker, entry, fields, INVALID)
        if not _check_sequence_keys(checker, entry, fields):
            fields["max_length"] = INVALID
        expanded = [name] if count is None else [f"{name}_{i}" for i in range(count)]
        if len(expanded[-1]) > MAX_NAME_LENGTH and count is not None:
            at = checker.child(entry, "count") or entry
            message = f"expands to names longer than {MAX_NAME_LENGTH} characters ('{expanded[-1]}')"
            checker.error(at, message)
            continue
        origin = "" if count is None else f"made by '{name}' with count {count}"
        name_node = checker.child(entry, "name") or entry
        for full in expanded:
            if _register(checker, names, full, name_node, origin):
                out.append(_Sparse(full, entry, name, fields))
    return out


def _check_ids(checker: Checker, entry: Node) -> None:
    exact, up_to = checker.child(entry, "ids_per_sample"), checker.child(entry, "max_ids_per_sample")
    if exact is not None and up_to is not None:
        message = "set ids_per_sample (exactly N ids) or max_ids_per_sample (up to N ids), not both"
        checker.error(up_to, message, at_key=True)


def _check_sequence_keys(checker: Checker, entry: Node, fields: dict[str, Any]) -> bool:
    """A sequence (`pooling: none`) has max_length and no pooled-only keys; a pooled feature no max_length."""
    pooling = fields["pooling"]
    if pooling == "none":
        good = True
        if fields["max_length"] is None:
            at = checker.child(entry, "pooling") or entry
            checker.error(at, "pooling: none (a sequence) needs max_length, the longest sequence the model reads")
            good = False
        for key, why in _POOLED_ONLY.items():
            node = checker.child(entry, key)
            if node is not None:
                checker.error(node, f"{key} applies to pooled features only: {why}", at_key=True)
                good = False
        return good
    if not known(pooling):
        return True
    for key in ("max_length", "keep"):
        node = checker.child(entry, key)
        if node is not None:
            written = f" (pooling: {pooling})" if pooling is not None else ""
            message = f"{key} applies to sequences (pooling: none) only; this feature is pooled{written}"
            checker.error(node, message, at_key=True)
    return True


def _tables(checker: Checker, root: Node, sparse: list[_Sparse]) -> dict[str, _TableSpec]:
    """Every table, explicit or implied, with the features that look it up."""
    explicit = _explicit_tables(checker, root)
    listed = _listed_features(checker, root, explicit, sparse)
    tables = dict(explicit)
    feature_names = {s.name for s in sparse}
    for feature in sparse:
        table = _table_of(checker, feature, explicit, listed, feature_names)
        if table is not None:
            table.features.append(feature.name)
        elif feature.fields["table"] is None and feature.name not in listed:
            implied = _implied_table(checker, feature, explicit)
            if implied is not None:
                tables[implied.name] = implied
    for spec in explicit.values():
        listing = checker.child(spec.node, "features")
        if not (spec.features or spec.claimed) and (listing is None or listing.path not in checker.tainted):
            at = checker.child(spec.node, "name") or spec.node
            checker.error(at, f"table '{spec.name}' is not used by any feature")
    return tables


def _explicit_tables(checker: Checker, root: Node) -> dict[str, _TableSpec]:
    tables: dict[str, _TableSpec] = {}
    for entry in checker.entries(root, "tables"):
        name = checker.name(entry)
        if name is None:
            continue
        if name in tables:
            first = tables[name].node
            tables[name].claimed = True
            at = checker.child(entry, "name") or entry
            checker.error(at, f"duplicate table name '{name}' (also at {where(first)})")
            continue
        tables[name] = _TableSpec(
            name=name,
            node=entry,
            rows=checker.value(entry, "num_embeddings"),
            dim=checker.value(entry, "dim"),
            pooling=checker.value(entry, "pooling", "sum"),
            init=checker.child(entry, "init"),
            optimizer=checker.child(entry, "optimizer"),
        )
    return tables


def _listed_features(
    checker: Checker, root: Node, explicit: dict[str, _TableSpec], sparse: list[_Sparse]
) -> dict[str, tuple[_TableSpec, Node]]:
    """Features named in `tables[].features`, each with its table and the list item."""
    names = {s.name for s in sparse}
    prefixes = {s.written for s in sparse if s.written != s.name}
    listed: dict[str, tuple[_TableSpec, Node]] = {}
    for spec in explicit.values():
        for item in checker.entries(spec.node, "features"):
            if item.path in checker.tainted or not isinstance(item.value, str):
                continue
            name = item.value
            spec.claimed = spec.claimed or name in names
            if name not in names:
                checker.error(item, _unknown_sparse(checker, name, names, prefixes))
            elif name in listed:
                table, first = listed[name]
                checker.error(item, f"feature '{name}' is already in table '{table.name}' (at {where(first)})")
            else:
                listed[name] = (spec, item)
    return listed


def _unknown_sparse(checker: Checker, name: str, names: set[str], prefixes: set[str]) -> str:
    if name in prefixes:
        return f"'{name}' has a count: name its features {name}_0, {name}_1, ..."
    return f"unknown sparse feature '{name}'{checker.suggest(name, names)}"


def _table_of(
    checker: Checker,
    feature: _Sparse,
    explicit: dict[str, _TableSpec],
    listed: dict[str, tuple[_TableSpec, Node]],
    features: set[str],
) -> _TableSpec | None:
    """The shared table of a feature (by `table:` or by a table's list), checking for conflicts."""
    named = feature.fields["table"]
    table_node = checker.child(feature.entry, "table")
    spec: _TableSpec | None = None
    if isinstance(named, str) and table_node is not None:
        spec = explicit.get(named)
        if spec is None:
            meant = checker.closest(named, explicit)
            if meant is not None:
                explicit[meant].claimed = True  # its only user misspelled it: not unused
            hint = f" (did you mean '{meant}'?)" if meant else ""
            hint += "; only tables under `tables` can be shared" if named in features else ""
            checker.error(table_node, f"unknown table '{named}'{hint}")
            return None
        spec.claimed = True
        if feature.name in listed and listed[feature.name][0] is not spec:
            other = listed[feature.name][0].name
            checker.error(table_node, f"feature '{feature.name}' names table '{named}' but table '{other}' lists it")
            return None
    elif named is None and feature.name in listed:
        spec = listed[feature.name][0]
    if spec is not None:
        _check_no_sizes(checker, feature, spec, "" if named is not None else f" (which lists '{feature.name}')")
    return spec


def _check_no_sizes(checker: Checker, feature: _Sparse, spec: _TableSpec, why: str) -> None:
    """A feature on a shared table must not repeat the table's sizes (they could drift)."""
    on_table = {"num_embeddings": spec.rows, "dim": spec.dim, "pooling": spec.pooling}
    for key, table_value in on_table.items():
        node = checker.child(feature.entry, key)
        mine = feature.fields[key]
        if node is None or not known(mine) or (key == "pooling" and mine == "none"):
            continue
        if known(table_value) and table_value != mine:
            message = (
                f"feature '{feature.written}' has {key} {mine} but its shared table '{spec.name}' has "
                f"{key} {table_value}; a shared table's {key} is set once, on the table: remove it here"
            )
        else:
            message = f"{key} is set on the shared table '{spec.name}'{why}; remove it here"
        checker.error(node, message, at_key=True)


def _implied_table(checker: Checker, feature: _Sparse, explicit: dict[str, _TableSpec]) -> _TableSpec | None:
    rows, dim = feature.fields["num_embeddings"], feature.fields["dim"]
    if rows is None and dim is None:
        checker.error(
            feature.entry,
            f"feature '{feature.written}' has no table: "
            "give it num_embeddings and dim, or name a shared table with `table`",
        )
        return None
    if rows is None or dim is None:
        missing = "num_embeddings" if rows is None else "dim"
        why = "a feature with its own table needs num_embeddings and dim"
        checker.error(feature.entry, f"missing required key '{missing}' ({why})")
        return None
    if feature.name in explicit:
        explicit[feature.name].claimed = True
        checker.error(
            checker.child(feature.entry, "name") or feature.entry,
            f"feature '{feature.name}' has its own num_embeddings and dim, which make a table '{feature.name}', "
            f"but tables defines one at {where(explicit[feature.name].node)}; use `table: {feature.name}` instead",
        )
        return None
    return _TableSpec(
        name=feature.name,
        node=feature.entry,
        rows=rows,
        dim=dim,
        pooling=feature.fields["pooling"] if feature.fields["pooling"] not in (None, "none") else "sum",
        init=None,
        optimizer=None,
        features=[feature.name],
    )


def _sparse_ir(
    feature: _Sparse, table: _TableSpec | None, source: feature_sources.Source | None
) -> SparseFeature | None:
    fields = feature.fields
    if table is None or source is None or not known(*fields.values()):
        return None
    fixed = fields["max_ids_per_sample"] is None
    ids = fields["ids_per_sample"] if fixed else fields["max_ids_per_sample"]
    max_length = fields["max_length"] if fields["pooling"] == "none" else None
    if max_length is not None:
        fixed, ids = False, max_length  # a sequence holds 0..max_length ids
    return SparseFeature(
        name=feature.name,
        table=table.name,
        ids_per_sample=1 if ids is None else ids,
        fixed_ids=fixed,
        weighted=bool(fields["weighted"]),
        hashed=bool(fields["hash"]),
        loc=feature.entry.loc,
        max_length=max_length,
        keep=fields["keep"] or "end",
        column=source.column,
        column_index=source.index,
        boundaries=source.boundaries,
        position_weighted=bool(fields["position_weights"]),
        transform=fields["transform"],
    )


def _table_ir(checker: Checker, spec: _TableSpec) -> Table | None:
    optimizer = optimizer_ir(checker, spec.optimizer, None) if spec.optimizer is not None else None
    optimizer = _table_optimizer(checker, spec.optimizer, optimizer)
    init = _init_range(checker, spec)
    if not (isinstance(spec.rows, int) and isinstance(spec.dim, int)):
        return None
    if spec.rows * spec.dim * FLOAT_BYTES > INT64_MAX:
        at = checker.child(spec.node, "num_embeddings") or spec.node
        size = spec.rows * spec.dim * FLOAT_BYTES
        checker.error(at, f"the table needs num_embeddings * dim * 4 = {size} bytes, more than a 64-bit integer holds")
        return None
    if init is None or not known(spec.pooling, optimizer):
        return None
    return Table(
        name=spec.name,
        num_embeddings=spec.rows,
        dim=spec.dim,
        pooling=spec.pooling,
        features=tuple(spec.features),
        init_min=init[0],
        init_max=init[1],
        optimizer=optimizer,
        loc=spec.node.loc,
    )


def _init_range(checker: Checker, spec: _TableSpec) -> tuple[float, float] | None:
    if spec.init is None:
        if not isinstance(spec.rows, int):
            return None
        bound = math.sqrt(1.0 / spec.rows)
        return -bound, bound
    low, high = checker.value(spec.init, "min"), checker.value(spec.init, "max")
    if not known(low, high) or low is None or high is None:
        return None
    if low >= high:
        checker.error(checker.child(spec.init, "max") or spec.init, f"must be greater than min ({low})")
        return None
    return float(low), float(high)


def optimizer_ir(checker: Checker, node: Node | None, default: Optimizer | None) -> Any:
    """The optimizer at `node` with defaults filled, `default` if absent, INVALID if broken."""
    if node is None:
        return default
    kind = checker.value(node, "type")
    if not isinstance(kind, str) or kind not in _OPTIMIZER_PARAMS:
        return INVALID
    usable = _OPTIMIZER_PARAMS[kind]
    broken = False
    for key in ("eps", "beta1", "beta2"):
        param = checker.child(node, key)
        if param is not None and key not in usable:
            users = sorted(k for k, params in _OPTIMIZER_PARAMS.items() if key in params)
            checker.error(param, f"{key} does not apply to {kind} (it is used by {', '.join(users)})", at_key=True)
            broken = True
    params = {key: checker.value(node, key) for key in ("lr", "eps", "weight_decay", "beta1", "beta2", "embedding_l2")}
    if broken or not known(*params.values()):
        return INVALID
    given = {key: float(value) for key, value in params.items() if value is not None}
    return Optimizer(type=kind, **{"lr": DEFAULT_LR, **given})


def _table_optimizer(checker: Checker, node: Node | None, optimizer: Any) -> Any:
    """`optimizer` unless it asks a table for what the fused kernels do not do (INVALID then)."""
    if isinstance(optimizer, Optimizer) and optimizer.type == "adamw":
        at = checker.child(node, "type") or node
        message = "adamw is for dense parameters only; tables take adam, whose weight_decay is an L2 term"
        checker.error(at, message)
        return INVALID
    if isinstance(optimizer, Optimizer) and optimizer.weight_decay and optimizer.type != "adam":
        at = checker.child(node, "weight_decay") or node
        checker.error(at, f"weight_decay applies to tables only with adam, not {optimizer.type}", at_key=True)
        return INVALID
    return optimizer


def resolve_sharding(checker: Checker, root: Node, table_names: set[str], world_size: int | None = None) -> Any:
    """The sharding section with defaults filled (INVALID if broken); `world_size`, when given,
    is the one the ranks of its checks are counted in (the IR keeps the spec's)."""
    node = checker.child(root, "sharding")
    world = checker.value(node, "world_size", 1)
    ranks = world if world_size is None else world_size
    device = checker.value(node, "device", "cpu")
    per_host = checker.value(node, "ranks_per_host")
    if isinstance(ranks, int) and isinstance(per_host, int) and ranks % per_host:
        at = checker.child(node, "ranks_per_host") or node
        checker.error(at, f"world_size {ranks} does not divide into hosts of {per_host} ranks")
    memory = _memory(checker, node)
    constraints = [
        _constraint(checker, name, entry, table_names, ranks) for name, entry in checker.pairs(node, "constraints")
    ]
    if not known(world, device, per_host, memory, *constraints):
        return INVALID
    return Sharding(world, device, per_host, memory, tuple(constraints), _section_loc(root, node))


def _memory(checker: Checker, node: Node | None) -> Any:
    value = checker.value(node, "memory_per_rank")
    if not isinstance(value, str):
        return value
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?) ?([A-Za-z]+)", value)
    assert match is not None  # the schema's pattern
    size = math.floor(Fraction(match.group(1)) * _SIZE_UNITS[match.group(2)])
    at = checker.child(node, "memory_per_rank") or node
    if not 1 <= size <= INT64_MAX:
        checker.error(at, f"'{value}' is {size} bytes; expected between 1 and {INT64_MAX}")
        return INVALID
    return size


def _constraint(checker: Checker, table: str, node: Node, table_names: set[str], world: Any) -> Any:
    if table not in table_names:
        checker.error(node, f"unknown table '{table}'{checker.suggest(table, table_names)}", at_key=True)
        return INVALID
    for item in checker.entries(node, "ranks"):
        readable = item.path not in checker.tainted and isinstance(item.value, int)
        if readable and isinstance(world, int) and item.value >= world:
            checker.error(item, f"rank {item.value} does not exist with world_size {world}")
            return INVALID
    kernels = checker.value(node, "compute_kernels", [])
    types = checker.value(node, "sharding_types", [])
    ranks = checker.value(node, "ranks", [])
    if not known(types, kernels, ranks):
        return INVALID
    return Constraint(table, tuple(types), tuple(kernels), tuple(ranks), node.key_loc or node.loc)


def resolve_training(checker: Checker, root: Node, world_size: Any) -> Any:
    """The training section with defaults filled (INVALID if broken)."""
    node = checker.child(root, "training")
    batch = checker.value(node, "batch_size", 2048)
    if isinstance(batch, int) and isinstance(world_size, int) and batch % world_size:
        at = checker.child(node, "batch_size") or checker.child(checker.child(root, "sharding"), "world_size") or root
        checker.error(at, f"batch_size {batch} does not divide evenly over world_size {world_size} ranks")
    dense = optimizer_ir(checker, checker.child(node, "dense_optimizer"), DEFAULT_DENSE_OPTIMIZER)
    if isinstance(dense, Optimizer) and dense.type == "rowwise_adagrad":
        at = checker.child(checker.child(node, "dense_optimizer"), "type") or root
        checker.error(at, "rowwise_adagrad is for embedding tables only; use adagrad for dense parameters")
        dense = INVALID
    if isinstance(dense, Optimizer) and dense.embedding_l2:
        at = checker.child(checker.child(node, "dense_optimizer"), "embedding_l2") or root
        message = "embedding_l2 penalises table rows (sparse_optimizer, a table's optimizer)"
        message += "; dense parameters take weight_decay"
        checker.error(at, message, at_key=True)
        dense = INVALID
    sparse = optimizer_ir(checker, checker.child(node, "sparse_optimizer"), DEFAULT_SPARSE_OPTIMIZER)
    sparse = _table_optimizer(checker, checker.child(node, "sparse_optimizer"), sparse)
    seed, steps = checker.value(node, "seed", 0), checker.value(node, "steps", 100)
    precision = checker.value(node, "precision", "fp32")
    if not known(batch, seed, steps, dense, sparse, precision):
        return INVALID
    at = checker.child(node, "precision")
    return Training(
        batch,
        seed,
        steps,
        dense,
        sparse,
        _section_loc(root, node),
        precision=precision,
        precision_loc=None if at is None else (at.key_loc or at.loc),
    )


def resolve_data(checker: Checker, root: Node, targets: set[str]) -> Any:
    """The data section (None if absent, INVALID if broken); columns must feed features or labels."""
    node = checker.child(root, "data")
    if node is None:
        return None
    reader, path = checker.value(node, "reader"), checker.value(node, "path")
    if reader == "synthetic" and isinstance(path, str):
        at = checker.child(node, "path") or node
        checker.error(at, "the synthetic reader reads no files; remove path", at_key=True)
    elif reader in READERS and reader != "synthetic" and path is None:
        checker.error(node, f"missing required key 'path' (the {reader} reader reads files)")
    columns = []
    for column, target in checker.pairs(node, "columns"):
        if target.path in checker.tainted:
            continue
        if target.value not in targets:
            hint = checker.suggest(target.value, targets)
            checker.error(target, f"column '{column}' feeds unknown feature or label '{target.value}'{hint}")
        columns.append((column, target.value))
    if not known(reader, path) or not isinstance(node.value, dict):
        return INVALID
    return Data(reader, path, tuple(columns), _section_loc(root, node))


def _section_loc(root: Node, node: Node | None) -> Location:
    """Where a top-level section's key is written (the document start when it is absent)."""
    if node is None:
        return root.loc
    return node.key_loc or node.loc
