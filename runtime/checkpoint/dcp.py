"""Blocks of global tensors on torch.distributed.checkpoint, and DCP's calls with clear errors.

`runtime.checkpoint.store` hands DCP state dicts whose values are plain tensors,
picklable objects, or `Blocks`: the pieces of one global tensor that this
rank holds, each at its global offsets (SparseArch's local shards). The two
planners below are DCP's default ones plus that: a rank writes its blocks as
chunks of the global tensor (replicas with the same offsets are written
once), and reads into its blocks the overlap with whatever chunks were saved,
which is all resharding needs. `save`, `load` and `read_metadata` turn DCP's
failures into `CheckpointError`s naming the checkpoint.
"""

from __future__ import annotations

import contextlib
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import (
    DefaultLoadPlanner,
    DefaultSavePlanner,
    create_default_local_load_plan,
    create_default_local_save_plan,
)
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
)
from torch.distributed.checkpoint.planner import (
    LoadPlan,
    SavePlan,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from runtime.checkpoint.files import CheckpointError


@dataclass
class Blocks:
    """This rank's blocks of one global tensor: (global offsets, local tensor)."""

    size: torch.Size
    blocks: list[tuple[torch.Size, torch.Tensor]] = field(default_factory=list)

    def add(self, offsets: tuple[int, ...], tensor: torch.Tensor) -> torch.Tensor:
        """Adds a block; the tensor already there if a block starts at `offsets`."""
        start = torch.Size(offsets)
        for existing, held in self.blocks:
            if existing == start:
                return held
        self.blocks.append((start, tensor))
        return tensor

    def at(self, offsets: torch.Size | None) -> torch.Tensor:
        for start, tensor in self.blocks:
            if start == offsets:
                return tensor
        raise KeyError(f"no block at offsets {offsets}")

    def chunks(self) -> list[ChunkStorageMetadata]:
        return [ChunkStorageMetadata(offsets=o, sizes=t.size()) for o, t in self.blocks]

    def write_items(self, fqn: str) -> list[WriteItem]:
        return [
            WriteItem(
                index=MetadataIndex(fqn, offsets),
                type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(
                    chunk=ChunkStorageMetadata(offsets=offsets, sizes=tensor.size()),
                    properties=TensorProperties.create_from_tensor(tensor),
                    size=self.size,
                ),
            )
            for offsets, tensor in self.blocks
        ]


def blocks_of(state: dict[str, Any], fqn: str, size: tuple[int, ...]) -> Blocks:
    """The `Blocks` of `fqn` in `state`, added (global shape `size`) if absent."""
    return state.setdefault(fqn, Blocks(torch.Size(size)))


class _SavePlanner(DefaultSavePlanner):
    """DCP's planner, writing `Blocks` as chunks of their global tensor (replicas deduplicated)."""

    def __init__(self) -> None:
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)

    def create_local_plan(self) -> SavePlan:
        plain = {k: v for k, v in self.state_dict.items() if not isinstance(v, Blocks)}
        items = list(create_default_local_save_plan(plain, self.is_coordinator).items)
        for fqn, value in self.state_dict.items():
            if isinstance(value, Blocks):
                items += value.write_items(fqn)
        self.plan = SavePlan(items)
        return self.plan

    def lookup_object(self, index: MetadataIndex) -> Any:
        value = self.state_dict[index.fqn]
        return value.at(index.offset) if isinstance(value, Blocks) else super().lookup_object(index)


class _LoadPlanner(DefaultLoadPlanner):
    """DCP's planner, reading into `Blocks` the overlap of each block with the saved chunks."""

    def __init__(self) -> None:
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)

    def set_up_planner(
        self, state_dict: dict[str, Any], metadata: Metadata | None = None, is_coordinator: bool = False
    ) -> None:
        # Not the base class's: its meta-tensor initialisation would drop `Blocks` values.
        self.original_state_dict = self.state_dict = state_dict
        self.metadata = metadata
        self.is_coordinator = is_coordinator

    def create_local_plan(self) -> LoadPlan:
        assert self.metadata is not None
        saved = self.metadata.state_dict_metadata
        plain = {k: v for k, v in self.state_dict.items() if not isinstance(v, Blocks)}
        items = list(create_default_local_load_plan(plain, self.metadata, True).items)
        for fqn, value in self.state_dict.items():
            if isinstance(value, Blocks):
                items += create_read_items_for_chunk_list(fqn, saved[fqn], value.chunks())
        return LoadPlan(items)

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        value = self.state_dict[index.fqn]
        return value.at(index.offset) if isinstance(value, Blocks) else super().lookup_tensor(index)


def save(state: dict[str, Any], path: Path, group: dist.ProcessGroup | None) -> None:
    """DCP's save of `state` into directory `path` (collective on `group`; None: this process)."""
    try:
        with _single_process_quiet():
            dcp.save(
                state,
                storage_writer=dcp.FileSystemWriter(path),
                planner=_SavePlanner(),
                process_group=group,
                no_dist=group is None,
            )
    except CheckpointException as error:
        _raise_a_stop(error)
        raise CheckpointError(f"{path}: writing the checkpoint failed: {_first(error)}{_space_left(path)}") from None


def _space_left(path: Path) -> str:
    """`; its file system has N bytes free`, for a failed write: torch's own error for a full disk
    at one rank is its zip writer's 'unexpected pos 704 vs 598'."""
    try:
        return f"; its file system has {shutil.disk_usage(path).free:,} bytes free"
    except OSError:
        return ""


def load(state: dict[str, Any], path: Path, group: dist.ProcessGroup | None) -> None:
    """DCP's load from `path` into `state`'s tensors and `Blocks` (objects are replaced)."""
    try:
        with _single_process_quiet():
            dcp.load(
                state,
                storage_reader=dcp.FileSystemReader(path),
                planner=_LoadPlanner(),
                process_group=group,
                no_dist=group is None,
            )
    except CheckpointException as error:
        _raise_a_stop(error)
        raise CheckpointError(f"{path}: reading the checkpoint failed: {_first(error)}") from None


def _raise_a_stop(error: CheckpointException) -> None:
    """A Ctrl-C or SIGTERM (a KeyboardInterrupt) during a save or load is the stop it is, not a failed
    write: DCP wraps whatever its writer raised. The save's `.partial` folder goes at the next save."""
    for exception, _ in error.failures.values():
        if isinstance(exception, KeyboardInterrupt):
            raise exception from None


@contextlib.contextmanager
def _single_process_quiet() -> Iterator[None]:
    """Silences DCP's warning that it runs in one process: here that is meant."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def read_metadata(path: Path) -> Metadata:
    try:
        return dcp.FileSystemReader(path).read_metadata()
    except Exception as error:  # the manifest's hash matched: a file DCP itself cannot read
        raise CheckpointError(f"{path / '.metadata'}: unreadable: {error}") from None


def _first(error: CheckpointException) -> str:
    """The first rank's underlying error of a DCP failure, as one line."""
    for rank, (exception, _) in sorted(error.failures.items()):
        return f"rank {rank}: {type(exception).__name__}: {exception}"
    return str(error)
