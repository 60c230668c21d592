"""TrainPipeline: the next batch's input side runs while this batch trains.

The compiler cuts the model's graph at the pipeline boundary
(compiler/lowering/split.py), and the generated Model has the two stages as methods;
`forward` is the one after the other, so the plain loop and this pipeline
run the same compiled code:

    stage 0  fetch the batch, copy it to the device (pinned, non-blocking on
             cuda), model.input_dist(dense, sparse) -> staged values: the ids
             all-to-alls started (counts exchanged, ids and lengths in flight)
    stage 1  model.compute(*staged) -> {head: output} (lookup waits for the
             ids), loss, backward (the tables update inside it), dense optimizer

`progress(iterator)` trains one batch. With depth d it first tops the
pipeline up to d batches through stage 0, then runs stage 1 on the oldest:
depth 1 is the plain loop; depth 2 runs stage 0 of batch i+1 before stage 1
of batch i, so batch i+1's ids travel (on gloo's worker threads, or NCCL's
stream) while batch i runs forward, backward and the optimizer.

Order of collectives. They pair up across ranks by issue order, and every
rank runs this same code, so each issues them in this order:

    progress() for batch i, depth 2
      input_dist(i+1)  counts all-to-all (waited), ids all-to-all (async)
      compute(i)       lookup waits for ids(i), issued one progress() earlier;
                       pooled all-to-all(i) (async, waited before first use)
      backward(i)      pooled-gradient all-to-all(i), DDP's all-reduces(i)
      optimizer(i)     none

Exactness: stage 0 reads the batch only (ids, lengths, dense features),
never a parameter, so running it early changes no value, and the tables and
dense parameters are updated in the plain loop's order: losses and tables
equal the plain loop's bit for bit.

Dense DDP (runtime/sharding/dense.py): `input_dist` runs outside DDP (it
touches no dense parameter) and `compute` runs as DDP's forward, so DDP
prepares its gradient all-reduce as it does for a whole forward.

Errors: a failure in any stage is raised once, as `PipelineError` naming the
stage and the batch (the original is its `__cause__`). The pipeline is then
closed: its queued batches' collectives would no longer pair with the peers'.
The iterator's end is not an error: the queued batches drain, one per
progress(), then progress() raises StopIteration (and a new iterator may
follow, e.g. the next epoch).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch.autograd.profiler import record_function

from runtime.data.batch import Batch
from runtime.train.dense_optimizer import step as step_dense

_END = object()


class PipelineError(RuntimeError):
    """A stage failed: `stage` (fetch, copy, input_dist, compute, loss, backward or
    optimizer) and `batch` (0-based, in fetch order) say where."""

    def __init__(self, stage: str, batch: int, error: BaseException) -> None:
        super().__init__(f"pipeline stage {stage!r} failed on batch {batch}: {type(error).__name__}: {error}")
        self.stage, self.batch = stage, batch


@dataclass
class _Staged:
    index: int
    batch: Batch
    values: tuple[Any, ...]  # what input_dist returned: compute's arguments


class TrainPipeline:
    """Trains `model` one batch per `progress()`, stage 0 running `depth - 1` batches ahead.

    `model` is a generated Model, or that model in `distribute_dense`'s DDP:
    anything with `input_dist`, `compute` and `loss`. `optimizer` steps the
    dense parameters (the tables update themselves in backward). `device`:
    where batches are copied before input_dist; None leaves them where they are.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        device: torch.device | str | None = None,
        depth: int = 2,
    ) -> None:
        if depth < 1:
            raise ValueError(f"pipeline depth must be at least 1, got {depth}")
        missing = [name for name in ("input_dist", "compute", "loss") if not hasattr(model, name)]
        if missing:
            raise TypeError(
                f"TrainPipeline needs a compiled model's stages; {type(model).__name__} has no "
                f"{', '.join(missing)} (recompile the spec: modules from before the stage cut lack them)"
            )
        self._model, self._optimizer, self._depth = model, optimizer, depth
        self._device = torch.device(device) if device is not None else None
        self._queue: deque[_Staged] = deque()
        self._fetched = 0  # batches taken from iterators so far
        self._exhausted = False  # the current iterator has ended; draining
        self._failure: str | None = None
        self.last_batch: Batch | None = None  # the batch the last progress() trained

    def progress(self, iterator: Iterator[Batch]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Train the next batch: (its detached local loss, its heads' detached outputs).

        Raises StopIteration once `iterator` has ended and every batch taken
        from it has been trained.
        """
        if self._failure is not None:
            raise RuntimeError(f"the pipeline is closed: {self._failure}")
        self._fill(iterator)
        if not self._queue:
            self._exhausted = False
            raise StopIteration
        return self._train(self._queue.popleft())

    def _fill(self, iterator: Iterator[Batch]) -> None:
        """Stage 0 for batches until `depth` are staged or the iterator ends."""
        while not self._exhausted and len(self._queue) < self._depth:
            index = self._fetched
            batch = self._run("fetch", index, next, iterator, _END)
            if batch is _END:
                self._exhausted = True
                return
            self._fetched += 1
            batch = self._run("copy", index, self._to_device, batch)
            values = self._run("input_dist", index, self._model.input_dist, batch.dense, batch.sparse)
            self._queue.append(_Staged(index, batch, tuple(values)))

    def _train(self, staged: _Staged) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Stage 1, in the order of runtime.train.loop.train_step."""
        model, index = self._model, staged.index
        outputs = self._run("compute", index, model.compute, *staged.values)
        loss = self._run("loss", index, model.loss, outputs, staged.batch.labels)
        self._optimizer.zero_grad(set_to_none=True)
        self._run("backward", index, loss.backward)
        self._run("optimizer", index, step_dense, self._optimizer)
        self.last_batch = staged.batch
        return loss.detach(), {name: output.detach() for name, output in outputs.items()}

    def _to_device(self, batch: Batch) -> Batch:
        if self._device is None or batch.sparse.device() == self._device:
            return batch
        if self._device.type == "cuda" and batch.sparse.device().type == "cpu":
            # Pinned host memory lets the copy run asynchronously; it is queued on the
            # current stream, ahead of this batch's input_dist, which reads it there.
            batch = batch.pin_memory()
        return batch.to(self._device, non_blocking=True)

    def _run(self, stage: str, index: int, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` as `stage` of batch `index`: profiled under its name, failures named."""
        try:
            with record_function(f"## pipeline.{stage} ##"):
                return fn(*args)
        except Exception as error:
            self._queue.clear()
            self._failure = f"stage {stage!r} failed on batch {index}"
            raise PipelineError(stage, index, error) from error
