"""Convert MLPerf Training power submissions into the bench's power data set format.

    python -m bench.power_data REPO_GIT_DIR RESULTS_DIR OUT_DIR [--version v4.1] [--split dev]
    python -m bench.power_data /work/.mirror/mlcommons+training_results_v4.1/repo \\
        Dell/results/8xXE9680x8H100-SXM-80GB-POWER/llama2_70b_lora bench/data/power-dell

Reads a bare git mirror of an mlcommons/training_results_* repository at HEAD (`git show`,
no work tree) and writes the layout of ../shared/data/power: INDEX.csv, one row per run, and
runs/<run_id>/power.csv (time_s, node, watts) + events.csv (time_s, event, value, detail),
with times in seconds from the job's run_start. Only numbers are taken from the source.

Per run: `result_<k>.txt` is the job log (MLLOG lines, optionally prefixed by the rank, " 0: ");
`power/result_<k>/node_<n>.txt` one power meter per node (MLLOG `power_reading` lines, watts,
`time_ms` on the meter's clock); `sw_<n>.txt` the interconnect, summarised in INDEX.csv only.
Exact duplicate readings (same time, same value: the Dell meters log most of them twice) are
dropped and counted; readings are sorted by time and backward steps counted.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import itertools
import json
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# Job-log keys kept as events: the phases, the run's edges and its progress. The rest
# (hyper-parameters, per-step losses) says nothing about when the GPUs are busy.
KEPT = {
    "cache_clear",
    "init_start",
    "init_stop",
    "run_start",
    "run_stop",
    "block_start",
    "block_stop",
    "epoch_start",
    "epoch_stop",
    "eval_start",
    "eval_stop",
    "eval_accuracy",
}
RANK_PREFIX = re.compile(r"^\s*(\d+):\s")


@dataclass
class Event:
    time_ms: int
    key: str
    value: object
    metadata: dict


def git_show(repo: Path, path: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "show", f"HEAD:{path}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def git_ls(repo: Path, path: str) -> list[str]:
    out = subprocess.run(
        ["git", "-C", str(repo), "ls-tree", "-r", "--name-only", "HEAD", path],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return out.split()


def mllog(text: str) -> list[tuple[int | None, Event]]:
    """(rank or None, event) for every MLLOG line."""
    out = []
    for line in text.splitlines():
        at = line.find(":::MLLOG ")
        if at < 0:
            continue
        match = RANK_PREFIX.match(line[:at])
        rank = int(match.group(1)) if match else None
        row = json.loads(line[at + len(":::MLLOG ") :])
        meta = {k: v for k, v in (row.get("metadata") or {}).items() if k not in ("file", "lineno")}
        out.append((rank, Event(int(row["time_ms"]), str(row["key"]), row.get("value"), meta)))
    return out


def job_events(text: str) -> tuple[list[Event], dict[str, int]]:
    """Rank 0's events (or the unprefixed log's); init_start and cache_clear at the earliest
    rank, with how many ranks logged them (`earliest_of`), as in the shared set."""
    rows = mllog(text)
    ranks = {r for r, _ in rows}
    lead = 0 if 0 in ranks else None
    earliest: dict[str, list[Event]] = {}
    kept: list[Event] = []
    for rank, e in rows:
        if e.key in ("init_start", "cache_clear"):
            earliest.setdefault(e.key, []).append(e)
        elif rank == lead and (e.key in KEPT or e.key == "tracked_stats"):
            kept.append(e)
    counts = {}
    for key, group in earliest.items():
        first = min(group, key=lambda e: e.time_ms)
        kept.append(first)
        counts[key] = len(group)
    kept.sort(key=lambda e: e.time_ms)
    return kept, counts


def event_rows(events: list[Event], counts: dict[str, int], t0: int) -> list[list[str]]:
    rows = []
    for e in events:
        detail = ";".join(f"{k}={v}" for k, v in e.metadata.items())
        if e.key in counts:
            detail = f"earliest_of={counts[e.key]}"
        if e.key == "tracked_stats" and isinstance(e.value, dict):
            for name, value in e.value.items():
                rows.append(
                    [f"{(e.time_ms - t0) / 1e3:.3f}", f"tracked_stats.{name}", str(value), detail]
                )
            continue
        value = (
            ""
            if e.value is None
            else json.dumps(e.value)
            if isinstance(e.value, bool)
            else str(e.value)
        )
        rows.append([f"{(e.time_ms - t0) / 1e3:.3f}", e.key, value, detail])
    return rows


@dataclass
class Meter:
    node: int
    t_ms: np.ndarray
    watts: np.ndarray
    duplicates: int
    backward: int
    measurement: str
    conversion_eff: float | None


def read_meter(text: str, node: int) -> Meter:
    rows = mllog(text)
    readings = [(e.time_ms, float(e.value)) for _, e in rows if e.key == "power_reading"]  # type: ignore[arg-type]
    backward = sum(1 for a, b in itertools.pairwise(readings) if b[0] < a[0])
    unique = sorted(set(readings))
    kinds = {str(e.metadata.get("measurement_type", "")) for _, e in rows}
    effs = [float(e.value) for _, e in rows if e.key == "conversion_eff"]  # type: ignore[arg-type]
    return Meter(
        node,
        np.array([t for t, _ in unique], dtype=np.int64),
        np.array([w for _, w in unique]),
        len(readings) - len(unique),
        backward,
        "/".join(sorted(k for k in kinds if k)),
        effs[0] if effs else None,
    )


def convert_run(repo: Path, results: str, k: str, out: Path, meta: dict) -> dict:
    text = git_show(repo, f"{results}/result_{k}.txt")
    events, counts = job_events(text)
    by_key = {e.key: e.time_ms for e in events}
    t0 = by_key["run_start"]
    stop = next(e for e in events if e.key == "run_stop")
    files = git_ls(repo, f"{results}/power/result_{k}")
    meters = []
    switch_w = []
    for path in files:
        name = Path(path).stem
        if name.startswith("node_"):
            meters.append(read_meter(git_show(repo, path), int(name.split("_")[1])))
        elif name.startswith("sw_"):
            sw = read_meter(git_show(repo, path), 0)
            switch_w.append(float(np.median(sw.watts)))
    meters.sort(key=lambda m: m.node)
    run_id = f"{meta['version']}__{meta['org_dir']}__{meta['system']}__{meta['benchmark']}__{k}"
    run_dir = out / "runs" / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    power = sorted(
        ((int(t) - t0) / 1e3, m.node, w)
        for m in meters
        for t, w in zip(m.t_ms, m.watts, strict=True)
    )
    with open(run_dir / "power.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["time_s", "node", "watts"])
        writer.writerows([f"{t:.3f}", n, f"{w:g}"] for t, n, w in power)
    with open(run_dir / "events.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["time_s", "event", "value", "detail"])
        writer.writerows(event_rows(events, counts, t0))
    digests = Counter(
        hashlib.blake2b(m.t_ms.tobytes() + m.watts.tobytes()).hexdigest() for m in meters
    )
    periods = np.concatenate([np.diff(m.t_ms) / 1e3 for m in meters])
    keys = Counter(e.key for e in events)
    return {
        "run_id": run_id,
        "split": meta["split"],
        "dir": f"runs/{run_id}",
        "version": meta["version"],
        "submitter": meta["submitter"],
        "org_dir": meta["org_dir"],
        "system": meta["system"],
        "benchmark": meta["benchmark"],
        "run": k,
        "measurement": "/".join(sorted({m.measurement for m in meters})),
        "nodes": len(meters),
        "gpus_per_node": meta["gpus_per_node"],
        "accelerator": meta["accelerator"],
        "cooling": meta["cooling"],
        # The mean spacing of distinct readings: the Dell meters alternate 1-s and 2-s steps.
        "sampling_period_s": round(float(np.mean(periods)), 3),
        "time_resolution_s": 1.0 if all((m.t_ms % 1000 == 0).all() for m in meters) else 0.001,
        "power_rows": len(power),
        "readings_per_node_min": min(len(m.t_ms) for m in meters),
        "readings_per_node_max": max(len(m.t_ms) for m in meters),
        "power_duplicates_dropped": sum(m.duplicates for m in meters),
        "power_backward_steps": sum(m.backward for m in meters),
        "run_duration_s": round((stop.time_ms - t0) / 1e3, 3),
        # The job log's run_start (Unix ms): a system's runs in the order they ran, for what
        # a node carries from its earlier runs (the bench's --carry).
        "run_start_unix_ms": t0,
        "power_start_s": round((min(int(m.t_ms[0]) for m in meters) - t0) / 1e3, 3),
        "power_end_s": round((max(int(m.t_ms[-1]) for m in meters) - t0) / 1e3, 3),
        "init_start_s": round((by_key["init_start"] - t0) / 1e3, 3),
        "n_events": len(events),
        "n_eval": keys["eval_start"],
        "n_block": keys["block_start"],
        "n_epoch": keys["epoch_start"],
        "run_status": stop.metadata.get("status", ""),
        "distinct_node_series": len(digests),
        "switch_power_median_w": "/".join(f"{w:g}" for w in switch_w),
        "conversion_eff": meters[0].conversion_eff if meters else "",
        # The shared set's column: a content id to match job logs by, not a safeguard.
        "job_log_sha1": hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()[:12],
        "source_job_log": f"{results}/result_{k}.txt",
        "source_power_dir": f"{results}/power/result_{k}",
        "repo": meta["repo"],
        "commit": meta["commit"],
        "licence": meta["licence"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("repo", type=Path, help="bare git mirror of the results repository")
    parser.add_argument("results", help="…/results/<system>/<benchmark> inside it")
    parser.add_argument("out", type=Path)
    parser.add_argument("--version", default="v4.1")
    parser.add_argument("--split", default="dev")
    parser.add_argument("--repo-name", default="mlcommons/training_results_v4.1")
    parser.add_argument("--licence", default="Apache-2.0")
    args = parser.parse_args(argv)
    parts = args.results.split("/")
    org, system, benchmark = parts[0], parts[2], parts[3]
    sysinfo = json.loads(git_show(args.repo, f"{org}/systems/{system}.json"))
    commit = subprocess.run(
        ["git", "-C", str(args.repo), "rev-parse", "HEAD"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    meta = {
        "version": args.version,
        "split": args.split,
        "submitter": sysinfo.get("submitter", org),
        "org_dir": org,
        "system": system,
        "benchmark": benchmark,
        "gpus_per_node": sysinfo.get("accelerators_per_node", ""),
        "accelerator": sysinfo.get("accelerator_model_name", ""),
        "cooling": sysinfo.get("cooling", ""),
        "repo": args.repo_name,
        "commit": commit,
        "licence": args.licence,
    }
    logs = sorted(
        (
            Path(p).stem.removeprefix("result_")
            for p in git_ls(args.repo, args.results)
            if Path(p).parent == Path(args.results) and Path(p).name.startswith("result_")
        ),
        key=lambda s: (len(s), s),
    )
    runs = [k for k in logs if git_ls(args.repo, f"{args.results}/power/result_{k}")]
    rows = [convert_run(args.repo, args.results, k, args.out, meta) for k in runs]
    with open(args.out / "INDEX.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"{len(rows)} runs -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
