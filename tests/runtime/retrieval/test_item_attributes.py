"""The item catalogue of an item tower reading attributes, and the item batches it fills.

`record` keeps the last row of each item (rows in order, repeats within one
batch too), or with on_conflict 'error' refuses a row that contradicts an
earlier one, naming the item, the attribute and both ids; unseen items have
no attributes, and `item_batch` gives their attribute keys empty bags.
"""

from __future__ import annotations

import pytest
import torch

from runtime.retrieval.head import item_batch, two_tower_output
from runtime.retrieval.item_attributes import ItemAttributes
from runtime.sparse.jagged import JaggedTensor


def test_the_last_row_of_an_item_wins_and_unseen_items_have_none() -> None:
    catalogue = ItemAttributes(6, ("category", "brand"))
    catalogue.record(torch.tensor([2, 4, 2]), torch.tensor([[1, 5], [0, 3], [2, 6]]))
    catalogue.record(torch.tensor([4]), torch.tensor([[1, 1]]))
    expected = torch.tensor([[-1, -1], [-1, -1], [2, 6], [-1, -1], [1, 1], [-1, -1]])
    assert torch.equal(catalogue.lookup(torch.arange(6)), expected)
    assert torch.equal(catalogue(torch.tensor([4, 2])), expected[[4, 2]])
    assert "table" in catalogue.state_dict()  # checkpoints carry it


@pytest.mark.parametrize(
    ("batches", "message"),
    [
        ([([3, 3], [[1, 5], [1, 6]])], "item 3: its 'brand' is 6 in a training row but 5 in an earlier one"),
        (
            [([3], [[1, 5]]), ([0, 3], [[0, 0], [2, 5]])],
            "item 3: its 'category' is 2 in a training row but 1 in an earlier one",
        ),
    ],
)
def test_a_contradicting_row_stops_with_on_conflict_error(batches: list, message: str) -> None:
    catalogue = ItemAttributes(6, ("category", "brand"), on_conflict="error")
    catalogue.record(torch.tensor([1, 1]), torch.tensor([[4, 4], [4, 4]]))  # agreeing repeats are fine
    with pytest.raises(ValueError) as error:
        for ids, attributes in batches:
            catalogue.record(torch.tensor(ids), torch.tensor(attributes))
    assert str(error.value) == message + " (item_attributes on_conflict: error)"


def test_an_item_batch_holds_the_id_and_the_known_attributes_of_each_item() -> None:
    attributes = torch.tensor([[1, -1], [2, 7]])
    keys = ["user", "item", "brand", "category"]
    batch = item_batch(torch.tensor([5, 9]), keys, "item", attributes, ["category", "brand"])
    assert batch.keys() == ["user", "item", "brand", "category"]
    assert batch.lengths().tolist() == [0, 0, 1, 1, 0, 1, 1, 1]
    assert batch.values().tolist() == [5, 9, 7, 1, 2]
    alone = item_batch(torch.tensor([5, 9]), ["brand"], "item", attributes, ["category", "brand"])
    assert (alone.lengths().tolist(), alone.values().tolist()) == ([0, 1], [7])


def test_the_head_keeps_each_positives_attributes_and_refuses_a_bag() -> None:
    one = lambda *values: JaggedTensor(torch.tensor(values), lengths=torch.ones(len(values), dtype=torch.long))  # noqa: E731
    output = two_tower_output(torch.zeros(2, 4), torch.zeros(2, 4), one(5, 9), one(1, 2), one(0, 7))
    assert output.attributes is not None and output.attributes.tolist() == [[1, 0], [2, 7]]
    bag = JaggedTensor(torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 2]))
    with pytest.raises(ValueError) as error:
        two_tower_output(torch.zeros(2, 4), torch.zeros(2, 4), one(5, 9), bag)
    assert str(error.value) == "retrieval head: sample 1 has 2 ids of an item attribute; the feature needs exactly one"
