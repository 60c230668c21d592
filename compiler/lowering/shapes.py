"""Shape check: propagate meta tensors through the lowered graph.

Runs after `lower` and before code generation. Every block is built on the
meta device (no memory, no compute) and the sparse stages are replaced by
stand-ins that return embeddings of the planned widths, so the whole dense
program is checked at compile time: a width that does not fit becomes a
diagnostic at the spec line that produced the node, not a runtime error.
Records each node's output shape in `node.meta["shape"]` for the graph text.
Sequence blocks and the sequence functions of the graph's edges are stood in
for by `sequence_shapes` (they read lengths' values, which meta tensors lack).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from compiler.diagnostics import CompileError, Diagnostic
from compiler.lowering.instantiate import build_call
from compiler.lowering.lower import sparse_groups
from compiler.lowering.sequence_shapes import META_FUNCTIONS, SequenceShapeError, meta_forward
from compiler.lowering.sequences import sequence_groups
from compiler.lowering.types import LoweredModel
from runtime.retrieval.head import RetrievalOutput, next_item_output, two_tower_output
from runtime.sparse.jagged import JaggedTensor, KeyedJaggedTensor, KeyedTensor
from runtime.sharding.awaitable import Done

# A batch size no width in a real spec is likely to equal, so the text can
# print it as `B` without ambiguity.
META_BATCH = 3


def _meta_retrieval(
    query: torch.Tensor, item: torch.Tensor, ids: JaggedTensor, *attributes: JaggedTensor
) -> RetrievalOutput:
    """A retrieval head's output on meta tensors (the meta batch has no ids to check or pad)."""
    rows = item.shape[:-1]
    kept = torch.empty((*rows, len(attributes)), dtype=torch.long, device="meta") if attributes else None
    return RetrievalOutput(query, item, torch.empty(rows, dtype=torch.long, device="meta"), kept)


# The retrieval heads' outputs; their widths are checked by the spec's semantic pass.
RETRIEVAL_META = {two_tower_output: _meta_retrieval, next_item_output: _meta_retrieval}


def check_shapes(lowered: LoweredModel) -> LoweredModel:
    """Propagate shapes; raise CompileError naming the spec location of the first bad node."""
    ir = lowered.ir
    root = torch.nn.Module()
    for decl in lowered.modules:
        if decl.target == "sparse_arch":
            continue
        with torch.device("meta"):
            setattr(root, decl.target, build_call(decl.call, {"process_group": None}))  # one process
    if ir.tables:
        root.sparse_arch = _MetaSparseArch(lowered)
    dense = {f.name: torch.empty(META_BATCH, f.size, device="meta") for f in ir.dense}
    keys = [f.name for f in ir.sparse] + [t.name for t in ir.timestamps]
    sparse = KeyedJaggedTensor.from_lengths_sync(
        keys=keys,
        values=torch.empty(0, dtype=torch.long),
        lengths=torch.zeros(META_BATCH * len(keys), dtype=torch.long),
        weights=torch.empty(0) if any(f.weighted for f in ir.sparse) else None,  # as the readers give them
        stride=META_BATCH,
    )
    # Eval mode: dropout's masks and batch norm's statistics need values, which meta tensors lack.
    try:
        _ShapeInterpreter(fx.GraphModule(root, lowered.graph).eval()).run(dense, sparse)
    except _ShapeFailure as failure:
        raise CompileError([failure.diagnostic]) from None
    _check_heads(lowered)
    return lowered


class _ShapeInterpreter(fx.Interpreter):
    def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
        module = self.fetch_attr(target)
        expected = getattr(module, "in_features", None)
        if expected is not None and isinstance(args[0], torch.Tensor) and args[0].shape[-1] != expected:
            raise _WidthError(f"the block takes width {expected} but its inputs give {args[0].shape[-1]}")
        try:
            result = meta_forward(module, args)
        except SequenceShapeError as exc:
            raise _WidthError(str(exc)) from None
        return result if result is not None else super().call_module(target, args, kwargs)

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        if target in META_FUNCTIONS:
            return META_FUNCTIONS[target](*args, **kwargs)
        if target in RETRIEVAL_META:
            return RETRIEVAL_META[target](*args, **kwargs)
        return super().call_function(target, args, kwargs)

    def run_node(self, node: fx.Node) -> Any:
        try:
            result = super().run_node(node)
        except _WidthError as exc:
            raise _ShapeFailure(_diagnostic(node, f"shapes do not fit: {exc}")) from None
        except Exception as exc:  # any failure inside a block is the spec's width problem
            message = f"shapes do not fit (checked with batch size {META_BATCH}): {_first_line(exc)}"
            raise _ShapeFailure(_diagnostic(node, message)) from None
        if isinstance(result, torch.Tensor) and result.dim() and result.shape[0] == META_BATCH:
            node.meta["shape"] = tuple(result.shape)  # not the rows of a sequence: their count is no batch
        return result


class _WidthError(Exception):
    pass


class _ShapeFailure(Exception):
    """Carries the diagnostic out of fx's interpreter, which annotates what passes through it."""

    def __init__(self, diagnostic: Diagnostic) -> None:
        super().__init__(str(diagnostic))
        self.diagnostic = diagnostic


def _check_heads(lowered: LoweredModel) -> None:
    output = next(n for n in lowered.graph.nodes if n.op == "output")
    problems = []
    for head in lowered.ir.heads:
        if head.retrieval is not None:
            continue  # a RetrievalOutput, not a tensor
        node = output.args[0][head.name]
        shape = node.meta.get("shape")
        want = (META_BATCH,) if head.loss != "softmax" else (META_BATCH, head.num_classes)
        if shape != want:
            problems.append(
                Diagnostic(
                    head.loc,
                    f"heads.{head.name}",
                    f"a {head.loss} head needs {_text(want)} per batch, but its input gives {_text(shape)}",
                )
            )
    if problems:
        raise CompileError(problems)


def _text(shape: tuple[int, ...] | None) -> str:
    if shape is None:
        return "no tensor"
    dims = ["B" if i == 0 else str(d) for i, d in enumerate(shape)]
    return "[" + ", ".join(dims) + "]"


def _diagnostic(node: fx.Node, message: str) -> Diagnostic:
    return Diagnostic(node.meta["loc"], node.meta.get("path", ""), f"{message} (node %{node.name})")


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


class _MetaGroup(torch.nn.Module):
    """Stands in for one sharding group: ids in, embeddings of the planned widths out."""

    def __init__(self, keys: list[str], widths: list[int], output_dist: torch.nn.Module | None = None) -> None:
        super().__init__()
        self.input_dist = _Passthrough()
        self.lookup = _Passthrough()
        self.output_dist = output_dist if output_dist is not None else _MetaEmbeddings(keys, widths)


class _Passthrough(torch.nn.Module):
    def forward(self, value: Any) -> Any:
        return Done(value) if not isinstance(value, Done) else value.wait()


class _MetaEmbeddings(torch.nn.Module):
    def __init__(self, keys: list[str], widths: list[int]) -> None:
        super().__init__()
        self.keys, self.widths = keys, widths

    def forward(self, _: Any) -> Done:
        values = torch.empty(META_BATCH, sum(self.widths), device="meta")
        return Done(KeyedTensor(keys=self.keys, length_per_key=self.widths, values=values))


class _MetaRows(torch.nn.Module):
    """A sequence group's output: each feature's rows, none, [0, width], with zero lengths."""

    def __init__(self, keys: list[str], widths: list[int]) -> None:
        super().__init__()
        self.keys, self.widths = keys, widths

    def forward(self, _: Any) -> Done:
        lengths = torch.zeros(META_BATCH, dtype=torch.long)
        rows = {key: JaggedTensor(torch.empty(0, width), lengths=lengths) for key, width in zip(self.keys, self.widths)}
        return Done(rows)


class _MetaSparseArch(torch.nn.Module):
    def __init__(self, lowered: LoweredModel) -> None:
        super().__init__()
        ir = lowered.ir
        dims = {f.name: ir.table(f.table).dim for f in ir.sparse}
        for group, keys in sparse_groups(ir, lowered.plan):
            self.add_module(group, _MetaGroup(keys, [dims[k] for k in keys]))
        for group, keys in sequence_groups(ir, lowered.plan):
            self.add_module(group, _MetaGroup(keys, [dims[k] for k in keys], _MetaRows(keys, [dims[k] for k in keys])))
