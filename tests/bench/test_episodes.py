"""bench/episodes: the scoring on hand-made flag streams (numbers worked out by hand), the
injected shapes, and one replay of a tiny set through the real pipeline."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bench.episodes.data import Episode, documented_episodes, inject_episode
from bench.episodes.run import _jobs, visibility
from bench.episodes.score import (
    FlagRow,
    Scored,
    score_episode,
    summarise,
    visible_before_checkpoint,
)
from bench.flagstream import Row
from tests.bench import episode_fixtures

REPO = Path(__file__).resolve().parents[2]


def flag(t: float, kind: str, state: str, rollback: float | None = None, **kw: object) -> FlagRow:
    return FlagRow(
        t=t,
        kind=kind,
        state=state,
        onset_step=None,
        rollback_step=rollback,
        closed_by_end=bool(kw.get("end", False)),
        sent=int(kw.get("sent", 1)),  # type: ignore[call-overload]
        held=int(kw.get("held", 0)),  # type: ignore[call-overload]
        back_at_end=bool(kw.get("back", False)),
        escalation=bool(kw.get("worse", False)),
    )


# A run of 400 s, a point a second and 10 steps a second; the episode begins at 100 s (step 1000).
CLOCK = (np.arange(0.0, 401.0), np.arange(0.0, 4010.0, 10.0))
ONSET = Episode("test", onset_step=1000.0, onset_t=100.0)
CHECKPOINTS = [500.0, 900.0, 1100.0]


def test_an_episode_shown_healthy_between_a_resolve_and_a_raise() -> None:
    flags = [
        flag(50, "rise", "raised"),  # before the onset: a false alert, not this episode's
        flag(60, "rise", "resolved"),
        flag(110, "spike", "raised", rollback=900),
        flag(150, "spike", "resolved"),  # 40 s shown healthy from here ...
        flag(190, "regression", "raised", rollback=1100, sent=0, held=1),  # ... to here
        flag(250, "regression", "updated", rollback=900),
        flag(401, "regression", "resolved", end=True),  # the run's end closes it: not counted
    ]
    s = score_episode("r", ONSET, flags, CLOCK, CHECKPOINTS)
    assert s.detected_after_s == 10.0
    assert s.detected_after_steps == 100.0  # step 1100 was logged at 110 s
    assert s.healthy_while_diverged_s == 40.0
    assert s.rollbacks == [900.0, 1100.0, 900.0]
    assert s.rollback_ok is False  # 1100 is a checkpoint saved inside the episode
    assert s.end_open and s.end_state_correct  # open at the last point, never recovered
    assert s.messages == 4  # from the onset on: raise, resolve, update, end's resolve
    assert s.held == 1
    assert (s.escalations, s.escalations_held) == (0, 0)
    worse = [flag(110, "spike", "raised"), flag(130, "spike", "updated", worse=True, held=1)]
    s = score_episode("r", ONSET, worse, CLOCK, CHECKPOINTS)
    assert (s.escalations, s.escalations_held) == (1, 1)


def test_a_recovered_episode_whose_flag_stays_open_has_the_wrong_end_state() -> None:
    back = Episode("test", 1000.0, 100.0, recovered_step=3000.0, recovered_t=300.0)
    flags = [flag(130, "rise", "raised", rollback=900), flag(200, "rise", "resolved")]
    s = score_episode("r", back, flags, CLOCK, CHECKPOINTS)
    assert s.healthy_while_diverged_s == 100.0  # 200 s to the recovery at 300 s
    assert s.rollback_ok and s.end_state_correct
    still_open = score_episode("r", back, flags[:1], CLOCK, CHECKPOINTS)
    assert still_open.healthy_while_diverged_s == 0.0 and not still_open.end_state_correct
    # The run's end closed it saying the loss was back: the episode was over, as it was.
    ended_back = [flags[0], flag(401, "rise", "resolved", end=True, back=True)]
    assert score_episode("r", back, ended_back, CLOCK, CHECKPOINTS).end_state_correct
    ended_open = [flags[0], flag(401, "rise", "resolved", end=True)]
    assert not score_episode("r", back, ended_open, CLOCK, CHECKPOINTS).end_state_correct


def test_a_missed_episode_was_shown_healthy_from_onset_to_end() -> None:
    s = score_episode("r", ONSET, [flag(20, "spike", "raised")], CLOCK, CHECKPOINTS)
    assert s.detected_after_s is None and s.healthy_while_diverged_s == 300.0
    assert s.rollback_ok is None  # nothing was advised in it: scored by recall, not here
    assert s.end_state_correct  # the spike of 20 s is still open at the end


def test_false_alert_rates_pooled_short_runs_and_per_run() -> None:
    long_run = Scored("long", None, 200.0, false_alerts=Counter({"deadline": 1}))
    short_run = Scored("short", None, 2.0, false_alerts=Counter({"rise": 1}))
    out = summarise([long_run, short_run], skipped=0)
    assert out["false_alerts_per_100_run_hours"] == round(100 * 2 / 202, 3)
    assert out["divergence_false_alerts_per_100_run_hours"] == round(100 * 1 / 202, 3)
    assert out["false_alerts_per_100_run_hours_under_a_week"] == 50.0
    assert out["runs_over_a_week"] == 1
    assert out["false_alerts_per_100_run_hours_mean_of_runs"] == (0.5 + 50.0) / 2


def _rows() -> list[Row]:
    rng = np.random.default_rng(0)
    return [
        Row(s, 0.5 * s, 2.0 * math.exp(rng.normal(0, 0.01)), 2.1 if s % 100 == 0 else None)
        for s in range(0, 2000, 5)
    ]


@pytest.mark.parametrize("shape", ["blowup", "spike", "oscillation", "nan"])
def test_injected_shapes(shape: str) -> None:
    rows = _rows()
    out, ep = inject_episode(rows, shape, random.Random(3))
    before = [r.loss for r in out if r.step < ep.onset_step]
    assert before == [r.loss for r in rows if r.step < ep.onset_step]  # untouched before
    tail = np.array([r.loss for r in out[-20:]], dtype=float)
    if shape == "blowup":  # settled at 2-20x its level, with its noise
        assert 2.0 * 0.95 <= np.median(tail) / 2.0 <= 20.0 * 1.05 and np.std(tail) > 0
    elif shape == "spike":
        assert ep.recovered_step is not None and ep.recovered_t is not None
        peak = max(r.loss for r in out if r.loss is not None)
        assert peak >= 3 * 2.0 * 0.95
        pairs = zip(out, rows, strict=True)
        after = [
            float(r.loss or 0) / float(o.loss or 1) for r, o in pairs if r.step >= ep.recovered_step
        ]
        assert max(after) <= 1.05 + 1e-9  # back within 5% of the run it was
    elif shape == "oscillation":
        assert tail.max() / tail.min() > 3.0  # swings at the end far wider than the noise
    else:
        assert all(math.isnan(float(r.loss or 0)) for r in out if r.step >= ep.onset_step)
    if shape != "spike":
        assert ep.recovered_step is None
    vals = [r.val for r in out if r.val is not None and r.step >= ep.onset_step]
    assert shape == "nan" or vals != [2.1] * len(vals)  # the validation loss moves too


def test_documented_episodes_pair_onsets_with_recoveries() -> None:
    rows = [Row(s, s / 10.0, 1.0, None) for s in range(0, 3000, 10)]
    events = pd.DataFrame(
        [
            ("r", "500", "", "checkpoint", "saved", "documented"),
            ("r", "1001", "", "divergence_onset", "lr_kept x100", "documented"),
            ("r", "1005", "", "nan", "not finite", "documented"),  # inside the open episode
            ("r", "1500", "", "recovered", "back", "documented"),
            ("r", "2001", "", "nan", "not finite", "documented"),  # a new episode of its own
            ("r", "2500", "", "auto_spike", "hint", "auto-detected"),
        ],
        columns=["file", "step", "elapsed_s", "event_type", "description", "origin"],
    )
    eps = documented_episodes(events, rows)
    assert [(e.scenario, e.onset_step, e.recovered_step) for e in eps] == [
        ("documented:lr_kept", 1001.0, 1500.0),
        ("documented:nan", 2001.0, None),
    ]
    assert eps[0].onset_t == pytest.approx(100.1)


def test_a_documented_nan_replayed_through_the_pipeline(tmp_path: Path) -> None:
    root = episode_fixtures.build(tmp_path / "set")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "bench.episodes", str(root), "--json", "--per-run", "0"]
    done = subprocess.run(
        [*cmd, "--processes", "1"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["episodes"] == 1 and out["episode_recall"] == 1.0
    assert out["healthy_while_diverged_s"] == {"total": 0.0, "max": 0.0}
    assert out["rollback_before_onset_share"] == 1.0  # checkpoint 400, before step 401
    assert out["end_state_correct_share"] == 1.0
    assert out["healthy_runs"] == 1 and out["false_alerts"] == 0
    assert out["by_scenario"]["documented:nan"]["episodes"] == 1


def test_an_injected_onset_is_a_row_that_logs_the_loss() -> None:
    # Timing rows without a loss between the logged ones: the onset must be one a point shows.
    rows = [Row(s, float(s), 2.0 if s % 50 == 0 else None, None) for s in range(0, 2000, 5)]
    for seed in range(5):
        _, ep = inject_episode(rows, "nan", random.Random(seed))
        assert ep.onset_step % 50 == 0


def test_a_fault_is_visible_before_a_checkpoint_only_once_it_leaves_the_noise() -> None:
    """A swing that grows from nothing stays inside the noise of the run up to a checkpoint
    close after its onset (no method could put the onset before it), and leaves it by one far
    later; a spike is visible at once."""
    rng = np.random.default_rng(0)
    steps = np.arange(0.0, 2000.0)
    clean = 2.0 * np.exp(rng.normal(0.0, 0.02, steps.size))
    d = np.where(steps >= 1000, steps - 1000, 0.0)
    grown = clean * np.exp(0.3 * d / 1000 * (1 + np.sin(2 * np.pi * d / 40)))
    assert visible_before_checkpoint((steps, clean), grown, 1000.0, [500.0, 1010.0]) is False
    assert visible_before_checkpoint((steps, clean), grown, 1000.0, [500.0, 1400.0]) is True
    spiked = clean.copy()
    spiked[1000] *= 4
    assert visible_before_checkpoint((steps, clean), spiked, 1000.0, [1010.0]) is True
    assert visible_before_checkpoint((steps, clean), grown, 1000.0, [900.0]) is None


def test_visibility_counts_every_shape_injected_into_every_healthy_run() -> None:
    """`--visibility` injects each shape into each healthy run as the replays do: on the tinygpt
    set (4 healthy runs, a checkpoint every 100 steps) a spike is seen at once and an
    oscillation growing from zero never before the next checkpoint."""
    jobs = _jobs(REPO / "bench" / "data" / "tinygpt", seed=0, per_run=1, limit=None)
    counts = visibility(jobs)
    assert counts["spike"] == {"visible": 4} and counts["nan"] == {"visible": 4}
    assert counts["oscillation"] == {"not_visible": 4}
