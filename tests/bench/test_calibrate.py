from __future__ import annotations

from bench.evaluate.calibrate import coverage, fit, half_of
from forecasting.estimators.calibration import scale_at


def test_scale_is_interpolated_and_flat_beyond_the_knots() -> None:
    table = ((0.1, 2.0), (0.5, 1.0))
    assert scale_at(0.3, ()) == 1.0
    assert scale_at(0.0, table) == 2.0 and scale_at(0.9, table) == 1.0
    assert scale_at(0.3, table) == 1.5


def test_fit_covers_the_target_share_of_families_not_of_rows() -> None:
    # Family "big" has 8 rows all at score 3, five small families one row each at score 0.5:
    # weighted by family, 5 of 6 families are covered by a factor of 0.5 (83% >= 80%).
    rows = [("big", 10, 0.1, 3.0)] * 8 + [(f"f{i}", 10, 0.1, 0.5) for i in range(5)]
    table = fit(rows, (10,))
    assert table == ((0.1, 0.5),)
    assert coverage(rows, table)["10"] == round(5 / 6, 3)
    assert {half_of(f"f{i}") for i in range(20)} == {"A", "B"}
