"""The hindsight bound on ETA interval factors (bench.evaluate.eta_bounds), on outcomes whose
answer is known."""

from __future__ import annotations

from bench.evaluate.eta_bounds import Outcome, best, covered, family_mean, least_widening


def _at(truth: float, family: str, *, seen: bool = False) -> Outcome:
    # Every interval is [-0.1, +0.1] around the median (log), so a factor f covers |truth| <= 0.1 f.
    return Outcome(family, 50, seen, truth, -0.1, 0.1, truth)


def test_a_factor_scales_its_own_side_only() -> None:
    row = _at(0.15, "a")
    assert not covered(((1.0, 1.0), (1.0, 1.0)))(row)
    assert covered(((0.0, 1.5), (1.0, 1.0)))(row)  # the upper side widened, the lower shut
    assert not covered(((1.0, 1.0), (1.0, 1.5)))(row)  # those factors are for seen runs


def test_coverage_weighs_families_not_forecasts() -> None:
    rows = [_at(0.0, "big") for _ in range(9)] + [_at(0.5, "small")]
    assert family_mean(rows, covered(((1.0, 1.0), (1.0, 1.0)))) == 0.5


def test_the_bound_finds_the_factors_that_keep_real_in_band() -> None:
    # Real: 8 of 10 families at the median, 2 far above; faulted: all at +0.18.
    real = [_at(0.0, f"r{i}") for i in range(8)] + [_at(1.0, "r8"), _at(1.0, "r9")]
    faulted = [_at(0.18, f"f{i}") for i in range(10)]
    found = best(real, faulted, max_upper=2.0)
    assert found is not None and found["real"] == 0.8 and found["faulted"] == 1.0
    assert found["factors"][0][1] >= 1.8  # the P90 had to reach +0.18
    # Capped at the present width, nothing covers the faulted outcomes.
    capped = best(real, faulted, max_upper=1.5)
    assert capped is not None and capped["faulted"] == 0.0
    least = least_widening(real, faulted)
    assert least is not None and least["max_upper"] == 2.0


def test_no_factors_when_real_coverage_cannot_enter_the_band() -> None:
    real = [_at(0.0, f"r{i}") for i in range(10)]  # every real outcome on the median
    assert best(real, [_at(0.0, "f")], max_upper=4.0) is None
