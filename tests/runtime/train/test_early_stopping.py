"""runtime/train/early_stopping.py: the metric by name and direction, gains, patience, saved state."""

from __future__ import annotations

import doctest

import pytest

from runtime.config.heads import HeadConfig
from runtime.train import early_stopping
from runtime.train.early_stopping import BestMetric, EarlyStopping, resolve_best_metric
from runtime.train.options import UsageError

CTR = HeadConfig("ctr", "bce", "click")
CVR = HeadConfig("cvr", "bce", "buy")
RATING = HeadConfig("rating", "mse", "stars")


def test_the_worked_example_in_the_docstring_holds() -> None:
    assert doctest.testmod(early_stopping).failed == 0


@pytest.mark.parametrize(
    ("name", "heads", "expected"),
    [
        ("auc", [CTR], BestMetric("ctr", "auc")),
        ("rmse", [CTR, RATING], BestMetric("rating", "rmse")),
        ("cvr.ne", [CTR, CVR], BestMetric("cvr", "ne")),
        (
            "ndcg@10",
            [HeadConfig("item", "softmax", "item", metrics=("recall@10", "ndcg@10"))],
            BestMetric("item", "ndcg@10"),
        ),
    ],
)
def test_a_metric_is_found_by_its_name_or_head_and_name(name: str, heads: list, expected: BestMetric) -> None:
    assert resolve_best_metric(name, heads) == expected


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("auc", "--best-metric 'auc': heads ctr and cvr both report it; name one, e.g. ctr.auc"),
        (
            "mse",
            "--best-metric 'mse': no head reports it; the heads' metrics are ctr.ne, ctr.auc, ctr.accuracy, "
            "cvr.ne, cvr.auc, cvr.accuracy",
        ),
        (
            "ctr.rmse",
            "--best-metric 'ctr.rmse': no head reports it; the heads' metrics are ctr.ne, ctr.auc, "
            "ctr.accuracy, cvr.ne, cvr.auc, cvr.accuracy",
        ),
    ],
)
def test_an_unknown_or_ambiguous_metric_is_a_usage_error(name: str, message: str) -> None:
    with pytest.raises(UsageError) as error:
        resolve_best_metric(name, [CTR, CVR])
    assert str(error.value) == message


@pytest.mark.parametrize(
    ("metric", "higher"),
    [
        ("auc", True),
        ("accuracy", True),
        ("recall@10", True),
        ("ndcg@5", True),
        ("mrr", True),
        ("hit_rate@20", True),
        ("user_recall@10", True),
        ("ne", False),
        ("mse", False),
        ("rmse", False),
        ("log_loss", False),
    ],
)
def test_the_direction_follows_the_name(metric: str, higher: bool) -> None:
    assert BestMetric("h", metric).higher_is_better is higher


def test_lower_is_better_for_ne_and_a_tie_is_no_gain() -> None:
    tracker = EarlyStopping(BestMetric("ctr", "ne"), patience=2)
    gains = [tracker.observe(step, {"ctr": {"ne": ne}}) for step, ne in ((5, 0.9), (10, 0.8), (15, 0.8), (20, 0.85))]
    assert gains == [True, True, False, False]
    assert (tracker.best_value, tracker.best_step, tracker.since_best) == (0.8, 10, 2)
    assert tracker.stop_reason == "ctr.ne did not improve for 2 evaluations (best 0.8 at step 10)"


def test_an_undefined_value_is_no_gain_and_is_named_when_it_stops() -> None:
    tracker = EarlyStopping(BestMetric("ctr", "auc"), patience=1)
    assert tracker.observe(5, {"ctr": {"auc": None}}) is False
    assert tracker.stop_reason == "ctr.auc was undefined for 1 evaluation"


def test_without_patience_it_keeps_the_best_and_never_stops() -> None:
    tracker = EarlyStopping(BestMetric("ctr", "auc"))
    for step in range(1, 50):
        tracker.observe(step, {"ctr": {"auc": 0.5}})
    assert not tracker.should_stop() and tracker.stop_reason is None
    assert tracker.best() == {"metric": "ctr.auc", "value": 0.5, "step": 1}


def test_the_state_goes_on_in_a_resumed_run_and_another_metric_starts_afresh() -> None:
    tracker = EarlyStopping(BestMetric("ctr", "auc"), patience=3)
    for step, auc in ((10, 0.7), (20, 0.75), (30, 0.74)):
        tracker.observe(step, {"ctr": {"auc": auc}})
    state = tracker.state_dict()
    assert state == {"metric": "ctr.auc", "value": 0.75, "step": 20, "since_best": 1, "last_step": 30}
    resumed = EarlyStopping(BestMetric("ctr", "auc"), patience=3)
    assert resumed.load_state_dict(state)
    for step in (40, 50):
        resumed.observe(step, {"ctr": {"auc": 0.74}})
    assert resumed.stop_reason == "ctr.auc did not improve for 3 evaluations (best 0.75 at step 20)"
    other = EarlyStopping(BestMetric("ctr", "ne"), patience=3)
    assert not other.load_state_dict(state)
    assert (other.best_value, other.since_best) == (None, 0)


def test_a_checkpoint_saved_before_its_steps_evaluation_is_evaluated_on_resume() -> None:
    tracker = EarlyStopping(BestMetric("ctr", "auc"), patience=3)
    tracker.observe(25, {"ctr": {"auc": 0.7}})
    assert tracker.missed(50, 25)  # saved at 50, evaluated after the save
    assert not tracker.missed(25, 25)  # the pass at 25 is in the state
    assert not tracker.missed(60, 25)  # no pass is due at 60
    assert not tracker.missed(50, 0)  # evaluation only at the end
