from __future__ import annotations

import json

import numpy as np
import pytest

from forecasting.estimators import formatting
from forecasting.estimators.deadline import deadline_risk
from forecasting.estimators.eta import EtaForecast, forecast_eta


def _eta() -> EtaForecast:
    steps = np.arange(0.0, 1001.0)
    rng = np.random.default_rng(1)
    times = np.cumsum(np.concatenate(([0.0], rng.gamma(100.0, 0.01, 1000))))
    eta = forecast_eta(steps, times, 3000.0)
    assert eta is not None
    return eta


def test_trivially_safe() -> None:
    eta = _eta()
    risk = deadline_risk(eta, eta.now + 100 * eta.wall_p90)
    assert risk.p_on_time > 0.99
    assert risk.speedup_for_p90 == 0.0 and risk.steps_cut_for_p90 == 0.0
    json.dumps(risk.to_dict(), allow_nan=False)


def test_already_impossible() -> None:
    eta = _eta()
    risk = deadline_risk(eta, eta.now - 10.0)
    assert risk.p_on_time == 0.0
    assert risk.speedup_for_p90 is None and risk.steps_cut_for_p90 is None
    json.dumps(risk.to_dict(), allow_nan=False)


def test_at_the_median_needs_a_speedup() -> None:
    eta = _eta()
    risk = deadline_risk(eta, eta.finish_p50())
    assert risk.p_on_time == pytest.approx(0.5, abs=0.02)
    assert risk.speedup_for_p90 is not None and risk.speedup_for_p90 > 0
    assert risk.steps_cut_for_p90 is not None
    assert 0 < risk.steps_cut_for_p90 < eta.total_steps - eta.current_step
    # The speedup is what brings the P90 compute inside the time left.
    budget = eta.finish_p50() - eta.now - (eta.wall_p90 - eta.compute_p90)
    assert eta.compute_p90 / (1 + risk.speedup_for_p90) == pytest.approx(budget, rel=1e-6)
    # Stored in the forecast and the flag as every reader sees it: one name, rounded up.
    assert risk.explanation == formatting.on_time(
        risk.p_on_time, risk.speedup_for_p90, risk.steps_cut_for_p90
    )
    assert f"{formatting.speedup(risk.speedup_for_p90)} or " in risk.explanation
    assert "throughput" not in risk.explanation


def test_probability_rises_with_the_deadline() -> None:
    eta = _eta()
    ps = [deadline_risk(eta, eta.now + f * eta.wall_p50).p_on_time for f in (0.5, 0.9, 1, 1.2)]
    assert ps == sorted(ps) and ps[0] < 0.1 and ps[-1] > 0.6
