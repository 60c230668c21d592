"""TrainPipeline trains exactly like the plain loop, drains, and names a failing stage.

Each case compiles pipeline_cases.spec_text (every table one sharding type,
or one type each) and trains the generated module from the same initial
state with the plain loop and with the pipeline: losses, full tables and
dense state must be torch.equal, at one rank here and at two ranks (gloo,
spawned once for all cases). The other tests use one rank.
"""

from __future__ import annotations

import re
import itertools
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
import torch.multiprocessing as mp

import pipeline_cases as pc
from compiler.pipeline import Options, generate
from runtime.data.batch import Batch
from runtime.sparse.jagged import KeyedJaggedTensor
from runtime.train.train_pipeline import PipelineError, TrainPipeline
from runtime.train.dense_optimizer import make_dense_optimizer
from runtime.train.context import RunContext
from runtime.train.loop import train
from runtime.train.options import TrainOptions
from runtime.train.worker import load_module
import rendezvous


def compile_case(case: str, world_size: int, outdir: Path) -> Path:
    spec = outdir / f"pipelined_{case}.yaml"
    spec.write_text(pc.spec_text(case))
    return generate(str(spec), Options(world_size=world_size)).write(outdir / f"ws{world_size}")[0]


@pytest.fixture(scope="module")
def specs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pipeline_specs")


@pytest.fixture(scope="module")
def two_ranks(specs_dir: Path) -> dict[str, Any]:
    paths = {case: str(compile_case(case, 2, specs_dir)) for case in pc.CASES}
    with rendezvous.hosted_store() as port:
        mp.spawn(pc.run_ranks, args=(port, paths, str(specs_dir)), nprocs=2)
    return torch.load(specs_dir / "results.pt")


@pytest.fixture(scope="module")
def one_rank_module(specs_dir: Path) -> Any:
    return load_module(str(compile_case("mixed", 1, specs_dir)))


def assert_same_training(plain: dict[str, Any], pipelined: dict[str, Any]) -> None:
    assert pipelined["drained"]
    for expected, got in zip(plain["losses"], pipelined["losses"]):
        assert torch.equal(got, expected), f"losses {got.tolist()} vs plain {expected.tolist()}"
    for part in ("tables", "dense"):
        assert plain[part].keys() == pipelined[part].keys()
        for name, value in plain[part].items():
            assert torch.equal(pipelined[part][name], value), name


@pytest.mark.parametrize("case", pc.CASES)
def test_one_rank_pipeline_equals_the_plain_loop(case: str, specs_dir: Path) -> None:
    module = load_module(str(compile_case(case, 1, specs_dir)))
    plain = pc.train_case(module, None, 0, 1, depth=None)
    for depth in (1, 2, 3) if case == "mixed" else (2,):
        pipelined = pc.train_case(module, None, 0, 1, depth=depth)
        plain_one = {**plain, "losses": [plain["losses"]]}
        assert_same_training(plain_one, {**pipelined, "losses": [pipelined["losses"]]})


@pytest.mark.parametrize("case", pc.CASES)
def test_two_ranks_pipeline_equals_the_plain_loop(case: str, two_ranks: dict[str, Any]) -> None:
    results = two_ranks[case]
    for mode in results.keys() - {"plain"}:
        assert_same_training(results["plain"], results[mode])


# column_wise (and `mixed`, which has a column_wise table) keeps row-wise Adagrad's accumulator per
# column shard, as TorchRec does: not one process's training, by design
# (tests/runtime/sharding/test_sharded_training.py compares it with a split reference).
@pytest.mark.parametrize("case", ["data_parallel", "table_wise", "row_wise", "table_row_wise"])
def test_two_ranks_train_what_one_process_does_on_the_global_batch(
    case: str, two_ranks: dict[str, Any], specs_dir: Path
) -> None:
    """The plain loop at two ranks against one process on the global batch: the mean of the ranks'
    losses, the full tables and the dense state, to float rounding (the ranks sum their halves in
    another order). In the table_wise case the dot interaction reads the pooled all-to-all's
    received pieces where they lie."""
    one = pc.train_case(load_module(str(compile_case(case, 1, specs_dir))), None, 0, 1, depth=None)
    two = two_ranks[case]["plain"]
    torch.testing.assert_close(torch.stack(two["losses"]).mean(dim=0), one["losses"], rtol=1e-5, atol=1e-6)
    for part in ("tables", "dense"):
        assert two[part].keys() == one[part].keys()
        for name, value in one[part].items():
            torch.testing.assert_close(two[part][name], value, rtol=1e-4, atol=1e-6, msg=name)


def test_two_ranks_train_differently_per_rank(two_ranks: dict[str, Any]) -> None:
    """The comparison above is not vacuous: the ranks' batches, and so their losses, differ."""
    rank0, rank1 = two_ranks["mixed"]["plain"]["losses"]
    assert not torch.equal(rank0, rank1)


# -- one rank: order, draining, failures ------------------------------------------------


def make_pipeline(module: Any, depth: int = 2) -> tuple[TrainPipeline, torch.nn.Module]:
    torch.manual_seed(pc.SEED)
    model = module.build()
    optimizer = make_dense_optimizer(module.DENSE_OPTIMIZER, model.dense_parameters())
    return TrainPipeline(model, optimizer, depth=depth), model


def batches(module: Any, count: int) -> list[Batch]:
    return [module.synthetic_batch(pc.GLOBAL_BATCH, step=i) for i in range(count)]


def test_stage_0_of_the_next_batch_runs_before_stage_1(one_rank_module: Any) -> None:
    pipeline, model = make_pipeline(one_rank_module, depth=2)
    calls: list[str] = []
    input_dist, compute = model.input_dist, model.compute
    model.input_dist = lambda *a: calls.append("input_dist") or input_dist(*a)
    model.compute = lambda *a: calls.append("compute") or compute(*a)
    source = iter(batches(one_rank_module, 3))
    for _ in range(3):
        pipeline.progress(source)
    assert calls == ["input_dist", "input_dist", "compute", "input_dist", "compute", "compute"]


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_n_batches_in_n_steps_out(one_rank_module: Any, depth: int) -> None:
    pipeline, _ = make_pipeline(one_rank_module, depth)
    fetched = []

    def source() -> Iterator[Batch]:
        for batch in batches(one_rank_module, 5):
            fetched.append(batch)
            yield batch

    iterator = source()
    for step in range(1, 6):
        loss, outputs = pipeline.progress(iterator)
        assert len(fetched) == min(5, step + depth - 1)
        assert pipeline.last_batch is fetched[step - 1]
        assert outputs["click"].shape == (pc.GLOBAL_BATCH,) and loss.ndim == 0
    with pytest.raises(StopIteration):
        pipeline.progress(iterator)
    # The next epoch: a new iterator through the same pipeline.
    pipeline.progress(iter(batches(one_rank_module, 1)))


def test_train_loop_takes_a_pipeline_depth(one_rank_module: Any) -> None:
    runs = []
    for depth in (1, 2):
        torch.manual_seed(pc.SEED)
        model = one_rank_module.build()
        optimizer = make_dense_optimizer(one_rank_module.DENSE_OPTIMIZER, model.dense_parameters())
        source = itertools.cycle(batches(one_rank_module, 3))
        options = TrainOptions(module="", steps=5, batch_size=pc.GLOBAL_BATCH, pipeline=True, pipeline_depth=depth)
        runs.append(train(RunContext(options, one_rank_module.INPUTS), model, source, optimizer).losses)
    assert runs[0] == runs[1] and len(runs[0]) == 5


def _break(stage: str, pipeline: TrainPipeline, model: torch.nn.Module) -> None:
    """Make `stage` fail on batch 2 (the third) with ValueError('broken')."""

    def fail(*_: Any) -> Any:
        raise ValueError("broken")

    if stage == "input_dist":
        real = model.input_dist
        count = itertools.count()
        model.input_dist = lambda *a: fail() if next(count) == 2 else real(*a)
    elif stage == "compute":
        real_compute = model.compute
        count = itertools.count()
        model.compute = lambda *a: fail() if next(count) == 2 else real_compute(*a)
    elif stage == "loss":
        real_loss = model.loss
        count = itertools.count()
        model.loss = lambda *a: fail() if next(count) == 2 else real_loss(*a)
    elif stage == "backward":
        count = itertools.count()
        model.dense_parameters()[0].register_hook(lambda grad: fail() if next(count) == 2 else None)
    elif stage == "optimizer":
        real_step = pipeline._optimizer.step
        count = itertools.count()
        pipeline._optimizer.step = lambda *a: fail() if next(count) == 2 else real_step(*a)


def _broken_batches(module: Any, stage: str) -> Iterator[Batch]:
    for index, batch in enumerate(batches(module, 6)):
        if index == 2 and stage == "fetch":
            raise ValueError("broken")
        yield batch


@pytest.mark.parametrize("stage", ["fetch", "input_dist", "compute", "loss", "backward", "optimizer"])
def test_a_failing_stage_surfaces_once_with_its_name(one_rank_module: Any, stage: str) -> None:
    pipeline, model = make_pipeline(one_rank_module, depth=2)
    _break(stage, pipeline, model)
    source = _broken_batches(one_rank_module, stage)
    # Stage 0 runs one batch ahead: fetch and input_dist of batch 2 fail in the 2nd step.
    ahead = stage in ("fetch", "input_dist")
    for _ in range(1 if ahead else 2):
        pipeline.progress(source)
    with pytest.raises(PipelineError) as failure:
        pipeline.progress(source)
    assert failure.value.stage == stage and failure.value.batch == 2
    assert str(failure.value).startswith(f"pipeline stage {stage!r} failed on batch 2: ")
    assert failure.value.__cause__ is not None
    with pytest.raises(RuntimeError, match=f"^the pipeline is closed: stage '{stage}' failed on batch 2$"):
        pipeline.progress(source)


def test_a_batch_with_a_bad_id_names_the_input_dist_stage(one_rank_module: Any, specs_dir: Path) -> None:
    # Ids are checked where the batch arrives, before any kernel (runtime/embeddings/ids.py).
    pipeline, _ = make_pipeline(one_rank_module, depth=2)
    good = batches(one_rank_module, 1)[0]
    values = good.sparse.values().clone()
    values[0] = 10_000
    sparse = KeyedJaggedTensor(
        good.sparse.keys(),
        values,
        good.sparse.weights_or_none(),
        good.sparse.lengths(),
        stride=good.sparse.stride(),
    )
    message = (
        "pipeline stage 'input_dist' failed on batch 0: IdOutOfRange: "
        f"feature 'a' at sample 0: id 10000 out of range for table 'a' ({specs_dir}/pipelined_mixed.yaml:7:7) "
        "with 60 rows"
    )
    with pytest.raises(PipelineError, match=f"^{re.escape(message)}$"):
        pipeline.progress(iter([Batch(good.dense, sparse, good.labels)]))


def test_depth_must_be_positive(one_rank_module: Any) -> None:
    model = one_rank_module.build()
    with pytest.raises(ValueError, match="^pipeline depth must be at least 1, got 0$"):
        TrainPipeline(model, torch.optim.SGD(model.dense_parameters(), lr=0.1), depth=0)
