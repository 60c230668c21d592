"""The sampled softmax against the written-out formula, its gradients, and the module's state."""

from __future__ import annotations

import importlib
import math

import pytest
import torch
from softmax_reference import reference_losses

from runtime.config.retrieval import Negatives, SampledSoftmaxConfig
from runtime.retrieval.frequency import StreamingFrequency, counts_log_q
from runtime.retrieval.gather import PaddedCounts
from runtime.retrieval.sampled_softmax import SampledSoftmaxLoss, sampled_softmax
from runtime.retrieval.sampling import uniform_log_q, uniform_negatives

# the module itself: runtime.retrieval's `sampled_softmax` attribute is the function
sampled_softmax_module = importlib.import_module("runtime.retrieval.sampled_softmax")

B, D, S = 7, 5, 6
# Ids 3 and 1 appear twice: each is an accidental hit for the other's query.
IDS = torch.tensor([3, 1, 4, 3, 5, 9, 1])
NEGATIVE_IDS = torch.tensor([2, 3, 8, 1, 6, 5])


def _inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    shape = (B, D)
    query = torch.randn(shape, generator=generator, dtype=torch.float64)
    positive = torch.randn(shape, generator=generator, dtype=torch.float64)
    negatives = torch.randn((S, D), generator=generator, dtype=torch.float64)
    return query, positive, negatives


CASES = {
    "in_batch": dict(in_batch=True),
    "in_batch_logq_t0.2": dict(in_batch=True, log_q=True, temperature=0.2),
    "uniform": dict(in_batch=False, uniform=True),
    "uniform_logq_normalized": dict(in_batch=False, uniform=True, log_q=True, normalize=True, temperature=0.1),
    "both_logq": dict(in_batch=True, uniform=True, log_q=True, temperature=0.5),
    "both_normalized": dict(in_batch=True, uniform=True, normalize=True, temperature=0.05),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_loss_is_the_written_out_softmax(case: str) -> None:
    options = CASES[case]
    query, positive, negatives = _inputs()
    uniform, log_q = options.get("uniform", False), options.get("log_q", False)
    in_batch_log_q = torch.linspace(-3.0, -0.5, B, dtype=torch.float64) if log_q and options["in_batch"] else None
    negative_log_q = uniform_log_q(S, 40, 1) if log_q and uniform else None
    common = dict(temperature=options.get("temperature", 1.0), normalize=options.get("normalize", False))
    losses = sampled_softmax(
        query,
        positive,
        IDS,
        in_batch=options["in_batch"],
        negatives=negatives if uniform else None,
        negative_ids=NEGATIVE_IDS if uniform else None,
        in_batch_log_q=in_batch_log_q,
        negative_log_q=negative_log_q,
        reduction="none",
        **common,
    )
    expected = reference_losses(
        query.tolist(),
        positive.tolist(),
        IDS.tolist(),
        in_batch=options["in_batch"],
        negatives=negatives.tolist() if uniform else None,
        negative_ids=NEGATIVE_IDS.tolist() if uniform else None,
        in_batch_log_q=None if in_batch_log_q is None else in_batch_log_q.tolist(),
        negative_log_q=negative_log_q,
        **common,
    )
    assert losses.tolist() == pytest.approx(expected, rel=1e-12, abs=1e-12)
    mean = sampled_softmax(
        query,
        positive,
        IDS,
        in_batch=options["in_batch"],
        negatives=negatives if uniform else None,
        negative_ids=NEGATIVE_IDS if uniform else None,
        in_batch_log_q=in_batch_log_q,
        negative_log_q=negative_log_q,
        **common,
    )
    assert float(mean) == pytest.approx(sum(expected) / B, rel=1e-12)


def test_an_accidental_hit_is_masked_and_the_own_positive_is_not() -> None:
    # Queries 0 and 3 share positive id 3; with that column masked, query 0's softmax runs over 6 of 7.
    query, positive, _ = _inputs()
    losses = sampled_softmax(query, positive, IDS, reduction="none")
    logits = query @ positive.T
    kept = [j for j in range(B) if j != 3]
    by_hand = -(logits[0, 0] - torch.logsumexp(logits[0, kept], dim=0))
    assert float(losses[0]) == pytest.approx(float(by_hand), rel=1e-12)


@pytest.mark.parametrize("case", ["in_batch_logq_t0.2", "both_normalized"])
def test_the_gradients_are_the_formulas_gradients(case: str) -> None:
    options = CASES[case]
    query, positive, negatives = (t.requires_grad_() for t in _inputs(1))
    uniform = options.get("uniform", False)

    def loss(q: torch.Tensor, p: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        return sampled_softmax(
            q,
            p,
            IDS,
            in_batch=True,
            negatives=n if uniform else None,
            negative_ids=NEGATIVE_IDS if uniform else None,
            in_batch_log_q=torch.linspace(-3.0, -0.5, B, dtype=torch.float64) if options.get("log_q") else None,
            temperature=options["temperature"],
            normalize=options.get("normalize", False),
        )

    assert torch.autograd.gradcheck(loss, (query, positive, negatives), eps=1e-6, atol=1e-7)


def test_without_negatives_the_call_says_so() -> None:
    query, positive, _ = _inputs()
    with pytest.raises(ValueError) as error:
        sampled_softmax(query, positive, IDS, in_batch=False)
    assert str(error.value) == "sampled softmax: no negatives (in_batch is off and no uniform negatives were given)"


def test_uniform_negatives_depend_on_seed_and_step_only() -> None:
    first = uniform_negatives(seed=3, step=5, num_samples=1000, num_items=50, first_id=1)
    assert torch.equal(first, uniform_negatives(seed=3, step=5, num_samples=1000, num_items=50, first_id=1))
    assert not torch.equal(first, uniform_negatives(seed=3, step=6, num_samples=1000, num_items=50, first_id=1))
    assert not torch.equal(first, uniform_negatives(seed=4, step=5, num_samples=1000, num_items=50, first_id=1))
    assert int(first.min()) == 1 and int(first.max()) == 49
    assert uniform_log_q(1000, 50, 1) == pytest.approx(math.log(1000 / 49))


def _streaming_by_hand(batches: list[list[int]], slots: int, alpha: float) -> dict[int, float]:
    """Yi et al.'s Algorithm 2 with dictionaries; a first sighting sets B to the step."""
    last: dict[int, int] = {}
    interval: dict[int, float] = {}
    for step, batch in enumerate(batches, start=1):
        for slot in {i % slots for i in batch}:
            if slot in last:
                interval[slot] = (1 - alpha) * interval[slot] + alpha * (step - last[slot])
            else:
                interval[slot] = float(step)
            last[slot] = step
    return interval


def test_the_streaming_estimate_follows_the_papers_algorithm() -> None:
    generator = torch.Generator().manual_seed(2)
    batches = [torch.randint(0, 40, (12,), generator=generator).tolist() for _ in range(30)]
    estimate = StreamingFrequency(slots=16, alpha=0.1)
    for batch in batches:
        estimate.update(torch.tensor(batch))
    by_hand = _streaming_by_hand(batches, 16, 0.1)
    ids = torch.arange(40)
    expected = [-math.log(max(by_hand.get(i % 16, 0.0), 1.0)) for i in range(40)]
    assert estimate.log_q(ids).tolist() == pytest.approx(expected, rel=1e-6)
    assert int(estimate.step) == 30


def test_a_frequent_item_gets_a_larger_log_q() -> None:
    estimate = StreamingFrequency(slots=100, alpha=0.2)
    for step in range(200):
        estimate.update(torch.tensor([7, 7, 11] if step % 4 == 0 else [7]))
    frequent, rare = estimate.log_q(torch.tensor([7, 11])).tolist()
    assert frequent == pytest.approx(0.0, abs=1e-6)  # every step: Q = 1
    # Every fourth step: Q -> 1/4; B starts at 1 (first seen at step 1) and moves 49 times toward 4.
    assert rare == pytest.approx(-math.log(4.0 - 3.0 * 0.8**49), rel=1e-6)


def test_counts_give_the_expected_count_in_a_batch() -> None:
    counts = torch.tensor([0.0, 10.0, 30.0, 60.0])
    got = counts_log_q(counts, torch.tensor([0, 1, 3]), batch_size=8)
    assert got.tolist() == pytest.approx([math.log(8 * 1 / 100), math.log(8 * 10 / 100), math.log(8 * 60 / 100)])


def test_the_module_draws_per_step_and_counts_steps_in_training_only() -> None:
    config = SampledSoftmaxConfig(Negatives(uniform=S), num_items=30, first_id=1, seed=9, logq=True)
    loss_fn = SampledSoftmaxLoss(config)
    query, positive, _ = _inputs()
    first = loss_fn.negative_ids()
    assert torch.equal(first, uniform_negatives(9, 0, S, 30, 1))
    loss_fn(query, positive, IDS, torch.randn(S, D, dtype=torch.float64))
    assert int(loss_fn.step) == 1 and int(loss_fn.frequency.step) == 1
    assert torch.equal(loss_fn.negative_ids(), uniform_negatives(9, 1, S, 30, 1))
    loss_fn.eval()
    loss_fn(query, positive, IDS, torch.randn(S, D, dtype=torch.float64))
    assert int(loss_fn.step) == 1 and int(loss_fn.frequency.step) == 1
    assert sorted(loss_fn.state_dict()) == [
        "frequency.interval",
        "frequency.last_seen",
        "frequency.step",
        "step",
    ]


def test_the_module_is_the_function_with_its_corrections() -> None:
    counts = torch.arange(1.0, 31.0)
    config = SampledSoftmaxConfig(Negatives(uniform=S), num_items=30, logq=True, frequency="counts", temperature=0.3)
    loss_fn = SampledSoftmaxLoss(config, item_counts=counts)
    query, positive, negatives = _inputs()
    got = loss_fn(query, positive, IDS, negatives, reduction="none")
    expected = reference_losses(
        query.tolist(),
        positive.tolist(),
        IDS.tolist(),
        in_batch=True,
        negatives=negatives.tolist(),
        negative_ids=uniform_negatives(0, 0, S, 30).tolist(),
        in_batch_log_q=[math.log(B * float(counts[i]) / float(counts.sum())) for i in IDS.tolist()],
        negative_log_q=math.log(S / 30),
        temperature=0.3,
    )
    assert got.tolist() == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(temperature=0.0), "sampled softmax: temperature must be > 0 (got 0.0)"),
        (
            dict(negatives=Negatives(uniform=4), num_items=1, first_id=1),
            "sampled softmax: uniform negatives need num_items > first_id (got num_items 1, first_id 1)",
        ),
        (dict(frequency="exact"), "sampled softmax: frequency 'exact' is not one of streaming, counts"),
    ],
)
def test_a_bad_config_is_named(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as error:
        SampledSoftmaxConfig(**kwargs)
    assert str(error.value) == message


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(in_batch=False), "sampled softmax: no negatives (in_batch is off and uniform is 0)"),
        (dict(uniform=-1), "sampled softmax: uniform negatives must be >= 0 (got -1)"),
        (dict(per_query=True), "sampled softmax: per_query draws uniform negatives, but uniform is 0"),
    ],
)
def test_bad_negatives_are_named(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as error:
        Negatives(**kwargs)
    assert str(error.value) == message


def test_missing_or_unwanted_negatives_are_named() -> None:
    query, positive, negatives = _inputs()
    uniform = SampledSoftmaxLoss(SampledSoftmaxConfig(Negatives(in_batch=False, uniform=S), num_items=30))
    with pytest.raises(ValueError) as error:
        uniform(query, positive, IDS)
    assert str(error.value) == "sampled softmax: uniform negatives need the embeddings of negative_ids()"
    with pytest.raises(ValueError) as error:
        uniform(query, positive, IDS, negatives[:4])
    assert str(error.value) == "sampled softmax: 4 negative embeddings for 6 negative ids"
    with pytest.raises(ValueError) as error:
        SampledSoftmaxLoss(SampledSoftmaxConfig())(query, positive, IDS, negatives)
    assert str(error.value) == "sampled softmax: negatives given but the config draws none (in-batch negatives only)"


@pytest.mark.parametrize(
    "config",
    [
        SampledSoftmaxConfig(Negatives(in_batch=True), num_items=30, logq=True),
        SampledSoftmaxConfig(Negatives(in_batch=False, uniform=S), num_items=30),
    ],
)
def test_counts_learnt_from_the_gather_are_refused_where_it_does_not_come_first(config: SampledSoftmaxConfig) -> None:
    """logq gathers the ids before the candidates, and without in-batch negatives there is no gather."""
    query, positive, negatives = _inputs()
    loss = SampledSoftmaxLoss(config)
    with pytest.raises(ValueError) as error:
        loss(query, positive, IDS, negatives if config.negatives.uniform else None, row_counts=PaddedCounts(4))
    assert str(error.value) == "sampled softmax: PaddedCounts need in-batch negatives without logq or per_query"


def test_counts_learnt_by_one_process_are_its_own() -> None:
    query, positive, _ = _inputs()
    counts = PaddedCounts(1)
    expected = SampledSoftmaxLoss(SampledSoftmaxConfig())(query, positive, IDS, reduction="sum")
    got = SampledSoftmaxLoss(SampledSoftmaxConfig())(query, positive, IDS, reduction="sum", row_counts=counts)
    assert torch.equal(got, expected) and counts.counts == [query.shape[0]]


@pytest.mark.parametrize("distinct", [True, False])
@pytest.mark.parametrize("uniform", [False, True])
def test_accidental_hits_found_by_search_match_the_written_out_softmax(distinct: bool, uniform: bool) -> None:
    # Distinct ids: no cell is masked (the in-batch path skips the search); else ids repeat
    # within the batch and among the uniform negatives, several times each.
    generator = torch.Generator().manual_seed(5)
    batch, samples = 24, 10
    if distinct:
        ids = torch.randperm(1000, generator=generator)[:batch]
        negative_ids = torch.randint(1000, 1010, (samples,), generator=generator)
    else:
        ids = torch.randint(0, 6, (batch,), generator=generator)
        negative_ids = torch.randint(0, 6, (samples,), generator=generator)
    query, positive, negatives = (
        torch.randn(n, D, generator=generator, dtype=torch.float64) for n in (batch, batch, samples)
    )
    for in_batch in (True, False) if uniform else (True,):
        losses = sampled_softmax(
            query,
            positive,
            ids,
            in_batch=in_batch,
            negatives=negatives if uniform else None,
            negative_ids=negative_ids if uniform else None,
            reduction="none",
        )
        expected = reference_losses(
            query.tolist(),
            positive.tolist(),
            ids.tolist(),
            in_batch=in_batch,
            negatives=negatives.tolist() if uniform else None,
            negative_ids=negative_ids.tolist() if uniform else None,
        )
        assert losses.tolist() == pytest.approx(expected, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("values", [6, 1000])
def test_in_batch_hits_crossed_from_the_repeated_ids_are_the_searchs(
    values: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ids of 6 values repeat in every row, of 1,000 in a few; the candidates are a rank's slice of the
    # global batch's (own columns 8..), then uniform negatives: every cell, rows ascending, as the search
    generator = torch.Generator().manual_seed(7)
    global_ids = torch.randint(0, values, (40,), generator=generator)
    negative_ids = torch.randint(0, values, (12,), generator=generator)
    ids, own = global_ids[8:24], torch.arange(8, 24)
    blocks = [torch.empty(16, 40), torch.empty(16, 12)]
    found = {}
    for cells in (sampled_softmax_module.CROSSED_CELLS, 0):  # 0: always the binary search
        monkeypatch.setattr(sampled_softmax_module, "CROSSED_CELLS", cells)
        hits = sampled_softmax_module._accidental_hits([global_ids, negative_ids], blocks, ids, own, True)
        assert hits is not None and bool((hits[0].diff() >= 0).all())
        found[cells] = sorted(zip(hits[0].tolist(), hits[1].tolist(), strict=True))
    expected = [
        (row, column)
        for row in range(16)
        for column, other in enumerate(global_ids.tolist() + negative_ids.tolist())
        if other == int(ids[row]) and column != 8 + row
    ]
    assert found[0] == found[sampled_softmax_module.CROSSED_CELLS] == expected


@pytest.mark.parametrize("in_batch", [False, True])
def test_per_query_negatives_are_each_querys_own_softmax(in_batch: bool) -> None:
    """generative-recommenders' "local" sampling: query i's candidates are its positive and its own S ids."""
    query, positive, _ = _inputs()
    config = SampledSoftmaxConfig(
        Negatives(in_batch=in_batch, uniform=S, per_query=True),
        num_items=10,
        temperature=0.5,
        normalize=True,
        logq=True,
        frequency="counts",
    )
    counts = torch.ones(10, dtype=torch.float64) if in_batch else None
    loss = SampledSoftmaxLoss(config, item_counts=counts)
    ids = loss.negative_ids(queries=slice(0, B), total_queries=B)
    assert ids.shape == (B, S) and bool((ids == IDS.unsqueeze(1)).any())  # some accidental hits to mask
    table = torch.randn(10, D, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    got = loss(query, positive, IDS, table[ids], reduction="none")
    in_batch_log_q = counts_log_q(counts, IDS, B).tolist() if in_batch else None
    expected = []
    for i in range(B):  # the written-out softmax with query i's own negatives; its own row of the batch
        rows = reference_losses(
            query.tolist(),
            positive.tolist(),
            IDS.tolist(),
            in_batch=in_batch,
            negatives=table[ids[i]].tolist(),
            negative_ids=ids[i].tolist(),
            in_batch_log_q=in_batch_log_q,
            negative_log_q=uniform_log_q(S, 10),
            temperature=0.5,
            normalize=True,
        )
        expected.append(rows[i])
    assert got.tolist() == pytest.approx(expected, rel=1e-9)


def test_per_query_negatives_of_a_query_do_not_depend_on_the_rank_it_lands_on() -> None:
    loss = SampledSoftmaxLoss(SampledSoftmaxConfig(Negatives(False, uniform=S, per_query=True), num_items=50))
    whole = loss.negative_ids(queries=slice(0, 10), total_queries=10)
    assert torch.equal(
        torch.cat(
            [
                loss.negative_ids(queries=slice(0, 4), total_queries=10),
                loss.negative_ids(queries=slice(4, 10), total_queries=10),
            ]
        ),
        whole,
    )
    assert len({tuple(row) for row in whole.tolist()}) == 10  # every query its own draw
