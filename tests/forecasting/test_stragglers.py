from __future__ import annotations

import json

import numpy as np
import pytest

from forecasting.estimators.stragglers import StragglerReport, detect_stragglers


def world(
    n: int = 600, ranks: int = 16, noise: float = 0.02, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    steps = np.arange(n)
    drift = 1.0 + 0.1 * np.sin(np.arange(n) / 50.0)  # the whole job speeds up and slows down
    compute = 0.5 * drift[:, None] * (1.0 + noise * rng.standard_normal((n, ranks)))
    return steps, compute


def test_it_finds_one_slow_rank() -> None:
    steps, compute = world()
    compute[400:, 5] *= 1.2
    rep = detect_stragglers(steps, compute)
    assert [s.ranks for s in rep.stragglers] == [(5,)]
    s = rep.stragglers[0]
    assert s.kind == "rank" and s.slowdown == pytest.approx(0.2, abs=0.03)
    assert s.cost_s > 0
    assert 0.8 < rep.whatif_factor() < 0.95
    json.dumps(rep.to_dict(), allow_nan=False)


def test_it_reports_nothing_on_a_clean_job() -> None:
    steps, compute = world()
    rep = detect_stragglers(steps, compute)
    assert isinstance(rep, StragglerReport)
    assert rep.stragglers == []
    assert rep.whatif_factor() == 1.0


def test_it_names_the_field_on_bad_input() -> None:
    with pytest.raises(ValueError, match="compute_s"):
        detect_stragglers(np.arange(5), np.ones((4, 3)))
    with pytest.raises(ValueError, match="hosts"):
        detect_stragglers(np.arange(5), np.ones((5, 3)), hosts=["a"])
