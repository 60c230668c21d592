"""The items of an exported retrieval model: their vectors, their index, and how good the index is.

`reccompile export` of a spec with a `sampled_softmax` head calls
`export_items` once the inference model holds its weights. It writes, into
the export directory:

    item_vectors.pt    the item tower's vector of every catalogue item [N, D] (runtime.serving.vectors)
    index/             a nearest-neighbour index of them (runtime.retrieval.index_files), item ids
                       (original ids: MovieLens movie ids, not table rows) as its labels

and measures the index against exact search at k = 100 (or fewer items):
with held-out requests (`--eval-data`, e.g. the test part of `reccompile data
split`), recall@k of their positives through the index over recall@k through
exact search; without them, the top-k overlap with exact search for item
vectors used as queries. A next-item model's held-out request is a rating
line: its query is the user's earlier positives (the history the reader
cuts from `history`, the training ratings the file was split from, and the
file's earlier lines), its positive the line's movie; a line with no history
is no query, and the report counts them. An approximate index that keeps
less than 0.95 of exact search's figure is written all the same, and the
report says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from runtime.config.data import ModelInputs
from runtime.data.checks.bad_rows import BadRowLog
from runtime.data.movielens.reader import MovieLensReader
from runtime.data.movielens.vocab import Vocabulary
from runtime.data.tables.learn import with_learned
from runtime.retrieval.index import build_index
from runtime.retrieval.index_files import save_index
from runtime.retrieval.index_quality import IndexQuality, check_index
from runtime.serving.samples import file_samples, requests_reader
from runtime.serving.vectors import catalogue, item_vocabulary, learned_catalogue, row_ids
from runtime.storage.manifest import MANIFEST, file_facts
from runtime.storage.output import save_tensors

__all__ = ["INDEX_DIR", "ITEM_VECTORS", "ItemsReport", "export_items", "item_vectors"]

INDEX_DIR = "index"
ITEM_VECTORS = "item_vectors.pt"
RECALL_K = 100
RATIO = 0.95  # an approximate index must keep this share of exact search's recall
MAX_QUERIES = 10_000  # held-out requests the recall check reads at most
SELF_QUERIES = 1_000  # item vectors used as queries when there are no held-out requests
CHUNK = 1 << 16


@dataclass(frozen=True)
class ItemsReport:
    items: int
    quality: IndexQuality
    queries: int
    source: str  # what the queries were

    def describe(self) -> str:
        return f"{self.quality.describe()} ({self.queries:,} queries: {self.source})"


def item_vectors(model: nn.Module, rows: torch.Tensor) -> torch.Tensor:
    """The item tower on `rows` of the item table, chunk by chunk: [n, D]."""
    with torch.inference_mode():
        return torch.cat([model.item_vectors(chunk) for chunk in rows.split(CHUNK)])


def export_items(
    model: nn.Module,
    module: Any,
    directory: Path,
    *,
    kind: str,
    vocabulary: Vocabulary | None,
    eval_data: str | None,
    threshold: float,
    history: str | None = None,
    features: Path | None = None,
) -> tuple[dict[str, Any], ItemsReport]:
    """Write the item vectors and index of `model` into `directory`; the manifest's section and the report.
    `features`: the export's features.json, whose learned vocabulary of the item feature (if any) is the
    catalogue (runtime.serving.vectors)."""
    retrieval, inputs = module.RETRIEVAL, module.INPUTS
    table_rows = next(f.num_embeddings for f in inputs.sparse if f.name == retrieval["item_feature"])
    movie_rows = None if vocabulary is None else vocabulary.movies
    if features is not None:
        inputs = with_learned(inputs, features)
    learned = item_vocabulary(inputs, retrieval["item_feature"])
    rows, ids = catalogue(table_rows, movie_rows) if learned is None else learned_catalogue(learned)
    vectors = item_vectors(model, rows)
    save_tensors(vectors.clone(), directory / ITEM_VECTORS)
    index = build_index(vectors, ids, kind=kind)
    exact = build_index(vectors, ids, kind="exact")
    save_index(index, directory / INDEX_DIR)
    k = min(RECALL_K, ids.numel())
    if eval_data is not None:
        if retrieval.get("next_item"):
            queries, positives, empty = _held_out_next(
                model, inputs, eval_data, threshold, vocabulary, retrieval["item_feature"], history
            )
            past = f"histories from {history} and the file" if history else "histories from the file alone"
            source = f"{eval_data}, one held-out positive each, {past}; {empty:,} requests without a history skipped"
        else:
            queries, positives = _held_out(model, inputs, eval_data, threshold, vocabulary, retrieval["item_feature"])
            source = f"{eval_data}, one held-out positive each"
        quality = check_index(index, exact, queries, k, positives, threshold=RATIO)
    else:
        picked = torch.linspace(0, ids.numel() - 1, min(SELF_QUERIES, ids.numel())).long()
        queries, source = vectors[picked], "item vectors (no --eval-data: top-k overlap only)"
        quality = check_index(index, exact, queries, k, threshold=RATIO)
    report = ItemsReport(ids.numel(), quality, queries.shape[0], source)
    section = {
        **retrieval,
        "items": ids.numel(),
        "item_ids": "table rows" if learned is None else "vocabulary",
        "item_vectors": {"file": ITEM_VECTORS, **file_facts(directory / ITEM_VECTORS)},
        "index": {
            "directory": INDEX_DIR,
            "kind": index.kind,
            "params": dict(index.params),
            "manifest": {"file": f"{INDEX_DIR}/{MANIFEST}", **file_facts(directory / INDEX_DIR / MANIFEST)},
        },
        "quality": {
            "k": k,
            "queries": queries.shape[0],
            "source": source,
            "overlap": quality.overlap,
            "recall": quality.recall,
            "exact_recall": quality.exact_recall,
            "ratio": quality.ratio,
            "threshold": RATIO,
            "ok": quality.ok,
        },
    }
    return section, report


def _held_out(
    model: nn.Module,
    inputs: ModelInputs,
    data: str,
    threshold: float,
    vocabulary: Vocabulary | None,
    item_feature: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Query vectors and positive item ids of the first MAX_QUERIES held-out requests of `data`."""
    from runtime.data.errors import DataError

    reader = requests_reader(inputs, data, vocabulary, threshold, positives=True)
    queries, positives, count = [], [], 0
    with torch.inference_mode():
        for _, batch in file_samples(reader, 4096, BadRowLog("fail")):
            items = batch.sparse[item_feature]
            if not bool(items.lengths().eq(1).all()):
                raise DataError(f"{data}: the recall check needs one {item_feature} id per request")
            queries.append(model.query_vectors(batch.dense, batch.sparse))
            positives.append(row_ids(items.values(), None if vocabulary is None else vocabulary.movies))
            count += queries[-1].shape[0]
            if count >= MAX_QUERIES:
                break
    if not queries:
        raise DataError(f"{data}: no held-out requests to measure the index with")
    return torch.cat(queries)[:MAX_QUERIES], torch.cat(positives)[:MAX_QUERIES]


def _held_out_next(
    model: nn.Module,
    inputs: ModelInputs,
    data: str,
    threshold: float,
    vocabulary: Vocabulary | None,
    item_feature: str,
    history: str | None,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A next-item model's query vectors (each line's history) and positive item ids (the line's
    movie) of the first MAX_QUERIES held-out lines of `data` with a history, and how many lines
    read had none."""
    from runtime.data.errors import DataError

    reader = requests_reader(inputs, data, vocabulary, threshold, positives=True, history=history)
    if not isinstance(getattr(reader, "inner", reader), MovieLensReader):  # a CSV reader parses lines too, into rows
        raise DataError(f"{data}: the recall check of a next-item model reads MovieLens ratings (movielens:FILE)")
    movies = (reader.parse(line)[1] for _, _, line in reader.epoch_lines())
    queries, positives, count, empty = [], [], 0, 0
    with torch.inference_mode():
        for keys, batch in file_samples(reader, 4096, BadRowLog("fail")):
            following = torch.tensor([next(movies) for _ in keys], dtype=torch.long)
            if vocabulary is not None:
                following = torch.tensor([m if m in vocabulary.movies else -1 for m in following.tolist()])
            known = batch.sparse[item_feature].lengths() > 0
            empty += len(keys) - int(known.sum())
            queries.append(model.query_vectors(batch.dense, batch.sparse)[known])
            positives.append(following[known])
            count += queries[-1].shape[0]
            if count >= MAX_QUERIES:
                break
    if not sum(q.shape[0] for q in queries):
        hint = (
            ""
            if history
            else (
                ": pass --history movielens:TRAIN, the training ratings they were split from, where their histories are"
            )
        )
        raise DataError(f"{data}: no held-out requests with a history to measure the index with{hint}")
    return torch.cat(queries)[:MAX_QUERIES], torch.cat(positives)[:MAX_QUERIES], empty
