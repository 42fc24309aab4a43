"""bench.power_data on a small MLPerf-shaped repository (a real git repository in tmp_path), and
the GPU activity bench's per-system scores."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd

from bench import gpu_activity as bench
from bench import power_data

RESULTS = "Acme/results/2xBox/llama2_70b_lora"
T0 = 1_700_000_000_000  # run_start, ms


def line(key: str, time_ms: int, value: object = None, **meta: object) -> str:
    event = {"time_ms": time_ms, "key": key, "value": value, "metadata": {"file": "x", **meta}}
    return ":::MLLOG " + json.dumps(event)


def make_repo(root: Path) -> Path:
    job = [
        line("init_start", T0 - 60_000),
        line("cache_clear", T0 - 61_000, True),
        line("run_start", T0),
        line("block_start", T0 + 1, samples_count=0),
        line("train_loss", T0 + 5_000, 1.2),
        line("tracked_stats", T0 + 30_000, {"throughput": 12.5}, step=64),
        line("block_stop", T0 + 30_000),
        line("eval_start", T0 + 30_001),
        line("eval_stop", T0 + 40_000),
        line("run_stop", T0 + 40_001, 0.92, status="success"),
    ]
    files = {
        f"{RESULTS}/result_0.txt": "\n".join(f" 0: {x}" for x in job)
        # Another rank starts init earlier: the earliest counts, with how many logged it.
        + "\n 1: "
        + line("init_start", T0 - 62_000),
        "Acme/systems/2xBox.json": json.dumps(
            {"submitter": "Acme", "accelerators_per_node": "8", "cooling": "air"}
        ),
    }
    for node, offset in ((0, 0), (1, 3000)):
        readings = [line("power_measurement_start", T0 - 10_000)]
        for s in range(-10, 41):
            t = T0 + s * 1000 + offset
            readings.append(line("power_reading", t, 8000.0 + node, host=str(node)))
            if s % 3 == 0:  # the Dell meters log most readings twice
                readings.append(line("power_reading", t, 8000.0 + node, host=str(node)))
        files[f"{RESULTS}/power/result_0/node_{node}.txt"] = "\n".join(readings)
    files[f"{RESULTS}/power/result_0/sw_0.txt"] = line("power_reading", T0, 700.0)
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text + "\n")
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "results"], check=True)
    return root


def test_it_converts_a_submission_into_the_shared_layout(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    out = tmp_path / "out"
    assert power_data.main([str(repo), RESULTS, str(out)]) == 0
    index = pd.read_csv(out / "INDEX.csv", keep_default_na=False)
    row = index.iloc[0]
    assert (row.submitter, row.system, row.nodes, row.run_status) == ("Acme", "2xBox", 2, "success")
    assert row.power_duplicates_dropped == 2 * 17  # every third of 51 readings, per node
    assert row.time_resolution_s == 1.0 and row.distinct_node_series == 2
    assert row.init_start_s == -62.0
    assert row.run_start_unix_ms == T0  # the runs of a system in the order they ran
    run = out / str(row.dir)
    power = pd.read_csv(run / "power.csv")
    assert len(power) == 2 * 51 and power.time_s.is_monotonic_increasing
    assert power[power.node == 1].time_s.min() == -7.0  # the meter's own clock, kept
    events = pd.read_csv(run / "events.csv", keep_default_na=False)
    assert "train_loss" not in set(events.event)
    init = events[events.event == "init_start"].iloc[0]
    assert (init.time_s, init.detail) == (-62.0, "earliest_of=2")
    stats = events[events.event == "tracked_stats.throughput"].iloc[0]
    assert (stats.value, stats.detail) == ("12.5", "step=64")


def test_the_bench_scores_each_system_apart() -> None:
    def run(system: str, found: bool, clean: int) -> dict:
        trial = {"kind": "burst", "context": "train", "length": 40.0, "found": found}
        trial |= {"delay": 5.0 if found else None, "extra": 0}
        return {
            "system": system,
            "series": 1,
            "hours": 1.0,
            "clean_alarms": [{}] * clean,
            "trials": [trial],
        }

    summary = bench.summarise([run("A", True, 0), run("B", False, 2)], {})
    per = summary["per_system"]
    assert per["A"]["gpu_unexplained_recall"] == 1.0
    assert per["A"]["gpu_false_alarms_per_node_hour"] == 0.0
    assert per["B"]["gpu_unexplained_recall"] == 0.0
    assert per["B"]["gpu_false_alarms_per_node_hour"] == 2.0
    assert summary["gpu_unexplained_recall"] == 0.5


def test_a_nodes_rating_is_its_host_plus_its_gpus_at_tdp() -> None:
    assert bench.rated_node_w("NVIDIA H100-SXM5-80GB", 8) == 10_200.0
    assert bench.rated_node_w("NVIDIA B200-SXM-180GB", "8") == 14_300.0
    # Fewer GPUs: the host's share stays, each GPU takes its TDP.
    assert bench.rated_node_w("NVIDIA H100-SXM5-80GB", 4) == 10_200.0 - 4 * 700.0
    assert bench.rated_node_w("Some other accelerator", 8) == float("inf")


def test_a_burst_the_nodes_headroom_cannot_hold_is_void_not_missed() -> None:
    t = np.arange(0.0, 100.0, 1.0)
    series = bench.Series(0, [0], t, np.full(t.size, 9_900.0))
    burst = bench.Injection(0, 20.0, 60.0, "burst", "train", 1.25)
    # At 9.9 kW a 10.2-kW node has 3% to give: the +25% is cut to +3%, void.
    capped = bench.apply(series, burst, 10_200.0)
    assert capped.max() == 10_200.0 and capped[:20].max() == 9_900.0
    assert bench.at_rated_power(series, burst, capped)
    # At 8 kW it holds +25% (10 kW): scored.
    low = bench.Series(0, [0], t, np.full(t.size, 8_000.0))
    assert not bench.at_rated_power(low, burst, bench.apply(low, burst, 10_200.0))
    # A throttle is never void.
    throttle = bench.Injection(0, 20.0, 60.0, "throttle", "train", 0.8)
    assert not bench.at_rated_power(series, throttle, bench.apply(series, throttle, 10_200.0))


def test_a_dc_side_meter_reads_the_rating_less_the_supplies_losses() -> None:
    class Row:
        measurement = "DC"
        conversion_eff = "0.96"

    assert bench.dc_share(Row()) == 0.96
    Row.measurement = "AC"
    assert bench.dc_share(Row()) == 1.0
    Row.measurement, Row.conversion_eff = "DC", ""
    assert bench.dc_share(Row()) == 1.0
