"""compiler/planner/fit.py: the smallest larger world size that fits, in a few plans."""

from __future__ import annotations

import doctest

import pytest

from compiler.planner import fit
from compiler.planner.fit import fitting_hint, fitting_world_size


def test_the_worked_example_in_the_docstring_holds() -> None:
    assert doctest.testmod(fit).failed == 0


@pytest.mark.parametrize(
    ("least", "expected", "tried"),
    [
        (2, 2, [2]),
        (3, 4, [2, 4]),
        (5, 8, [2, 4, 16, 8]),
        (100, 128, [2, 4, 16, 256, 64, 128]),
        (1024, 1024, [2, 4, 16, 256, 1024, 512]),
        (2000, None, [2, 4, 16, 256, 1024]),
    ],
)
def test_it_doubles_then_bisects_over_the_sizes_the_batch_divides_over(
    least: int, expected: int | None, tried: list[int]
) -> None:
    calls: list[int] = []

    def fits(world_size: int) -> bool:
        calls.append(world_size)
        return world_size >= least

    assert fitting_world_size(fits, 1, 1024, 1) == expected
    assert calls == tried


def test_sizes_are_whole_hosts_and_divide_the_batch() -> None:
    assert fitting_world_size(lambda n: n >= 7, 1, 12, 1) == 12  # 7..11 do not divide 12
    assert fitting_world_size(lambda n: n >= 5, 4, 48, 4) == 8  # 5, 6 are not whole hosts of 4
    assert fitting_world_size(lambda n: True, 8, 8, 1) is None  # nothing larger divides the batch


def test_the_hint_names_the_flag_or_says_none_fits() -> None:
    assert fitting_hint(lambda n: n >= 6, 2, 24, 1) == "6 ranks would fit (--world-size 6)"
    assert fitting_hint(lambda n: False, 2, 24, 1) == (
        "no larger world size that the batch size 24 divides over would fit"
    )


def test_divisors_are_every_number_that_divides_in_order() -> None:
    for n in range(1, 300):
        assert fit.divisors(n) == [d for d in range(1, n + 1) if n % d == 0]


def test_the_largest_batch_size_takes_a_few_plans_not_one_trial_per_number() -> None:
    calls: list[int] = []

    def fits(world_size: int) -> bool:
        calls.append(world_size)
        return False

    largest = 2**31 - 1  # a prime: no world size divides it but itself, past the largest a spec may ask for
    assert fitting_world_size(fits, 1, largest, 1) is None
    assert calls == []
    assert fitting_world_size(lambda n: n >= 3, 1, 2**30, 1) == 4  # 2^30's 31 divisors, not 2^30 trials


def test_the_search_stops_at_the_largest_world_size_a_spec_may_ask_for() -> None:
    tried: list[int] = []

    def fits(world_size: int) -> bool:
        tried.append(world_size)
        return False

    assert fitting_world_size(fits, 1, 2**31 - 2, 1) is None  # 2 * 3^2 * 7 * 11 * 31 * 151 * 331
    assert max(tried) == max(d for d in fit.divisors(2**31 - 2) if d <= fit.MAX_WORLD_SIZE) == 65534
