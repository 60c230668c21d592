"""runtime/embeddings/ids.py: every malformed batch is a ValueError naming key, sample and numbers.

The same cases go through the check itself, an EmbeddingBagCollection's
forward, a sharded input_dist (checked before any collective) and a compiled
training model's forward (tests/compiler/codegen/test_emit.py); the cases
are in tests/malformed_batches.py.
"""

from __future__ import annotations

import re

import pytest
import torch
from malformed_batches import IDS, KEYS, MALFORMED, TABLES, make_kjt

from runtime.config.embeddings import EmbeddingOptimizer
from runtime.embeddings.bag_collection import EmbeddingBagCollection
from runtime.embeddings.ids import IdCheck, IdOutOfRange
from runtime.sharding import table_wise
from runtime.sharding.group import GroupEnv
from runtime.sharding.layout import Shard, TableLayout
from runtime.sparse.jagged import KeyedJaggedTensor


def _check() -> IdCheck:
    return IdCheck(KEYS, ["table 'ta'", "table 'tb'"], [10, 20])


@pytest.mark.parametrize("case", MALFORMED)
def test_the_check_names_what_is_wrong(case: str) -> None:
    make, message = MALFORMED[case]
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        _check()(make())


@pytest.mark.parametrize("case", MALFORMED)
@pytest.mark.parametrize("kernel", ["fused", "dense"])
def test_an_embedding_bag_collection_refuses_a_malformed_batch(case: str, kernel: str) -> None:
    make, message = MALFORMED[case]
    ebc = EmbeddingBagCollection(TABLES, compute_kernel=kernel)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        ebc(make())


@pytest.mark.parametrize("case", MALFORMED)
def test_a_sharded_input_dist_refuses_a_malformed_batch_before_any_collective(case: str) -> None:
    make, message = MALFORMED[case]
    layouts = [
        TableLayout(t, "table_wise", "fused", (Shard(rank, 0, t.num_embeddings, 0, 4),))
        for rank, t in enumerate(TABLES)
    ]
    env = GroupEnv(1, 2, None, torch.device("cpu"), EmbeddingOptimizer(), False)
    input_dist = table_wise.build(layouts, env).input_dist
    with pytest.raises(ValueError, match=f"^{re.escape(message)} \\(on rank 1\\)$"):
        input_dist(make())


def test_out_of_range_ids_are_index_errors_too() -> None:
    make, _ = MALFORMED["an id past its table"]
    with pytest.raises(IndexError):
        _check()(make())
    assert issubclass(IdOutOfRange, ValueError)


def test_a_sound_batch_passes_with_its_per_key_counts() -> None:
    checked = _check()(make_kjt(IDS, offsets=[0, 1, 3, 3, 4, 6, 7]))
    assert checked.length_per_key_or_none() == [3, 4]
    assert checked.offset_per_key_or_none() == [0, 3, 7]
    assert torch.equal(checked.values(), torch.tensor(IDS))


def test_keys_without_a_table_are_checked_for_layout_only() -> None:
    check = IdCheck(["a"], ["table 'ta'"], [10])
    check(make_kjt([1, 2, 3, 400, 500, 600, 700], lengths=[1, 2, 0, 1, 2, 1]))
    make, message = MALFORMED["offsets decrease once"]
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        check(make())


def test_an_empty_batch_passes() -> None:
    empty = KeyedJaggedTensor(KEYS, torch.tensor([], dtype=torch.int64), lengths=torch.zeros(6, dtype=torch.int64))
    assert _check()(empty).length_per_key_or_none() == [0, 0]
