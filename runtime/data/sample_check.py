"""`reccompile check SPEC --data PATH`: a data file checked against a spec before training.

Opens the reader the way training does (so every mapping error of spec
against file shows up), parses the first `rows` lines with the same parser
(field counts, types, label values: every bad line with its file:line,
column and value), and summarises what the good rows would feed: each
label's values and, for each sparse feature, how much of its table the
sample's ids reach. The parse is a sample and says so: when the file goes
on past it, the output says which lines were not checked.

Features learned from csv or parquet data (runtime.features) are learned from
the whole file first, as training on it would learn them, and each hashed
feature's values are counted for collisions in the sample
(runtime.data.tables.collisions), with a warning naming the fix above 1%.

MovieLens tables must hold every distinct id of the whole file (plus row 0),
so the vocabulary is built from all of it, as training builds it: one
streaming pass keeping only the distinct ids, and a table too small for
them is the same error `train` would give.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Iterator

import torch

from runtime.config.data import ModelInputs
from runtime.data.checks.bad_rows import BadRow
from runtime.data.checks.timestamps import check_timestamps
from runtime.data.columns import Columns
from runtime.data.errors import DataError, RowError
from runtime.data.loader import Reader
from runtime.data.movielens.reader import movielens_layout, movies_file, rating_ids, ratings_file
from runtime.data.movielens.vocab import build_vocabulary, with_genres
from runtime.data.sources import DataChoice, open_reader
from runtime.data.spec_columns import table_rows
from runtime.data.tables.collisions import count_collisions
from runtime.data.tables.learn import learn_features, learned_configs
from runtime.data.tables.mapping import layout_of

SHOWN_BAD_ROWS = 20


@dataclass
class SampleReport:
    """What `check_sample` found: errors (file:line first) and notes on the good rows."""

    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def check_sample(inputs: ModelInputs, choice: DataChoice, rows: int = 1000) -> SampleReport:
    """Check the first `rows` lines of `choice`'s data against `inputs` (MovieLens ids: all lines)."""
    report = SampleReport()
    try:
        reader = _open(inputs, choice, report)
        if learned_configs(inputs) and layout_of(reader) is not None and inputs.learned is None:
            inputs = _learned(inputs, choice, reader, report)
            reader = open_reader(inputs, choice)
    except DataError as error:
        report.errors.append(f"{choice.path}: error: {error}")
        return report
    collisions = count_collisions(reader, rows) if layout_of(reader) is not None else []
    good, bad, lines = [], [], 0
    stream = iter(reader.epoch_lines())
    for file, number, line in itertools.islice(stream, rows):
        lines += 1
        try:
            good.append(reader.parse(line))
        except RowError as error:
            bad.append(BadRow.from_error(file, number, error))
    rest = next(stream, None)
    for row in bad[:SHOWN_BAD_ROWS]:
        where, _, what = str(row).partition(": ")
        report.errors.append(f"{where}: error: {what}")
    if len(bad) > SHOWN_BAD_ROWS:
        report.errors.append(f"{choice.path}: error: ... and {len(bad) - SHOWN_BAD_ROWS} more bad rows")
    counted = f"{len(good):,} good, {len(bad):,} bad"
    if rest is None:
        report.notes.append(f"{choice.path}: {choice.reader} data, all {lines:,} lines checked: {counted}")
    else:
        report.notes.append(
            f"{choice.path}: {choice.reader} data, first {lines:,} lines checked: {counted}; "
            f"lines from {rest[0]}:{rest[1]} on were not parsed (--sample N checks more)"
        )
    if good:
        columns = reader.to_columns(good)
        try:
            check_timestamps(columns.to_batch(reader.weighted).sparse, inputs.timestamps)
        except DataError as error:
            report.errors.append(f"{choice.path}: error: {error} (counting the good rows of the sample from 0)")
        report.notes += _describe(inputs, columns)
    for found in collisions:
        report.notes.append(f"  hashed {found.describe()}")
        warning = found.warning()
        if warning is not None:
            report.warnings.append(f"{choice.path}: warning: {warning}")
    return report


def _learned(inputs: ModelInputs, choice: DataChoice, reader: Reader, report: SampleReport) -> ModelInputs:
    """`inputs` with the features learned from all of `choice`'s rows, as training on it would learn them."""
    learned = learn_features(reader, warn=lambda line: report.warnings.append(f"{choice.path}: {line}"))
    report.notes.append(f"{choice.path}: features learned from all its rows, as training on it learns them:")
    report.notes += [f"  {line}" for line in learned.describe()]
    return dataclasses.replace(inputs, learned=learned)


def _open(inputs: ModelInputs, choice: DataChoice, report: SampleReport) -> Reader:
    """The reader of `choice`; MovieLens with the vocabulary of the whole file (noted in `report`)."""
    if choice.reader != "movielens" or choice.path is None:
        return open_reader(inputs, choice)
    movielens_layout(inputs)  # a spec the file cannot feed fails before the pass over the file
    file, layout = ratings_file(choice.path)
    good_lines = 0

    def ids() -> Iterator[tuple[int, int]]:
        nonlocal good_lines
        for pair in rating_ids(file, layout):
            good_lines += 1
            yield pair

    vocabulary = build_vocabulary(ids())
    report.notes.append(
        f"{choice.path}: movielens ids, all {good_lines:,} good lines read: "
        f"{len(vocabulary.users):,} distinct userId, {len(vocabulary.movies):,} distinct movieId"
    )
    if movielens_layout(inputs).genres is not None:
        vocabulary = with_genres(vocabulary, movies_file(file, layout), layout)
    return open_reader(inputs, choice, vocabulary=vocabulary)


def _describe(inputs: ModelInputs, columns: Columns) -> list[str]:
    """Each label's values and each sparse feature's reach into its table."""
    losses = {head.label: head.loss for head in inputs.heads}
    notes = []
    for label, values in columns.labels.items():
        if losses.get(label) == "mse":
            low, mean, high = float(values.min()), float(values.mean()), float(values.max())
            notes.append(f"  label {label}: min {low:g}, mean {mean:.4g}, max {high:g}")
        else:
            counts = torch.unique(values, return_counts=True)
            shown = ", ".join(f"{v:g}: {int(n):,}" for v, n in zip(counts[0].tolist(), counts[1]))
            notes.append(f"  label {label}: {shown}")
    rows = table_rows(inputs)
    timestamps = {t.name for t in inputs.timestamps}
    for name, jagged in columns.sparse.items():
        if name in timestamps and jagged.values.numel():
            low, high = int(jagged.values.min()), int(jagged.values.max())
            notes.append(f"  timestamps {name}: {low} to {high}, {jagged.values.numel() / len(columns):.2g} per row")
            continue
        if jagged.values.numel() == 0:
            notes.append(f"  feature {name}: no ids in the sample")
            continue
        distinct = torch.unique(jagged.values).numel()
        notes.append(
            f"  feature {name}: {distinct:,} distinct rows of {rows[name]:,} "
            f"(max row {int(jagged.values.max()):,}), {jagged.values.numel() / len(columns):.2g} ids per row"
        )
    return notes
