"""The options of blocks beyond their shape: mlp's norm / dropout / residual, PLE's experts, heads on probabilities.

Used by `compiler.spec.build` while it infers each block's op. Each function
reads a block's (or head's) keys, reports a misuse at the key that causes it,
and returns the values the IR holds, or INVALID when something was wrong.
"""

from __future__ import annotations

from typing import Any

from compiler.ir import Activation, Mlp
from compiler.spec.checker import INVALID, Checker, known
from compiler.spec.load import Node
from compiler.spec.values import ParsedBlock

MLP_OPTIONS = ("norm", "dropout", "residual")


def mlp_options(checker: Checker, block: ParsedBlock, layers: list[int], final: Any) -> Any:
    """{norm, dropout, residual} of an mlp, or INVALID (reported).

    They decorate the layers followed by an activation; an mlp whose only
    layer is linear (final_activation none) has no such layer.
    """
    values = {
        "norm": checker.value(block.node, "norm", "none"),
        "dropout": checker.value(block.node, "dropout", 0.0),
        "residual": checker.value(block.node, "residual", False),
    }
    if not known(*values.values()):
        return INVALID
    values["dropout"] = float(values["dropout"])
    defaults = ("none", 0.0, False)
    used = [key for key in MLP_OPTIONS if checker.child(block.node, key) is not None and values[key] not in defaults]
    if used and len(layers) == 1 and final == "none":
        at = checker.child(block.node, used[0])
        assert at is not None
        message = (
            f"{used[0]} applies to the layers followed by an activation, and this mlp's only layer is linear "
            "(final_activation: none); add a hidden layer or set final_activation"
        )
        checker.error(at, message, at_key=True)
        return INVALID
    return values


def ple_options(checker: Checker, block: ParsedBlock, experts: Any, layers: list[int]) -> Any:
    """(task_experts, levels, per_level) of a moe block, or INVALID (reported).

    `per_level` entries default to the block's num_experts (`experts`), task_experts and expert_layers
    (`layers`); `levels`, when written beside it, must count its entries.
    """
    task_experts = checker.value(block.node, "task_experts", 0)
    entries = checker.entries(block.node, "per_level") if checker.child(block.node, "per_level") else []
    levels = checker.value(block.node, "levels", len(entries) or 1)
    if not known(task_experts, levels, experts):
        return INVALID
    per_level = []
    for entry in entries:
        values = (
            checker.value(entry, "num_experts", experts),
            checker.value(entry, "task_experts", task_experts),
            checker.value(entry, "expert_layers", layers),
        )
        if not known(*values):
            return INVALID
        per_level.append((values[0], values[1], tuple(values[2])))
    if entries and levels != len(entries):
        at = checker.child(block.node, "levels")
        assert at is not None
        checker.error(at, f"levels: {levels}, but per_level describes {len(entries)} levels; write one of them")
        return INVALID
    if entries:
        missing = [i for i, (_, task, _) in enumerate(per_level) if task == 0]
        for i in missing:
            checker.error(entries[i], f"per_level[{i}] has no task experts: set its task_experts or the block's")
        # The block's task_experts describes the first level (is_ple holds it).
        return INVALID if missing else (per_level[0][1], levels, tuple(per_level))
    if levels > 1 and task_experts == 0:
        at = checker.child(block.node, "levels")
        assert at is not None
        message = (
            f"levels: {levels} stacks PLE extraction layers, which need task-specific experts: "
            "set task_experts (at least 1)"
        )
        checker.error(at, message)
        return INVALID
    return task_experts, levels, ()


def head_output(checker: Checker, head: Node, loss: Any, source: Any, readers: dict[str, Any]) -> Any:
    """A head's `output` ("logit" or "probability"), or INVALID (reported).

    `source` is the block the head reads (its ParsedBlock, its op inferred), if
    it resolved; `readers` maps each head reading that block to its `output`.
    A probability head must read values in [0, 1]: an mlp ending in a linear
    layer gives logits, so it is refused. A bce or softmax head reading logits
    must not read a sigmoid's output: the loss would squash it again.
    """
    output = checker.value(head, "output", "logit")
    node = checker.child(head, "output")
    if output == "logit" and known(loss) and loss in ("bce", "softmax") and isinstance(source, ParsedBlock):
        return _logit_source(checker, head, loss, source)
    if output != "probability" or node is None:
        return output
    if known(loss) and loss != "bce":
        checker.error(node, f"output: probability applies to bce heads only (this head's loss is {loss})")
        return INVALID
    if isinstance(source, ParsedBlock) and source.kind == "mlp":
        final = source.op.final_activation if isinstance(source.op, Mlp) else INVALID
        others = [name for name, read in readers.items() if read != "probability"]
        if final == "none" and others and checker.child(source.node, "final_activation") is None:
            other = f"head '{others[0]}' reads it as {'a logit' if readers[others[0]] == 'logit' else 'a vector'}"
            message = (
                f"output: probability needs values in [0, 1], but mlp '{source.name}' ends with a linear layer: "
                f"{other}, and one block gives one or the other; read the logit here as well (a bce head's "
                "probability is its sigmoid) or give this head its own block"
            )
            checker.error(node, message)
            return INVALID
        if final not in ("sigmoid", INVALID):
            message = (
                f"output: probability needs values in [0, 1], but mlp '{source.name}' ends with "
                f"final_activation {final}; use sigmoid (or leave it out) or read the logit (output: logit)"
            )
            checker.error(node, message)
            return INVALID
        shifted = [key for key, off in (("dropout", 0), ("residual", False)) if checker.value(source.node, key, off)]
        if shifted and known(*(checker.value(source.node, key) for key in shifted)):
            effect = "scales its kept outputs by 1/(1-p)" if shifted[0] == "dropout" else "adds its input"
            message = (
                f"output: probability needs values in [0, 1], but mlp '{source.name}' applies {shifted[0]} to its "
                f"sigmoid output (it {effect}); end the mlp with a linear layer and add an activation block"
            )
            checker.error(node, message)
            return INVALID
    return output


def _logit_source(checker: Checker, head: Node, loss: str, source: ParsedBlock) -> Any:
    """ "logit", or INVALID (reported) when the block a logit head reads ends with a sigmoid."""
    if isinstance(source.op, Mlp) and source.op.final_activation == "sigmoid":
        ends, linear = f"mlp '{source.name}' ends with final_activation sigmoid", "set final_activation: none"
    elif isinstance(source.op, Activation) and source.op.fn == "sigmoid":
        ends, linear = f"activation block '{source.name}' is a sigmoid", "read the sigmoid's input"
    else:
        return "logit"
    at = checker.child(head, "output") or checker.child(head, "input") or head
    if loss == "bce":
        fix = f"read them as such (output: probability) or {linear}"
        message = f"a bce head reads a logit unless told otherwise, but {ends}: its values are probabilities; {fix}"
    else:
        message = f"a softmax head reads one logit per class, but {ends}: its values are squashed into (0, 1); {linear}"
    checker.error(at, message)
    return INVALID
