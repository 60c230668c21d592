"""Sequence tables over two ranks: models, plans, batches and the rank entry point.

The model is a SparseArch with one bag table and several sequence tables (of
widths 4, 8 and 12, one serving two features, one with a single row so that
row_wise leaves a rank an empty shard), then, per sequence feature, tanh of
its rows weighted by a learned weight per position and summed, then an MLP
and BCE. The position weights make the order of each sample's rows matter,
tanh makes every row's gradient depend on its value, so a row returned to the
wrong place or rank changes the numbers.

Batches are made globally from the step number and sliced per rank. Some
samples have empty sequences; `h2` is empty on all of rank 1's samples, `h3`
on every sample of even steps, and at step 4 rank 1 has no sequence ids at all.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable

import sharded_cases as sc
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from runtime.checkpoint.store import load_checkpoint, save_checkpoint
from runtime.config.embeddings import EmbeddingBagConfig, EmbeddingConfig, EmbeddingOptimizer
from runtime.sharding import SparseArch, distribute_dense
from runtime.sparse.jagged import JaggedTensor, KeyedJaggedTensor, KeyedTensor
from runtime.sparse.sequence import to_padded
from runtime.train.process_group import close_process_group

WORLD_SIZE = sc.WORLD_SIZE
GLOBAL_BATCH = 8
STEPS = 6
MAX_LENGTH = 4
DENSE = 3
SEED = 0

BAG = EmbeddingBagConfig("b0", 20, 4, ("user",))
SEQUENCES = [
    EmbeddingConfig("s0", 40, 8, ("h0", "h1")),
    EmbeddingConfig("s1", 30, 12, ("h2",)),
    EmbeddingConfig("s2", 3, 4, ("h3",)),
    EmbeddingConfig("s3", 1, 4, ("h4",)),
]
KEYS = [f for t in SEQUENCES for f in t.feature_names]
KERNELS = {"s1": "dense"}  # the others fused
# Read-only, as sharded_cases.OPTIMIZERS.
OPTIMIZERS = MappingProxyType(
    {
        "sgd": EmbeddingOptimizer("sgd", lr=0.5),
        "rowwise_adagrad": EmbeddingOptimizer("rowwise_adagrad", lr=0.1),
        "adam": EmbeddingOptimizer("adam", lr=0.05),
    }
)
SEQUENCE_TYPES = ("data_parallel", "table_wise", "column_wise", "row_wise")
MIXED = {"s0": "row_wise", "s1": "column_wise", "s2": "data_parallel", "s3": "table_wise"}


@dataclass(frozen=True)
class Case:
    name: str
    types: dict[str, str]  # sequence table -> sharding type
    optimizer: str

    def plan(self, world_size: int = WORLD_SIZE) -> dict[str, Any]:
        entries = [_entry(BAG, "table_wise", [sc.whole(BAG, world_size - 1)])]
        for table in SEQUENCES:
            kind = self.types[table.name]
            shards = [sc.whole(table, 0)] if world_size == 1 else _shards(kind, table)
            entries.append(_entry(table, kind, shards))
        return {"format_version": 1, "world_size": world_size, "device": "cpu", "tables": entries}


def _entry(table: Any, kind: str, shards: list[dict[str, int]]) -> dict[str, Any]:
    return {
        "table": table.name,
        "sharding_type": kind,
        "compute_kernel": KERNELS.get(table.name, "fused"),
        "shards": shards,
    }


def _shards(kind: str, table: EmbeddingConfig) -> list[dict[str, int]]:
    if kind == "data_parallel":
        return [sc.whole(table, r) for r in range(WORLD_SIZE)]
    if kind == "table_wise":
        return [sc.whole(table, (SEQUENCES.index(table) + 1) % WORLD_SIZE)]
    if kind == "column_wise":
        return sc.column_shards(table)  # type: ignore[arg-type]
    return sc.ceil_rows(table)  # type: ignore[arg-type]


def cases() -> list[Case]:
    plans = {kind: {t.name: kind for t in SEQUENCES} for kind in SEQUENCE_TYPES} | {"mixed": MIXED}
    out = [
        Case(f"{name}-{optimizer}", types, optimizer)
        for name, types in plans.items()
        for optimizer in ("sgd", "rowwise_adagrad")
    ]
    return out + [Case("mixed-adam", MIXED, "adam")]


class SequenceModel(nn.Module):
    """SparseArch, position-weighted tanh sums of each sequence, an MLP, BCE.

    `parts[key]`: the keys whose rows, side by side, are `key`'s (the
    column-split reference); `rename` makes their features from the batch's.
    """

    def __init__(
        self,
        case: Case,
        plan: dict[str, Any],
        process_group: dist.ProcessGroup | None,
        sequences: list[EmbeddingConfig] = SEQUENCES,
        parts: dict[str, list[str]] | None = None,
        rename: Callable[[KeyedJaggedTensor], KeyedJaggedTensor] | None = None,
    ) -> None:
        super().__init__()
        self.sparse_arch = SparseArch([BAG], OPTIMIZERS[case.optimizer], plan, process_group, sequence_tables=sequences)
        self.parts = parts or {}
        self.rename = rename
        self.position = nn.Parameter(torch.linspace(1.0, 0.25, MAX_LENGTH))
        dims = {f: t.embedding_dim for t in SEQUENCES for f in t.feature_names}
        width = DENSE + BAG.embedding_dim + sum(dims[k] for k in KEYS)
        self.mlp = nn.Sequential(nn.Linear(width, 8), nn.ReLU(), nn.Linear(8, 1))

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor) -> torch.Tensor:
        if self.rename is not None:
            sparse = self.rename(sparse)
        arch = self.sparse_arch
        pending = [g.output_dist(g.lookup(g.input_dist(sparse))) for g in arch.groups()]
        pooled: list[torch.Tensor] = []
        rows: dict[str, JaggedTensor] = {}
        for result in (p.wait() for p in pending):
            if isinstance(result, KeyedTensor):
                pooled.append(result.values())
            else:
                rows.update(result)
        for key in KEYS:
            parts = [rows[p] for p in self.parts.get(key, [key])]
            values = torch.cat([p.values() for p in parts], dim=1)
            padded = to_padded(torch.tanh(values), parts[0].lengths(), MAX_LENGTH)
            pooled.append((padded * self.position[None, :, None]).sum(dim=1))
        return self.mlp(torch.cat([dense, *pooled], dim=1)).squeeze(1)

    def dense_parameters(self) -> list[nn.Parameter]:
        return [p for name, p in self.named_parameters() if not name.startswith("sparse_arch.")]


def make_batch(step: int, rank: int, world_size: int) -> tuple[torch.Tensor, KeyedJaggedTensor, torch.Tensor]:
    """Rank `rank`'s slice of global batch `step` (see the module docstring)."""
    gen = torch.Generator().manual_seed(2000 + step)
    rows = {f: t.num_embeddings for t in SEQUENCES for f in t.feature_names}
    names = ["user", *KEYS]
    lengths = torch.randint(0, MAX_LENGTH + 1, (len(names), GLOBAL_BATCH), generator=gen)
    lengths[0] = 1
    half = GLOBAL_BATCH // 2
    lengths[names.index("h2"), half:] = 0
    if step % 2 == 0:
        lengths[names.index("h3")] = 0
    if step == 4:
        lengths[1:, half:] = 0
    sizes = {"user": BAG.num_embeddings, **rows}
    ids = [torch.randint(0, sizes[n], (int(lengths[i].sum()),), generator=gen) for i, n in enumerate(names)]
    dense = torch.randn(GLOBAL_BATCH, DENSE, generator=gen)
    labels = torch.randint(0, 2, (GLOBAL_BATCH,), generator=gen).float()
    local = GLOBAL_BATCH // world_size
    lo, hi = rank * local, (rank + 1) * local
    values = []
    for i in range(len(names)):
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths[i].cumsum(0)])
        values.append(ids[i][offsets[lo] : offsets[hi]])
    kjt = KeyedJaggedTensor(names, torch.cat(values), lengths=lengths[:, lo:hi].reshape(-1), stride=local)
    return dense[lo:hi], kjt, labels[lo:hi]


def dense_optimizer(model: SequenceModel) -> torch.optim.Optimizer:
    """Plain SGD: no state, so a resumed run may start a new one."""
    return torch.optim.SGD(model.dense_parameters(), lr=0.1)


def train(
    model: SequenceModel,
    process_group: dist.ProcessGroup | None,
    rank: int,
    world_size: int,
    steps: range = range(STEPS),
) -> list[float]:
    """`steps`; the global mean loss of each."""
    optimizer = dense_optimizer(model)
    trained = distribute_dense(model, process_group)
    losses = []
    for step in steps:
        dense, sparse, labels = make_batch(step, rank, world_size)
        loss = F.binary_cross_entropy_with_logits(trained(dense, sparse), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total = loss.detach().clone()
        if process_group is not None:
            dist.all_reduce(total, group=process_group)
        losses.append(float(total) / world_size)
    return losses


def build(case: Case, process_group: dist.ProcessGroup | None, world_size: int) -> SequenceModel:
    torch.manual_seed(SEED)
    return SequenceModel(case, case.plan(world_size), process_group)


def tables_of(model: SequenceModel) -> dict[str, torch.Tensor]:
    return model.sparse_arch.full_state_dict()


def reference(case: Case) -> tuple[SequenceModel, Callable[[SequenceModel], dict[str, torch.Tensor]]]:
    """One process on the global batch, and how to read its full tables.

    With rowwise_adagrad, column_wise tables keep one accumulator per column
    shard (runtime/sharding/column_wise.py), so the reference splits them into
    one table per shard, started from the same values, and puts each key's
    rows side by side again.
    """
    plain = build(case, None, 1)
    split = {t.name: sc.column_shards(t) for t in SEQUENCES if case.types[t.name] == "column_wise"}  # type: ignore[arg-type]
    if case.optimizer != "rowwise_adagrad" or not split:
        return plain, tables_of
    tables, parts, copies, source = [], {}, {}, {}
    for t in SEQUENCES:
        shards = split.get(t.name)
        if not shards:
            tables.append(t)
            continue
        for k, shard in enumerate(shards):
            part = replace(
                t,
                name=f"{t.name}.c{k}",
                embedding_dim=shard["cols"],
                feature_names=tuple(f"{f}.c{k}" for f in t.feature_names),
                weight_init_min=t.init_range()[0],
                weight_init_max=t.init_range()[1],
            )
            tables.append(part)
            source[part.name] = (t.name, shard["col_offset"], shard["cols"])
            for f, renamed in zip(t.feature_names, part.feature_names):
                parts.setdefault(f, []).append(renamed)
                copies[renamed] = f
    plan = {
        "world_size": 1,
        "tables": [_entry(BAG, "table_wise", [sc.whole(BAG, 0)])]
        + [
            {**_entry(t, "table_wise", [sc.whole(t, 0)]), "compute_kernel": KERNELS.get(t.name.split(".")[0], "fused")}
            for t in tables
        ],
    }
    torch.manual_seed(SEED)
    model = SequenceModel(case, plan, None, tables, parts, lambda kjt: sc.duplicate(kjt, copies))
    full = plain.sparse_arch.full_state_dict()
    model.sparse_arch.load_state_dict(
        {
            f"{name}.weight": full[f"{table}.weight"][:, offset : offset + cols]
            for name, (table, offset, cols) in source.items()
        },
        strict=False,
    )

    def joined(model: SequenceModel) -> dict[str, torch.Tensor]:
        got = model.sparse_arch.full_state_dict()
        out = {"b0.weight": got["b0.weight"]}
        for t in SEQUENCES:
            names = [n for n, (table, _, _) in source.items() if table == t.name] or [t.name]
            out[f"{t.name}.weight"] = torch.cat([got[f"{n}.weight"] for n in names], dim=1)
        return out

    return model, joined


def run_training(rank: int, port: int, out: str) -> None:
    """Every case at WORLD_SIZE ranks; rank 0 saves losses, full tables and dense parameters."""
    group = sc.init(rank, port)
    results: dict[str, Any] = {}
    for case in cases():
        model = build(case, group, WORLD_SIZE)
        losses = train(model, group, rank, WORLD_SIZE)
        results[case.name] = {
            "losses": losses,
            "tables": tables_of(model),
            "dense": {k: v.detach().clone() for k, v in model.named_parameters()},
            "groups": [name for name, _ in model.sparse_arch.named_children()],
        }
    gathered: list[Any] = [None] * WORLD_SIZE
    dist.all_gather_object(gathered, errors(group, rank), group=group)
    results["errors"] = gathered
    if rank == 0:
        torch.save(results, Path(out) / "results.pt")
    close_process_group()


def errors(group: dist.ProcessGroup, rank: int) -> dict[str, str]:
    """The messages of a table_row_wise sequence table and of an out-of-range sequence id.

    Both are raised on every rank before any collective could wait for a peer.
    """
    out = {}
    trw = Case("table_row_wise", {**MIXED, "s1": "table_row_wise"}, "sgd")
    try:
        SequenceModel(trw, trw.plan(), group)
    except ValueError as error:
        out["table_row_wise"] = str(error)
    model = build(case_named("mixed-sgd"), group, WORLD_SIZE)
    _, sparse, _ = make_batch(1, rank, WORLD_SIZE)
    values = sparse.values().clone()
    h0 = sparse.keys().index("h0")
    values[sparse.offset_per_key()[h0]] = 40  # s0 has 40 rows
    bad = KeyedJaggedTensor(sparse.keys(), values, lengths=sparse.lengths(), stride=sparse.stride())
    try:
        model.sparse_arch.row_wise_sequence.input_dist(bad)
    except ValueError as error:
        out["bad_id"] = str(error)
    out["first_sample"] = str(int(sparse["h0"].lengths().nonzero()[0, 0]))
    return out


# Checkpoints: the mixed plan with Adam (exact under resharding: its state is per element).
RESUME_CASE = "mixed-adam"
SAVED_AT = 3


def case_named(name: str) -> Case:
    return next(case for case in cases() if case.name == name)


def save(model: SequenceModel, directory: str, group: dist.ProcessGroup | None, world_size: int) -> None:
    case = case_named(RESUME_CASE)
    save_checkpoint(
        directory,
        model,
        dense_optimizer(model),
        step=SAVED_AT,
        spec_sha256="sequences",
        plan=case.plan(world_size),
        process_group=group,
    )


def resume(directory: str, group: dist.ProcessGroup | None, rank: int, world_size: int) -> SequenceModel:
    model = build(case_named(RESUME_CASE), group, world_size)
    load_checkpoint(directory, model, dense_optimizer(model), spec_sha256="sequences", process_group=group)
    return model


def run_checkpoints(rank: int, port: int, out: str, saved_at_one: str) -> None:
    """Saves at WORLD_SIZE ranks after SAVED_AT steps and goes on; resumes `saved_at_one`.

    Rank 0 saves the losses after the save, and those of the run resumed
    from the one-process checkpoint, with the tables each run ends with.
    """
    group = sc.init(rank, port)
    model = build(case_named(RESUME_CASE), group, WORLD_SIZE)
    train(model, group, rank, WORLD_SIZE, range(SAVED_AT))
    save(model, str(Path(out) / "ws2"), group, WORLD_SIZE)
    saved = tables_of(model)
    after = train(model, group, rank, WORLD_SIZE, range(SAVED_AT, STEPS))
    resumed = resume(saved_at_one, group, rank, WORLD_SIZE)
    loaded = tables_of(resumed)
    resumed_losses = train(resumed, group, rank, WORLD_SIZE, range(SAVED_AT, STEPS))
    results = {
        "saved": saved,
        "after": after,
        "loaded_from_one": loaded,
        "resumed_losses": resumed_losses,
        "resumed_tables": tables_of(resumed),
    }
    if rank == 0:
        torch.save(results, Path(out) / "checkpoints.pt")
    close_process_group()
