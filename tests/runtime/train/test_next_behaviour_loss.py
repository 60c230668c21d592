"""A gru's `aux_loss` (DIEN's auxiliary next-behaviour loss) in a compiled model, end to end.

tests/specs/valid/dien_aux_loss.yaml (an extractor gru with aux_loss weight 0.5, an AUGRU, the item
table row-wise at 2 ranks) compiled as written, with weight 0 and without the option:

- weight 0 trains bit-identically to the model without the option (no auxiliary network is built);
- the model's loss is the head's loss plus 0.5 x the authors' loss written out position by position,
  each position's negative the item table's row of the id per_query_negatives draws for it;
- the term's gradient reaches the extractor's states (at the positions that score a next item only)
  and its parameters;
- evaluation scores as the model without the option, and export's graph is that model's;
- 2 ranks (plain loop and pipeline) train what one process does: losses, tables and dense state.

The auxiliary loss of one batch is tested against a direct computation in
tests/runtime/modules/test_dien_auxiliary.py.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import feature_transforms_cases as fc
import pipeline_cases as pc
import pytest
import rendezvous
import torch
import torch.multiprocessing as mp

from compiler.pipeline import Options, generate
from compiler.serving.lower import lower_inference
from compiler.spec.load import load
from compiler.spec.validate import validate
from runtime.data.loader import LocalBatch
from runtime.modules.heads.losses import total_loss
from runtime.retrieval.next_behaviour import output_key
from runtime.retrieval.sampling import per_query_negatives
from runtime.train.evaluate import evaluate
from runtime.train.worker import load_module

SPEC = Path(__file__).resolve().parents[2] / "specs" / "valid" / "dien_aux_loss.yaml"
OPTION = "aux_loss: {weight: 0.5}"
WEIGHT, MAX_LENGTH, NUM_ITEMS = 0.5, 6, 30
ATOL = 1e-5


def spec_text(option: str | None) -> str:
    text = SPEC.read_text()
    assert f", {OPTION}" in text
    return text.replace(f", {OPTION}", "" if option is None else f", {option}")


@pytest.fixture(scope="module")
def specs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("next_behaviour")
    paths = {}
    for name, option in (("aux", OPTION), ("zero", "aux_loss: {weight: 0}"), ("plain", None)):
        paths[name] = out / f"{name}.yaml"
        paths[name].write_text(spec_text(option))
    return paths


@pytest.fixture(scope="module")
def compiled(specs: dict[str, Path]) -> dict[str, Path]:
    out = specs["aux"].parent
    modules = {name: generate(str(path), Options(world_size=1)).write(out / name)[0] for name, path in specs.items()}
    modules["aux2"] = generate(str(specs["aux"]), Options(world_size=2)).write(out / "aux2")[0]
    return modules


def test_weight_zero_trains_bit_identically_to_the_model_without_the_option(compiled: dict[str, Path]) -> None:
    zero = pc.train_case(load_module(str(compiled["zero"])), None, 0, 1, None)
    plain = pc.train_case(load_module(str(compiled["plain"])), None, 0, 1, None)
    assert torch.equal(zero["losses"], plain["losses"])
    for part in ("tables", "dense"):
        assert zero[part].keys() == plain[part].keys()
        for name, value in plain[part].items():
            assert torch.equal(zero[part][name], value), name


def _click_probability(layers: torch.nn.Sequential, state: torch.Tensor, item: torch.Tensor) -> float:
    """The authors' auxiliary_net on one pair, in float64: softmax(f3(sigmoid(f2(sigmoid(f1(x))))))[0]."""
    f1, _, f2, _, f3 = layers
    x = torch.cat([state, item]).detach().double()
    hidden = torch.sigmoid(f1.weight.detach().double() @ x + f1.bias.detach().double())
    hidden = torch.sigmoid(f2.weight.detach().double() @ hidden + f2.bias.detach().double())
    logits = f3.weight.detach().double() @ hidden + f3.bias.detach().double()
    return float(torch.exp(logits[0]) / torch.exp(logits).sum())


def _model_and_outputs(compiled: dict[str, Path]) -> tuple[Any, Any, Any, dict[str, Any]]:
    module = load_module(str(compiled["aux"]))
    torch.manual_seed(pc.SEED)
    model = module.build()
    batch = module.synthetic_batch(pc.GLOBAL_BATCH, step=0)
    return module, model, batch, model(batch.dense, batch.sparse)


def test_the_loss_is_the_heads_plus_the_weighted_per_position_auxiliary_loss(compiled: dict[str, Path]) -> None:
    module, model, batch, outputs = _model_and_outputs(compiled)
    table = model.sparse_arch.full_state_dict()["item.weight"]
    history = batch.sparse["history"]
    lengths, ids = history.lengths(), history.values()
    assert int(lengths.max()) <= MAX_LENGTH and int((lengths >= 2).sum()) >= 4  # positions to score
    negatives = per_query_negatives(0, 0, slice(0, pc.GLOBAL_BATCH), pc.GLOBAL_BATCH, MAX_LENGTH, NUM_ITEMS)
    states = outputs[output_key("interests")].states
    layers = model.interests_aux_loss.net.layers
    expected, start = 0.0, 0
    for b, n in enumerate(lengths.tolist()):
        items = ids[start : start + n]
        start += n
        for t in range(n - 1):
            expected -= math.log(_click_probability(layers, states[b, t], table[items[t + 1]]))
            expected -= math.log(1.0 - _click_probability(layers, states[b, t], table[negatives[b, t + 1]]))
    expected /= pc.GLOBAL_BATCH * (MAX_LENGTH - 1)
    heads = total_loss(outputs, batch.labels, module.HEADS)
    loss = model.loss(outputs, batch.labels)
    assert loss.item() == pytest.approx(heads.item() + WEIGHT * expected, rel=1e-5)
    assert WEIGHT * expected > 0.1  # the term is a real part of the loss
    assert int(model.interests_aux_loss.step) == 1  # the next step draws other negatives


def test_the_terms_gradient_reaches_the_extractors_states_and_parameters(compiled: dict[str, Path]) -> None:
    _, model, batch, outputs = _model_and_outputs(compiled)
    inputs = outputs[output_key("interests")]
    term = model.interests_aux_loss(inputs, model.interests_item_rows)
    states_grad, extractor_grad = torch.autograd.grad(term, [inputs.states, model.interests.gru.weight_hh_l0])
    lengths = batch.sparse["history"].lengths()
    scored = torch.arange(inputs.states.shape[1]).unsqueeze(0) < (lengths - 1).unsqueeze(1)  # t < length - 1
    per_position = states_grad.abs().sum(dim=2)
    assert bool((per_position[scored] > 0).all()) and not per_position[~scored].any()
    assert extractor_grad.abs().sum() > 0


def test_evaluation_runs_no_auxiliary_loss_and_scores_as_the_model_without_it(compiled: dict[str, Path]) -> None:
    """The auxiliary network is built last, so from one seed both models hold the same other weights."""
    results = []
    for name in ("aux", "plain"):
        module = load_module(str(compiled[name]))
        torch.manual_seed(pc.SEED)
        model = module.build()
        batches = [LocalBatch(module.synthetic_batch(pc.GLOBAL_BATCH, step=i), pc.GLOBAL_BATCH) for i in range(3)]
        results.append(evaluate(model, batches, module.HEADS))
        if name == "aux":
            assert int(model.interests_aux_loss.step) == 0  # no draw, no lookup
    assert results[0] == results[1]
    assert results[0]["click"]["auc"] > 0


def test_export_has_no_auxiliary_network(specs: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(specs["aux"].parent)
    aux, plain = (lower_inference(validate(load(specs[name].name))) for name in ("aux", "plain"))
    assert [d.target for d in aux.modules] == [d.target for d in plain.modules]
    assert "aux_loss" not in aux.graph.python_code("self").src
    assert aux.graph.python_code("self").src == plain.graph.python_code("self").src


@pytest.fixture(scope="module")
def two_ranks(compiled: dict[str, Path]) -> dict[str, Any]:
    out = compiled["aux2"].parent
    with rendezvous.hosted_store() as port:
        mp.spawn(fc.run_ranks, args=(port, str(compiled["aux2"]), str(out)), nprocs=2)
    return torch.load(out / "results.pt")


@pytest.mark.parametrize("mode", ["plain", "depth2"])
def test_two_ranks_train_like_one_process(compiled: dict[str, Path], two_ranks: dict[str, Any], mode: str) -> None:
    one = pc.train_case(load_module(str(compiled["aux"])), None, 0, 1, None)
    got = two_ranks[mode]
    torch.testing.assert_close(got["losses"], one["losses"], rtol=0, atol=ATOL)
    for part in ("tables", "dense"):
        assert got[part].keys() == one[part].keys()
        for name, value in one[part].items():
            torch.testing.assert_close(got[part][name], value, rtol=0, atol=ATOL, msg=name)
    assert int(one["dense"]["interests_aux_loss.step"]) == pc.STEPS
