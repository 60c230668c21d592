"""Estimate: the memory and the time per training step of every shard of a candidate.

Third stage of the planner, after enumerate and before partition. Storage
is weights + optimizer state + input/output buffers (+ a full-size gradient
for the dense kernel). Time is the lookup (forward and backward, bytes
touched over the kernel's memory bandwidth) plus the communication the
sharding type needs: the ids all-to-all or, for data_parallel, all-gather
(input_dist), and the pooled all-to-all or reduce-scatter, forward and
backward, or data_parallel's all-gather of pooled gradients in backward
(output_dist); a sequence table's output is one row per id, L·B·D for a
sequence of max_length L, sent by the same collectives; collectives count only the bytes that cross between ranks,
(W-1)/W of the global batch's. Every type, data_parallel included, looks up
the global batch with the optimizer fused into backward
(runtime/sharding/data_parallel.py). docs/planner.md writes out every
formula with a worked example; keep the two in step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from compiler.ir import ComputeKernel, OptimizerType, ShardingType
from compiler.planner.enumerate import Candidate, TableSpec
from compiler.planner.topology import Topology

WEIGHT_BYTES = 4  # float32 weights, gradients, optimizer state and pooled outputs
ID_BYTES = 8  # int64 ids
ID_WEIGHT_BYTES = 4  # float32 per-id weights of weighted features
DENSE_KERNEL_SLOWDOWN = 2.0  # torch.nn.EmbeddingBag against fbgemm's fused kernel
MS_PER_S = 1000.0


@dataclass(frozen=True, slots=True)
class ShardEstimate:
    """Bytes one shard holds on its rank and its milliseconds per training step."""

    storage_bytes: int
    lookup_ms: float  # forward + backward + optimizer update
    input_dist_ms: float  # ids all-to-all (data_parallel: all-gather)
    output_dist_ms: float  # pooled all-to-all or reduce-scatter, forward + backward
    # (data_parallel: all-gather of the pooled gradients, backward only)

    @property
    def cost_ms(self) -> float:
        return self.lookup_ms + self.input_dist_ms + self.output_dist_ms


class Estimator(Protocol):
    def estimate(self, table: TableSpec, candidate: Candidate, topology: Topology) -> tuple[ShardEstimate, ...]: ...


class BandwidthEstimator:
    """The default estimator: every formula of docs/planner.md, one shard shape at a time."""

    def estimate(self, table: TableSpec, candidate: Candidate, topology: Topology) -> tuple[ShardEstimate, ...]:
        known: dict[tuple[int, int], ShardEstimate] = {}
        out = []
        for shard in candidate.shards:
            key = (shard.rows, shard.cols)
            if key not in known:
                known[key] = estimate_shard(
                    table, candidate.sharding_type, candidate.compute_kernel, shard.rows, shard.cols, topology
                )
            out.append(known[key])
        return tuple(out)


def state_bytes_per_row(optimizer: OptimizerType, cols: int) -> int:
    """Optimizer state of one row of `cols` columns."""
    per_element = {"sgd": 0, "rowwise_adagrad": 0, "adagrad": 1, "adam": 2}[optimizer]
    per_row = 1 if optimizer == "rowwise_adagrad" else 0
    return (per_element * cols + per_row) * WEIGHT_BYTES


def shard_traffic(table: TableSpec, sharding_type: ShardingType, rows: int, topology: Topology) -> tuple[float, float]:
    """(ids looked up, vectors written) by one shard per step.

    Every shard serves the global batch, a data_parallel replica included.
    Row splits see the share of ids that falls in their rows (ids are assumed
    uniform over rows) but write partial sums for every sample; a sequence
    table writes one row per id (L per sample for a sequence of max_length
    L), so its row splits write their share of the rows only.
    """
    samples = topology.batch_size_per_rank * topology.world_size
    ids = float(samples * table.ids_per_sample)
    out = float(samples * table.outputs_per_sample)
    if sharding_type in ("row_wise", "table_row_wise"):
        share = rows / table.rows if table.rows else 0.0
        ids *= share
        if table.is_sequence:
            out *= share
    return ids, out


def estimate_shard(
    table: TableSpec,
    sharding_type: ShardingType,
    kernel: ComputeKernel,
    rows: int,
    cols: int,
    topology: Topology,
) -> ShardEstimate:
    """Storage and time of one shard of `rows` x `cols` of `table`."""
    ids, pooled = shard_traffic(table, sharding_type, rows, topology)
    id_bytes = ID_BYTES + (ID_WEIGHT_BYTES if table.weighted else 0)
    row_bytes = cols * WEIGHT_BYTES
    state_row = state_bytes_per_row(table.optimizer, cols)
    out_bytes = pooled * row_bytes
    return ShardEstimate(
        storage_bytes=estimate_storage(kernel, rows, row_bytes, state_row, ids * id_bytes, out_bytes),
        lookup_ms=_lookup_ms(kernel, row_bytes, state_row, ids, id_bytes, out_bytes, topology),
        input_dist_ms=_input_dist_ms(ids * id_bytes, topology),
        output_dist_ms=_output_dist_ms(sharding_type, out_bytes, topology),
    )


def estimate_storage(
    kernel: ComputeKernel,
    rows: int,
    row_bytes: int,
    state_row: int,
    input_bytes: float,
    out_bytes: float,
) -> int:
    """Device bytes: weights + optimizer state + a full gradient (dense kernel)
    + ids in + pooled out and its gradient."""
    table_bytes = rows * (row_bytes + state_row)
    gradient = rows * row_bytes if kernel == "dense" else 0
    return int(table_bytes + gradient + input_bytes + 2 * out_bytes)


def kernel_bandwidth(kernel: ComputeKernel, topology: Topology) -> float:
    """Bytes/s a lookup kernel streams: fused at the memory bandwidth, dense at half."""
    if kernel == "dense":
        return topology.memory_bandwidth / DENSE_KERNEL_SLOWDOWN
    return topology.memory_bandwidth


def _lookup_ms(
    kernel: ComputeKernel,
    row_bytes: int,
    state_row: int,
    ids: float,
    id_bytes: int,
    out_bytes: float,
    topology: Topology,
) -> float:
    # Forward reads the ids and their rows and writes the pooled vectors.
    forward = ids * (id_bytes + row_bytes) + out_bytes
    # Fused backward (every type: a data_parallel replica applies the global
    # update itself): read the output gradient, read+write each touched row
    # and its optimizer state.
    backward = out_bytes + ids * 2 * (row_bytes + state_row)
    return _ms(forward + backward, kernel_bandwidth(kernel, topology))


def _input_dist_ms(id_bytes: float, topology: Topology) -> float:
    """The shard's ids, by all-to-all (data_parallel: all-gather). Its own
    rank's share, 1/W of the global batch, never leaves the rank."""
    return _ms(id_bytes * _remote_share(topology), topology.comm_bandwidth)


def _output_dist_ms(sharding_type: ShardingType, out_bytes: float, topology: Topology) -> float:
    """Pooled vectors, less the rank's own samples' share: sent forward and their
    gradients back (twice one way), except data_parallel, which keeps its own
    rows forward and all-gathers the other ranks' gradients in backward."""
    remote = out_bytes * _remote_share(topology)
    if sharding_type == "data_parallel":
        return _ms(remote, topology.comm_bandwidth)
    if sharding_type == "table_row_wise":
        # Reduce-scatter partial sums inside the host, then send the host's
        # reduced slice to the ranks that own the samples.
        local = topology.ranks_per_host
        one_way = _ms(out_bytes * (local - 1) / local, topology.intra_host_bandwidth) + _ms(
            out_bytes / local, topology.comm_bandwidth
        )
    else:
        # The all-to-all of table_wise and column_wise, the reduce-scatter of row_wise.
        one_way = _ms(remote, topology.comm_bandwidth)
    return 2 * one_way


def _remote_share(topology: Topology) -> float:
    """(W-1)/W: the share of the global batch's samples that belongs to other ranks."""
    return (topology.world_size - 1) / topology.world_size


def _ms(num_bytes: float, bandwidth: float) -> float:
    return num_bytes / bandwidth * MS_PER_S
