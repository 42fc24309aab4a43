from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bench.evaluate import __main__ as cli
from bench.evaluate.eta_eval import CUTOFFS, KINDS, METHODS, evaluate_eta, run_timeline
from bench.evaluate.faults import inject_faults, run_rng
from curveset import load_runs

CURVES = Path(os.environ.get("RUNCAST_CURVES", "/work/shared/data/curves"))
needs_curves = pytest.mark.skipif(not (CURVES / "runs").is_dir(), reason="curve set not present")

PICK = (
    "runs/modded-nanogpt__track_1_short-2024-10-18_PyTorch25-d4bfb25f-688d-4da5-8743-33926fad4842.csv",
    "runs/megatron-lm__nemotron3_super_release_gb200_sm__dev_dgx_gb200.csv",
    "runs/parameter-golf__track_10min_16mb-2026-03-17_NaiveBaseline-train.csv",
    "runs/olmo__",  # prefix: an OLMo run has no timing and must be skipped for ETA
)


@pytest.fixture(scope="module")
def small_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not (CURVES / "runs").is_dir():
        pytest.skip("curve set not present")
    root = tmp_path_factory.mktemp("curves")
    (root / "runs").mkdir()
    index = pd.read_csv(CURVES / "INDEX.csv", dtype=str)
    chosen = [index[index["file"].str.startswith(p)].head(1) for p in PICK]
    rows = pd.concat(chosen)
    for file in rows["file"]:
        shutil.copy(CURVES / file, root / file)
    rows.to_csv(root / "INDEX.csv", index=False)
    events = pd.read_csv(CURVES / "EVENTS.csv", dtype=str)
    events[events["file"].isin(rows["file"])].to_csv(root / "EVENTS.csv", index=False)
    return root


@needs_curves
def test_timelines(small_set: Path) -> None:
    runs = {r.file.split("__")[0]: r for r in load_runs(small_set)}
    nano = run_timeline(runs["runs/modded-nanogpt"])
    assert nano is not None
    assert (np.diff(nano[1]) >= 0).all()  # the timer reset at step ~11 is stitched
    assert nano[1][-1] > 60.0  # and the compile minute before it is kept on the clock
    mega = run_timeline(runs["runs/megatron-lm"])
    assert mega is not None and (np.diff(mega[1]) > 0).all()  # from step_ms alone
    assert run_timeline(runs["runs/olmo"]) is None


def test_faults_are_deterministic_and_plausible() -> None:
    steps = np.arange(0.0, 2001.0, 10.0)
    times = steps * 0.5
    a = inject_faults(steps, times, run_rng(3, "x"))
    b = inject_faults(steps, times, run_rng(3, "x"))
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]
    kinds = set()
    for seed in range(30):
        s, t, log = inject_faults(steps, times, run_rng(seed, "x"))
        assert (np.diff(t) >= 0).all()  # time only moves on
        assert t[-1] >= times[-1] and s[-1] == steps[-1]
        assert ((np.diff(s) < 0).sum() > 0) == (log.restarts > 0)
        kinds |= {
            k
            for k, on in (("slow", log.slowdown > 1), ("restart", log.restarts), ("gap", log.gaps))
            if on
        }
        if log.slowdown > 1:
            assert 1.05 <= log.slowdown <= 1.30
    assert kinds == {"slow", "restart", "gap"}


@needs_curves
def test_evaluate_eta_structure(small_set: Path) -> None:
    fields, text = evaluate_eta(load_runs(small_set), seed=0)
    assert fields["eta_runs_timed"] == 3
    for key in ("eta_ape_median", "eta_ape_p90"):
        assert set(fields[key]) == set(METHODS)
        assert set(fields[key]["runcast"]) == {str(c) for c in CUTOFFS}
        assert set(fields["faulted"][key]) == set(METHODS)
    assert set(fields["eta_cover80"]) == {str(c) for c in CUTOFFS}
    # Held-out half coverage, real timings and faulted, per cut-off.
    for part in (fields, fields["faulted"]):
        assert set(part["eta_cover80_half"]) == {"A", "B"}
        assert set(part["eta_cover80_half"]["B"]) == {str(c) for c in CUTOFFS}
    # Deadline odds per timing kind and cut-off, with the baseline's and per half.
    for key in ("p_on_time_ece", "p_on_time_brier", "p_on_time_brier_baseline", "p90_exceedance"):
        assert set(fields[key]) == set(KINDS)
        assert set(fields[f"{key}_half"]["real"]) == {"A", "B"}
    for kind in KINDS:
        for c, value in fields["p_on_time_brier"][kind].items():
            assert 0.0 <= value <= 1.0 and c in {str(x) for x in CUTOFFS}
    assert set(fields["realistic"]) == set(fields["faulted"])
    # On steady runs with the true total, Runcast is close at 50%.
    assert fields["eta_ape_median"]["runcast"]["50"] < 0.05
    assert "runcast" in text and "tqdm_ema" in text


@needs_curves
def test_cli_json_last_line(small_set: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = (("bench.evaluate.no_such_module", "evaluate_nothing"),)
    original = cli.OPTIONAL
    cli.OPTIONAL = missing  # type: ignore[assignment]
    try:
        assert cli.main([str(small_set), "--json", "--seed", "1"]) == 0
    finally:
        cli.OPTIONAL = original  # type: ignore[assignment]
    out = capsys.readouterr()
    data = json.loads(out.out.strip().splitlines()[-1])
    assert data["runs"] == 4 and data["seed"] == 1
    assert {"eta_ape_median", "eta_ape_p90", "eta_cover80", "faulted"} <= set(data)
    assert "[skip]" in out.err


@needs_curves
def test_cli_eta_only_skips_loss_and_divergence(
    small_set: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main([str(small_set), "--json", "--eta-only"]) == 0
    data = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"p_on_time_ece", "p_on_time_brier", "p90_exceedance", "eta_cover80"} <= set(data)
    assert not any(key.startswith("loss_") for key in data)
