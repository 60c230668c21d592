"""The nodes torchrun started, checked against the plan before any table is built.

torchrun numbers ranks node by node: with LOCAL_WORLD_SIZE ranks on each
node, rank r runs on node r // LOCAL_WORLD_SIZE. A table_row_wise table is
meant to stay within one host (its partial sums cross hosts, its shards do
not); a plan compiled for larger hosts than torchrun started would spread
it over several nodes, so the worker refuses it with the flag that fixes it.
`reccompile train` plans for torchrun's local world size unless told
otherwise, so only a spec's or the command line's `ranks_per_host` that
disagrees with the launch gets here.
"""

from __future__ import annotations

import os
from typing import Any, Mapping


def ranks_per_node(environ: Mapping[str, str] = os.environ) -> int | None:
    """torchrun's local world size (ranks on this node), or None outside torchrun."""
    value = environ.get("LOCAL_WORLD_SIZE")
    return int(value) if value is not None else None


def check_plan_fits_nodes(plan: Mapping[str, Any], ranks_per_node: int) -> None:
    """ValueError naming the first table_row_wise table whose shards sit on several nodes."""
    for table in plan["tables"]:
        if table["sharding_type"] != "table_row_wise":
            continue
        ranks = sorted({shard["rank"] for shard in table["shards"]})
        nodes = sorted({rank // ranks_per_node for rank in ranks})
        if len(nodes) > 1:
            each = f"{ranks_per_node} rank{'s' if ranks_per_node != 1 else ''}"
            raise ValueError(
                f"plan for table {table['table']!r} (table_row_wise): shards on ranks {ranks} "
                f"span nodes {nodes} of {each} each (torchrun's LOCAL_WORLD_SIZE); "
                f"recompile with --ranks-per-host {ranks_per_node}"
            )
