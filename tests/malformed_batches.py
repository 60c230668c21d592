"""Malformed KeyedJaggedTensors and the exact message each must raise, wherever it is fed.

Keys 'a' and 'b' look up tables 'ta' (10 rows) and 'tb' (20 rows), stride 3.
Used by tests/runtime/embeddings/test_ids.py (the check, a collection, a
sharded input_dist) and tests/compiler/codegen/test_emit.py (a compiled
training model's forward).
"""

from __future__ import annotations

from typing import Callable

import torch

from runtime.config.embeddings import EmbeddingBagConfig
from runtime.sparse.jagged import KeyedJaggedTensor

KEYS = ["a", "b"]
TABLES = [EmbeddingBagConfig("ta", 10, 4, ["a"]), EmbeddingBagConfig("tb", 20, 4, ["b"])]
IDS = [1, 2, 3, 4, 5, 6, 7]  # a: samples 0..2 hold [1], [2, 3], []; b: [4], [5, 6], [7]


def make_kjt(values: list, **layout: list[int]) -> KeyedJaggedTensor:
    tensors = {name: torch.tensor(numbers) for name, numbers in layout.items()}
    return KeyedJaggedTensor(KEYS, torch.tensor(values), **tensors)


# (batch, the exact message): every case the issue lists.
MALFORMED: dict[str, tuple[Callable[[], KeyedJaggedTensor], str]] = {
    "offsets decrease once": (
        lambda: make_kjt(IDS, offsets=[0, 1, 3, 4, 6, 5, 7]),
        "KeyedJaggedTensor: key 'b' has offsets decreasing from 6 to 5 at sample 1",
    ),
    "offsets do not start at 0": (
        lambda: make_kjt(IDS, offsets=[1, 1, 3, 3, 4, 6, 7]),
        "KeyedJaggedTensor: offsets must start at 0, got 1",
    ),
    "a negative length": (
        lambda: make_kjt(IDS, lengths=[1, 2, 0, 3, -1, 2]),
        "KeyedJaggedTensor: key 'b' has a negative length -1 at sample 1",
    ),
    "lengths not summing to values": (
        lambda: make_kjt(IDS, lengths=[1, 2, 0, 1, 2, 2]),
        "KeyedJaggedTensor: sum(lengths)=8 but values has 7 entries",
    ),
    "offsets past the values": (
        lambda: make_kjt(IDS, offsets=[0, 1, 3, 3, 4, 6, 9]),
        "KeyedJaggedTensor: sum(lengths)=9 but values has 7 entries",
    ),
    "wrong number of lengths": (
        lambda: KeyedJaggedTensor(KEYS, torch.tensor(IDS), lengths=torch.tensor([1, 2, 0, 1, 2, 1, 0]), stride=3),
        "KeyedJaggedTensor: lengths has 7 entries but 2 keys x stride 3 need 6",
    ),
    "wrong number of offsets": (
        lambda: KeyedJaggedTensor(KEYS, torch.tensor(IDS), offsets=torch.tensor([0, 1, 3, 3, 4, 7]), stride=3),
        "KeyedJaggedTensor: offsets has 6 entries but 2 keys x stride 3 need 7",
    ),
    "float values": (
        lambda: make_kjt([float(i) for i in IDS], lengths=[1, 2, 0, 1, 2, 1]),
        "KeyedJaggedTensor: the ids of keys 'a', 'b' are torch.float32; ids must be int32 or int64",
    ),
    "an id past its table": (
        lambda: make_kjt([1, 2, 3, 4, 5, 20, 7], lengths=[1, 2, 0, 1, 2, 1]),
        "feature 'b' at sample 1: id 20 out of range for table 'tb' with 20 rows",
    ),
    "a negative id": (
        lambda: make_kjt([1, 2, -3, 4, 5, 6, 7], lengths=[1, 2, 0, 1, 2, 1]),
        "feature 'a' at sample 1: id -3 out of range for table 'ta' with 10 rows",
    ),
    "an id of one table past the other's rows": (
        lambda: make_kjt([1, 12, 3, 4, 5, 6, 7], offsets=[0, 1, 3, 3, 4, 6, 7]),
        "feature 'a' at sample 1: id 12 out of range for table 'ta' with 10 rows",
    ),
    "length_per_key that disagrees": (
        lambda: KeyedJaggedTensor(
            KEYS, torch.tensor(IDS), lengths=torch.tensor([1, 2, 0, 1, 2, 1]), length_per_key=[4, 3]
        ),
        "KeyedJaggedTensor: length_per_key says key 'a' has 4 values but its lengths sum to 3",
    ),
}
