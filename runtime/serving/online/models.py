"""What the server serves: an export directory loaded once, or a retrieval export feeding a ranking one.

    model = load_model(Path("out"), k=10)            # a ranking model, or a retrieval model's top k
    model.name, model.inputs, model.outputs          # the spec's name; raw columns; (name, datatype, dims)
    answers = model.predict([request, ...])          # one (outputs, parameters) or BadRequest per request
    pipeline = load_pipeline(Path("retrieval_out"), Path("ranking_out"), k=100, n=10)

A ranking model answers one FP32 output per head, shape [N] ([N, C] for a
softmax head): the scores `reccompile predict` writes (runtime.serving.predict).
A retrieval model answers `items` (INT64 [N, K], the items' own ids, -1 past
the index's end; BYTES, the raw values such as a CSV's `m345`, "" past the
end, when the item feature has a learned vocabulary) and `scores` (FP32
[N, K]), as `reccompile retrieve` writes them.
A pipeline takes the retrieval model's K candidates per row, scores every
(row, candidate) pair with the ranking model's first head, the candidate's
id (its raw value with a learned vocabulary: the ranking model maps it
through its own) in the ranking model's column of the retrieval's item
feature and the row's own values in the others, and answers the best N
(`items`, `scores`, ties in retrieval order) with each stage's milliseconds
in the response's parameters. The models hold no feature logic: rows go through
runtime.serving.online.raw_rows, scores through the export's own `scores`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from runtime.data.errors import DataError
from runtime.data.movielens.vocab import read_vocabulary
from runtime.data.tables.learn import with_learned
from runtime.retrieval.index_files import load_index
from runtime.serving.export_dir import data_file, load, read_export_manifest
from runtime.serving.online.protocol import BadRequest, InferRequest, Output
from runtime.serving.online.raw_rows import BadValue, RawInput, RawRows, raw_rows
from runtime.serving.vectors import item_names, item_vocabulary

__all__ = ["Answer", "ServedModel", "load_model", "load_pipeline"]

# One request's outputs and the response's parameters, or the BadRequest of its bad row.
Answer = tuple[list[Output], dict[str, Any]]


@dataclass(frozen=True)
class ServedModel:
    name: str
    source: str  # the export directory (or directories) it was loaded from
    inputs: tuple[RawInput, ...]
    outputs: tuple[tuple[str, str, tuple[int, ...]], ...]  # name, datatype, dims (-1: the rows)
    predict: Callable[[Sequence[InferRequest]], list[Answer | BadRequest]]

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(name for name, _, _ in self.outputs)


def load_model(directory: Path, *, k: int = 10, verify: bool = True, reader: str | None = None) -> ServedModel:
    """The export at `directory`; a retrieval export answers its top `k` items per row; `reader`: whose
    columns requests carry when the spec has no data section (runtime.serving.online.raw_rows).
    ExportError, IndexFileError or DataError when it cannot be served."""
    manifest = read_export_manifest(directory)
    if "retrieval" in manifest:
        return _retrieval(directory, manifest, k, verify, reader).served
    module, loaded = load(directory, verify=verify)
    model: Any = loaded  # the generated module's Model: scores, query_vectors
    rows = _rows(module, directory, verify, reader)
    heads = module.INPUTS.heads
    outputs = tuple((h.name, "FP32", (-1, h.num_classes) if h.loss == "softmax" else (-1,)) for h in heads)

    def predict(requests: Sequence[InferRequest]) -> list[Answer | BadRequest]:
        answers, parsed = _parse(rows, requests)
        if parsed:
            batch = rows.batch([row for _, part in parsed for row in part])
            with torch.inference_mode():
                scores = model.scores(model(batch.dense, batch.sparse))
            per_head = [_sliced(h.name, scores[h.name], h.loss != "softmax") for h in heads]
            _answer_each(answers, parsed, lambda lo, hi: ([output(lo, hi) for output in per_head], {}))
        return answers

    return ServedModel(manifest["name"], str(directory), rows.inputs, outputs, predict)


@dataclass(frozen=True)
class _Retrieval:
    served: ServedModel
    rows: RawRows
    search: Callable[[Any], tuple[torch.Tensor, torch.Tensor]]  # a batch -> (scores, item ids) [B, K]
    item_column: str  # the raw column the item feature reads
    names: dict[int, str] | None  # item id -> its raw value, with a learned vocabulary on the item feature

    def raw_ids(self, items: torch.Tensor) -> list[Any]:
        """`items` [B, K] flattened as the raw values the item column takes (ids, or names; "" past the end)."""
        ids = items.reshape(-1).tolist()
        return ids if self.names is None else [self.names.get(i, "") for i in ids]


def _retrieval(directory: Path, manifest: dict[str, Any], k: int, verify: bool, reader: str | None) -> _Retrieval:
    section = manifest["retrieval"]
    module, loaded = load(directory, verify=verify)
    model: Any = loaded  # the generated module's Model: scores, query_vectors
    index = load_index(directory / section["index"]["directory"], verify=verify)
    k = min(k, len(index.ids))
    item = section["item_feature"]
    inputs = _learned(module, directory, verify)
    rows = _rows(module, directory, verify, reader, unused=(item,), inputs=inputs)
    vocabulary = item_vocabulary(inputs, item)
    names = None if vocabulary is None else item_names(vocabulary)

    def search(batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.inference_mode():
            return index.search(model.query_vectors(batch.dense, batch.sparse), k)

    def predict(requests: Sequence[InferRequest]) -> list[Answer | BadRequest]:
        answers, parsed = _parse(rows, requests)
        if parsed:
            scores, items = search(rows.batch([row for _, part in parsed for row in part]))
            both = (_sliced("items", items, names=names), _sliced("scores", scores))
            _answer_each(answers, parsed, lambda lo, hi: ([output(lo, hi) for output in both], {}))
        return answers

    outputs = (("items", "INT64" if names is None else "BYTES", (-1, k)), ("scores", "FP32", (-1, k)))
    served = ServedModel(manifest["name"], str(directory), rows.inputs, outputs, predict)
    return _Retrieval(served, rows, search, rows.feature_columns[item], names)


def load_pipeline(
    retrieval: Path, ranking: Path, *, k: int, n: int, verify: bool = True, reader: str | None = None
) -> ServedModel:
    """Retrieval's top `k` per row, ranked by the ranking export's first head, the best `n` answered."""
    manifest = read_export_manifest(retrieval)
    if "retrieval" not in manifest:
        raise DataError(f"{retrieval}: not a retrieval export (no sampled_softmax head, no index)")
    first = _retrieval(retrieval, manifest, k, verify, reader)
    ranked_manifest = read_export_manifest(ranking)
    if "retrieval" in ranked_manifest:
        raise DataError(f"{ranking}: a retrieval export, not a ranking model")
    module, loaded = load(ranking, verify=verify)
    model: Any = loaded
    head = module.INPUTS.heads[0]
    if head.loss == "softmax":
        raise DataError(
            f"{ranking}: its first head {head.name!r} is a softmax head, which gives no one score to rank by"
        )
    rank_rows = _rows(module, ranking, verify, reader)
    item = first.item_column
    if item not in {raw.name for raw in rank_rows.inputs}:
        raise DataError(f"{ranking}: the ranking model has no input {item!r} for the retrieved items")
    inputs = tuple({raw.name: raw for raw in [*first.rows.inputs, *rank_rows.inputs] if raw.name != item}.values())
    n = min(n, first.served.outputs[0][2][1])

    def predict(requests: Sequence[InferRequest]) -> list[Answer | BadRequest]:
        answers, parsed = _parse(first.rows, requests)
        if not parsed:
            return answers
        started = time.perf_counter()
        _, items = first.search(first.rows.batch([row for _, part in parsed for row in part]))
        retrieved = time.perf_counter()
        pairs, start = [], 0
        for index, part in parsed:
            request = requests[index]
            candidates = items[start : start + len(part)]
            start += len(part)
            fields = {
                raw.name: [v for v in request.fields[raw.name] for _ in range(candidates.shape[1])]
                for raw in rank_rows.inputs
                if raw.name != item
            }
            fields[item] = first.raw_ids(candidates)
            try:
                pairs.append((index, candidates, rank_rows.parse(fields, candidates.numel())))
            except BadValue as error:
                answers[index] = _bad(error)
        if pairs:
            batch = rank_rows.batch([row for _, _, part in pairs for row in part])
            with torch.inference_mode():
                scores = model.scores(model(batch.dense, batch.sparse))[head.name].reshape(-1)
        ranked = time.perf_counter()
        timing = {
            "retrieval_ms": round(1000 * (retrieved - started), 3),
            "ranking_ms": round(1000 * (ranked - retrieved), 3),
        }
        start = 0
        for index, candidates, _ in pairs:
            part = scores[start : start + candidates.numel()].reshape(candidates.shape)
            start += candidates.numel()
            order = torch.sort(part, dim=1, descending=True, stable=True).indices[:, :n]
            answers[index] = (
                [
                    _output("items", candidates.gather(1, order), names=first.names),
                    _output("scores", part.gather(1, order)),
                ],
                timing,
            )
        return answers

    outputs = (("items", first.served.outputs[0][1], (-1, n)), ("scores", "FP32", (-1, n)))
    name = f"{manifest['name']}_then_{ranked_manifest['name']}"
    return ServedModel(name, f"{retrieval} {ranking}", inputs, outputs, predict)


def _learned(module: Any, directory: Path, verify: bool) -> Any:
    """The module's inputs with the export's learned feature state (features.json), if it has one."""
    features = data_file(directory, "features", verify=verify)
    return module.INPUTS if features is None else with_learned(module.INPUTS, features)


def _rows(
    module: Any,
    directory: Path,
    verify: bool,
    reader: str | None,
    unused: Sequence[str] = (),
    inputs: Any = None,
) -> RawRows:
    """The export's raw rows with what `predict` reads beside the module: the MovieLens vocabulary, and
    the learned feature state (features.json; `inputs` when already read), applied by `with_learned`
    as predict applies it."""
    inputs = _learned(module, directory, verify) if inputs is None else inputs
    vocabulary = data_file(directory, "vocabulary", verify=verify)
    return raw_rows(inputs, None if vocabulary is None else read_vocabulary(vocabulary), unused, reader)


def _parse(rows: RawRows, requests: Sequence[InferRequest]) -> tuple[list[Any], list[tuple[int, list[Any]]]]:
    """Each request's parsed rows, or its BadRequest in the answers. The batch's requests are parsed in
    one call, their columns joined (one pass instead of one per request); only a batch holding a bad
    row is parsed again request by request, so that the bad request alone is refused, naming its row."""
    answers: list[Any] = [None] * len(requests)
    if len(requests) > 1:
        names = [raw.name for raw in rows.inputs]
        joined = {name: [value for request in requests for value in request.fields[name]] for name in names}
        try:
            every = rows.parse(joined, sum(request.rows for request in requests))
        except BadValue:
            pass
        else:
            parsed, start = [], 0
            for index, request in enumerate(requests):
                parsed.append((index, every[start : start + request.rows]))
                start += request.rows
            return answers, parsed
    parsed = []
    for index, request in enumerate(requests):
        try:
            parsed.append((index, rows.parse(request.fields, request.rows)))
        except BadValue as error:
            answers[index] = _bad(error)
    return answers, parsed


def _answer_each(answers: list[Any], parsed: list[tuple[int, list[Any]]], make: Callable[[int, int], Answer]) -> None:
    """Each parsed request's answer, `make(lo, hi)` of its rows' slice of the batch."""
    start = 0
    for index, part in parsed:
        answers[index] = make(start, start + len(part))
        start += len(part)


def _bad(error: BadValue) -> BadRequest:
    where = f"row {error.row}" if error.column is None else f"input {error.column!r}, row {error.row}"
    return BadRequest(f"{where}: {error.reason} (got {error.value!r})")


def _sliced(
    name: str, values: torch.Tensor, vector: bool = False, names: dict[int, str] | None = None
) -> Callable[[int, int], Output]:
    """Rows lo:hi of `values` [N, ...] as an output (see `_output`), the batch's values turned into Python
    numbers once rather than once per request (a tensor slice and `tolist` cost more than the copy)."""
    whole = _output(name, values, vector, names)
    width, inner = math.prod(values.shape[1:]), list(values.shape[1:])

    def output(lo: int, hi: int) -> Output:
        shape = [hi - lo] if vector else [hi - lo, *inner]
        return Output(name, whole.datatype, shape, whole.data[lo * width : hi * width])

    return output


def _output(name: str, values: torch.Tensor, vector: bool = False, names: dict[int, str] | None = None) -> Output:
    """`values` [N, ...] as an output: INT64 for ids (BYTES, their raw values, with `names`; "" for an
    id without one), FP32 otherwise; `vector`: shape [N]."""
    datatype = "INT64" if values.dtype == torch.int64 else "FP32"
    values = values.to(torch.int64 if datatype == "INT64" else torch.float32)
    shape = [values.shape[0]] if vector else list(values.shape)
    data = values.reshape(-1).tolist()
    if names is not None:
        return Output(name, "BYTES", shape, [names.get(i, "") for i in data])
    return Output(name, datatype, shape, data)
