"""Criteo click logs (the Kaggle and Terabyte day-file layout) as training rows.

A line is `label`, `I1`..`I13`, `C1`..`C26`, tab-separated: the label 0 or
1, thirteen integer counts (possibly negative), twenty-six categorical
values in hexadecimal (32-bit hashes in the published data). Any field but
the label may be empty. As DLRM prepares them: an integer x becomes
log(1 + max(x, 0)), an empty one 0; a categorical value becomes
int(value, 16) mod the rows of the feature's table, an empty one 0. Both
are pure functions of the text, so every process and machine agrees.

Default mapping onto a inputs: I1..I13 feed the spec's single dense feature
(13 wide), C1..C26 feed the sparse features in declaration order, and the
label feeds the first bce head. `data.columns` (`C3: cat_7`, `label: ctr`)
overrides any of it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from runtime.config.data import ModelInputs, TimestampsConfig
from runtime.data.columns import Columns, Jagged
from runtime.data.errors import DataError, RowError
from runtime.data.files.text_lines import data_files, numbered_lines
from runtime.data.spec_columns import (
    check_labels_fed,
    explicit_columns,
    feature_list,
    heads_by_label,
    is_weighted,
    table_rows,
)

LABEL = "label"
INT_COLUMNS = tuple(f"I{i}" for i in range(1, 14))
CAT_COLUMNS = tuple(f"C{i}" for i in range(1, 27))
COLUMNS = (LABEL, *INT_COLUMNS, *CAT_COLUMNS)
_INT_DIGITS = 18  # at most 18 digits: every value fits int64
_HEX_DIGITS = 16  # at most 64 bits (the published data has 32)
_INT = rb"-?[0-9]{1,%d}" % _INT_DIGITS
_HEX = rb"[0-9a-fA-F]{0,%d}" % _HEX_DIGITS
_LINE = re.compile(rb"[01]\t" + (rb"(?:%s)?\t" % _INT) * 13 + (rb"%s\t" % _HEX) * 25 + _HEX)

# One parsed line: the label, the 13 integers, the 26 categorical values (0 when empty).
CriteoRow = tuple[float, list[int], list[int]]


@dataclass(frozen=True, slots=True)
class CriteoLayout:
    """Which columns feed which features: indices into I1..I13 and C1..C26 (from 0)."""

    dense: tuple[tuple[str, tuple[int, ...]], ...]  # dense feature -> its integer columns
    sparse: tuple[tuple[str, int, int], ...]  # sparse feature, categorical column, table rows
    label: str  # the head label the label column feeds


class CriteoReader:
    """Criteo TSV files (plain or gzip; a file or a directory of day files) for one inputs."""

    name = "criteo"
    unseen_features: tuple[str, ...] = ()  # ids are hashed into their table: none is unseen
    timestamps: tuple[TimestampsConfig, ...] = ()  # criteo_layout refuses timestamps features

    def __init__(self, inputs: ModelInputs, path: str | Path) -> None:
        self.layout = criteo_layout(inputs)
        self.files = data_files(path)
        self.source = str(path)
        self.weighted = is_weighted(inputs)

    def epoch_lines(self) -> Iterator[tuple[str, int, bytes]]:
        """(file, line number, line) of every line of every file, in order."""
        for file in self.files:
            name = str(file)
            for number, line in numbered_lines(file):
                yield name, number, line

    def parse(self, line: bytes) -> CriteoRow:
        """The label, integers and categorical values of one line; RowError names the bad column."""
        if _LINE.fullmatch(line) is None:
            raise _diagnose(line)
        fields = line.split(b"\t")
        ints = [int(v) if v else 0 for v in fields[1:14]]
        cats = [int(v, 16) if v else 0 for v in fields[14:]]
        return float(fields[0] == b"1"), ints, cats

    def to_columns(self, rows: list[CriteoRow]) -> Columns:
        labels = torch.tensor([row[0] for row in rows], dtype=torch.float32)
        ints = torch.from_numpy(np.array([row[1] for row in rows], dtype=np.float64).reshape(len(rows), 13))
        logs = torch.log1p(ints.clamp(min=0)).float()
        dense = {name: logs[:, list(columns)] for name, columns in self.layout.dense}
        cats = np.array([row[2] for row in rows], dtype=np.uint64).reshape(len(rows), 26)
        sparse = {
            name: Jagged.one_per_row(torch.from_numpy((cats[:, column] % np.uint64(size)).astype(np.int64)))
            for name, column, size in self.layout.sparse
        }
        return Columns(dense, sparse, {self.layout.label: labels})


def criteo_layout(inputs: ModelInputs) -> CriteoLayout:
    """The mapping of Criteo columns onto `inputs`'s features and label; DataError when it cannot fit."""
    explicit = explicit_columns(inputs, "criteo", COLUMNS)
    dense_sizes = {f.name: f.size for f in inputs.dense}
    rows = table_rows(inputs)
    labels = heads_by_label(inputs)
    if inputs.timestamps:
        names = [t.name for t in inputs.timestamps]
        raise DataError(f"criteo has no timestamps to feed timestamps features {feature_list(names)}")
    for column, target in explicit.items():
        kind, allowed = _target_kind(column)
        if target not in {"dense": dense_sizes, "sparse": rows, "label": labels}[kind]:
            raise DataError(f"data.columns.{column}: {allowed}, not {target!r}")
    return CriteoLayout(
        _dense_layout(explicit, dense_sizes), _sparse_layout(inputs, explicit, rows), _label(inputs, explicit)
    )


def _target_kind(column: str) -> tuple[str, str]:
    if column == LABEL:
        return "label", "the label column feeds a head label"
    if column in INT_COLUMNS:
        return "dense", "an integer column feeds a dense feature"
    return "sparse", "a categorical column feeds a sparse feature"


def _dense_layout(explicit: dict[str, str], sizes: dict[str, int]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    fed = {name: tuple(i for i, c in enumerate(INT_COLUMNS) if explicit.get(c) == name) for name in sizes}
    if not any(fed.values()) and len(sizes) == 1:
        fed = {name: tuple(range(13)) for name in sizes}
    layout = []
    for name, size in sizes.items():
        columns = fed[name]
        if not columns:
            raise DataError(
                f"dense feature {name!r} has no criteo columns: the spec has {len(sizes)} dense features, "
                f"map integer columns (I1..I13) to each in data.columns"
            )
        if len(columns) != size:
            names = ", ".join(INT_COLUMNS[i] for i in columns)
            raise DataError(
                f"dense feature {name!r} has size {size} but {len(columns)} criteo integer columns feed it ({names})"
            )
        layout.append((name, columns))
    return tuple(layout)


def _sparse_layout(
    inputs: ModelInputs, explicit: dict[str, str], rows: dict[str, int]
) -> tuple[tuple[str, int, int], ...]:
    features = [f.name for f in inputs.sparse]
    mapped = {c: t for c, t in explicit.items() if c in CAT_COLUMNS}
    if not mapped and len(features) != len(CAT_COLUMNS):
        raise DataError(
            f"criteo has {len(CAT_COLUMNS)} categorical columns (C1..C26) but the spec has {len(features)} "
            f"sparse features ({feature_list(features)}); map columns to features in data.columns"
        )
    taken = set(mapped.values())
    source: dict[str, str] = {}
    for column, target in mapped.items():
        if target in source:
            raise DataError(f"data.columns: sparse feature {target!r} is fed by both {source[target]} and {column}")
        source[target] = column
    for column, feature in zip(CAT_COLUMNS, features):
        if column not in mapped and feature not in taken:
            source[feature] = column
    missing = [f for f in features if f not in source]
    if missing:
        raise DataError(f"sparse features {feature_list(missing)} have no criteo column; map them in data.columns")
    return tuple((f, CAT_COLUMNS.index(source[f]), rows[f]) for f in features)


def _label(inputs: ModelInputs, explicit: dict[str, str]) -> str:
    label = explicit.get(LABEL)
    if label is None:
        bce = [head for head in inputs.heads if head.loss == "bce"]
        if not bce:
            raise DataError("the criteo label (a click, 0 or 1) feeds the first bce head, but the spec has none")
        label = bce[0].label
    check_labels_fed(inputs, "criteo", {label})
    return label


def _diagnose(line: bytes) -> RowError:
    """Why `line` is not a Criteo line: the first bad column, or the field count."""
    fields = line.split(b"\t")
    if len(fields) != len(COLUMNS):
        return RowError(
            None, line, f"{len(fields)} tab-separated fields, expected {len(COLUMNS)} (label, I1..I13, C1..C26)"
        )
    if fields[0] not in (b"0", b"1"):
        return RowError(LABEL, fields[0], "the label must be 0 or 1")
    for column, value in zip(INT_COLUMNS, fields[1:14]):
        if value and re.fullmatch(_INT, value) is None:
            return RowError(column, value, f"not an integer of at most {_INT_DIGITS} digits")
    for column, value in zip(CAT_COLUMNS, fields[14:]):
        if re.fullmatch(_HEX, value) is None:
            return RowError(column, value, f"not hexadecimal of at most {_HEX_DIGITS} digits")
    return RowError(None, line, "not a criteo line")
