"""SparseArch: all embedding tables of a model, laid out as its sharding plan says.

One child per sharding type present in the plan, in SHARDING_TYPES (types.py),
each an `EmbeddingGroup` with the three stages the compiled graph calls:
`input_dist`, `lookup` and `output_dist`. Inside a group, output keys follow
table order, then each table's feature order; the compiler's lowering relies
on that. Sequence tables (`sequence_tables`, looked up as one row per id by
`EmbeddingCollection`) get groups of their own, named `<type>_sequence`,
whose output_dist yields `{feature: JaggedTensor}` of the local samples;
over several ranks they may be data_parallel, table_wise, column_wise or
row_wise (each type module's `build_sequence`; the rows travel back in
sequence_dist.py), not table_row_wise. At world size 1 every group runs locally (local.py); over several
ranks each type has its module (data_parallel.py, table_wise.py,
column_wise.py, row_wise.py, table_row_wise.py) on the collectives of
`process_group`. Training on N ranks equals training one process on the
concatenated global batch (see pooled_dist.py and data_parallel.py for how
gradients are scaled), except column_wise with rowwise_adagrad (see
column_wise.py).

The collectives pair up across ranks by order: every rank must run the
stages (and backward) in the same order, from one thread; a pipeline may run
batch i+1's input_dist early, but at the same point on every rank.

Construction is collective when distributed: the ranks all-gather hashes of
the plan and of the table configs, and fail at once, with a message, if they
disagree (instead of hanging in a collective later). Tables are initialised
alike at every world size: rows are drawn in blocks of INIT_BLOCK_ROWS from
generators seeded by (seed, table, block), the seed taken once from torch's
global generator (rank 0's wins), and a rank draws only the blocks its
shards overlap. The collections' own initialisation runs under a forked RNG,
so the global generator moves by the same single draw at every world size
and dense layers built afterwards start alike too.

State: `state_dict()` holds this rank's shards only: `<table>.weight` (and
optimizer state such as `<table>.momentum1`) for a whole table, including a
data_parallel replica, and `<table>.rows_<a>_<b>.cols_<c>_<d>.<state>` for a
block of rows [a, b) and columns [c, d); `shard_metadata()` describes them.
`full_state_dict()` gathers whole tables.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.distributed as dist

from runtime.config.embeddings import EmbeddingBagConfig, EmbeddingConfig, EmbeddingOptimizer
from runtime.embeddings.bag_collection import EmbeddingBagCollection
from runtime.embeddings.sequence_collection import EmbeddingCollection
from runtime.sharding import (
    column_wise,
    data_parallel,
    local,
    row_wise,
    table_row_wise,
    table_wise,
)
from runtime.sharding.group import EmbeddingGroup, GroupEnv
from runtime.sharding.layout import LocalTable, TableLayout, digest, table_layouts
from runtime.sharding.sequence_lookup import build_local as build_local_sequences
from runtime.sharding.types import SHARDING_TYPES

INIT_BLOCK_ROWS = 1 << 16

_BUILDERS: dict[str, Callable[[Sequence[TableLayout], GroupEnv], EmbeddingGroup]] = {
    "data_parallel": data_parallel.build,
    "table_wise": table_wise.build,
    "column_wise": column_wise.build,
    "row_wise": row_wise.build,
    "table_row_wise": table_row_wise.build,
}

_SEQUENCE_BUILDERS: dict[str, Callable[[Sequence[TableLayout], GroupEnv], EmbeddingGroup]] = {
    "data_parallel": data_parallel.build_sequence,
    "table_wise": table_wise.build_sequence,
    "column_wise": column_wise.build_sequence,
    "row_wise": row_wise.build_sequence,
}


class SparseArch(torch.nn.Module):
    """The model's embedding tables over `process_group` (see the module docstring).

    `is_weighted`: the KeyedJaggedTensor's per-id weights multiply the
    embeddings (and travel with the ids); otherwise they are ignored.
    `sequence_tables` are looked up as rows, one per id, never pooled.
    """

    def __init__(
        self,
        tables: Sequence[EmbeddingBagConfig],
        optimizer: EmbeddingOptimizer,
        plan: Mapping[str, Any],
        process_group: dist.ProcessGroup | None = None,
        device: torch.device | str | None = None,
        is_weighted: bool = False,
        sequence_tables: Sequence[EmbeddingConfig] = (),
    ) -> None:
        super().__init__()
        world_size = dist.get_world_size(process_group) if process_group is not None else 1
        if plan["world_size"] != world_size:
            raise ValueError(
                f"the plan is for world size {plan['world_size']} but this job has "
                f"{world_size} rank{'s' if world_size != 1 else ''}: recompile with "
                f"--world-size {world_size}"
            )
        _check_distinct(tables, sequence_tables)
        self._layouts = table_layouts([*tables, *sequence_tables], plan, world_size)
        self._group = process_group if world_size > 1 else None
        self._rank = dist.get_rank(process_group) if self._group is not None else 0
        self._device = torch.device(device) if device is not None else torch.device("cpu")
        seed = int(torch.randint(0, 2**62, (1,)))
        if self._group is not None:
            configs = [list(tables), optimizer, is_weighted, list(sequence_tables)]
            seed = _agree(seed, plan, configs, self._group, self._device)
        env = GroupEnv(self._rank, world_size, self._group, self._device, optimizer, is_weighted)
        with _forked_rng(self._device):
            for sharding_type in SHARDING_TYPES:
                group = [t for t in self._bag_layouts() if t.sharding_type == sharding_type]
                if group:
                    build = local.build if world_size == 1 else _BUILDERS[sharding_type]
                    # .to() brings the stages' index buffers to the device of the tables.
                    self.add_module(sharding_type, build(group, env).to(self._device))
            for sharding_type in SHARDING_TYPES:
                group = [t for t in self._sequence_layouts() if t.sharding_type == sharding_type]
                if group:
                    build = build_local_sequences if world_size == 1 else _sequence_builder(group)
                    self.add_module(f"{sharding_type}_sequence", build(group, env).to(self._device))
        self._init_weights(seed)

    def _bag_layouts(self) -> list[TableLayout]:
        return [t for t in self._layouts if isinstance(t.config, EmbeddingBagConfig)]

    def _sequence_layouts(self) -> list[TableLayout]:
        return [t for t in self._layouts if isinstance(t.config, EmbeddingConfig)]

    def groups(self) -> list[EmbeddingGroup]:
        return [child for child in self.children() if isinstance(child, EmbeddingGroup)]

    def _collections(self) -> list[EmbeddingBagCollection | EmbeddingCollection]:
        return [c for group in self.groups() for c in group.lookup.collections()]

    def logged_penalty(self) -> torch.Tensor | None:
        """What this rank adds to its logged loss for the tables' `embedding_l2` penalty in the last training
        step, so that the mean of the ranks' logged losses is the global loss plus the whole penalty; None
        without a penalty. A rank's shards hold rows no other rank holds (world size x their penalty); a
        data_parallel replica looks up the rows of the global batch as every other does (its penalty once)."""
        world_size = dist.get_world_size(self._group) if self._group is not None else 1
        shares = []
        for name, group in self.named_children():
            if not isinstance(group, EmbeddingGroup):
                continue
            factor = 1 if name.startswith("data_parallel") else world_size
            lookup: Any = group.lookup
            shares += [p * factor for c in lookup.collections() if (p := c.embedding_penalty()) is not None]
        return torch.stack(shares).sum() if shares else None

    def set_lr_scale(self, scale: float) -> None:
        """Every local table trains at `scale` times its optimizer's learning rate (a schedule's factor)."""
        for collection in self._collections():
            collection.set_lr_scale(scale)

    def _local_weights(self) -> list[tuple[LocalTable, torch.Tensor]]:
        return [pair for group in self.groups() for pair in group.lookup.weights()]

    @torch.no_grad()
    def _init_weights(self, seed: int) -> None:
        for table, weight in self._local_weights():
            shard, config = table.shard, table.layout.config
            low, high = config.init_range()
            first_block = shard.row_offset // INIT_BLOCK_ROWS
            last_block = (shard.row_offset + shard.rows - 1) // INIT_BLOCK_ROWS
            for block in range(first_block, last_block + 1):
                start = block * INIT_BLOCK_ROWS
                rows = min(INIT_BLOCK_ROWS, config.num_embeddings - start)
                generator = torch.Generator().manual_seed(_block_seed(seed, config.name, block))
                drawn = torch.empty(rows, config.embedding_dim)
                drawn.uniform_(low, high, generator=generator)
                lo = max(start, shard.row_offset)
                hi = min(start + rows, shard.row_offset + shard.rows)
                weight[lo - shard.row_offset : hi - shard.row_offset].copy_(
                    drawn[lo - start : hi - start, shard.col_offset : shard.col_offset + shard.cols]
                )

    def shard_metadata(self) -> dict[str, dict[str, Any]]:
        """Each local shard's state-dict name (less `.<state>`) and the table block it holds."""
        return {
            table.config.name: {
                "table": table.layout.config.name,
                "rank": self._rank,
                "row_offset": table.shard.row_offset,
                "rows": table.shard.rows,
                "col_offset": table.shard.col_offset,
                "cols": table.shard.cols,
                "table_rows": table.layout.config.num_embeddings,
                "table_cols": table.layout.config.embedding_dim,
            }
            for table, _ in self._local_weights()
        }

    @torch.no_grad()
    def full_state_dict(self, rank0_only: bool = False) -> dict[str, torch.Tensor]:
        """`<table>.weight` (rows x dim) of every table, gathered from all ranks (collective).

        With `rank0_only`, the tables are reduced to rank 0 and the other
        ranks get an empty dict.
        """
        local = self._local_weights()
        gathered = {}
        for layout in self._layouts:
            config = layout.config
            full = torch.zeros(config.num_embeddings, config.embedding_dim, device=self._device)
            for table, weight in local:
                shard = table.shard
                if table.layout.config.name == config.name and table.layout.gathers_from(shard):
                    rows = slice(shard.row_offset, shard.row_offset + shard.rows)
                    full[rows, shard.col_offset : shard.col_offset + shard.cols] = weight
            if self._group is not None and rank0_only:
                dist.reduce(full, group=self._group, group_dst=0)
            elif self._group is not None:
                dist.all_reduce(full, group=self._group)
            if not rank0_only or self._rank == 0:
                gathered[f"{config.name}.weight"] = full
        return gathered

    # The state dict: the collections' entries, which carry shard names, without group prefixes.

    def _save_to_state_dict(self, destination: dict[str, Any], prefix: str, keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for collection in self._collections():
            for name, tensor in collection.state_dict(keep_vars=keep_vars).items():
                destination[prefix + name] = tensor

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        # Not strict here: the base class would call every shard's key unexpected.
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, False, missing_keys, unexpected_keys, error_msgs
        )
        expected = set()
        for collection in self._collections():
            expected.update(prefix + name for name in collection.state_dict())
            collection._load_from_state_dict(state_dict, prefix, local_metadata, False, missing_keys, [], error_msgs)
        if strict:
            children = tuple(f"{prefix}{name}." for name, _ in self.named_children())
            unexpected_keys.extend(
                key
                for key in state_dict
                if key.startswith(prefix) and key not in expected and not key.startswith(children)
            )


def _check_distinct(tables: Sequence[EmbeddingBagConfig], sequence_tables: Sequence[EmbeddingConfig]) -> None:
    pooled = {t.name for t in tables}
    for table in sequence_tables:
        if table.name in pooled:
            raise ValueError(f"table {table.name!r} is given twice: as a pooled table and as a sequence table")
    reader: dict[str, str] = {}
    for table in [*tables, *sequence_tables]:
        for feature in table.feature_names:
            if reader.setdefault(feature, table.name) != table.name:
                # The stages route and name outputs by feature; a spec never puts one feature in two tables.
                raise ValueError(
                    f"feature {feature!r} is read by tables {reader[feature]!r} and {table.name!r}: "
                    "sharded tables take one feature each (outputs named feature@table are "
                    "EmbeddingBagCollection's and EmbeddingCollection's only)"
                )


def _sequence_builder(
    layouts: Sequence[TableLayout],
) -> Callable[[Sequence[TableLayout], GroupEnv], EmbeddingGroup]:
    """The builder of sequence `layouts`' type; table_row_wise is refused, naming the table."""
    sharding_type = layouts[0].sharding_type
    if sharding_type not in _SEQUENCE_BUILDERS:
        raise ValueError(
            f"plan for table {layouts[0].config.name!r} ({sharding_type}): sequence tables "
            f"may be {', '.join(_SEQUENCE_BUILDERS)}, not {sharding_type}"
        )
    return _SEQUENCE_BUILDERS[sharding_type]


def _forked_rng(device: torch.device) -> Any:
    """A context in which torch's global generators (CPU, and `device`'s) may be used freely."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return torch.random.fork_rng(devices=[index], device_type="cuda")
    return torch.random.fork_rng(devices=[])


def _block_seed(seed: int, table: str, block: int) -> int:
    text = f"{seed}/{table}/{block}".encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "little") & (2**63 - 1)


def _words(data: bytes) -> list[int]:
    return [int.from_bytes(data[i : i + 8], "little", signed=True) for i in range(0, len(data), 8)]


def _hex(words: Sequence[int]) -> str:
    return b"".join(w.to_bytes(8, "little", signed=True) for w in words).hex()[:12]


def _agree(seed: int, plan: Any, tables: Any, group: dist.ProcessGroup, device: torch.device) -> int:
    """Rank 0's seed, after checking that every rank has the same plan and tables."""
    mine = torch.tensor([seed, *_words(digest(plan)), *_words(digest(tables))], device=device)
    everyone = mine.new_empty(dist.get_world_size(group) * mine.numel())
    dist.all_gather_single(everyone, mine, group=group)
    rows = everyone.view(-1, mine.numel()).tolist()
    for what, part in (("sharding plan", slice(1, 5)), ("table configuration", slice(5, 9))):
        for rank, row in enumerate(rows):
            if row[part] != rows[0][part]:
                raise ValueError(
                    f"rank {rank}'s {what} does not match rank 0's (sha256 "
                    f"{_hex(rows[0][part])}… on rank 0, {_hex(row[part])}… on rank {rank}): "
                    f"every rank must build the model from the same {what}"
                )
    return rows[0][0]
