"""column_wise: each table split into column ranges, each range whole on one rank.

Each column shard is looked up like a table-wise shard (table_wise.py): a
feature's ids go unchanged to every rank holding one of its table's column
shards (several shards on one rank are separate sub-tables), and
`PooledOutputDist` concatenates the pooled columns back in column order.
Collectives per step: a counts all_to_all_single, one of lengths + ids (and
one of weights), one of pooled rows, and one of gradients in backward.

Optimizer state is per shard. For sgd, adagrad and adam that is exactly the
state of the whole table; rowwise_adagrad keeps one accumulator per row and
shard (the mean of the squared gradient over the shard's columns, as in
TorchRec), which differs from the whole table's accumulator over all columns.
"""

from __future__ import annotations

import logging
from typing import Sequence

from runtime.sharding import table_wise
from runtime.sharding.group import EmbeddingGroup, GroupEnv
from runtime.sharding.layout import TableLayout

logger = logging.getLogger(__name__)


def build(tables: Sequence[TableLayout], env: GroupEnv) -> EmbeddingGroup:
    """The column_wise group of `tables`."""
    _warn_rowwise_adagrad(tables, env)
    return table_wise.build(tables, env)


def _warn_rowwise_adagrad(tables: Sequence[TableLayout], env: GroupEnv) -> None:
    for layout in tables:
        optimizer = layout.config.optimizer or env.optimizer
        if optimizer.type == "rowwise_adagrad" and len(layout.shards) > 1:
            logger.warning(
                "table %r: column_wise with rowwise_adagrad keeps one accumulator per column "
                "shard, so training differs from an unsharded table's",
                layout.config.name,
            )


def build_sequence(tables: Sequence[TableLayout], env: GroupEnv) -> EmbeddingGroup:
    """The column_wise group of sequence `tables`: each key's rows are its shards' columns."""
    _warn_rowwise_adagrad(tables, env)
    return table_wise.build_sequence(tables, env)
