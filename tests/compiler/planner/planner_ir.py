"""Small ModelIRs for the planner tests, built directly (no spec file needed)."""

from __future__ import annotations

from dataclasses import dataclass

from compiler.ir import (
    Constraint,
    Location,
    ModelIR,
    Optimizer,
    Sharding,
    SparseFeature,
    Table,
    Training,
)

SPEC = "specs/test.yaml"


@dataclass(frozen=True)
class T:
    """A table for `make_ir`: `features` features of `ids` ids per sample each
    (sequences of up to `max_length` ids when it is given)."""

    name: str
    rows: int
    dim: int
    ids: int = 1
    features: int = 1
    weighted: bool = False
    optimizer: str | None = None
    max_length: int | None = None  # its features are sequences of at most this many ids


def loc(line: int) -> Location:
    return Location(SPEC, line, 3)


def make_ir(
    tables: list[T],
    world_size: int = 2,
    device: str = "cpu",
    ranks_per_host: int | None = None,
    memory_per_rank: int | None = None,
    batch_size: int = 2048,
    constraints: dict[str, dict] | None = None,
    sparse_optimizer: str = "rowwise_adagrad",
) -> ModelIR:
    ir_tables, features = [], []
    for i, t in enumerate(tables):
        names = [t.name] if t.features == 1 else [f"{t.name}_f{k}" for k in range(t.features)]
        for name in names:
            features.append(
                SparseFeature(name, t.name, t.ids, True, t.weighted, False, loc(100 + len(features)), t.max_length)
            )
        optimizer = Optimizer(t.optimizer or sparse_optimizer, 0.01)  # type: ignore[arg-type]  # resolved, as build_ir does
        ir_tables.append(Table(t.name, t.rows, t.dim, "sum", tuple(names), -0.01, 0.01, optimizer, loc(10 + i)))
    constraint_list = tuple(
        Constraint(
            table=name,
            sharding_types=tuple(c.get("sharding_types", ())),
            compute_kernels=tuple(c.get("compute_kernels", ())),
            ranks=tuple(c.get("ranks", ())),
            loc=loc(500 + i),
        )
        for i, (name, c) in enumerate((constraints or {}).items())
    )
    root = Location(SPEC, 1, 1)
    return ModelIR(
        version=1,
        name="test",
        source=SPEC,
        source_sha256="0" * 64,
        dense=(),
        sparse=tuple(features),
        tables=tuple(ir_tables),
        blocks=(),
        heads=(),
        training=Training(
            batch_size=batch_size,
            seed=0,
            steps=1,
            dense_optimizer=Optimizer("adagrad", 0.01),
            sparse_optimizer=Optimizer(sparse_optimizer, 0.01),  # type: ignore[arg-type]
            loc=loc(300),
        ),
        sharding=Sharding(
            world_size=world_size,
            device=device,  # type: ignore[arg-type]
            ranks_per_host=ranks_per_host,
            memory_per_rank=memory_per_rank,
            constraints=constraint_list,
            loc=loc(400),
        ),
        data=None,
        loc=root,
    )


def dlrm_ir(world_size: int = 2) -> ModelIR:
    """DLRM on Criteo as in ARCHITECTURE.md: 26 tables of 100,000 x 64, one id each, batch 2048."""
    return make_ir([T(f"cat_{i}", 100_000, 64) for i in range(26)], world_size=world_size)
