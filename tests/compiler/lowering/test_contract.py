"""The contract between the generated module and the runtime: typed configs that carry spec locations.

Every table, block and head of a generated module is built from a runtime
config that knows the spec line it came from, so a runtime error names it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from compiler.codegen.emit import emit
from compiler.pipeline import compile_spec
from runtime.config.data import DenseFeatureConfig, SparseFeatureConfig
from runtime.config.embeddings import EmbeddingBagConfig
from runtime.config.heads import HeadConfig
from runtime.config.training import DenseOptimizerConfig, TrainingConfig
from runtime.modules.blocks.pooled import MLP
from runtime.modules.heads.losses import total_loss
from runtime.sparse.jagged import KeyedJaggedTensor
from runtime.train.worker import load_module

REPO = Path(__file__).resolve().parents[3]
SPEC = "specs/dlrm_criteo.yaml"


@pytest.fixture(scope="module")
def dlrm(tmp_path_factory: pytest.TempPathFactory):
    """The generated DLRM module, compiled from the repository root (spec paths as in the goldens)."""
    cwd = Path.cwd()
    try:
        os.chdir(REPO)
        path = emit(compile_spec(SPEC)).write(tmp_path_factory.mktemp("dlrm"))[0]
    finally:
        os.chdir(cwd)
    return load_module(str(path))


def test_the_module_hands_the_runtime_typed_configs(dlrm) -> None:
    (click,) = dlrm.HEADS
    assert click == HeadConfig("click", "bce", "click", 1.0, 1, ("ne", "auc", "accuracy"), f"{SPEC}:19:5")
    assert dlrm.DENSE_OPTIMIZER == DenseOptimizerConfig("adagrad", 0.01, where=f"{SPEC}:21:1")
    inputs = dlrm.INPUTS
    assert inputs.dense == (DenseFeatureConfig("int", 13, f"{SPEC}:7:7"),)
    assert inputs.sparse[3] == SparseFeatureConfig("cat_3", "cat_3", 100000, 1, True, False, f"{SPEC}:10:7")
    assert [f.name for f in inputs.sparse] == [f"cat_{i}" for i in range(26)]
    assert inputs.heads is dlrm.HEADS
    assert inputs.training == TrainingConfig(steps=inputs.training.steps, batch_size=2048, seed=0, where=f"{SPEC}:21:1")
    assert (inputs.data, inputs.device) == (None, "cpu")
    assert not hasattr(dlrm, "SPEC")  # the readers and the trainer read INPUTS, not a dict


def test_an_id_out_of_range_names_the_table_and_its_spec_line(dlrm) -> None:
    model = dlrm.build()
    batch = dlrm.synthetic_batch(batch_size=4, step=0)
    sparse = batch.sparse
    values = sparse.values().clone()
    values[0] = 100_000  # cat_0 has 100000 rows
    bad = KeyedJaggedTensor.from_lengths_sync(
        keys=sparse.keys(), values=values, lengths=sparse.lengths(), stride=sparse.stride()
    )
    with pytest.raises(IndexError) as error:
        model(batch.dense, bad)
    assert str(error.value) == (
        f"feature 'cat_0' at sample 0: id 100000 out of range for table 'cat_0' ({SPEC}:10:7) with 100000 rows"
    )


def test_a_block_given_the_wrong_width_names_its_spec_line(dlrm) -> None:
    model = dlrm.build()
    with pytest.raises(ValueError) as error:
        model.bottom(torch.zeros(2, 12))
    assert str(error.value) == f"MLP ({SPEC}:13:3): expected input of shape (B, 13), got (2, 12)"


def test_a_missing_label_names_the_head_and_its_spec_line(dlrm) -> None:
    batch = dlrm.synthetic_batch(batch_size=4, step=0)
    model = dlrm.build()
    with pytest.raises(KeyError) as error:
        model.loss(model(batch.dense, batch.sparse), {})
    assert error.value.args[0] == (
        f"head 'click' ({SPEC}:19:5): label column 'click' is not in the batch (labels present: [])"
    )


def test_configs_built_by_hand_name_what_they_are() -> None:
    with pytest.raises(ValueError) as table:
        EmbeddingBagConfig("t", 10, 4, ("f",), pooling="max", where="model.yaml:3:5")
    assert str(table.value) == "table 't' (model.yaml:3:5): unknown pooling 'max'; expected 'sum' or 'mean'"
    with pytest.raises(ValueError) as head:
        HeadConfig("y", "hinge", "y")
    assert str(head.value) == "head 'y': unknown loss 'hinge' (expected bce, mse, softmax or sampled_softmax)"
    with pytest.raises(ValueError) as dense:
        DenseOptimizerConfig("rowwise_adagrad", 0.1, where="model.yaml:9:3")
    assert str(dense.value) == (
        "dense optimizer 'rowwise_adagrad' (model.yaml:9:3) is not supported (sgd, adagrad, adam or adamw)"
    )
    with pytest.raises(ValueError) as block:
        MLP(4, [0], where="model.yaml:5:3")
    assert str(block.value) == "MLP (model.yaml:5:3): layers[0] must be an integer >= 1 (got 0)"


def test_total_loss_weights_the_heads() -> None:
    heads = (HeadConfig("a", "mse", "x", weight=0.5), HeadConfig("b", "bce", "y"))
    outputs = {"a": torch.tensor([1.0, 3.0]), "b": torch.tensor([0.0, 0.0])}
    labels = {"x": torch.tensor([0.0, 1.0]), "y": torch.tensor([1.0, 0.0])}
    expected = 0.5 * (1.0 + 4.0) / 2 + torch.log(torch.tensor(2.0)).item()
    assert total_loss(outputs, labels, heads).item() == pytest.approx(expected, rel=1e-6)
