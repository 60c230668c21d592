"""Models, plans and batches shared by the sharded-training tests, and the rank entry points.

The model is built from runtime pieces only: a SparseArch, a small MLP over
the dense features and every pooled embedding, and BCE. Batches are made
globally from the step number and sliced per rank, so two ranks together see
exactly the batch one process sees. Ranks are started with
torch.multiprocessing.spawn over gloo on a loopback port.
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable

import rendezvous
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from runtime.config.embeddings import EmbeddingBagConfig, EmbeddingOptimizer
from runtime.sharding import SparseArch, distribute_dense
from runtime.sparse.jagged import KeyedJaggedTensor, KeyedTensor
from runtime.train.process_group import close_process_group, init_process_group

WORLD_SIZE = 2
GLOBAL_BATCH = 8
STEPS = 10
DENSE_FEATURES = 3
SEED = 0

TABLES = [
    EmbeddingBagConfig("t0", 40, 8, ("f0", "f1")),
    EmbeddingBagConfig("t1", 30, 8, ("f2",), pooling="mean"),
    EmbeddingBagConfig("t2", 25, 12, ("f3",)),
    EmbeddingBagConfig("t3", 1, 4, ("f4",), pooling="mean"),
    EmbeddingBagConfig("t4", 50, 4, ("f5",)),
]
# A feature no table reads: input_dist must pick its own features out of the batch.
UNUSED = ("extra", 1000)
# Read-only: a test that trains with other optimizers replaces the mapping with monkeypatch, so
# the next file's one-process reference (in the same pytest worker) uses these again.
OPTIMIZERS = MappingProxyType(
    {
        "sgd": EmbeddingOptimizer("sgd", lr=0.5),
        "rowwise_adagrad": EmbeddingOptimizer("rowwise_adagrad", lr=0.1),
    }
)
KERNELS = {"t4": "dense"}  # the others fused


def shard(rank: int, rows: tuple[int, int], cols: tuple[int, int]) -> dict[str, int]:
    """A shard dict of the plan: rows and cols as (offset, size)."""
    return {
        "rank": rank,
        "row_offset": rows[0],
        "rows": rows[1],
        "col_offset": cols[0],
        "cols": cols[1],
    }


def whole(table: EmbeddingBagConfig, rank: int) -> dict[str, int]:
    return shard(rank, (0, table.num_embeddings), (0, table.embedding_dim))


def row_split(table: EmbeddingBagConfig, ranks: list[int], sizes: list[int]) -> list[dict[str, int]]:
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    return [shard(r, (o, n), (0, table.embedding_dim)) for r, o, n in zip(ranks, offsets, sizes)]


def ceil_rows(table: EmbeddingBagConfig) -> list[dict[str, int]]:
    block = -(-table.num_embeddings // WORLD_SIZE)
    sizes = [max(0, min(block, table.num_embeddings - r * block)) for r in range(WORLD_SIZE)]
    return row_split(table, list(range(WORLD_SIZE)), sizes)


def column_shards(table: EmbeddingBagConfig) -> list[dict[str, int]]:
    """Column ranges of 4, out of rank order, several on one rank where the table is wide."""
    rows = (0, table.num_embeddings)
    ranks = {8: [0, 1], 12: [1, 0, 0], 4: [1]}[table.embedding_dim]
    return [shard(r, rows, (4 * i, 4)) for i, r in enumerate(ranks)]


def table_shards(sharding_type: str, table: EmbeddingBagConfig) -> list[dict[str, int]]:
    index = TABLES.index(table)
    if sharding_type == "data_parallel":
        return [whole(table, r) for r in range(WORLD_SIZE)]
    if sharding_type == "table_wise":
        return [whole(table, (index + 1) % WORLD_SIZE)]
    if sharding_type == "column_wise":
        return column_shards(table)
    if sharding_type == "row_wise":
        return ceil_rows(table)
    # table_row_wise over a host of both ranks: uneven ranges, rank 1 first; t1 on rank 0 only.
    if table.name == "t1":
        return [whole(table, 0)]
    first = table.num_embeddings * 2 // 3
    return row_split(table, [1, 0], [first, table.num_embeddings - first])


# t4's row_wise ranges are both non-empty (one sum over ranks); t3's one row sits on rank 0.
MIXED = {
    "t0": "data_parallel",
    "t1": "table_wise",
    "t2": "column_wise",
    "t3": "table_row_wise",
    "t4": "row_wise",
}


def make_plan(types: dict[str, str], world_size: int = WORLD_SIZE) -> dict[str, Any]:
    entries = []
    for table in TABLES:
        kind = types[table.name]
        shards = [whole(table, 0)] if world_size == 1 else table_shards(kind, table)
        entries.append(
            {
                "table": table.name,
                "sharding_type": kind,
                "compute_kernel": KERNELS.get(table.name, "fused"),
                "shards": shards,
                "storage_bytes": 0,
                "cost_ms": 0.0,
                "reason": "test",
            }
        )
    return {"format_version": 1, "world_size": world_size, "device": "cpu", "tables": entries}


@dataclass(frozen=True)
class Case:
    name: str
    types: dict[str, str]  # table -> sharding type
    optimizer: str
    weighted: bool

    def plan(self, world_size: int = WORLD_SIZE) -> dict[str, Any]:
        return make_plan(self.types, world_size)


def cases() -> list[Case]:
    kinds = ["data_parallel", "table_wise", "column_wise", "row_wise", "table_row_wise"]
    plans = {kind: {t.name: kind for t in TABLES} for kind in kinds} | {"mixed": MIXED}
    return [
        Case(f"{name}-{optimizer}", types, optimizer, weighted=optimizer == "sgd")
        for name, types in plans.items()
        for optimizer in OPTIMIZERS
    ]


class TinyModel(nn.Module):
    """SparseArch, then an MLP over [dense, every pooled embedding], then BCE."""

    def __init__(
        self,
        tables: list[EmbeddingBagConfig],
        case: Case,
        plan: dict[str, Any],
        process_group: dist.ProcessGroup | None,
        embedding_keys: list[str],
        rename: Callable[[KeyedJaggedTensor], KeyedJaggedTensor] | None = None,
    ) -> None:
        super().__init__()
        self.rename = rename
        self.sparse_arch = SparseArch(
            tables, OPTIMIZERS[case.optimizer], plan, process_group, is_weighted=case.weighted
        )
        self.embedding_keys = embedding_keys
        width = DENSE_FEATURES + sum(t.embedding_dim * len(t.feature_names) for t in tables)
        self.mlp = nn.Sequential(nn.Linear(width, 8), nn.ReLU(), nn.Linear(8, 1))

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor) -> torch.Tensor:
        if self.rename is not None:
            sparse = self.rename(sparse)
        pending = []
        for group in self.sparse_arch.groups():
            pending.append(group.output_dist(group.lookup(group.input_dist(sparse))))
        embeddings: list[KeyedTensor] = [p.wait() for p in pending]
        (pooled,) = KeyedTensor.regroup(embeddings, [self.embedding_keys])
        return self.mlp(torch.cat([dense, pooled], dim=1)).squeeze(1)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(logits, labels)

    def dense_parameters(self) -> list[nn.Parameter]:
        return [p for name, p in self.named_parameters() if not name.startswith("sparse_arch.")]


def feature_keys(tables: list[EmbeddingBagConfig]) -> list[str]:
    return [f for t in tables for f in t.feature_names]


def make_batch(step: int, rank: int, world_size: int) -> tuple[torch.Tensor, KeyedJaggedTensor, torch.Tensor]:
    """Rank `rank`'s slice of global batch `step`: dense, ids (all features plus UNUSED), labels."""
    gen = torch.Generator().manual_seed(1000 + step)
    features = [(f, t.num_embeddings) for t in TABLES for f in t.feature_names] + [UNUSED]
    lengths = torch.randint(0, 4, (len(features), GLOBAL_BATCH), generator=gen)
    # Every bag of a feature as long (fixed ids_per_sample, 1 to 3): the id all-to-all then sends
    # no lengths, from every rank on one step in three, from rank 0 only on the next.
    fixed = (torch.arange(len(features)) % 3 + 1).unsqueeze(1)
    if step % 3 == 1:
        lengths[:] = fixed
    elif step % 3 == 2:
        lengths[:, : GLOBAL_BATCH // 2] = fixed
    ids = [torch.randint(0, rows, (int(lengths[i].sum()),), generator=gen) for i, (_, rows) in enumerate(features)]
    weights = [torch.rand(v.numel(), generator=gen) + 0.5 for v in ids]
    dense = torch.randn(GLOBAL_BATCH, DENSE_FEATURES, generator=gen)
    labels = torch.randint(0, 2, (GLOBAL_BATCH,), generator=gen).float()
    local = GLOBAL_BATCH // world_size
    lo, hi = rank * local, (rank + 1) * local
    values, kept_weights = [], []
    for i in range(len(features)):
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths[i].cumsum(0)])
        values.append(ids[i][offsets[lo] : offsets[hi]])
        kept_weights.append(weights[i][offsets[lo] : offsets[hi]])
    kjt = KeyedJaggedTensor(
        [name for name, _ in features],
        torch.cat(values),
        torch.cat(kept_weights),
        lengths=lengths[:, lo:hi].reshape(-1),
        stride=local,
    )
    return dense[lo:hi], kjt, labels[lo:hi]


def train(model: TinyModel, process_group: dist.ProcessGroup | None, rank: int, world_size: int) -> list[float]:
    """STEPS steps; the global mean loss of each."""
    optimizer = torch.optim.SGD(model.dense_parameters(), lr=0.1)
    trained = distribute_dense(model, process_group)
    losses = []
    for step in range(STEPS):
        dense, sparse, labels = make_batch(step, rank, world_size)
        loss = trained.loss(trained(dense, sparse), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total = loss.detach().clone()
        if process_group is not None:
            dist.all_reduce(total, group=process_group)
        losses.append(float(total) / world_size)
    return losses


def build(case: Case, process_group: dist.ProcessGroup | None, world_size: int) -> TinyModel:
    torch.manual_seed(SEED)
    return TinyModel(TABLES, case, case.plan(world_size), process_group, feature_keys(TABLES))


def reference(case: Case) -> tuple[TinyModel, Callable[[TinyModel], dict[str, torch.Tensor]]]:
    """One process on the global batch, and how to read its full tables.

    Where the case has column_wise tables and rowwise_adagrad, whose state is
    per column shard (see runtime/sharding/column_wise.py), the reference
    splits those tables into one table per column shard, started from the
    same initial values.
    """
    plain = build(case, None, 1)
    if case.optimizer != "rowwise_adagrad":
        return plain, lambda model: model.sparse_arch.full_state_dict()
    split = {t.name: column_shards(t) for t in TABLES if case.types[t.name] == "column_wise"}
    if not split:
        return plain, lambda model: model.sparse_arch.full_state_dict()
    tables, keys, copies, source = [], [], {}, {}  # source: table -> (table of `plain`, column)
    for t in TABLES:
        shards = split.get(t.name, [])
        parts = [split_table(t, k, shard) for k, shard in enumerate(shards)] or [t]
        tables.extend(parts)
        offsets = [shard["col_offset"] for shard in shards] or [0]
        source.update({part.name: (t.name, offset) for part, offset in zip(parts, offsets)})
        keys.extend(part.feature_names[i] for i in range(len(t.feature_names)) for part in parts)
        if shards:
            for part in parts:
                copies.update(zip(part.feature_names, t.feature_names))
    plan = {
        "world_size": 1,
        "tables": [
            {
                "table": t.name,
                "sharding_type": "table_wise",
                "compute_kernel": KERNELS.get(t.name.split(".")[0], "fused"),
                "shards": [whole(t, 0)],
            }
            for t in tables
        ],
    }
    torch.manual_seed(SEED)
    model = TinyModel(tables, case, plan, None, keys, rename=lambda kjt: duplicate(kjt, copies))
    full = plain.sparse_arch.full_state_dict()
    initial = {
        f"{t.name}.weight": full[f"{source[t.name][0]}.weight"][
            :, source[t.name][1] : source[t.name][1] + t.embedding_dim
        ]
        for t in tables
    }
    model.sparse_arch.load_state_dict(initial, strict=False)

    def tables_of(model: TinyModel) -> dict[str, torch.Tensor]:
        got = model.sparse_arch.full_state_dict()
        return {
            f"{t.name}.weight": torch.cat([got[f"{t.name}.c{k}.weight"] for k in range(len(split[t.name]))], dim=1)
            if t.name in split
            else got[f"{t.name}.weight"]
            for t in TABLES
        }

    return model, tables_of


def split_table(table: EmbeddingBagConfig, k: int, shard: dict[str, int]) -> EmbeddingBagConfig:
    """Column shard k of `table` as a table of its own, features renamed `<feature>.c<k>`."""
    low, high = table.init_range()
    return replace(
        table,
        name=f"{table.name}.c{k}",
        embedding_dim=shard["cols"],
        feature_names=tuple(f"{f}.c{k}" for f in table.feature_names),
        weight_init_min=low,
        weight_init_max=high,
    )


def duplicate(kjt: KeyedJaggedTensor, copies: dict[str, str]) -> KeyedJaggedTensor:
    """`kjt` plus a copy of feature `copies[name]` under each `name`."""
    index = kjt.index_per_key()
    permuted = kjt.permute(list(range(len(kjt.keys()))) + [index[f] for f in copies.values()])
    return KeyedJaggedTensor(
        kjt.keys() + list(copies),
        permuted.values(),
        permuted.weights_or_none(),
        permuted.lengths(),
        stride=kjt.stride(),
    )


def bad_batch(rank: int) -> tuple[torch.Tensor, KeyedJaggedTensor, str]:
    """Rank `rank`'s batch 0 with its first id set one past its table's rows; the expected error.

    The first id belongs to the first group (data_parallel in MIXED), so the
    rank raises before its first collective.
    """
    dense, sparse, _ = make_batch(0, rank, WORLD_SIZE)
    tables = {f: t for t in TABLES for f in t.feature_names}
    values = sparse.values().clone()
    key = next(i for i, n in enumerate(sparse.length_per_key()) if n and sparse.keys()[i] in tables)
    feature = sparse.keys()[key]
    table = tables[feature]
    values[sparse.offset_per_key()[key]] = table.num_embeddings
    corrupted = KeyedJaggedTensor(sparse.keys(), values, sparse.weights(), sparse.lengths(), stride=sparse.stride())
    sample = int(sparse[feature].lengths().nonzero()[0, 0])  # the first sample with an id
    message = (
        f"feature {feature!r} at sample {sample}: id {table.num_embeddings} out of range "
        f"for table {table.name!r} "
        f"with {table.num_embeddings} rows (on rank {rank})"
    )
    return dense, corrupted, message


def init(rank: int, port: int) -> dist.ProcessGroup:
    torch.set_num_threads(1)
    init_process_group(
        backend="gloo",
        store=rendezvous.client(port, WORLD_SIZE, datetime.timedelta(seconds=60)),
        rank=rank,
        world_size=WORLD_SIZE,
        timeout=datetime.timedelta(seconds=60),
    )
    return dist.group.WORLD


def run_training(rank: int, port: int, out: str) -> None:
    """Every case at WORLD_SIZE ranks; rank 0 saves losses, full tables and state checks."""
    group = init(rank, port)
    results: dict[str, Any] = {}
    for case in cases():
        model = build(case, group, WORLD_SIZE)
        losses = train(model, group, rank, WORLD_SIZE)
        results[case.name] = {
            "losses": losses,
            "tables": model.sparse_arch.full_state_dict(),
            "mlp": {k: v.detach().clone() for k, v in model.mlp.state_dict().items()},
        }
    results["state"] = state_checks(model, group)
    if rank == 0:
        torch.save(results, Path(out) / "results.pt")
    del model, group  # nothing may hold the group when it closes (see runtime/train/process_group.py)
    close_process_group()


def state_checks(model: TinyModel, group: dist.ProcessGroup) -> dict[str, Any]:
    """Local state dicts name shards, reload into a fresh model, and rank0_only gathers."""
    arch = model.sparse_arch
    state = arch.state_dict()
    fresh = build(cases()[-1], group, WORLD_SIZE).sparse_arch
    fresh.load_state_dict(state)
    reloaded = fresh.full_state_dict()
    expected = arch.full_state_dict()
    rank0 = arch.full_state_dict(rank0_only=True)
    gathered: list[Any] = [None] * WORLD_SIZE
    dist.all_gather_object(
        gathered,
        {
            "keys": sorted(state),
            "metadata": arch.shard_metadata(),
            "reload_equal": all(torch.equal(reloaded[k], expected[k]) for k in expected),
            "rank0_only_keys": sorted(rank0),
        },
        group=group,
    )
    return {"ranks": gathered}


def run_errors(rank: int, port: int, out: str) -> None:
    """Ranks that disagree on the plan fail with a message; then rank 1 feeds an out-of-range id."""
    group = init(rank, port)
    case = cases()[-1]
    plan = case.plan()
    if rank == 1:
        plan["tables"][1]["shards"] = [whole(TABLES[1], 1)]  # t1 is on rank 0 in MIXED
    try:
        TinyModel(TABLES, case, plan, group, feature_keys(TABLES))
        message = "no error"
    except ValueError as error:
        message = str(error)
    Path(out, f"plan_error_{rank}.txt").write_text(message)
    model = build(case, group, WORLD_SIZE)
    if rank == 1:
        dense, sparse, _ = bad_batch(rank)
        model(dense, sparse)
    # Rank 0 stays out of collectives: a peer blocked in one may also abort when the bad
    # rank exits, and the test wants to see which error spawn reports. It waits to be stopped.
    time.sleep(120)
