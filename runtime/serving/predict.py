"""Batch prediction: stream samples through an exported model into a CSV file.

`reccompile predict OUT --data ... -o predictions.csv` runs this in one
process, without the compiler. Samples come in batches
(runtime.serving.samples) from

    synthetic          the spec's synthetic batches (runtime.data.synthetic.batches), ids 0, 1, 2, ...
    criteo:PATH        Criteo TSV lines (runtime.data.criteo.reader)
    movielens:PATH     MovieLens ratings (runtime.data.movielens.reader), ids mapped with the
                       vocabulary training used (the export's vocab.json); ids outside it
                       are scored with row 0 and counted (runtime.data.checks.unseen_ids)

and each becomes one CSV row: `id` (synthetic) or `file,line` (files), then
one column per head: the sigmoid of the logit (bce; a probability head's output as is), the value (mse), or one
probability per class (softmax: `<head>_<k>`). Floats are written with 9
significant digits, which round-trips float32 exactly. File lines are parsed
by the reader's own `parse` and `to_columns`, line by line in file order, so
each prediction keeps its line number; bad rows follow the training rule
(runtime.data.checks.bad_rows): stop at the first (`fail`) or count, report and skip.
"""

from __future__ import annotations

import csv
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence, TextIO

import torch
from torch import nn

from runtime.config.data import ModelInputs
from runtime.config.heads import HeadConfig
from runtime.data.checks.unseen_ids import UnseenIds
from runtime.data.movielens.reader import DEFAULT_THRESHOLD
from runtime.serving.samples import Keyed, open_samples
from runtime.storage.output import write_file


@dataclass(frozen=True)
class PredictionReport:
    rows: int
    seconds: float  # the whole stream: reading, parsing, the model, writing
    model_seconds: float  # forward passes only
    bad_rows: int
    bad_rows_summary: str | None
    unseen_ids: UnseenIds | None = None  # MovieLens: the scored ids outside the training vocabulary

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    @property
    def model_rows_per_s(self) -> float:
        return self.rows / self.model_seconds if self.model_seconds > 0 else 0.0


def score_columns(heads: Sequence[HeadConfig]) -> list[str]:
    """The CSV columns of the heads' scores."""
    columns = []
    for head in heads:
        if head.loss == "softmax":
            columns += [f"{head.name}_{k}" for k in range(head.num_classes)]
        else:
            columns.append(head.name)
    return columns


def predict(
    model: nn.Module,
    heads: Sequence[HeadConfig],
    samples: Iterator[Keyed],
    out: TextIO,
    id_columns: Sequence[str],
) -> tuple[int, float]:
    """Write one CSV row per sample of `samples`; returns (rows, seconds in the model)."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*id_columns, *score_columns(heads)])
    rows, model_seconds = 0, 0.0
    with torch.inference_mode():
        for ids, batch in samples:
            started = time.perf_counter()
            scores = model.scores(model(batch.dense, batch.sparse))
            model_seconds += time.perf_counter() - started
            table = torch.cat([scores[h.name].reshape(len(ids), -1) for h in heads], dim=1).tolist()
            writer.writerows([*key, *(f"{value:.9g}" for value in values)] for key, values in zip(ids, table))
            rows += len(ids)
    return rows, model_seconds


def predict_file(
    model: nn.Module,
    inputs: ModelInputs,
    output: Path,
    *,
    data: str,
    batch_size: int,
    rows: int,
    seed: int,
    bad_rows_policy: str = "fail",
    rating_threshold: float | None = None,
    warn: Any = None,
    vocabulary: Path | None = None,
    features: Path | None = None,
) -> PredictionReport:
    """Predict every sample of `data` (see the module docstring) into the CSV file `output`.

    `vocabulary`: the saved MovieLens vocabulary training used (an export's
    vocab.json); without it MovieLens ids map through one built from `data`.
    `features`: the learned feature state (an export's features.json).
    """
    started = time.perf_counter()
    samples = open_samples(
        inputs,
        data,
        batch_size=batch_size,
        rows=rows,
        seed=seed,
        bad_rows_policy=bad_rows_policy,
        warn=warn,
        vocabulary=vocabulary,
        threshold=DEFAULT_THRESHOLD if rating_threshold is None else rating_threshold,
        features=features,
    )
    count, model_seconds = write_file(
        output, lambda out: predict(model, inputs.heads, samples.batches, out, samples.id_columns)
    )
    return PredictionReport(
        rows=count,
        seconds=time.perf_counter() - started,
        model_seconds=model_seconds,
        bad_rows=samples.bad_count,
        bad_rows_summary=samples.bad_rows_summary,
        unseen_ids=samples.unseen,
    )
