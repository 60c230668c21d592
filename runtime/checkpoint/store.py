"""Checkpoints of a training run on torch.distributed.checkpoint (DCP): atomic, resumable, reshardable.

`save_checkpoint` writes, collectively, everything a run needs to continue
exactly where it was: the embedding tables and their fused optimizer state,
the dense parameters and the dense optimizer's state, the step, the sharding
plan, the spec's sha256, and the run's other Stateful objects by name
(runtime.checkpoint.states: each rank's RNG states and data position, the
learning-rate schedule, early stopping, the kernel choices the run made).
`load_checkpoint` puts them back, at any world size and with any plan for
the same spec. `load_model_state` and `read_checkpoint_manifest` read a checkpoint in
one process without a process group (the inference export uses them).
Where the files go, and why a save killed halfway harms nothing, is
`runtime.checkpoint.files`; the worker's options are `runtime.train.checkpointing`.

Keys in DCP, each a global tensor whatever the world size:

    model.<key>                      a dense entry of the world-size-1 `Model.state_dict()`
    model.<arch>.<table>.weight      a whole table (rows x dim); each rank writes the blocks
                                     it holds, at their global row and column offsets
    model.<arch>.<table>.<state>     fused optimizer state, laid out like the weight
                                     (momentum1, momentum2: rows x dim; rowwise momentum1: rows;
                                     Adam's iter: shape (1,))
    model.<arch>.<table>.momentum1@columns
                                     rowwise state of a table split into column shards, which
                                     keep one accumulator per row *and shard* (column_wise.py):
                                     stored rows x dim, each shard's accumulator repeated over
                                     its columns. A shard reads the mean over its columns: its
                                     own accumulator at the same plan, the column-width-weighted
                                     mean (an unsplit table's accumulator) when whole.
    optim.<parameter>.<state>        the dense optimizer's state, by parameter name
    rank.<r>                         rank r's RNG states and data position (pickled)

Resharding is DCP's: a rank describes the blocks it needs by global offset
and DCP reads the overlapping parts of the saved chunks, so a checkpoint from
2 ranks loads at 1 or 4, table_wise into row_wise, and so on. The custom
planners of `runtime.checkpoint.dcp` exist only because a rank's blocks of
one table are plain tensors here (SparseArch's local shards), not DTensor
or ShardedTensor.

Data position protocol: the worker's batches are indexed by step, so the
step is the position. An iterator that cannot be recreated from the step
offers `state_dict() -> dict` (picklable; the position after the batches the
completed steps consumed, not after a prefetch) and `load_state_dict(dict)`;
each rank's dict is saved under `rank.<r>` and handed back to the same rank.
At another world size ranks get None, and the worker draws and drops the
batches of the completed steps instead (runtime.train.checkpointing), as it does
for iterators without the protocol.
RNG states (torch CPU and CUDA, Python's `random`) are restored only at the
same world size too.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.nn.parallel import DistributedDataParallel

from runtime.checkpoint import dcp
from runtime.checkpoint.dcp import blocks_of
from runtime.checkpoint.files import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    CheckpointError,
    commit,
    complete_checkpoints,
    latest_checkpoint,
    prepare_partial,
    prune,
    read_manifest_file,
    resolve,
    verify_files,
)
from runtime.checkpoint.states import CheckpointStates
from runtime.sharding.sparse_arch import SparseArch

__all__ = [
    "CheckpointError",
    "Resumed",
    "latest_checkpoint",
    "load_checkpoint",
    "load_model_state",
    "read_checkpoint_manifest",
    "save_checkpoint",
]


COLUMNS = "@columns"
T = TypeVar("T")


@dataclass(frozen=True)
class Resumed:
    """What `load_checkpoint` restored besides the model and optimizer."""

    path: Path
    step: int
    manifest: dict[str, Any]
    data_state: Any  # this rank's saved data position; None at another world size
    skipped: tuple[str, ...] = ()  # keys the checkpoint lacked (only with allow_spec_change)
    passed_over: tuple[str, ...] = ()  # why each newer, damaged checkpoint was not used (fall_back)
    damaged: tuple[Path, ...] = ()  # those checkpoints: `save_checkpoint(damaged=...)` spares them


def save_checkpoint(
    directory: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    step: int,
    spec_sha256: str,
    plan: Mapping[str, Any],
    states: CheckpointStates | None = None,
    facts: Mapping[str, Any] | None = None,
    keep: int | None = None,
    process_group: dist.ProcessGroup | None = None,
    files: Mapping[str, bytes] | None = None,
    damaged: Collection[Path] = (),
) -> Path:
    """Write `DIR/step_<step>` atomically (collective on `process_group`); returns its path.

    `model` may be DDP-wrapped. `states` are the run's other Stateful objects by name
    (runtime.checkpoint.states: the schedule, early stopping and kernel choices in the
    manifest, each rank's RNG and data position under `rank.<r>`); without it, the RNG
    states alone. `facts` are plain manifest entries the run is checked against on resume
    ("global_batch_size", "seed"). `keep` prunes all but the newest `keep`, sparing the
    checkpoints `damaged` (a resume's `Resumed.damaged`).
    `files` (name -> contents, rank 0's) are saved beside the state and listed
    with their hashes in the manifest: what training used to read its data,
    such as the MovieLens vocabulary, travels with the weights it shaped.
    """
    states = states if states is not None else CheckpointStates()
    root = Path(directory)
    group = _group(process_group)
    rank, world_size = _rank_and_size(group)
    partial = _on_first_rank(lambda: prepare_partial(root, step), group)
    state = _save_state(_unwrap(model), optimizer, rank, states.rank_state())
    dcp.save(state, partial, group)
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "step": step,
        "world_size": world_size,
        "spec_sha256": spec_sha256,
        "plan": dict(plan),
        **(facts or {}),
        **states.shared_state(),
    }

    def finish() -> Path:
        for name, contents in (files or {}).items():
            (partial / name).write_bytes(contents)
        final = commit(partial, manifest)
        if keep is not None:
            prune(root, keep, upto=step, damaged=damaged)
        return final

    return _on_first_rank(finish, group)


def load_checkpoint(
    directory: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    spec_sha256: str,
    allow_spec_change: bool = False,
    fall_back: bool = False,
    process_group: dist.ProcessGroup | None = None,
    states: CheckpointStates | None = None,
) -> Resumed:
    """Restore the latest complete checkpoint in `directory` (or `directory` itself); collective.

    `states`: the Stateful objects saved with it, each handed its saved state
    (runtime.checkpoint.states); without it, the RNG states alone. A per-rank
    state is restored at the same world size only, and one saved but not
    registered (the data position, whose reader opens later) is in `Resumed.data_state`.

    The files are checked against the manifest first; with `fall_back`, a
    damaged checkpoint is passed over for the newest intact one before it
    (`Resumed.passed_over` says why). A checkpoint of another spec is
    refused unless `allow_spec_change`, which also lets entries the
    checkpoint lacks keep their fresh values (shapes must agree).
    """
    group = _group(process_group)
    rank, world_size = _rank_and_size(group)
    path, manifest, damaged = _on_first_rank(lambda: _newest_intact(directory, fall_back), group)
    if manifest["spec_sha256"] != spec_sha256 and not allow_spec_change:
        raise CheckpointError(
            f"{path}: written for another spec (sha256 {manifest['spec_sha256'][:12]}…, this "
            f"model's spec is {spec_sha256[:12]}…); pass --allow-spec-change to load it anyway"
        )
    metadata = dcp.read_metadata(path)
    model = _unwrap(model)
    targets = _LoadTargets(metadata.state_dict_metadata, path, allow_spec_change)
    apply_model = targets.model(model)
    apply_optimizer = targets.optimizer(model, optimizer)
    same_world = manifest["world_size"] == world_size
    rank_key = f"rank.{rank}"
    if same_world and rank_key in metadata.state_dict_metadata:
        targets.state[rank_key] = None  # DCP puts the unpickled object here
    dcp.load(targets.state, path, group)
    apply_model()
    apply_optimizer()
    saved = targets.state.get(rank_key) if same_world else None
    states = states if states is not None else CheckpointStates()
    states.load_shared(manifest)
    if saved is not None:
        states.load_rank(saved)
    return Resumed(
        path=path,
        step=int(manifest["step"]),
        manifest=manifest,
        data_state=saved["data"] if saved is not None else None,
        skipped=tuple(targets.skipped),
        passed_over=tuple(reason for _, reason in damaged),
        damaged=tuple(path for path, _ in damaged),
    )


def read_checkpoint_manifest(directory: str | Path) -> dict[str, Any]:
    """The manifest of the latest complete checkpoint in `directory` (or of `directory` itself).

    At least "spec_sha256", "step", "world_size" and "plan"; "path" is the
    checkpoint read. The data files are not checked (`load_model_state` does).
    """
    path = resolve(directory)
    return {**read_manifest_file(path), "path": str(path)}


def load_model_state(directory: str | Path) -> dict[str, torch.Tensor]:
    """The full, unsharded model state of the latest complete checkpoint in `directory`.

    Keyed as a world-size-1 `Model.state_dict()` of the generated module:
    dense entries, whole tables (`sparse_arch.<table>.weight`) and their
    optimizer state. One process, no process group.
    """
    path, _ = _checked(directory)
    metadata = dcp.read_metadata(path)
    state: dict[str, Any] = {
        fqn: torch.empty(entry.size, dtype=entry.properties.dtype)
        for fqn, entry in metadata.state_dict_metadata.items()
        if fqn.startswith("model.") and isinstance(entry, TensorStorageMetadata)
    }
    dcp.load(state, path, None)
    result = {}
    for fqn, tensor in state.items():
        key = fqn.removeprefix("model.")
        if key.endswith(COLUMNS):
            result[key.removesuffix(COLUMNS)] = tensor.mean(dim=1)
        else:
            result[key] = tensor
    return result


# What a rank writes.


def _save_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, rank: int, rank_state: dict[str, Any]
) -> dict[str, Any]:
    full = model.state_dict()
    archs = _sparse_archs(model)
    state: dict[str, Any] = {
        f"model.{key}": value for key, value in full.items() if not key.startswith(_prefixes(archs))
    }
    for prefix, arch in archs:
        for key, info, name, tensor in _local_shard_entries(prefix, arch, full):
            fqn = f"model.{prefix}{info['table']}.{name}"
            rows, dim = info["table_rows"], info["table_cols"]
            if name == "iter":
                state[fqn] = tensor
            elif tensor.dim() == 2:
                blocks_of(state, fqn, (rows, dim)).add((info["row_offset"], info["col_offset"]), tensor)
            elif info["cols"] == dim:
                blocks_of(state, fqn, (rows,)).add((info["row_offset"],), tensor)
            else:
                repeated = tensor.unsqueeze(1).expand(-1, info["cols"]).contiguous()
                blocks_of(state, fqn + COLUMNS, (rows, dim)).add((info["row_offset"], info["col_offset"]), repeated)
    for name, param_state in _optimizer_state(model, optimizer):
        for key, value in param_state.items():
            state[f"optim.{name}.{key}"] = value
    state[f"rank.{rank}"] = rank_state
    return state


# What a rank reads, and how it is put back.


@dataclass
class _LoadTargets:
    """The DCP state dict a rank loads into, checked against the checkpoint's metadata."""

    metadata: Mapping[str, Any]
    path: Path
    allow_missing: bool
    state: dict[str, Any] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)

    def model(self, model: nn.Module) -> Callable[[], None]:
        """Targets for the model's entries; the returned call loads them into the model."""
        full = model.state_dict()
        archs = _sparse_archs(model)
        loaded: dict[str, torch.Tensor] = dict(full)  # what is not loaded keeps its value
        after: list[Callable[[], None]] = []
        for key, value in full.items():
            if not key.startswith(_prefixes(archs)) and self._present(f"model.{key}", value.shape):
                loaded[key] = self.state[f"model.{key}"] = torch.empty_like(value)
        entries = [(prefix, *entry) for prefix, arch in archs for entry in _local_shard_entries(prefix, arch, full)]
        fresh = self._other_table_optimizers(entries)
        for prefix, key, info, name, tensor in entries:
            if name != "weight" and f"{prefix}{info['table']}" in fresh:
                continue  # keeps its fresh value
            fqn = f"model.{prefix}{info['table']}.{name}"
            rows, dim = info["table_rows"], info["table_cols"]
            block = (info["row_offset"], info["col_offset"])
            target = loaded[key] = torch.empty_like(tensor)
            if name == "iter":
                if self._present(fqn, tensor.shape):
                    after.append(_copier(target, self.state.setdefault(fqn, target)))
            elif tensor.dim() == 2:
                if self._present(fqn, (rows, dim)):
                    blocks_of(self.state, fqn, (rows, dim)).add(block, target)
            elif fqn not in self.metadata and fqn + COLUMNS in self.metadata:
                if self._present(fqn + COLUMNS, (rows, dim)):
                    repeated = torch.empty(tensor.shape[0], info["cols"])
                    blocks_of(self.state, fqn + COLUMNS, (rows, dim)).add(block, repeated)
                    after.append(_copier(target, repeated, mean=True))
            elif self._present(fqn, (rows,)):
                # Column shards of one table on this rank read the same rows: once.
                held = blocks_of(self.state, fqn, (rows,)).add(block[:1], target)
                if held is not target:
                    after.append(_copier(target, held))
            if fqn not in self.state and fqn + COLUMNS not in self.state:
                loaded[key] = tensor  # skipped: keeps its value

        def apply() -> None:
            for step in after:
                step()
            model.load_state_dict(loaded, strict=True)

        return apply

    def _other_table_optimizers(self, entries: list[tuple[str, str, dict[str, Any], str, torch.Tensor]]) -> set[str]:
        """The tables (`<prefix><table>`) whose optimizer state the checkpoint holds under other
        names or shapes than this model's table optimizer keeps (adam's momentum1 and momentum2
        where adagrad keeps momentum1 alone, or a per-row momentum1 where it keeps one per value):
        they were trained with another table optimizer. An error, or with allow_missing a fresh
        optimizer state for each (its weights still load), reported as skipped."""
        keeps: dict[str, set[tuple[str, int]]] = {}
        for prefix, _, info, name, tensor in entries:
            kept = keeps.setdefault(f"{prefix}{info['table']}", set())
            if name != "weight":
                kept.add((name, 0 if name == "iter" else tensor.dim()))
        other = set()
        for table, kept in sorted(keeps.items()):
            head = f"model.{table}."
            if head + "weight" not in self.metadata:
                continue  # a table the checkpoint lacks: its weight is refused or skipped
            saved = set()
            for fqn, entry in self.metadata.items():
                name = fqn[len(head) :]
                if not fqn.startswith(head) or name == "weight" or "." in name:
                    continue
                if name.endswith(COLUMNS):  # a per-row state of a column-sharded table
                    saved.add((name.removesuffix(COLUMNS), 1))
                elif isinstance(entry, TensorStorageMetadata):
                    saved.add((name, 0 if name == "iter" else len(entry.size)))
            if saved == kept:
                continue
            self._another_optimizer(
                f"{self.path}: table {table.rpartition('.')[2]!r} has the optimizer state {_spell_state(saved)}, "
                f"where this run's table optimizer keeps {_spell_state(kept)}: it was trained with another "
                "table optimizer",
                f"{head.removeprefix('model.')}* optimizer state (another table optimizer's: {_spell_state(saved)})",
            )
            other.add(table)
        return other

    def optimizer(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> Callable[[], None]:
        """Targets for the dense optimizer's state; the returned call loads them.

        A checkpoint whose per-parameter state has other names than this optimizer keeps (adagrad's
        `sum` where adam keeps `exp_avg` and `exp_avg_sq`, say) was trained with another dense
        optimizer: an error, or with allow_missing a fresh state, reported as skipped."""
        names = _parameter_names(model, optimizer)
        wanted: dict[int, dict[str, str]] = {}
        for index, name in enumerate(names):
            head = f"optim.{name}."
            for fqn in self.metadata:
                if fqn.startswith(head) and "." not in fqn[len(head) :]:
                    wanted.setdefault(index, {})[fqn[len(head) :]] = fqn
        keeps = _state_names(optimizer)
        saved = {frozenset(keys) for keys in wanted.values()}
        if not saved and keeps and names:  # no state at all: a stateless optimizer (sgd) trained it
            saved = {frozenset()}
        other = next((keys for keys in sorted(saved, key=sorted) if keys != keeps), None)
        if other is not None:
            self._another_optimizer(
                f"{self.path}: the dense optimizer's state has {', '.join(sorted(other)) or 'no entries'}, "
                f"where this run's {type(optimizer).__name__} keeps {', '.join(sorted(keeps)) or 'none'}: "
                "it was trained with another dense optimizer",
                f"optim.* (the state of another dense optimizer: {', '.join(sorted(other))})",
            )
            return lambda: None
        for keys in wanted.values():
            for fqn in keys.values():
                entry = self.metadata[fqn]
                is_tensor = isinstance(entry, TensorStorageMetadata)
                self.state[fqn] = torch.empty(entry.size, dtype=entry.properties.dtype) if is_tensor else None

        def apply() -> None:
            current = optimizer.state_dict()
            for index, keys in wanted.items():
                current["state"][index] = {name: self.state[fqn] for name, fqn in keys.items()}
            optimizer.load_state_dict(current)

        return apply

    def _another_optimizer(self, problem: str, skipped: str) -> None:
        """State another optimizer saved: CheckpointError, or with allow_missing `skipped` (it starts afresh)."""
        if not self.allow_missing:
            raise CheckpointError(f"{problem}; pass --allow-spec-change to start that state afresh")
        self.skipped.append(skipped)

    def _present(self, fqn: str, shape: tuple[int, ...] | torch.Size) -> bool:
        """Whether to load `fqn`; CheckpointError if it is missing (unless allowed) or misshapen."""
        entry = self.metadata.get(fqn)
        if entry is None:
            if not self.allow_missing:
                raise CheckpointError(f"{self.path}: has no entry {fqn!r}, which this model needs")
            self.skipped.append(fqn)
            return False
        if not isinstance(entry, TensorStorageMetadata) or tuple(entry.size) != tuple(shape):
            saved = tuple(entry.size) if isinstance(entry, TensorStorageMetadata) else "an object"
            raise CheckpointError(
                f"{self.path}: entry {fqn!r} has shape {saved} in the checkpoint but {tuple(shape)} in this model"
            )
        return True


def _spell_state(names: set[tuple[str, int]]) -> str:
    """`momentum1 per value, momentum2 per value, iter`, or `none`."""
    shapes = {0: "", 1: " per row", 2: " per value"}
    return ", ".join(f"{name}{shapes.get(dims, '')}" for name, dims in sorted(names)) or "none"


def _state_names(optimizer: torch.optim.Optimizer) -> frozenset[str]:
    """The names of the state `optimizer` keeps per parameter, from one step of a twin on one value."""
    probe = torch.zeros(1, requires_grad=True)
    accepted = inspect.signature(type(optimizer)).parameters  # AdamW's defaults hold a key it does not take
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
    twin = type(optimizer)([probe], **{k: v for k, v in optimizer.defaults.items() if takes_any or k in accepted})
    probe.grad = torch.zeros(1)
    twin.step()
    return frozenset(twin.state[probe])


def _copier(target: torch.Tensor, source: torch.Tensor, mean: bool = False) -> Callable[[], None]:
    def copy() -> None:
        target.copy_(source.mean(dim=1) if mean else source)

    return copy


# Model, optimizer and RNG plumbing.


def _unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, DistributedDataParallel) else model


def _sparse_archs(model: nn.Module) -> list[tuple[str, SparseArch]]:
    """(state-dict prefix, module) of every SparseArch in `model`."""
    return [
        (f"{name}." if name else "", module) for name, module in model.named_modules() if isinstance(module, SparseArch)
    ]


def _prefixes(archs: list[tuple[str, SparseArch]]) -> tuple[str, ...]:
    # Plan-derived buffers of a SparseArch are rebuilt from the plan, never saved.
    return tuple(prefix for prefix, _ in archs)


def _local_shard_entries(
    prefix: str, arch: SparseArch, full: Mapping[str, torch.Tensor]
) -> Iterator[tuple[str, dict[str, Any], str, torch.Tensor]]:
    """(state-dict key, shard metadata, state name, tensor) of every local shard tensor."""
    shards = arch.shard_metadata()
    for key, tensor in full.items():
        if key.startswith(prefix):
            shard, _, name = key[len(prefix) :].rpartition(".")
            if shard in shards:
                yield key, shards[shard], name, tensor


def _parameter_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The name of each of the optimizer's parameters, in its state-dict order."""
    by_id = {id(p): name for name, p in model.named_parameters()}
    names = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in by_id:
                raise ValueError("the optimizer holds a parameter that is not the model's")
            names.append(by_id[id(p)])
    return names


def _optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> Iterator[tuple[str, dict[str, Any]]]:
    states = optimizer.state_dict()["state"]
    for index, name in enumerate(_parameter_names(model, optimizer)):
        if index in states:
            yield name, states[index]


# Agreement between ranks.


def _group(process_group: dist.ProcessGroup | None) -> dist.ProcessGroup | None:
    if process_group is None or dist.get_world_size(process_group) == 1:
        return None
    return process_group


def _rank_and_size(group: dist.ProcessGroup | None) -> tuple[int, int]:
    return (dist.get_rank(group), dist.get_world_size(group)) if group is not None else (0, 1)


def _on_first_rank(fn: Callable[[], T], group: dist.ProcessGroup | None) -> T:
    """`fn()` on rank 0, its result (or its error, raised as CheckpointError) on every rank."""
    if group is None:
        return fn()
    payload: list[Any] = [None]
    if dist.get_rank(group) == 0:
        try:
            payload = [("ok", fn())]
        except Exception as error:  # every rank must learn of it, or the others wait forever
            payload = [("error", str(error))]
    dist.broadcast_object_list(payload, group=group, group_src=0)
    kind, value = payload[0]
    if kind == "error":
        raise CheckpointError(value)
    return value


def _checked(directory: str | Path) -> tuple[Path, dict[str, Any]]:
    path = resolve(directory)
    manifest = read_manifest_file(path)
    verify_files(path, manifest)
    return path, manifest


def newest_intact_checkpoint(directory: str | Path) -> Path | None:
    """The checkpoint a resume from `directory` would load (the newest whose files pass their checks),
    or None."""
    try:
        return _newest_intact(directory, fall_back=True)[0]
    except CheckpointError:
        return None


def _newest_intact(directory: str | Path, fall_back: bool) -> tuple[Path, dict[str, Any], tuple[tuple[Path, str], ...]]:
    """The checkpoint `_checked` picks; with `fall_back`, the newest that passes its checks, and the
    newer ones passed over, each with why."""
    if not fall_back or (Path(directory) / MANIFEST).exists():
        return (*_checked(directory), ())
    candidates = [path for _, path in reversed(complete_checkpoints(Path(directory)))]
    passed_over: list[tuple[Path, str]] = []
    for path in candidates:
        try:
            return (*_checked(path), tuple(passed_over))
        except CheckpointError as error:
            passed_over.append((path, str(error)))
    if not candidates:
        return (*_checked(directory), ())  # its error: no checkpoint at all
    raise CheckpointError(f"no intact checkpoint in {directory}: " + "; ".join(reason for _, reason in passed_over))
