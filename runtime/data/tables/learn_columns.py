"""The learning pass's columnar fast path: a chunk of CSV lines parsed a column at a time, not a row at a time.

`chunk_raws(reader, layout, configs, lines)` gives, for one chunk of a
CsvReader's lines, what `runtime.data.tables.learn` hands each transform's
`fit` (the same values the row path, `parse_learned`, would give), and the
chunk as an Arrow table for the collision count; or None when the chunk
holds anything the row path treats specially, and the caller parses that
chunk row by row:

- a quote, CR or NUL byte (the csv module's quoting), text that is not UTF-8,
  a line whose fields are not the header's (Arrow's parser refuses it);
- a value the row path refuses (a number `float` would not read, or not
  finite; a single id with a `|`; a bag longer than `max_ids_per_sample`), or
  one it changes (a sequence longer than its `max_length`).

So every row of a chunk taken here is a good row, and bad rows are left out
exactly as the row path leaves them out. Arrow's number parsing is stricter
than `float` (no spaces, no `_`), never looser; whatever it refuses goes the
row path. Empty lines are no rows on either path.
"""

from __future__ import annotations

import io
import math
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import torch

from runtime.config.transforms import Aggregate, History, Numeric, Quantiles, Vocabulary
from runtime.data.tables.mapping import SEPARATOR, SparseColumn, TableLayout
from runtime.features.aggregate import composite_key

_SPECIAL = (b'"', b"\r", b"\0")  # what sends a line through the csv module on the row path


def chunk_table(reader: Any, columns: list[str], lines: list[bytes]) -> pa.Table | None:
    """The `columns` of a CsvReader's `lines` as strings, or None when a line needs the row path."""
    text = b"\n".join(lines)
    if any(special in text for special in _SPECIAL):
        return None
    try:
        text.decode("utf-8")
        return pa_csv.read_csv(
            io.BytesIO(text),
            read_options=pa_csv.ReadOptions(column_names=reader.header, use_threads=False),
            parse_options=pa_csv.ParseOptions(delimiter=reader.delimiter, quote_char=False, double_quote=False),
            convert_options=pa_csv.ConvertOptions(
                column_types={name: pa.string() for name in reader.header},
                include_columns=columns,
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
            ),
        )
    except (UnicodeDecodeError, pa.ArrowInvalid):
        return None


def _numbers(column: pa.ChunkedArray, empty: float) -> torch.Tensor | None:
    """A string column as float64 (`empty` for an empty field), or None when a field is no finite number."""
    present = pc.not_equal(column, "")
    try:
        values = pc.cast(pc.if_else(present, column, "0"), pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if len(values) and not pc.all(pc.is_finite(values)).as_py():
        return None
    out = torch.from_numpy(values.to_numpy().copy())
    out[~torch.from_numpy(present.to_numpy(zero_copy_only=False))] = empty
    return out


def _items(key: SparseColumn, column: pa.ChunkedArray) -> pa.Array | None:
    """A vocabulary key's items, flat (a bag's each), or None when a row is bad or cut."""
    if key.single:
        if pc.any(pc.match_substring(column, SEPARATOR)).as_py():
            return None
        return column.combine_chunks()
    empty = pc.equal(column, "")
    bags = pc.split_pattern(pc.if_else(empty, pa.scalar(None, pa.string()), column), SEPARATOR)
    lengths = pc.list_value_length(bags)
    bound = key.max_length if key.max_length is not None else key.max_ids
    if bound is not None and len(lengths) and (pc.max(lengths).as_py() or 0) > bound:
        return None
    return pc.list_flatten(bags).combine_chunks()


def _where(config: Any) -> bool:
    return isinstance(config, History) and config.where is not None


def _events(config: Aggregate, table: pa.Table) -> list[tuple[Any, ...]] | None:
    """An aggregate's training rows of the chunk, as the row path's `_aggregated(..., learning=True)` gives
    them: (key, time, sharing values, `of` value); None when a time or an `of` value is no finite number."""
    moment = _numbers(table.column(config.time), math.inf)
    of = _numbers(table.column(config.of), math.nan) if config.of is not None else None
    if moment is None or (config.of is not None and of is None):
        return None
    n = table.num_rows
    if config.sharing is None:
        shared: list[Any] = [()] * n
    else:
        column = table.column(config.sharing)
        bags = pc.split_pattern(pc.if_else(pc.equal(column, ""), pa.scalar(None, pa.string()), column), SEPARATOR)
        shared = [tuple(bag) if bag else () for bag in bags.to_pylist()]
    values = of.tolist() if of is not None else [math.nan] * n
    if isinstance(config.by, str):
        keys = table.column(config.by).to_pylist()
    else:
        keys = [composite_key(parts) for parts in zip(*(table.column(c).to_pylist() for c in config.by), strict=True)]
    return list(zip(keys, moment.tolist(), shared, values, strict=True))


def chunk_raws(
    reader: Any, layout: TableLayout, configs: dict[str, Any], lines: list[bytes], extra: tuple[str, ...] = ()
) -> tuple[dict[str, Any], pa.Table] | None:
    """Per learned feature, the raw values its `fit` takes for this chunk (as the row path builds them), and
    the chunk's table (the learned columns and `extra`); None when the chunk must go the row path."""
    needed = [c for name, cols in layout.dense if name in configs for c in cols]
    aggregates = {name: configs[name] for name, _ in layout.dense if isinstance(configs.get(name), Aggregate)}
    needed += [c for config in aggregates.values() for c in (*config.reads, *([config.of] if config.of else []))]
    needed += [c for key in layout.sparse if key.key in configs for c in key.reads]
    needed += [configs[key.key].where[0] for key in layout.sparse if _where(configs.get(key.key))]
    table = chunk_table(reader, list(dict.fromkeys([*needed, *extra])), lines)
    if table is None:
        return None
    raws: dict[str, Any] = {}
    for name, aggregate in aggregates.items():
        made = _events(aggregate, table)
        if made is None:
            return None
        raws[name] = made
    for name, columns in layout.dense:
        if name in configs and name not in aggregates:
            parsed = [_numbers(table.column(c), math.nan) for c in columns]
            if any(p is None for p in parsed):
                return None
            raws[name] = torch.stack(parsed, 1)  # type: ignore[arg-type]
    for key in layout.sparse:
        config = configs.get(key.key)
        if isinstance(config, Quantiles):
            number = _numbers(table.column(key.column), math.nan)
            if number is None:
                return None
            raws[key.key] = number
        elif isinstance(config, History):
            by, time, value = (table.column(c) for c in key.columns)
            moment = _numbers(time, math.inf)
            if moment is None:
                return None
            events = zip(by.to_pylist(), moment.tolist(), value.to_pylist(), strict=True)
            if config.where is None:
                raws[key.key] = list(events)
                continue
            compared = _numbers(table.column(config.where[0]), math.nan)
            if compared is None:
                return None
            kept = (compared == config.where[1]).tolist()
            raws[key.key] = [(*event, keep) for event, keep in zip(events, kept, strict=True)]
        elif isinstance(config, Vocabulary):
            items = _items(key, table.column(key.column))
            if items is None:
                return None
            raws[key.key] = items
        elif isinstance(config, Numeric):
            raise AssertionError(f"sparse feature {key.key!r} with a numeric transform")
    return raws, table
