"""Sequence tables in SparseArch at world size 1: rows per id, training, state dict."""

from __future__ import annotations

import pytest
import torch

from runtime.config.embeddings import EmbeddingBagConfig, EmbeddingConfig, EmbeddingOptimizer
from runtime.sharding import SparseArch
from runtime.sparse.jagged import KeyedJaggedTensor

SGD = EmbeddingOptimizer("sgd", lr=0.5)
BAGS = [EmbeddingBagConfig("user", 50, 4, ("user",))]
SEQUENCES = [
    EmbeddingConfig("items", 100, 8, ("item", "history")),
    EmbeddingConfig("genres", 20, 12, ("genre_history",)),
]


def whole_table_plan(tables, sharding_type="table_wise", kernel="fused") -> dict:
    return {
        "world_size": 1,
        "tables": [
            {
                "table": t.name,
                "sharding_type": sharding_type,
                "compute_kernel": kernel,
                "shards": [
                    {"rank": 0, "row_offset": 0, "rows": t.num_embeddings, "col_offset": 0, "cols": t.embedding_dim}
                ],
            }
            for t in tables
        ],
    }


def batch() -> KeyedJaggedTensor:
    # Three samples; `history` has lengths 2, 0, 3 and `genre_history` 1, 1, 0.
    return KeyedJaggedTensor.from_lengths_sync(
        ["user", "item", "history", "genre_history"],
        torch.tensor([1, 2, 3, 5, 7, 9, 11, 12, 13, 9, 4, 7, 1]),
        torch.tensor([1, 1, 1, 1, 1, 1, 2, 0, 3, 1, 1, 0]),
    )


def sequences(arch: SparseArch, kjt: KeyedJaggedTensor) -> dict:
    group = arch.table_wise_sequence
    return group.output_dist(group.lookup(group.input_dist(kjt))).wait()


@pytest.mark.parametrize("kernel", ["fused", "dense"])
def test_sequence_group_yields_each_features_rows_in_key_order(kernel: str) -> None:
    torch.manual_seed(0)
    arch = SparseArch(BAGS, SGD, whole_table_plan(BAGS + SEQUENCES, kernel=kernel), sequence_tables=SEQUENCES)
    assert [name for name, _ in arch.named_children()] == ["table_wise", "table_wise_sequence"]
    out = sequences(arch, batch())
    assert list(out) == ["item", "history", "genre_history"]
    state = arch.state_dict()
    items, genres = state["items.weight"], state["genres.weight"]
    assert torch.equal(out["item"].values(), items[torch.tensor([5, 7, 9])])
    assert torch.equal(out["history"].values(), items[torch.tensor([11, 12, 13, 9, 4])])
    assert out["history"].lengths().tolist() == [2, 0, 3]
    assert torch.equal(out["genre_history"].values(), genres[torch.tensor([7, 1])])
    assert out["genre_history"].lengths().tolist() == [1, 1, 0]


@pytest.mark.parametrize("kernel", ["fused", "dense"])
def test_backward_updates_each_looked_up_row_by_its_summed_gradient(kernel: str) -> None:
    torch.manual_seed(0)
    arch = SparseArch(BAGS, SGD, whole_table_plan(BAGS + SEQUENCES, kernel=kernel), sequence_tables=SEQUENCES)
    before = arch.state_dict()["items.weight"].clone()
    out = sequences(arch, batch())
    grad_item = torch.randn(3, 8)
    grad_history = torch.randn(5, 8)
    ((out["item"].values() * grad_item).sum() + (out["history"].values() * grad_history).sum()).backward()
    expected = before.clone()
    for row, grad in zip([5, 7, 9, 11, 12, 13, 9, 4], torch.cat([grad_item, grad_history])):
        expected[row] -= 0.5 * grad
    torch.testing.assert_close(arch.state_dict()["items.weight"], expected, rtol=0, atol=1e-6)


def test_state_dict_shard_metadata_and_full_tables_name_sequence_tables_like_bags() -> None:
    torch.manual_seed(0)
    adagrad = EmbeddingOptimizer("rowwise_adagrad", lr=0.1)
    arch = SparseArch(BAGS, adagrad, whole_table_plan(BAGS + SEQUENCES), sequence_tables=SEQUENCES)
    assert sorted(arch.state_dict()) == [
        f"{t}.{s}" for t in ("genres", "items", "user") for s in ("momentum1", "weight")
    ]
    assert arch.shard_metadata()["items"] == {
        "table": "items",
        "rank": 0,
        "row_offset": 0,
        "rows": 100,
        "col_offset": 0,
        "cols": 8,
        "table_rows": 100,
        "table_cols": 8,
    }
    full = arch.full_state_dict()
    assert torch.equal(full["items.weight"], arch.state_dict()["items.weight"])
    torch.manual_seed(1)
    other = SparseArch(BAGS, adagrad, whole_table_plan(BAGS + SEQUENCES), sequence_tables=SEQUENCES)
    other.load_state_dict(arch.state_dict())
    assert torch.equal(other.full_state_dict()["items.weight"], full["items.weight"])


def test_sequence_tables_start_as_they_would_as_bag_tables() -> None:
    """Initialisation depends on the table's name and shape, not on how it is looked up."""
    torch.manual_seed(3)
    as_sequences = SparseArch(BAGS, SGD, whole_table_plan(BAGS + SEQUENCES), sequence_tables=SEQUENCES)
    bags = BAGS + [EmbeddingBagConfig(t.name, t.num_embeddings, t.embedding_dim, t.feature_names) for t in SEQUENCES]
    torch.manual_seed(3)
    as_bags = SparseArch(bags, SGD, whole_table_plan(bags))
    for name, table in as_bags.full_state_dict().items():
        assert torch.equal(as_sequences.full_state_dict()[name], table)


def test_a_name_shared_by_a_bag_table_and_a_sequence_table_is_refused() -> None:
    clash = [EmbeddingConfig("user", 10, 4, ("history",))]
    with pytest.raises(ValueError, match="^table 'user' is given twice: as a pooled table and as a sequence table$"):
        SparseArch(BAGS, SGD, whole_table_plan(BAGS), sequence_tables=clash)


@pytest.mark.parametrize("as_sequence", [False, True])
def test_a_feature_read_by_two_tables_is_refused_naming_it(as_sequence: bool) -> None:
    """The collections name such outputs feature@table; the sharded stages route by feature, and a
    spec never puts one feature in two tables."""
    second = (EmbeddingConfig if as_sequence else EmbeddingBagConfig)("other", 10, 4, (BAGS[0].feature_names[0],))
    bags, sequences = (BAGS, [second]) if as_sequence else (BAGS + [second], [])
    message = (
        f"feature {BAGS[0].feature_names[0]!r} is read by tables {BAGS[0].name!r} and 'other': sharded tables take "
        "one feature each (outputs named feature@table are EmbeddingBagCollection's and EmbeddingCollection's only)"
    )
    with pytest.raises(ValueError) as refused:
        SparseArch(bags, SGD, whole_table_plan(bags + sequences), sequence_tables=sequences)
    assert str(refused.value) == message
