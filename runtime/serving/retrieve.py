"""Retrieval: requests through an exported model's query tower and its item index into a CSV file.

`reccompile retrieve OUT --data ... --k K -o results.csv` runs this in one
process, without the compiler. Requests come as `predict`'s samples do
(runtime.serving.samples): `synthetic` (ids 0, 1, 2, ...) or a data file
(`movielens:FILE`, `criteo:FILE`, `csv:FILE`, ... each line a request; a
MovieLens file's every line, whatever its rating, ids mapped with the export's
vocabulary). Each request becomes K rows, best first:

    file,line,rank,item,score        (synthetic: id,rank,item,score)

`item` is the item's own id (a MovieLens movie id, not a table row; with a
learned vocabulary on the item feature, the raw value, e.g. a CSV's `m345`) and
`score` the inner product of the query and item vectors (their cosine when
the head normalises), 9 significant digits. A request with fewer than K
items in the index gets fewer rows. Bad lines stop the run naming file and
line (`fail`) or are counted, reported and skipped (`skip`).

A next-item model's request is its history (the user's earlier positives):
with `history` (`--history movielens:TRAIN`, the training file the requests
were split from, as `reccompile data split` writes it) they come from the
training data and the requests file's earlier lines, without it from the
requests file alone. A request with no history gets no rows: it is counted
(`no_history`) and reported, never answered as if the empty sequence were
a user.
"""

from __future__ import annotations

import csv
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, TextIO

import torch
from torch import nn

from runtime.data.tables.learn import with_learned
from runtime.retrieval.index import ItemIndex
from runtime.serving.samples import Keyed, open_samples
from runtime.serving.vectors import item_names, item_vocabulary
from runtime.storage.output import write_file

__all__ = ["RetrieveReport", "retrieve", "retrieve_file"]


@dataclass(frozen=True)
class RetrieveReport:
    requests: int
    seconds: float  # the whole stream: reading, the query tower, the index, writing
    query_seconds: float  # the query tower
    search_seconds: float  # the index
    bad_rows: int
    bad_rows_summary: str | None
    unseen: Any = None  # MovieLens: request ids outside the training vocabulary (runtime.data.checks.unseen_ids)
    no_history: int = 0  # next-item requests without a history: no rows written for them

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0


def retrieve(
    model: nn.Module,
    index: ItemIndex,
    samples: Iterator[Keyed],
    k: int,
    out: TextIO,
    id_columns: list[str],
    sequence: str | None = None,
    names: dict[int, str] | None = None,
) -> tuple[int, int, float, float]:
    """Write K rows per request of `samples`; returns (requests, requests without a history,
    query seconds, search seconds). `sequence`: a next-item model's history feature, whose
    empty requests get no rows; `names`: index id -> the item written (a learned vocabulary's values)."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*id_columns, "rank", "item", "score"])
    requests, empty, query_seconds, search_seconds = 0, 0, 0.0, 0.0
    with torch.inference_mode():
        for keys, batch in samples:
            requests += len(keys)
            started = time.perf_counter()
            queries = model.query_vectors(batch.dense, batch.sparse)
            if sequence is not None:  # the query of an empty history is no user's: not searched
                known = batch.sparse[sequence].lengths() > 0
                empty += len(keys) - int(known.sum())
                keys, queries = [key for key, kept in zip(keys, known.tolist()) if kept], queries[known]
            if not keys:
                continue
            searched = time.perf_counter()
            scores, items = index.search(queries, k)
            query_seconds += searched - started
            search_seconds += time.perf_counter() - searched
            for key, row_scores, row_items in zip(keys, scores.tolist(), items.tolist()):
                writer.writerows(
                    [*key, rank, item if names is None else names[item], f"{score:.9g}"]
                    for rank, (item, score) in enumerate(zip(row_items, row_scores), start=1)
                    if item >= 0
                )
    return requests, empty, query_seconds, search_seconds


def retrieve_file(
    model: nn.Module,
    module: Any,
    index: ItemIndex,
    output: Path,
    *,
    data: str,
    k: int,
    batch_size: int,
    rows: int,
    seed: int,
    bad_rows_policy: str = "fail",
    vocabulary: Path | None = None,
    warn: Any = None,
    features: Path | None = None,
    history: str | None = None,
) -> RetrieveReport:
    """Retrieve the top `k` items of every request of `data` (see the module docstring) into `output`."""
    started = time.perf_counter()
    samples = open_samples(
        module.INPUTS,
        data,
        batch_size=batch_size,
        rows=rows,
        seed=seed,
        bad_rows_policy=bad_rows_policy,
        warn=warn,
        vocabulary=vocabulary,
        positives=False,
        features=features,
        history=history,
    )
    section = module.RETRIEVAL
    sequence = section["item_feature"] if section.get("next_item") and data != "synthetic" else None
    item = section["item_feature"]
    learned = None if features is None else item_vocabulary(with_learned(module.INPUTS, features), item)
    names = None if learned is None else item_names(learned)
    count, empty, query_seconds, search_seconds = write_file(
        output, lambda out: retrieve(model, index, samples.batches, k, out, samples.id_columns, sequence, names)
    )
    return RetrieveReport(
        requests=count,
        seconds=time.perf_counter() - started,
        query_seconds=query_seconds,
        search_seconds=search_seconds,
        bad_rows=samples.bad_count,
        bad_rows_summary=samples.bad_rows_summary,
        unseen=samples.unseen,
        no_history=empty,
    )
