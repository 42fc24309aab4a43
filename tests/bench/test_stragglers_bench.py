from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from bench.stragglers import __main__ as cli
from bench.stragglers import data
from bench.stragglers.score import Truth, oracle_delay, rows_needed

RANKS = Path(os.environ.get("RUNCAST_RANKS", "/work/shared/data/ranks"))
needs_ranks = pytest.mark.skipif(
    not (RANKS / "LABELS.csv").exists(), reason="rank trace not present"
)


@needs_ranks
def test_it_loads_the_trace_with_its_episodes() -> None:
    jobs = data.load_jobs(RANKS)
    assert len(jobs) >= 2
    for job in jobs:
        assert job.compute.shape[0] == job.steps.size and job.compute.shape[1] >= 3
        assert (job.steps[1:] > job.steps[:-1]).all()
        assert 0 < job.days < 1
    labelled = [e for j in jobs for e in j.episodes]
    assert labelled and all(0 <= e.lo <= e.hi for e in labelled)


@needs_ranks
def test_the_bench_prints_its_table_and_one_json_line(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--data", str(RANKS), "--limit", "1", "--sizes", "64", "--cells", "19200"]
    assert cli.main([*argv, "--json", "--skip-cost"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert any(line.startswith("set ") for line in out)  # the table
    result = json.loads(out[-1])
    assert result["jobs"] == len(data.load_jobs(RANKS))
    recall = result["straggler_recall_by_slowdown"]
    assert set(recall) == {"2", "5", "10", "20"}
    assert all(v is None or 0.0 <= v <= 1.0 for v in recall.values())
    # A 20% slowdown on one rank of a real job is well above its noise.
    assert recall["20"] is not None and recall["20"] > 0.5
    # Clean ranks of the real jobs and of the 64-rank worlds: no false alarm at all.
    assert result["straggler_false_alarms_per_job_day"] == 0.0
    assert result["whatif_eta_error"] is None or 0.0 <= result["whatif_eta_error"] < 1.0
    # The publisher-described episode (job 1, rank 6) is found.
    assert result["episodes"]["recall_primary"] == 1.0
    for name in ("nvidia_relative", "nvidia_individual", "nvidia_relative_matched"):
        base = result["baselines"][name]
        assert set(base["recall_by_slowdown"]) == {"2", "5", "10", "20"}
        assert "false_alarms_per_job_day" in base
    assert "straggler_delay_steps_median" in result


def test_the_oracle_is_run_on_the_injected_and_the_clean_series() -> None:
    # White noise of 1%: a 10% shift from row 300 is ten noise units, far above the threshold.
    rng = np.random.default_rng(0)
    clean = 0.01 * rng.standard_normal(600)
    slowed = clean.copy()
    slowed[300:] += np.log(1.10)
    delay = oracle_delay(slowed, clean, 1.10, 8640.0, 64, onset=300)
    assert delay is not None and delay < 20
    assert oracle_delay(clean, clean, 1.10, 8640.0, 64, onset=0) is None
    # Its mean delay is what rows_needed predicts, within the spread of one path.
    assert delay <= 3 * rows_needed(clean, 1.10, 8640.0, 64) + 5


@needs_ranks
def test_the_json_line_has_the_oracle_beside_runcast(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--data", str(RANKS), "--limit", "1", "--sizes", "64", "--cells", "19200"]
    assert cli.main([*argv, "--json", "--skip-cost"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    findable = result["straggler_recall_findable_by_slowdown"]
    assert {"oracle", "runcast"} <= set(findable)
    shares = result["oracle_clean_alarm_share_by_slowdown"]
    assert set(shares) == {"2", "5", "10", "20"}
    assert all(v is None or 0.0 <= v <= 1.0 for v in shares.values())


def test_the_bound_runs_the_oracle_on_every_scored_trial() -> None:
    # White noise of 5% over 2,000 rows: a 2% shift needs ~170 rows of the oracle. From row
    # 1,000 it has 1,000; from row 1,990 it has 10. Both are scored (the bound is over every
    # trial, not only the findable ones), the second as unfindable; an ineligible one is not.
    rng = np.random.default_rng(0)
    clean = 0.05 * rng.standard_normal(2000)
    tally = cli.Tally()
    for onset in (1000, 1990):
        slowed = clean.copy()
        slowed[onset:] += np.log(1.02)
        truth = Truth(rank=0, onset=onset)
        cli._bound(tally, None, "w", slowed, clean, 1.02, 8640.0, 64, truth, 2000 - onset)
    skipped = Truth(rank=0, onset=1000, eligible=False)
    cli._bound(tally, None, "w", clean, clean, 1.02, 8640.0, 64, skipped, 1000)
    assert tally.trials("oracle")["2"] == 2
    assert tally.recall("oracle")["2"] == 0.5  # found with 1,000 rows left, not with 10
    assert tally.recall("unfindable")["2"] == 0.5
    assert tally.recall("oracle_clean")["2"] == 0.0
    # The stress set stays out of the pooled figures, as it does for the detectors.
    cli._bound(
        tally, None, "synth_stress_rank", clean, clean, 1.02, 8640.0, 64, Truth(rank=0), 2000
    )
    assert tally.trials("oracle")["2"] == 2


@needs_ranks
def test_the_json_line_has_the_bound_beside_runcast(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--data", str(RANKS), "--limit", "1", "--sizes", "64", "--cells", "19200"]
    assert cli.main([*argv, "--json", "--skip-cost"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert any(line.startswith("the bound:") for line in out)
    result = json.loads(out[-1])
    sizes = {"2", "5", "10", "20"}
    for key in ("oracle_recall_by_slowdown", "unfindable_share_by_slowdown"):
        assert set(result[key]) == sizes
        assert all(v is None or 0.0 <= v <= 1.0 for v in result[key].values())
    trials = result["scored_trials_by_slowdown"]
    assert set(trials) == sizes and sum(trials.values()) > 0
    # The findable trials are a subset of the scored ones.
    assert all(result["findable_trials_by_slowdown"][s] <= trials[s] for s in sizes)
    # A 20% slowdown of a real job's rank is far above its noise: the oracle finds it.
    assert result["oracle_recall_by_slowdown"]["20"] > 0.5
