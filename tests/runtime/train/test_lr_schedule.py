"""runtime/config/lr_schedule.py: each schedule's factors against its formula, and bad schedules' errors.

The expected factors are written out from the formulas by hand (warmup
W, decay to final_factor f at total_steps T, t the steps completed).
"""

from __future__ import annotations

import math

import pytest

from runtime.config.lr_schedule import LrSchedule, problems


def test_constant_is_one_at_every_step() -> None:
    assert LrSchedule().factors(5) == (1.0,) * 5


def test_step_multiplies_by_gamma_every_step_size_steps() -> None:
    schedule = LrSchedule("step", step_size=3, gamma=0.5)
    assert schedule.factors(8) == (1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.25, 0.25)


def test_exponential_multiplies_by_gamma_every_step() -> None:
    schedule = LrSchedule("exponential", gamma=0.9)
    assert schedule.factors(4) == pytest.approx((1.0, 0.9, 0.81, 0.729), abs=1e-15)


def test_warmup_rises_linearly_from_its_start_factor_then_the_decay_starts_from_its_end() -> None:
    schedule = LrSchedule("exponential", warmup_steps=4, start_factor=0.2, gamma=0.5)
    assert schedule.factors(7) == pytest.approx((0.2, 0.4, 0.6, 0.8, 1.0, 0.5, 0.25), abs=1e-15)
    assert LrSchedule("constant", warmup_steps=2).factors(4) == (0.0, 0.5, 1.0, 1.0)


def test_linear_decays_to_its_final_factor_at_total_steps_and_stays() -> None:
    schedule = LrSchedule("linear", warmup_steps=2, total_steps=6, final_factor=0.2)
    # after the warmup: 1 - 0.8 * (t - 2) / 4
    assert schedule.factors(9) == pytest.approx((0.0, 0.5, 1.0, 0.8, 0.6, 0.4, 0.2, 0.2, 0.2), abs=1e-15)
    assert LrSchedule("linear", total_steps=4).factors(5) == (1.0, 0.75, 0.5, 0.25, 0.0)


def test_cosine_follows_half_a_cosine_to_its_final_factor() -> None:
    schedule = LrSchedule("cosine", warmup_steps=1, total_steps=5, final_factor=0.1)
    expected = [0.0] + [0.1 + 0.9 * (1 + math.cos(math.pi * (t - 1) / 4)) / 2 for t in range(1, 6)] + [0.1]
    assert schedule.factors(7) == pytest.approx(expected, abs=1e-15)
    assert schedule.factor(3) == pytest.approx(0.55, abs=1e-15)  # halfway: the mean of 1 and 0.1
    assert schedule.factor(1000) == pytest.approx(0.1, abs=1e-15)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(type="cosine"), "lr_schedule (s.yaml:9:3): cosine needs total_steps"),
        (
            dict(type="cosine", total_steps=10, step_size=2),
            "lr_schedule (s.yaml:9:3): step_size does not apply to cosine (it is used by step)",
        ),
        (
            dict(type="constant", gamma=0.5, final_factor=0.1),
            "lr_schedule (s.yaml:9:3): gamma does not apply to constant (it is used by step, exponential); "
            "final_factor does not apply to constant (it is used by linear, cosine)",
        ),
        (dict(type="step", gamma=0.5), "lr_schedule (s.yaml:9:3): step needs step_size"),
        (
            dict(type="linear", warmup_steps=10, total_steps=10),
            "lr_schedule (s.yaml:9:3): total_steps 10 must be greater than warmup_steps 10",
        ),
        (
            dict(type="exponential", gamma=0.9, start_factor=0.1),
            "lr_schedule (s.yaml:9:3): start_factor is the warmup's first factor, but warmup_steps is 0",
        ),
        (
            dict(type="exponential", gamma=0.0, warmup_steps=-1),
            "lr_schedule (s.yaml:9:3): warmup_steps must be >= 0 (got -1); gamma must be > 0 (got 0.0)",
        ),
        (
            dict(type="cosinus"),
            "lr_schedule (s.yaml:9:3): unknown schedule 'cosinus'; expected one of constant, step, "
            "exponential, linear, cosine",
        ),
    ],
)
def test_a_bad_schedule_is_refused_with_every_problem_named(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as error:
        LrSchedule(**kwargs, where="s.yaml:9:3")
    assert str(error.value) == message


def test_problems_name_the_parameter_each_is_about() -> None:
    assert problems("step", step_size=0, gamma=0.5, total_steps=3) == [
        ("total_steps", "total_steps does not apply to step (it is used by linear, cosine)"),
        ("step_size", "step_size must be >= 1 (got 0)"),
    ]


def test_describe_keeps_the_parameters_that_are_set() -> None:
    schedule = LrSchedule("cosine", warmup_steps=3, total_steps=9, where="s.yaml:1:1")
    assert schedule.describe() == {"type": "cosine", "warmup_steps": 3, "start_factor": 0.0, "total_steps": 9}
