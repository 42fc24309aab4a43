"""Unexplained GPU activity on real MLPerf node power (../shared/data/power): does the run's own
activity come out explained and injected foreign work unexplained?

    python -m bench.gpu_activity [DIR ...] [--json] [--seed N] [--limit N] [--trials N] [--misses]

For every run: the distinct node series (identical twin files are one sensor, see the data
README), phases and step timings from the job's own event log, and the run's other distinct
series as peers. A clean pass counts false alarms (unexplained episodes on unmodified data, per
distinct-series hour). Then seeded injections, one per trial on one series: foreign work (+10-30%
of the current level, 10-300 s) starting during training, eval or idle (before init_start or
after run_stop; runs whose readings cover neither skip those trials), and throttling (x0.6-0.9,
30-300 s, ending by run_stop) during training. A burst stops at the node's rated power
(`rated_node_w`: host + GPUs at TDP); one that the headroom cuts under +10% on average is void
(at its rated power a node shows foreign work as the job's slowdown, not as watts), counted
per system and not scored. An injection is found when an unexplained
episode on that series overlaps it; every other unexplained episode on that series is a false
alarm. Plus the
attribution path on synthetic per-process traces (forecasting.estimators.gpu_attribution), and
attribution on the fake-NVML host agent's own traces with process data and on power alone
(bench/gpu_agent_traces.py: the `gpu_agent_attribution` section, `--agent-hosts N`, 0 to skip).
Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from bench.gpu_agent_traces import agent_attribution
from forecasting.estimators import gpu_activity as ga
from forecasting.estimators import gpu_attribution as gattr

DEFAULT_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "power"
SIZE_BUCKETS = ((10, 30), (30, 60), (60, 120), (120, 300))


@dataclass
class Series:
    node: int
    twins: list[int]
    t: np.ndarray
    w: np.ndarray


@dataclass
class LoadedRun:
    run_id: str
    benchmark: str
    series: list[Series]
    events: ga.RunEvents
    period: float
    # Where the node is idle (the data README): before init_start and after run_stop.
    idle_before: float = -np.inf
    idle_after: float = np.inf
    # The most a node can draw (rated_node_w): injected watts stop there.
    ceiling_w: float = np.inf


# -- the node's physical headroom --------------------------------------------------------------

# Per accelerator: its TDP and the rated maximum input power of the reference 8-GPU system built
# on it (NVIDIA's DGX user guides, "Power Specifications": DGX H100/H200 10.2 kW max, DGX B200
# 14.3 kW max; H100 SXM5 700 W, also the Dell system description's "GPU TDP:700W"; B200 SXM
# 1,000 W). A node is its host plus its GPUs, each at most its TDP; the host's share is the
# reference system's rating less its eight GPUs. The SMC set's README said "below ~10 kW per
# node" for the same H100 nodes, within 2% of this.
RATED = {
    "H100": (700.0, 10_200.0),
    "B200": (1_000.0, 14_300.0),
}


def rated_node_w(accelerator: str, gpus_per_node: int | str) -> float:
    """The rated power of a node: host + GPUs x TDP (inf for an accelerator not in RATED)."""
    for name, (tdp, reference) in RATED.items():
        if name in accelerator.upper():
            try:
                gpus = int(gpus_per_node)
            except (TypeError, ValueError):
                gpus = 8
            return reference - 8 * tdp + gpus * tdp
    return float("inf")


def dc_share(row: object) -> float:
    """What of a node's AC rating a DC-side meter can read: the run's PSU conversion
    efficiency (INDEX.csv `conversion_eff`) where it measured DC, else all of it."""
    if str(getattr(row, "measurement", "")).upper() != "DC":
        return 1.0
    try:
        eff = float(getattr(row, "conversion_eff", ""))
    except (TypeError, ValueError):
        return 1.0
    return eff if 0.0 < eff <= 1.0 else 1.0


# -- loading --------------------------------------------------------------------------------


def load_run(path: Path, run_id: str, benchmark: str, rated_w: float = np.inf) -> LoadedRun:
    power = pd.read_csv(path / "power.csv")
    events = pd.read_csv(path / "events.csv", keep_default_na=False)
    by_hash: dict[str, Series] = {}
    for node, group in power.groupby("node", sort=True):
        t = group["time_s"].to_numpy(float)
        w = group["watts"].to_numpy(float)
        digest = hashlib.blake2b(t.tobytes() + w.tobytes()).hexdigest()
        if digest in by_hash:
            by_hash[digest].twins.append(int(node))
        else:
            by_hash[digest] = Series(int(node), [int(node)], t, w)
    series = list(by_hash.values())
    # Each node's meter has its own clock (Dell's are up to 17 s apart): line the series up
    # with their peers before they are compared (clock.peer_offsets).
    for s, offset in zip(series, ga.peer_offsets([(s.t, s.w) for s in series]), strict=True):
        s.t = s.t + offset
    period = float(np.median(np.diff(series[0].t)))
    times = {str(e): float(t) for t, e in zip(events["time_s"], events["event"], strict=True)}
    return LoadedRun(
        run_id,
        benchmark,
        series,
        run_events(events),
        period,
        idle_before=times.get("init_start", -np.inf),
        idle_after=times.get("run_stop", np.inf),
        # A reading over the rating says the rating is not this node's: never clip below
        # what the node itself drew.
        ceiling_w=max(rated_w, max(float(s.w.max()) for s in series)),
    )


def run_events(events: pd.DataFrame) -> ga.RunEvents:
    """Phases (init, train blocks/epochs, evals) and step timings from the MLLOG event rows."""
    phases: list[ga.Phase] = []
    opened: dict[str, float] = {}
    pairs = {"init": "init", "block": "train", "epoch": "train", "eval": "eval"}
    for row in events.itertuples(index=False):
        name = str(row.event)
        prefix, _, edge = name.rpartition("_")
        if prefix in pairs and edge == "start":
            opened[prefix] = float(row.time_s)
        elif prefix in pairs and edge == "stop" and prefix in opened:
            phases.append(ga.Phase(opened.pop(prefix), float(row.time_s), pairs[prefix]))
    step_rows = events[
        events["detail"].str.contains("step=") & events["event"].str.startswith("tracked_stats.")
    ]
    steps = step_rows["detail"].str.extract(r"step=(\d+)")[0].astype(float).to_numpy()
    # A job that logs no step numbers still progresses at every block/epoch boundary.
    return ga.RunEvents(
        phases=phases,
        marks=[],
        step_times=step_rows["time_s"].to_numpy(float),
        steps=steps,
    )


def peers_for(run: LoadedRun, index: int) -> np.ndarray | None:
    """Median of the run's other distinct series, read at this series' times."""
    others = [s for i, s in enumerate(run.series) if i != index]
    if len(others) < 2:
        return None
    target = run.series[index].t
    stack = np.vstack([np.interp(target, s.t, s.w, left=np.nan, right=np.nan) for s in others])
    return np.nanmedian(stack, axis=0)


# -- injection ------------------------------------------------------------------------------


@dataclass
class Injection:
    series: int
    start: float
    end: float
    kind: str  # "burst" | "throttle"
    context: str  # where it started: train / eval / idle
    factor: float


def choose_injection(
    run: LoadedRun, rng: np.random.Generator, kind: str, context: str
) -> Injection | None:
    index = int(rng.integers(len(run.series)))
    s = run.series[index]
    if context == "idle":
        # Idle is the node outside the job (before init_start, after run_stop), not the
        # unlabelled instants inside it: the 0.2-0.8 s between run_start and the first block
        # of a GPT-3 run is the start of training, where a burst sits in the warm-up the
        # detector must explain.
        candidates = np.flatnonzero((s.t < run.idle_before) | (s.t > run.idle_after))
    else:
        candidates = np.flatnonzero(ga.phase_labels(s.t, run.events.phases) == context)
    if candidates.size == 0:
        return None
    start = float(s.t[int(rng.choice(candidates))])
    if kind == "burst":
        length = float(np.exp(rng.uniform(np.log(10), np.log(300))))
        factor = 1.0 + float(rng.uniform(0.10, 0.30))
    else:
        length = float(rng.uniform(30, 300))
        factor = float(rng.uniform(0.6, 0.9))
    end = min(start + length, float(s.t[-1]))
    if kind == "throttle":
        # Throttling is of the training (the README: "during training"): a clock cap does
        # not take 30% off an idle node, and a throttle running on past run_stop made the
        # node's idle floor 30% lower, so the untouched idle before the run read as a burst.
        end = min(end, run.idle_after)
    if end - start < 10:
        return None
    return Injection(index, start, end, kind, context, factor)


def during(series: Series, injection: Injection) -> np.ndarray:
    return (series.t >= injection.start) & (series.t < injection.end)


def apply(
    series: Series, injection: Injection, ceiling_w: float = np.inf, w: np.ndarray | None = None
) -> np.ndarray:
    """The series' readings (or `w`, readings already modified) with the injection applied."""
    w = (series.w if w is None else w).copy()
    inside = during(series, injection)
    if injection.kind == "burst":
        # A node cannot draw past its rated power (rated_node_w): foreign work beyond it
        # shares the GPUs' time and shows as the job's slowdown, not as watts.
        w[inside] = np.minimum(w[inside] * injection.factor, ceiling_w)
    else:
        w[inside] = w[inside] * injection.factor
    return w


# The smallest foreign work the bench injects (+10% of the level).
MIN_BURST = 0.10


def at_rated_power(series: Series, injection: Injection, injected: np.ndarray) -> bool:
    """A burst that the node's headroom cut below the smallest injected (+10% on average over
    its readings): the node was at its rated power, where foreign work is the job's slowdown,
    which power readings do not show (per-process data does). Such a trial is void: counted
    per system, not scored as found or missed."""
    if injection.kind != "burst":
        return False
    inside = during(series, injection)
    if not inside.any():
        return False
    added = float(np.mean(injected[inside] / series.w[inside])) - 1.0
    return added < MIN_BURST - 1e-9


# -- scoring --------------------------------------------------------------------------------


def unexplained(
    run: LoadedRun,
    index: int,
    w: np.ndarray,
    peers: np.ndarray | None,
    profile: ga.PeerProfile | None = None,
) -> list[ga.Episode]:
    return [e for e in episodes(run, index, w, peers, profile) if not e.explained]


def episodes(
    run: LoadedRun,
    index: int,
    w: np.ndarray,
    peers: np.ndarray | None,
    profile: ga.PeerProfile | None = None,
) -> list[ga.Episode]:
    s = run.series[index]
    return ga.find_episodes(s.t, w, run.events, peers=peers, profile=profile)


def seen(found: list[ga.Episode], injection: Injection) -> str:
    """What the detector made of a missed injection: the episodes over it, and why each was
    explained ("nothing": no departure at all)."""
    over = [e for e in found if e.start < injection.end and e.end > injection.start]
    return (
        "; ".join(
            f"{e.kind} {e.start:.0f}-{e.end:.0f} s ({e.phase}, expected {e.expected:.0f}, "
            f"observed {e.observed:.0f}): {e.reason or 'unexplained'}"
            for e in over
        )
        or "nothing"
    )


def evaluate_run(
    run: LoadedRun,
    rng: np.random.Generator,
    trials: int,
    system: str = "",
    profiles: dict[tuple[str, int], ga.PeerProfile] | None = None,
    learn_injected: int = 0,
) -> dict:
    """Score one run. With `profiles` (--carry), each series is judged with what its node's
    earlier runs of this system taught (ga.PeerProfile), and this run is added to it only
    after it was scored: the unmodified readings, as production would have seen them, or
    (`learn_injected` N, a stress test of what a profile learns) with the run's first N
    trials' injections applied at once, as if that foreign work had run in that run."""
    peers = [peers_for(run, i) for i in range(len(run.series))]
    own = [
        profiles.setdefault((system, s.node), ga.PeerProfile()) if profiles is not None else None
        for s in run.series
    ]
    clean_alarms: list[tuple[int, ga.Episode]] = []
    hours = 0.0
    for i, s in enumerate(run.series):
        hours += (s.t[-1] - s.t[0]) / 3600.0
        clean_alarms += [(i, e) for e in unexplained(run, i, s.w, peers[i], own[i])]
    results = []
    void: list[str] = []
    learnt = [s.w for s in run.series]
    learnt_n = 0
    plan = [("burst", c) for c in ("train", "eval", "idle")] + [("throttle", "train")]
    for trial in range(trials):
        kind, context = plan[trial % len(plan)]
        injection = choose_injection(run, rng, kind, context)
        if injection is None:
            continue
        s = run.series[injection.series]
        injected = apply(s, injection, run.ceiling_w)
        if learnt_n < learn_injected:
            learnt_n += 1
            learnt[injection.series] = apply(s, injection, run.ceiling_w, learnt[injection.series])
        if at_rated_power(s, injection, injected):
            void.append(f"{s.node}@{injection.start:.0f}s")
            continue
        found = episodes(
            run, injection.series, injected, peers[injection.series], own[injection.series]
        )
        alarms = [e for e in found if not e.explained]
        hits = [e for e in alarms if e.start < injection.end and e.end > injection.start]
        # Alarms elsewhere on that series that the clean pass did not already have.
        clean_here = [e for i, e in clean_alarms if i == injection.series]
        extra = [
            e
            for e in alarms
            if e not in hits and not any(abs(e.start - c.start) < 1 for c in clean_here)
        ]
        delay = min(e.detected_at for e in hits) - injection.start if hits else None
        results.append(
            {
                "kind": kind,
                "context": context,
                "length": injection.end - injection.start,
                "found": bool(hits),
                "delay": delay,
                "extra": len(extra),
                # For --misses: where it was and what the detector saw instead.
                "series": s.node,
                "start": injection.start,
                "factor": injection.factor,
                "phases": sorted(
                    set(ga.phase_labels(s.t, run.events.phases)[during(s, injection)])
                ),
                "seen": "" if hits else seen(found, injection),
                "extra_at": [
                    f"{e.kind} {e.start:.0f}-{e.end:.0f} s ({e.phase}, expected {e.expected:.0f}, "
                    f"observed {e.observed:.0f})"
                    for e in extra
                ],
            }
        )
    for i, s in enumerate(run.series):
        profile, p = own[i], peers[i]
        if profile is not None and p is not None:
            w = learnt[i]
            ga.learn_peer_profile(s.t, w, run.events, peers=p, profile=profile)
    return {
        "run": run.run_id,
        "system": system,
        "benchmark": run.benchmark,
        "series": len(run.series),
        "hours": hours,
        "clean_alarms": [
            {"series": run.series[i].node, "start": e.start, "end": e.end, "phase": e.phase}
            for i, e in clean_alarms
        ],
        "trials": results,
        "void_at_rated_power": void,
    }


def summarise(per_run: list[dict], attribution: dict) -> dict:
    summary = score(per_run)
    # Per system (submitter, system, measurement point): a method that generalises holds on
    # each, not only on the pool the largest system dominates.
    systems = sorted({r["system"] for r in per_run})
    summary["per_system"] = {
        name: {
            k: v
            for k, v in score([r for r in per_run if r["system"] == name]).items()
            if k in PER_SYSTEM_KEYS
        }
        for name in systems
    }
    return {**summary, **attribution}


PER_SYSTEM_KEYS = (
    "gpu_unexplained_f1",
    "gpu_unexplained_precision",
    "gpu_unexplained_recall",
    "gpu_recall_burst_train",
    "gpu_false_alarms_per_node_hour",
    "gpu_false_alarms_in_trials",
    "gpu_delay_s_median",
    "node_hours_distinct",
    "injections",
    "injections_void_at_rated_power",
    "runs",
)


def score(per_run: list[dict]) -> dict:
    trials = [t for r in per_run for t in r["trials"]]
    hours = sum(r["hours"] for r in per_run)
    false_alarms = sum(len(r["clean_alarms"]) for r in per_run) + sum(t["extra"] for t in trials)
    found = sum(t["found"] for t in trials)
    # Event precision: injected episodes found over all unexplained episodes raised in trials
    # (a found injection counts once), with the clean pass's alarms pro rata per trial.
    trial_false = sum(t["extra"] for t in trials) + sum(
        len(r["clean_alarms"]) * len(r["trials"]) / max(1, r["series"]) for r in per_run
    )
    precision = found / (found + trial_false) if found + trial_false else 0.0
    recall = found / len(trials) if trials else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    delays = [t["delay"] for t in trials if t["delay"] is not None]
    by_size = {}
    for lo, hi in SIZE_BUCKETS:
        # Half-open buckets (a 30.5-s burst was counted in 10-30 s and 30-60 s); the last one
        # closed, since a burst is at most 300 s long.
        top = hi + 1e-9 if hi == SIZE_BUCKETS[-1][1] else hi
        inside = [t for t in trials if t["kind"] == "burst" and lo <= t["length"] < top]
        by_size[f"{lo}-{hi}s"] = (
            round(sum(t["found"] for t in inside) / len(inside), 3) if inside else None
        )
    by_context = {}
    for kind, context in (
        ("burst", "train"),
        ("burst", "eval"),
        ("burst", "idle"),
        ("throttle", "train"),
    ):
        inside = [t for t in trials if t["kind"] == kind and t["context"] == context]
        by_context[f"{kind}/{context}"] = (
            round(sum(t["found"] for t in inside) / len(inside), 3) if inside else None
        )
    clean_hours = hours
    void = sum(len(r.get("void_at_rated_power", [])) for r in per_run)
    return {
        "gpu_unexplained_f1": round(f1, 4),
        "gpu_unexplained_precision": round(precision, 4),
        "gpu_unexplained_recall": round(recall, 4),
        "gpu_unexplained_recall_by_size": by_size,
        "gpu_unexplained_recall_by_context": by_context,
        "gpu_recall_burst_train": by_context["burst/train"],
        "gpu_false_alarms_per_node_hour": round(
            sum(len(r["clean_alarms"]) for r in per_run) / clean_hours, 5
        )
        if clean_hours
        else None,
        "gpu_false_alarms_in_trials": int(sum(t["extra"] for t in trials)),
        "gpu_false_alarms_total": int(false_alarms),
        "gpu_delay_s_median": round(float(np.median(delays)), 2) if delays else None,
        "gpu_delay_s_p90": round(float(np.percentile(delays, 90)), 2) if delays else None,
        "gpu_nab_standard": nab_score(trials, trial_false),
        "node_hours_distinct": round(hours, 2),
        "injections": len(trials),
        # Bursts the node's rated power left under +10%: not scored (at_rated_power).
        "injections_void_at_rated_power": void,
        "runs": len(per_run),
    }


# NAB's standard profile (Lavin & Ahmad 2015, numenta/NAB): a false positive costs 0.11, a missed
# window 1.0, a detection in the window earns the scaled sigmoid of where it fell in it.
NAB_FP, NAB_FN = 0.11, 1.0


def nab_sigmoid(y: float) -> float:
    """NAB's scaled sigmoid: ~1 at the window's start (y = -1), 0 at its end, < 0 after."""
    return 2.0 / (1.0 + float(np.exp(5.0 * y))) - 1.0


def nab_score(trials: list[dict], false_alarms: float) -> float | None:
    """NAB-style score normalised to 0 (detect nothing) .. 100 (every window at its start).

    The window of each injection is the injection itself; the first alarm's time, `detected_at`
    (when the departure had lasted the minimum episode), places it; false alarms are the same
    count as in precision.
    """
    if not trials:
        return None
    raw = -NAB_FP * false_alarms
    for t in trials:
        if t["found"]:
            raw += nab_sigmoid(max(-1.0, (t["delay"] - t["length"]) / t["length"]))
        else:
            raw -= NAB_FN
    null = -NAB_FN * len(trials)
    perfect = nab_sigmoid(-1.0) * len(trials)
    return round(100.0 * (raw - null) / (perfect - null), 1)


# -- attribution on synthetic per-process traces ---------------------------------------------


def attribution_check(rng: np.random.Generator, hosts: int = 20) -> dict:
    """Synthetic hosts: a run's processes, another run's, and an unknown one at known times.

    The attribution must put each process's SM time where it belongs; the error is the absolute
    difference of the run / other-run / unknown shares, in SM-percent-seconds, over the truth.
    """
    errors = []
    named = 0
    for _ in range(hosts):
        trace = gattr.synthetic_trace(rng)
        shares = gattr.attribute(trace.samples, trace.own_pids, trace.other_runs)
        truth = trace.truth
        total = sum(truth.values()) or 1.0
        errors.append(sum(abs(shares.totals[k] - truth[k]) for k in truth) / total)
        top = shares.top_unknown()
        named += int(top is not None and top.pid == trace.foreign_pid)
    return {
        "gpu_attribution_error": round(float(np.mean(errors)), 4),
        "gpu_attribution_names_foreign": round(named / hosts, 3),
    }


# -- main -----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "dir", nargs="*", type=Path, default=[DEFAULT_DIR], help="data sets, scored in turn"
    )
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, default=None, help="first N runs only")
    parser.add_argument("--trials", type=int, default=40, help="injections per run")
    parser.add_argument(
        "--misses", action="store_true", help="list every missed injection and what was seen"
    )
    parser.add_argument(
        "--agent-hosts", type=int, default=40, help="hosts for the agent-trace section (0: skip)"
    )
    parser.add_argument(
        "--carry",
        action="store_true",
        help="each node carries its profile against its peers from its earlier runs",
    )
    parser.add_argument(
        "--carry-injected",
        type=int,
        default=0,
        metavar="N",
        help="with --carry: learn from each run with its first N trials' injections applied",
    )
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    started = time.perf_counter()
    per_run = []
    profiles: dict[tuple[str, int], ga.PeerProfile] | None = {} if args.carry else None
    for data in args.dir:
        index = pd.read_csv(data / "INDEX.csv", keep_default_na=False)
        if "run_start_unix_ms" in index:
            # The order the runs ran in: what a node carries comes from its earlier runs.
            index = index.sort_values("run_start_unix_ms", kind="stable")
        if args.limit:
            index = index.head(args.limit)
        for row in index.itertuples(index=False):
            rated = rated_node_w(
                str(getattr(row, "accelerator", "")), getattr(row, "gpus_per_node", 8)
            ) * dc_share(row)
            run = load_run(data / str(row.dir), str(row.run_id), str(row.benchmark), rated)
            per_run.append(
                evaluate_run(run, rng, args.trials, system_name(row), profiles, args.carry_injected)
            )
    summary = summarise(per_run, attribution_check(rng))
    if args.agent_hosts:
        # Its own generator: the section's hosts do not depend on --limit or --trials.
        agent_rng = np.random.default_rng([args.seed, 28])
        summary["gpu_agent_attribution"] = agent_attribution(agent_rng, args.agent_hosts)
    summary["seconds"] = round(time.perf_counter() - started, 1)
    if not args.json:
        print_table(per_run, summary)
    if args.misses:
        print_misses(per_run)
    print(json.dumps(summary))
    return 0


def system_name(row: object) -> str:
    """Submitter, system and measurement point of an INDEX.csv row."""
    parts = [str(getattr(row, k, "")) for k in ("submitter", "system", "measurement")]
    return " ".join(p for p in parts if p)


def print_table(per_run: list[dict], summary: dict) -> None:
    head = f"{'run':<58} {'series':>6} {'hours':>6} {'clean FA':>8} {'found':>9} {'delay':>6}"
    print(head)
    print("-" * len(head))
    for r in per_run:
        trials = r["trials"]
        delays = [t["delay"] for t in trials if t["delay"] is not None]
        found = f"{sum(t['found'] for t in trials)}/{len(trials)}"
        delay = f"{np.median(delays):.1f}" if delays else "-"
        name = r["run"].split("__", 3)[-1][:58]
        print(
            f"{name:<58} {r['series']:>6} {r['hours']:>6.2f} {len(r['clean_alarms']):>8} "
            f"{found:>9} {delay:>6}"
        )
        for a in r["clean_alarms"]:
            print(
                f"    false alarm: series {a['series']} "
                f"{a['start']:.0f}-{a['end']:.0f} s ({a['phase']})"
            )
    print()
    head = (
        f"{'system':<58} {'runs':>4} {'hours':>6} {'F1':>6} {'recall':>6} {'train':>6} "
        f"{'FA/h':>6} {'trialFA':>7}"
    )
    print(head)
    print("-" * len(head))
    for name, m in summary["per_system"].items():
        print(
            f"{name[:58]:<58} {m['runs']:>4} {m['node_hours_distinct']:>6.2f} "
            f"{m['gpu_unexplained_f1']:>6.3f} {m['gpu_unexplained_recall']:>6.3f} "
            f"{m['gpu_recall_burst_train'] or 0:>6.3f} {m['gpu_false_alarms_per_node_hour']:>6.2f} "
            f"{m['gpu_false_alarms_in_trials']:>7}"
        )
    print()
    for key, value in summary.items():
        if key != "per_system":
            print(f"{key:<36} {value}")


def print_misses(per_run: list[dict]) -> None:
    """Every injection not found: run, kind and context, series, start, length, amplitude, the
    phases it covered, and what the detector saw there."""
    for r in per_run:
        for t in r["trials"]:
            for e in t["extra_at"]:
                print(
                    f"extra alarm {r['benchmark']} {t['kind']}/{t['context']} node {t['series']} "
                    f"(injected at {t['start']:.1f} s for {t['length']:.1f} s "
                    f"x{t['factor']:.2f}): {e}"
                )
            if t["found"]:
                continue
            print(
                f"missed {r['benchmark']} {t['kind']}/{t['context']} node {t['series']} "
                f"at {t['start']:.1f} s for {t['length']:.1f} s x{t['factor']:.2f} "
                f"over {','.join(t['phases'])}: {t['seen']}"
            )


if __name__ == "__main__":
    sys.exit(main())
