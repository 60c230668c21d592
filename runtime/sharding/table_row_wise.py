"""table_row_wise: each table split into row ranges over the ranks of one host.

The plan dict does not carry ranks_per_host: the host size is inferred as
the largest number of ranks any table is spread over, and every table's
shards must then sit in one aligned block of that many ranks. Past that
check this is row_wise (row_wise.py) with each table's buckets sent to its
own shards' ranks: the same collectives (counts all_to_all_single, lengths +
ids in one, weights in another; pooled partial sums back in one, added up by
the receiver) and the same exact mean pooling.

Unlike TorchRec, partial sums go straight from every shard to the samples'
ranks instead of being reduced inside the host first: the same numbers, one
collective fewer, but more bytes across hosts.
"""

from __future__ import annotations

from typing import Sequence

from runtime.sharding import row_wise
from runtime.sharding.group import EmbeddingGroup, GroupEnv
from runtime.sharding.layout import TableLayout


def build(tables: Sequence[TableLayout], env: GroupEnv) -> EmbeddingGroup:
    """The table_row_wise group of `tables`; ValueError if a table spans two hosts."""
    host_size = max(len({s.rank for s in t.shards}) for t in tables)
    for layout in tables:
        hosts = sorted({s.rank // host_size for s in layout.shards})
        if len(hosts) > 1:
            ranks = sorted({s.rank for s in layout.shards})
            raise ValueError(
                f"plan for table {layout.config.name!r} (table_row_wise): shards on ranks {ranks} "
                f"span several hosts of {host_size} ranks"
            )
    return row_wise.build(tables, env)
