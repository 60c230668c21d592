"""Learning a table's feature transforms: one pass over the training rows, before anything trains.

    learned = learn_features(reader)          # a CsvReader / ParquetReader of the training files
    inputs = dataclasses.replace(inputs, learned=learned)
    learned.write(directory / "features.json")

Only the columns the transforms read are parsed, as training parses them
(runtime.data.tables.mapping.parse_learned, raw values kept), so the pass
costs less than training's own parse; the values go to each transform's
`fit` in chunks, whose partial states merge (runtime.features.registry). A
row whose learned columns are bad is left out (training meets it again and
reports it as `--bad-rows` says); a row bad only in columns no transform
reads is learned from, and skipped or refused by training. Only the
training files are read: evaluation and prediction data apply the state
learned here, they never add to it.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from runtime.config.data import ModelInputs
from runtime.config.transforms import Aggregate, History, Numeric, Quantiles
from runtime.data.errors import DataError, RowError
from runtime.data.tables.collisions import CollisionCounter
from runtime.data.tables.csv_files import CsvReader
from runtime.data.tables.learn_columns import chunk_raws
from runtime.data.tables.mapping import LEARNED_KINDS, TableLayout, TableRow, layout_of, parse_learned
from runtime.features.registry import transform
from runtime.features.state import FeatureStateError, Learned, LearnedFeatures, read_features

CHUNK_ROWS = 8192


def learned_configs(inputs: ModelInputs) -> dict[str, Any]:
    """Feature name -> config of every transform of `inputs` with a state to learn."""
    configs: dict[str, Any] = {f.name: f.transform for f in inputs.dense if f.transform is not None}
    configs.update(
        {f.name: f.transform for f in inputs.sparse if f.transform is not None and f.transform.kind in LEARNED_KINDS}
    )
    return configs


def with_learned(inputs: ModelInputs, path: str | Path, sha256: str | None = None) -> ModelInputs:
    """`inputs` with the state of the features.json at `path` (checked against `sha256` when given, and held
    to the spec's transforms); DataError when it does not fit."""
    try:
        learned = read_features(path, learned_configs(inputs), sha256)
    except FeatureStateError as error:
        raise DataError(str(error)) from None
    return dataclasses.replace(inputs, learned=learned)


def learn_features(
    reader: Any,
    progress: bool = True,
    collisions: CollisionCounter | None = None,
    warn: Callable[[str], None] | None = None,
) -> LearnedFeatures:
    """The learned state of every transform of `reader`'s layout, from all its rows (one pass);
    `progress` shows a bar on a terminal (stderr); `collisions` counts the hashed features' values of the
    rows read on the way (runtime.data.tables.collisions); `warn` gets a 'warning: ...' line per feature
    learned from no value at all (it would train as a constant)."""
    layout = layout_of(reader)
    if layout is None:
        raise DataError(f"the {reader.name} reader does not learn feature transforms; use csv: or parquet: data")
    configs = layout.learned_configs()
    partials: dict[str, list[tuple[int, Any]]] = {}  # per feature: merged partials and their merge levels
    bar = tqdm(desc="learning features", unit=" rows", file=sys.stderr, disable=not (progress and sys.stderr.isatty()))
    columnar = isinstance(reader, CsvReader)  # runtime.data.tables.learn_columns reads CSV lines
    lines: list[bytes] = []
    for _, _, line in reader.epoch_lines():
        lines.append(line)
        if len(lines) == CHUNK_ROWS:
            bar.update(_learn_chunk(reader, layout, configs, lines, partials, collisions, columnar))
            lines = []
    if lines:
        bar.update(_learn_chunk(reader, layout, configs, lines, partials, collisions, columnar))
    bar.close()
    rows = {key.key: key.rows for key in layout.sparse}
    learned = {}
    for name, config in configs.items():
        kind = transform(config.kind)
        partial = kind.merge(config, [p for _, p in partials.get(name, [])])
        empty = kind.without_values(config, partial) if hasattr(kind, "without_values") else None
        if empty is not None and warn is not None:
            warn(f"warning: feature {name} ({config.kind}): {empty}")
        learned[name] = Learned(config.kind, config, kind.finish(config, partial, rows.get(name)))
    return LearnedFeatures(learned, "the features learned from the training data")


def _learn_chunk(
    reader: Any,
    layout: TableLayout,
    configs: dict[str, Any],
    lines: list[bytes],
    partials: dict[str, list],
    collisions: CollisionCounter | None,
    columnar: bool,
) -> int:
    """Fit every transform on one chunk of lines, a column at a time where the chunk allows it
    (runtime.data.tables.learn_columns), else row by row; the rows learned from."""
    counting = collisions is not None and not collisions.full
    extra = tuple(column for key in collisions.keys for column in key.reads) if counting else ()  # type: ignore[union-attr]
    found = chunk_raws(reader, layout, configs, lines, extra) if columnar else None
    if found is not None:
        raws, table = found
        if counting:
            collisions.add_table(table)  # type: ignore[union-attr]
        _fit(configs, raws, partials)
        return table.num_rows
    names = frozenset(configs)
    rows: list[TableRow] = []
    for line in lines:
        try:
            fields = reader.fields(line)
            rows.append(parse_learned(layout, fields, names))
        except RowError:
            continue
        if collisions is not None:
            collisions.add(fields)
    if rows:
        _fit(configs, _raws(layout, configs, rows), partials)
    return len(rows)


def _raws(layout: TableLayout, configs: dict[str, Any], rows: list[TableRow]) -> dict[str, Any]:
    """Per learned feature, the raw values of parsed `rows` its `fit` takes."""
    raws: dict[str, Any] = {}
    for i, (name, columns) in enumerate(layout.dense):
        if isinstance(configs.get(name), Aggregate):
            raws[name] = [row[0][i][0] for row in rows]
        elif isinstance(configs.get(name), Numeric):
            raws[name] = torch.tensor([row[0][i] for row in rows], dtype=torch.float64).reshape(len(rows), len(columns))
    for i, key in enumerate(layout.sparse):
        config = configs.get(key.key)
        if isinstance(config, Quantiles):
            raws[key.key] = torch.tensor([row[1][i][0] for row in rows], dtype=torch.float64)
        elif isinstance(config, History):
            raws[key.key] = [row[1][i][0] for row in rows]
        elif config is not None:
            raws[key.key] = [item for row in rows for item in row[1][i]]
    return raws


def _fit(configs: dict[str, Any], raws: dict[str, Any], partials: dict[str, list]) -> None:
    """Fit every transform on one chunk's raw values and merge it into `partials`."""
    for name, raw in raws.items():
        config = configs[name]
        kind = transform(config.kind)
        stack = partials.setdefault(name, [])
        stack.append((0, kind.fit(config, raw)))
        while len(stack) > 1 and stack[-1][0] == stack[-2][0]:  # merge like a binary counter: O(n log n) in all
            (level, right), (_, left) = stack.pop(), stack.pop()
            stack.append((level + 1, kind.merge(config, [left, right])))
