"""Partition: pick one estimated candidate per table and put its shards on ranks.

Last stage of the planner, after estimate. Goal: no rank over its memory,
and the slowest rank's estimated time as small as it can be made. The
default `GreedyPartitioner`:

1. select: per table, the cheapest option (least total time) whose shards
   fit an empty rank and none of whose shards exceeds a balance target; this
   is tried for targets of infinity, 1, 1/2 and 1/4 times the lower bound;
2. place: options with fixed ranks first (largest memory first), then every
   free shard, largest first (time or memory, whichever is the bigger share
   of a rank), on the least loaded rank with room; a table that finds no room
   falls back to its next cheapest option that fits now;
3. improve the best of those layouts: while one step lowers the slowest rank
   without raising another to its time, move a shard off it, swap two shards,
   or switch a table on it to another option.

Everything is ordered by value then index, so the same input gives the same
layout. No table fits anywhere -> CompileError naming it, its bytes and the
bytes free per rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from compiler.diagnostics import CompileError, Diagnostic
from compiler.ir import Location
from compiler.planner.enumerate import Candidate, TableSpec
from compiler.planner.estimate import ShardEstimate
from compiler.planner.topology import Topology, format_bytes

TARGET_FACTORS = (math.inf, 1.0, 0.5, 0.25)  # balance targets tried, times the lower bound
RELATIVE_EPS = 1e-9  # improvements smaller than this share of the slowest rank do not count


@dataclass(frozen=True, slots=True)
class Option:
    """A candidate with its estimates, per shard and summed up."""

    candidate: Candidate
    storage: tuple[int, ...]
    cost: tuple[float, ...]
    total_cost: float
    max_cost: float
    total_storage: int
    max_storage: int

    @classmethod
    def of(cls, candidate: Candidate, estimates: Sequence[ShardEstimate]) -> Option:
        storage = tuple(e.storage_bytes for e in estimates)
        cost = tuple(e.cost_ms for e in estimates)
        return cls(candidate, storage, cost, sum(cost), max(cost), sum(storage), max(storage))

    @property
    def sharding_type(self) -> str:
        return self.candidate.sharding_type

    @property
    def fixed(self) -> bool:
        return self.candidate.ranks is not None


@dataclass(frozen=True, slots=True)
class TableOptions:
    table: TableSpec
    options: tuple[Option, ...]
    allowed_ranks: tuple[int, ...]
    constrained: bool  # the spec's constraints narrowed its sharding types, kernels or ranks


@dataclass(frozen=True, slots=True)
class Placement:
    """The option chosen for a table, the rank of each of its shards, and why."""

    option: int
    ranks: tuple[int, ...]
    reason: str


class Partitioner(Protocol):
    def partition(self, tables: Sequence[TableOptions], topology: Topology) -> tuple[Placement, ...]: ...


def lower_bound_ms(tables: Sequence[TableOptions], topology: Topology) -> float:
    """No layout of these options has a slowest rank below this: the least total
    time spread evenly over the ranks, or the least time of a table's largest shard."""
    work, largest = 0.0, 0.0
    for table in tables:
        fitting = [o for o in table.options if o.max_storage <= topology.memory_per_rank] or table.options
        work += min(o.total_cost for o in fitting)
        largest = max(largest, min(o.max_cost for o in fitting))
    return max(work / topology.world_size, largest)


class GreedyPartitioner:
    def partition(self, tables: Sequence[TableOptions], topology: Topology) -> tuple[Placement, ...]:
        _check_each_fits(tables, topology)
        bound = lower_bound_ms(tables, topology)
        best: _Layout | None = None
        first_failure: _Layout | None = None
        tried: list[list[int]] = []
        for factor in TARGET_FACTORS:
            choice, why = _select(tables, bound * factor, topology)
            if choice in tried:
                continue
            tried.append(choice)
            layout = _Layout(tables, topology)
            if not layout.place_all(choice, why):
                first_failure = first_failure or layout
                continue
            layout.improve()
            if best is None or layout.key() < best.key():
                best = layout
        if best is None:
            assert first_failure is not None
            raise CompileError([first_failure.failure_diagnostic()])
        return best.placements()


def _check_each_fits(tables: Sequence[TableOptions], topology: Topology) -> None:
    cap = topology.memory_per_rank
    free = [cap] * topology.world_size
    problems = [_no_room(t, free, topology) for t in tables if all(o.max_storage > cap for o in t.options)]
    if problems:
        raise CompileError(problems)


def _no_room(table: TableOptions, free: Sequence[int], topology: Topology) -> Diagnostic:
    """`table` needs more than the ranks have free: what its smallest split needs, and the
    free bytes of each rank (of the ranks the constraints let it use)."""
    smallest = min(table.options, key=lambda o: (o.max_storage, o.total_storage))
    if smallest.fixed:
        where = f"{format_bytes(smallest.max_storage)} on each of {len(smallest.cost)} ranks"
    else:
        where = f"{format_bytes(smallest.max_storage)} for its largest shard"
    if len(free) <= 16:
        per_rank = ", ".join(format_bytes(f) for f in free)
    else:
        per_rank = f"{format_bytes(min(free))} to {format_bytes(max(free))} over {len(free)} ranks"
    message = (
        f"table '{table.table.name}' does not fit: it needs {format_bytes(smallest.total_storage)} "
        f"as {describe(smallest)}, {where}; free per rank: {per_rank} "
        f"(of {format_bytes(topology.memory_per_rank)} each)"
    )
    allowed = table.allowed_ranks
    if len(allowed) < topology.world_size:
        plural = "s" if len(allowed) > 1 else ""
        message += f"; the spec's constraints allow only rank{plural} " + ", ".join(map(str, allowed))
    return Diagnostic(table.table.loc, "", message)


def check_total_memory(tables: Sequence[TableOptions], topology: Topology) -> None:
    """All tables together against all ranks: one clear diagnostic, at the largest table's
    spec line, before any placement is tried."""
    least = {t.table.name: min(o.total_storage for o in t.options) for t in tables}
    need, have = sum(least.values()), topology.memory_per_rank * topology.world_size
    if need <= have:
        return
    largest = sorted(least, key=lambda name: -least[name])[:3]
    where = next(t.table.loc for t in tables if t.table.name == largest[0])
    world = topology.world_size
    ranks = "1 rank has" if world == 1 else f"the {world} ranks have"
    each = "" if world == 1 else f" ({format_bytes(topology.memory_per_rank)} each)"
    message = (
        f"the tables need at least {format_bytes(need)} together, {ranks} {format_bytes(have)}{each}; "
        "largest: " + ", ".join(f"'{name}' {format_bytes(least[name])}" for name in largest)
    )
    raise CompileError([Diagnostic(where, "", message)])


def _select(tables: Sequence[TableOptions], target: float, topology: Topology) -> tuple[list[int], list[str]]:
    """Per table: the option index to try first and why it is chosen."""
    cap = topology.memory_per_rank
    choice, why = [], []
    for table in tables:
        options = table.options
        order = sorted(range(len(options)), key=lambda i: (options[i].total_cost, i))
        cheapest = options[order[0]]
        fitting = [i for i in order if options[i].max_storage <= cap]
        balanced = [i for i in fitting if options[i].max_cost <= target]
        if balanced:
            pick = balanced[0]
        else:
            pick = min(fitting, key=lambda i: (options[i].max_cost, options[i].total_cost, i))
        choice.append(pick)
        if len(options) == 1:  # world size 1, or narrowed down by the spec
            text = "the only option the spec's constraints allow" if table.constrained else "world size 1"
        elif pick == order[0]:
            text = f"cheapest estimate ({cheapest.total_cost:.3f} ms{_runner_up(options, order)})"
        elif cheapest.max_storage > cap:
            text = (
                f"{format_bytes(cheapest.max_storage)} as {describe(cheapest)} "
                f"does not fit one rank ({format_bytes(cap)})"
            )
        else:
            text = (
                f"{describe(cheapest)} would put {cheapest.max_cost:.3f} ms on one rank, "
                f"over the balance target of {target:.3f} ms"
            )
        if table.constrained and len(options) > 1:
            text += "; within the spec's constraints"
        why.append(text)
    return choice, why


def _runner_up(options: Sequence[Option], order: Sequence[int]) -> str:
    first = options[order[0]].sharding_type
    for i in order[1:]:
        if options[i].sharding_type != first:
            return f"; next {describe(options[i])} {options[i].total_cost:.3f} ms"
    return ""


def describe(option: Option) -> str:
    """`table_wise`, `column_wise in 4 shards`, `row_wise`, ... (with a kernel other than fused)."""
    text = option.sharding_type
    if text == "column_wise":
        text += f" in {len(option.cost)} shard" + ("s" if len(option.cost) > 1 else "")
    elif text == "table_row_wise" and option.candidate.ranks:
        text += f" on ranks {option.candidate.ranks[0]}-{option.candidate.ranks[-1]}"
    if option.candidate.compute_kernel != "fused":
        text += f" ({option.candidate.compute_kernel})"
    return text


class _Layout:
    """A layout in the making: the option of each table, its shards' ranks and the per-rank sums."""

    def __init__(self, tables: Sequence[TableOptions], topology: Topology) -> None:
        self.tables = tables
        self.topology = topology
        self.world = topology.world_size
        self.cap = topology.memory_per_rank
        self.load = np.zeros(self.world)
        self.used = np.zeros(self.world, dtype=np.int64)
        self.choice: list[int] = []
        self.why: list[str] = []
        self.ranks: list[list[int]] = []
        self.failed: int | None = None
        self.failed_free: list[int] = []
        everywhere = tuple(range(self.world))
        self.masks = []
        for table in tables:
            mask = np.zeros(self.world, dtype=bool)
            mask[list(table.allowed_ranks)] = True
            self.masks.append(None if table.allowed_ranks == everywhere else mask)
        self._arrays: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def option(self, t: int) -> Option:
        return self.tables[t].options[self.choice[t]]

    def key(self) -> tuple[float, float]:
        return float(self.load.max()), float(self.load.sum())

    # -- greedy placement --------------------------------------------------

    def place_all(self, choice: list[int], why: list[str]) -> bool:
        """Place every table, fixed options first; False (and `failed` set) when one finds no room."""
        self.choice, self.why = list(choice), list(why)
        self.ranks = [[-1] * len(self.option(t).cost) for t in range(len(self.tables))]
        done = [False] * len(self.tables)
        fixed = [t for t in range(len(self.tables)) if self.option(t).fixed]
        for t in sorted(fixed, key=lambda t: (-self.option(t).total_storage, t)):
            self.choice[t] = self._least_loaded_twin(t)
            placed = self._try_place(t, self.choice[t], self.load, self.used)
            if placed is None and not self._fall_back(t):
                return False
            self.ranks[t] = placed if placed is not None else self.ranks[t]
            done[t] = True
        mean = max(sum(self.option(t).total_cost for t in range(len(self.tables))) / self.world, 1e-12)
        items = [
            (max(c / mean, s / self.cap), t, j)
            for t in range(len(self.tables))
            if not done[t]
            for j, (c, s) in enumerate(zip(self.option(t).cost, self.option(t).storage))
        ]
        items.sort(key=lambda item: (-item[0], item[1], item[2]))
        for _, t, j in items:
            if done[t]:
                continue
            option = self.option(t)
            q = self._best_rank(t, option.storage[j], self.load, self.used, self.ranks[t])
            if q < 0:
                self._remove(t)
                if not self._fall_back(t):
                    return False
                done[t] = True
                continue
            self.load[q] += option.cost[j]
            self.used[q] += option.storage[j]
            self.ranks[t][j] = q
        return True

    def _least_loaded_twin(self, t: int) -> int:
        """Among the options that differ from the chosen one only in their ranks (table_row_wise
        on each host), the one whose ranks fit and end least loaded; the chosen one if none fits."""

        def layout(c: Candidate) -> tuple:
            return c.sharding_type, c.compute_kernel, c.shards

        chosen = layout(self.option(t).candidate)
        best, best_peak = self.choice[t], np.inf
        for o, option in enumerate(self.tables[t].options):
            if layout(option.candidate) != chosen:
                continue
            ranks, cost, storage = self._arrays_of(t, o)
            if (self.used[ranks] + storage > self.cap).any():
                continue
            peak = float((self.load[ranks] + cost).max())
            if peak < best_peak:
                best, best_peak = o, peak
        return best

    def _fall_back(self, t: int) -> bool:
        """Put table t, whose chosen option found no room, in its next cheapest option that fits now."""
        failed = self.option(t)
        free_max = self.cap - int(self.used.min())
        options = self.tables[t].options
        for o in sorted(range(len(options)), key=lambda i: (options[i].total_cost, i)):
            if o == self.choice[t] or options[o].max_storage > self.cap:
                continue
            load, used = self.load.copy(), self.used.copy()
            placed = self._try_place(t, o, load, used)
            if placed is not None:
                self.load, self.used = load, used
                self.choice[t], self.ranks[t] = o, placed
                if options[o].sharding_type != failed.sharding_type:
                    shard, free = format_bytes(failed.max_storage), format_bytes(free_max)
                    self.why[t] = f"{describe(failed)} did not fit the memory left ({shard} shard, at most {free} free)"
                return True
        self.failed = t
        self.failed_free = [self.cap - int(u) for u in self.used]
        return False

    def failure_diagnostic(self) -> Diagnostic:
        assert self.failed is not None
        return _no_room(self.tables[self.failed], self.failed_free, self.topology)

    def _arrays_of(self, t: int, o: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Ranks, costs and storage of a fixed option as arrays (its ranks are distinct)."""
        key = (t, o)
        if key not in self._arrays:
            option = self.tables[t].options[o]
            self._arrays[key] = (
                np.array(option.candidate.ranks, dtype=np.int64),
                np.array(option.cost),
                np.array(option.storage, dtype=np.int64),
            )
        return self._arrays[key]

    def _try_place(self, t: int, o: int, load: np.ndarray, used: np.ndarray) -> list[int] | None:
        """Add option o of table t to load/used; None if it finds no room (the arrays are then spoilt)."""
        option = self.tables[t].options[o]
        if option.fixed:
            ranks, cost, storage = self._arrays_of(t, o)
            if (used[ranks] + storage > self.cap).any():
                return None
            load[ranks] += cost
            used[ranks] += storage
            return list(option.candidate.ranks or ())
        placed = [-1] * len(option.cost)
        for j in sorted(range(len(option.cost)), key=lambda j: (-option.cost[j], j)):
            q = self._best_rank(t, option.storage[j], load, used, placed)
            if q < 0:
                return None
            load[q] += option.cost[j]
            used[q] += option.storage[j]
            placed[j] = q
        return placed

    def _best_rank(self, t: int, storage: int, load: np.ndarray, used: np.ndarray, taken: list[int]) -> int:
        """The least loaded rank table t may use, with room for `storage` bytes and none of
        its shards yet (`taken`, -1 for shards not placed), or -1."""
        room = used + storage <= self.cap
        mask = self.masks[t]
        if mask is not None:
            room &= mask
        room[[q for q in taken if q >= 0]] = False
        loads = np.where(room, load, np.inf)
        q = int(loads.argmin())
        return q if room[q] else -1

    def _remove(self, t: int) -> None:
        option = self.option(t)
        for j, q in enumerate(self.ranks[t]):
            if q >= 0:
                self.load[q] -= option.cost[j]
                self.used[q] -= option.storage[j]
        self.ranks[t] = [-1] * len(option.cost)

    # -- local improvement -------------------------------------------------

    def improve(self) -> None:
        """Steps that lower the slowest rank, until none is left (or a generous cap)."""
        self._index_free_shards()
        for _ in range(4 * (len(self.tables) + self.world)):
            if not (self._move() or self._swap() or self._switch()):
                return

    def _index_free_shards(self) -> None:
        """Arrays over every shard the partitioner placed freely, for vectorised moves and swaps."""
        entries = [
            (t, j) for t in range(len(self.tables)) if not self.option(t).fixed for j in range(len(self.option(t).cost))
        ]
        self.free_shards = entries
        self.f_cost = np.array([self.option(t).cost[j] for t, j in entries])
        self.f_mem = np.array([self.option(t).storage[j] for t, j in entries], dtype=np.int64)
        self.f_rank = np.array([self.ranks[t][j] for t, j in entries], dtype=np.int64)
        self.f_table = np.array([t for t, _ in entries], dtype=np.int64)
        self.f_allowed = np.ones((len(entries), self.world), dtype=bool)
        for i, (t, _) in enumerate(entries):
            if self.masks[t] is not None:
                self.f_allowed[i] = self.masks[t]

    def _slowest(self) -> tuple[int, float, float]:
        r = int(self.load.argmax())
        top = float(self.load[r])
        return r, top, RELATIVE_EPS * top

    def _move_shard(self, i: int, q: int) -> None:
        t, j = self.free_shards[i]
        r = int(self.f_rank[i])
        self.load[r] -= self.f_cost[i]
        self.used[r] -= self.f_mem[i]
        self.load[q] += self.f_cost[i]
        self.used[q] += self.f_mem[i]
        self.f_rank[i] = q
        self.ranks[t][j] = q

    def _move(self) -> bool:
        """Move the shard of the slowest rank that leaves the pair's slower side lowest."""
        r, top, eps = self._slowest()
        best: tuple[float, int, int] | None = None
        for i in np.flatnonzero(self.f_rank == r):
            room = self.f_allowed[i] & (self.used + self.f_mem[i] <= self.cap)
            room[self.ranks[self.free_shards[i][0]]] = False  # r, and where its table's other shards are
            loads = np.where(room, self.load, np.inf)
            q = int(loads.argmin())
            if not room[q]:
                continue
            peak = max(top - self.f_cost[i], self.load[q] + self.f_cost[i])
            if peak < top - eps and (best is None or peak < best[0]):
                best = (peak, int(i), q)
        if best is None:
            return False
        self._move_shard(best[1], best[2])
        return True

    def _swap(self) -> bool:
        """Swap a shard of the slowest rank with a cheaper one elsewhere."""
        r, top, eps = self._slowest()
        q = self.f_rank
        best: tuple[float, int, int] | None = None
        on_r = {t for t in range(len(self.tables)) if r in self.ranks[t]}
        # u may come to r: it is elsewhere, allowed on r, and no shard of its table is on r yet
        elsewhere = (q != r) & self.f_allowed[:, r] & ~np.isin(self.f_table, list(on_r))
        for i in np.flatnonzero(q == r):
            cost, mem = self.f_cost[i], self.f_mem[i]
            siblings = np.zeros(self.world, dtype=bool)
            siblings[self.ranks[self.free_shards[i][0]]] = True
            peak = np.maximum(self.load[q] - self.f_cost + cost, top - cost + self.f_cost)
            valid = (
                elsewhere
                & (self.f_cost < cost)
                & (peak < top - eps)
                & self.f_allowed[i][q]
                & ~siblings[q]
                & (self.used[q] - self.f_mem + mem <= self.cap)
                & (self.used[r] - mem + self.f_mem <= self.cap)
            )
            if not valid.any():
                continue
            u = int(np.where(valid, peak, np.inf).argmin())
            if best is None or peak[u] < best[0]:
                best = (float(peak[u]), int(i), u)
        if best is None:
            return False
        _, i, u = best
        q_u = int(self.f_rank[u])
        self._move_shard(u, r)
        self._move_shard(i, q_u)
        return True

    def _switch(self) -> bool:
        """Re-shard a table of the slowest rank in another option, placed greedily."""
        r, top, eps = self._slowest()
        best = None
        for t in range(len(self.tables)):
            if r not in self.ranks[t]:
                continue
            base_load, base_used = self.load.copy(), self.used.copy()
            current = self.option(t)
            for j, q in enumerate(self.ranks[t]):
                base_load[q] -= current.cost[j]
                base_used[q] -= current.storage[j]
            for o, option in enumerate(self.tables[t].options):
                if o == self.choice[t] or option.max_storage > self.cap:
                    continue
                load, used = base_load.copy(), base_used.copy()
                placed = self._try_place(t, o, load, used)
                if placed is None or load[r] >= top - eps:
                    continue
                raised = load > self.load + eps
                if (load[raised] >= top - eps).any():
                    continue
                peak = max(float(load[r]), float(load[raised].max()) if raised.any() else 0.0)
                key = (peak, float(load.sum()))
                if best is None or key < best[0]:
                    best = (key, t, o, placed, load, used)
        if best is None:
            return False
        _, t, o, placed, load, used = best
        self.why[t] = f"balances ranks: as {describe(self.option(t))} it left rank {r} the slowest ({top:.3f} ms)"
        self.load, self.used = load, used
        self.choice[t], self.ranks[t] = o, placed
        self._index_free_shards()
        return True

    def placements(self) -> tuple[Placement, ...]:
        return tuple(
            Placement(self.choice[t], tuple(self.ranks[t]), f"{self.option(t).sharding_type}: {self.why[t]}")
            for t in range(len(self.tables))
        )
