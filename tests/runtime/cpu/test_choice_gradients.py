"""Every kernel pair of runtime/cpu/choice.py trains the same: both choices give the same gradients.

For each kernel that `choice.KERNELS` lists, one small computation runs with
the choice forced each way (RECCOMPILE_KERNELS) and its output and the
gradient of every input that requires one (per-id weights included) are
compared; for the embedding update, whose table gradients go straight into
the fused optimizer, the tables and their state after the step are compared
too. Tolerances cover float32 sums taken in another order; `softmax_gemm`'s
and `attention_precision`'s bf16 sides, asked only under bf16 training, are held to bf16's (its own
stated bound is tests/runtime/retrieval/test_blocked_softmax.py's). The embedding
update is also measured for real, on an empty choice cache: the timing runs
must leave no gradient, and the step after them must see the true one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from runtime.config.embeddings import EmbeddingBagConfig, EmbeddingOptimizer
from runtime.config.training import DenseOptimizerConfig
from runtime.cpu import choice
from runtime.embeddings.bag_collection import EmbeddingBagCollection
from runtime.modules.blocks.pooled import MLP, DotInteraction
from runtime.modules.layers import linear as linear_module
from runtime.modules.layers.one_query_attention import one_query_attention
from runtime.modules.layers.padded_attention import padded_attention
from runtime.retrieval.blocked_softmax import blocked_softmax_loss
from runtime.serving.packed_mlp import PackedMLP
from runtime.serving.quant_embedding import QuantEmbeddingBagCollection
from runtime.sparse.jagged import KeyedJaggedTensor, KeyedTensor
from runtime.train import dense_optimizer
from runtime.train.dense_optimizer import make_dense_optimizer

TOL = {"rtol": 1e-5, "atol": 1e-6}
# bf16 products against fp32 ones
TOLERANCES = {"softmax_gemm": {"rtol": 3e-2, "atol": 1e-4}, "attention_precision": {"rtol": 3e-2, "atol": 2e-2}}
BATCH = 6
TABLES = [
    EmbeddingBagConfig("t0", 40, 8, ["f0", "f1"]),  # one table read by two features
    EmbeddingBagConfig("t1", 30, 16, ["f2"], pooling="mean"),
    EmbeddingBagConfig("t2", 20, 4, ["f3"]),
]
ROWS = {"f0": 40, "f1": 40, "f2": 30, "f3": 20}

# What a case returns: the output, the inputs whose gradients are compared, and tensors to compare
# after the backward (a fused optimizer's tables and state).
Outcome = tuple[torch.Tensor, dict[str, torch.Tensor], Callable[[], dict[str, torch.Tensor]]]


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).requires_grad_()


def _batch(seed: int) -> KeyedJaggedTensor:
    """0-4 ids per bag, rows repeating, per-id weights that require grad (a non-leaf: 2 x a leaf)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 5, (len(ROWS) * BATCH,), generator=gen)
    per_key = lengths.view(len(ROWS), BATCH).sum(1).tolist()
    values = torch.cat([torch.randint(0, min(rows, 7), (n,), generator=gen) for rows, n in zip(ROWS.values(), per_key)])
    leaf = torch.rand(values.numel(), generator=gen).requires_grad_()
    return KeyedJaggedTensor.from_lengths_sync(list(ROWS), values, lengths, weights=leaf * 2)


def _collection_case(lookup_threads: int = 1) -> Outcome:
    torch.manual_seed(0)
    collection = EmbeddingBagCollection(
        TABLES,
        is_weighted=True,
        lookup_threads=lookup_threads,
        optimizer=EmbeddingOptimizer("rowwise_adagrad", lr=0.1),
    )
    kjt = _batch(1)
    leaf = kjt.weights().grad_fn.next_functions[0][0].variable  # the leaf behind `leaf * 2`
    return collection(kjt).values(), {"weights": leaf}, collection.state_dict


def _dot_case() -> Outcome:
    dense, sparse = _randn(BATCH, 8, seed=1), _randn(BATCH, 24, seed=2)
    out = DotInteraction(4, 8)(dense, KeyedTensor(["a", "b", "c"], [8, 8, 8], sparse))
    return out, {"dense": dense, "sparse": sparse}, dict


def _linear_case() -> Outcome:
    x, weight, bias = _randn(BATCH, 13, seed=1), _randn(7, 13, seed=2), _randn(7, seed=3)
    return linear_module.linear(x, weight, bias, relu=True), {"x": x, "weight": weight, "bias": bias}, dict


def _attention_case() -> Outcome:
    x, query = _randn(BATCH, 5, 8, seed=1), _randn(BATCH, 2, 8, seed=2)
    counts = torch.tensor([1, 5, 3, 2, 4, 5])
    return one_query_attention(x, query, counts), {"x": x, "query": query}, dict


def _quant_case() -> Outcome:
    """Forward only on both paths: per-id weights are taken detached, or refused when they require grad."""
    torch.manual_seed(0)
    trained = EmbeddingBagCollection(TABLES, is_weighted=True)
    quantized = QuantEmbeddingBagCollection(TABLES, "int8", is_weighted=True).quantize_from(
        trained.embedding_parameters()
    )
    kjt = _batch(1)
    with pytest.raises(ValueError) as refused:
        quantized(kjt)
    assert str(refused.value) == (
        "QuantEmbeddingBagCollection: per-id weights that require grad; quantized tables are forward only "
        "(detach the weights, or look up under torch.no_grad())"
    )
    detached = KeyedJaggedTensor.from_lengths_sync(
        kjt.keys(), kjt.values(), kjt.lengths(), weights=kjt.weights().detach()
    )
    return quantized(detached).values(), {}, dict


def _packed_mlp_case() -> Outcome:
    """A serving MLP given an input that requires grad runs the model's own layers, on either choice."""
    torch.manual_seed(0)
    mlp = PackedMLP.from_mlp(MLP(13, [16, 7]), exact=False)
    x = _randn(BATCH, 13, seed=1)
    return mlp(x), {"x": x, **dict(mlp.named_parameters())}, dict


def _mlp_int8_case() -> Outcome:
    """A serving MLP that may run int8 layers, given an input that requires grad: the model's own layers."""
    torch.manual_seed(0)
    mlp = PackedMLP.from_mlp(MLP(13, [16, 7]), exact=False, int8=True)
    x = _randn(BATCH, 13, seed=1)
    return mlp(x), {"x": x, **dict(mlp.named_parameters())}, dict


def _softmax_gemm_case() -> Outcome:
    """The in-batch softmax under a bf16 autocast, where `softmax_gemm` is asked."""
    query = torch.nn.functional.normalize(_randn(40, 16, seed=1), dim=-1)
    candidates = torch.nn.functional.normalize(_randn(40, 16, seed=2), dim=-1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = blocked_softmax_loss(query, candidates, torch.arange(40), None, 0.05, "mean", block=16, bound=20.0)
    leaves = {"query": query.grad_fn.next_functions[0][0].variable}
    leaves["candidates"] = candidates.grad_fn.next_functions[0][0].variable
    return out, leaves, dict


def _in_batch_softmax_case() -> Outcome:
    """The in-batch softmax in fp32 with D a multiple of 16, where `in_batch_softmax` is asked."""
    query, candidates = _randn(40, 16, seed=1), _randn(37, 16, seed=2)
    hits = (torch.tensor([0, 3]), torch.tensor([5, 9]))
    out = blocked_softmax_loss(query, candidates, torch.arange(40) % 37, hits, 0.5, "mean")
    return out, {"query": query, "candidates": candidates}, dict


def _dense_step_case() -> Outcome:
    """A layer's weights stepped by the dense optimizer (two threads), where `dense_step` is asked."""
    weight = _randn(5, 3, seed=1)
    optimizer = make_dense_optimizer(DenseOptimizerConfig("adagrad", lr=0.1), [weight])
    out = _randn(4, 5, seed=2).detach() @ weight

    def after() -> dict[str, torch.Tensor]:
        dense_optimizer.step(optimizer)
        return {"weight after the step": weight.detach().clone()}

    return out, {"weight": weight}, after


def _attention_precision_case() -> Outcome:
    """Causal attention under a bf16 autocast, where `attention_precision` is asked."""
    q, k, v = (_randn(3, 2, 5, 8, seed=seed) for seed in (1, 2, 3))
    allowed = torch.ones(5, 5, dtype=torch.bool).tril()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = padded_attention(q, k, v, allowed)
    return out.float(), {"q": q, "k": k, "v": v}, dict


# kernel -> (the case, the environment of each choice beside the kernel's own)
CASES: dict[str, tuple[Callable[[], Outcome], str]] = {
    "dot": (_dot_case, ""),
    "linear": (_linear_case, "linear_grad_input=plain,linear_grad_weight=mm"),
    "lookup": (lambda: _collection_case(lookup_threads=2), "embedding_update=fbgemm"),
    "quant_pool": (_quant_case, ""),
    "pool_team": (_quant_case, "quant_pool=native"),
    "attention": (_attention_case, ""),
    "embedding_update": (_collection_case, "lookup=sequential"),
    "linear_grad_input": (_linear_case, "linear=aten"),
    "linear_grad_weight": (_linear_case, "linear=onednn"),
    "packed_mlp": (_packed_mlp_case, "linear=aten"),
    "mlp_int8": (_mlp_int8_case, "linear=aten,packed_mlp=aten"),
    "softmax_gemm": (_softmax_gemm_case, ""),
    "attention_precision": (_attention_precision_case, ""),
    "in_batch_softmax": (_in_batch_softmax_case, ""),
    "dense_step": (_dense_step_case, ""),
}


@pytest.fixture
def two_threads() -> Iterator[None]:
    """The concurrent lookup needs 2 intra-op threads (it runs on min(lookup_threads, threads))."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _step(case: Callable[[], Outcome]) -> tuple[torch.Tensor, dict, dict]:
    """The case's output, its inputs' gradients after one backward, and what it compares after that."""
    out, inputs, after = case()
    if out.requires_grad:
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(9)))
    return out.detach(), {name: t.grad for name, t in inputs.items()}, after()


def _run(kernel: str, path: str, monkeypatch: pytest.MonkeyPatch) -> tuple[torch.Tensor, dict, dict]:
    case, others = CASES[kernel]
    monkeypatch.setenv(choice.ENV, ",".join(filter(None, [f"{kernel}={path}", others])))
    return _step(case)


def test_every_measured_kernel_has_a_case() -> None:
    assert CASES.keys() == choice.KERNELS.keys()


@pytest.mark.usefixtures("native_kernels", "two_threads")
@pytest.mark.parametrize("kernel", list(CASES))
def test_both_choices_give_the_same_gradients(kernel: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RECCOMPILE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(linear_module, "MIN_ONEDNN_MACS", 1)  # the small layers here would stay on aten
    baseline, alternative = choice.KERNELS[kernel]
    out, grads, after = _run(kernel, baseline, monkeypatch)
    other_out, other_grads, other_after = _run(kernel, alternative, monkeypatch)
    tolerance = TOLERANCES.get(kernel, TOL)
    torch.testing.assert_close(other_out, out, **tolerance)
    assert grads.keys() == other_grads.keys()
    for name, grad in grads.items():
        assert grad is not None and other_grads[name] is not None, name
        torch.testing.assert_close(other_grads[name], grad, **tolerance, msg=name)
    assert after.keys() == other_after.keys()
    for name, tensor in after.items():
        torch.testing.assert_close(other_after[name], tensor, **TOL, msg=name)
    if kernel in ("lookup", "embedding_update"):
        assert bool(grads["weights"].abs().sum() > 0)  # a zero gradient would also compare equal


def _reference_weights_grad() -> torch.Tensor:
    """d loss / d w_i = <grad of i's bag, row of id i> from the tables as initialised (plain torch)."""
    torch.manual_seed(0)
    tables = EmbeddingBagCollection(TABLES, compute_kernel="dense").embedding_parameters()
    kjt = _batch(1)
    leaf = kjt.weights().grad_fn.next_functions[0][0].variable
    grad = torch.randn(BATCH, 8 + 8 + 16 + 4, generator=torch.Generator().manual_seed(9))
    columns = {"f0": (0, "t0"), "f1": (8, "t0"), "f2": (16, "t1"), "f3": (32, "t2")}
    expected, lengths = [], kjt.lengths().view(len(ROWS), BATCH)
    for key, values in zip(kjt.keys(), kjt.values().split(lengths.sum(1).tolist())):
        column, table = columns[key]
        rows = tables[table][values]
        bags = torch.repeat_interleave(torch.arange(BATCH), lengths[kjt.keys().index(key)])
        per_id = (rows * grad[bags, column : column + rows.shape[1]]).sum(1)
        if table == "t1":  # mean pooling: the bag's sum over its length
            per_id = per_id / lengths[2].clamp(min=1)[bags]
        expected.append(per_id * 2)  # through `leaf * 2`
    assert leaf.grad is None
    return torch.cat(expected)


@pytest.mark.usefixtures("native_kernels")
@pytest.mark.parametrize("forced", ["native", "fbgemm", None])
def test_the_weights_get_the_true_gradient_on_the_first_step(
    forced: str | None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Unforced, the choice is measured on this very batch (empty cache): the timing runs backward a
    zero gradient, which must neither land on the weights nor use up the graph that computed them."""
    monkeypatch.setenv("RECCOMPILE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(choice.ENV, f"embedding_update={forced}" if forced else "lookup=sequential")
    _, grads, _ = _step(_collection_case)
    torch.testing.assert_close(grads["weights"], _reference_weights_grad(), **TOL)
    measured = [c.kernel for c in choice.recorded() if c.kernel == "embedding_update"]
    assert measured == ([] if forced else ["embedding_update"] * 2)  # the sum and the mean group
