"""The estimators that read telemetry take whatever a trainer or an agent sends without raising:
empty, one point, NaN and infinities, steps out of order, repeated or restarted, a clock that
stops or resets, values from 1e-300 to 1e200. A property test over their public entry points
(the ones forecasting/compute.py, liveness.py, stragglers.py, episodes.py and gpu/check.py
call); each result must also become JSON (the Forecast and Flag rows store it).

Examples drawn are fixed (RUNCAST_FUZZ_SEED=random explores new ones) and as many as
RUNCAST_FUZZ_EXAMPLES (default 40) per entry point; the cases that once raised are pinned with
@example."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from forecasting.estimators import divergence, eta, loss, stalled
from forecasting.estimators import episodes as ep
from forecasting.estimators import gpu_activity as ga
from forecasting.estimators import straggler_detect as sd

EXAMPLES = int(os.environ.get("RUNCAST_FUZZ_EXAMPLES", "40"))
DERANDOMIZE = os.environ.get("RUNCAST_FUZZ_SEED", "fixed") != "random"
T0 = 1.76e9
ROBUST = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=DERANDOMIZE,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# Numpy says what it thinks of NaN and overflow in warnings; only exceptions fail these tests.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@dataclass(frozen=True)
class Curve:
    """One logged series: steps, values and their epoch-second times, as the store hands them."""

    steps: np.ndarray
    values: np.ndarray
    times: np.ndarray

    def last_time(self) -> float:
        finite = self.times[np.isfinite(self.times)]
        return float(finite.max()) if finite.size else T0


def curve(
    n: int,
    *,
    values: np.ndarray | None = None,
    order: str = "sorted",
    broken: tuple[str, ...] = (),
    share: float = 0.0,
    scale: float = 1.0,
    clock: str = "steady",
    seed: int = 0,
) -> Curve:
    """A falling loss logged once a second, then made hostile as asked."""
    rng = np.random.default_rng(seed)
    steps = np.arange(n, dtype=float)
    times = T0 + steps
    if values is None:
        values = 2.0 + 8.0 * (steps + 10.0) ** -0.3 + rng.normal(0.0, 0.02, n)
    values = np.asarray(values, dtype=float) * scale
    if clock == "stopped":
        times = np.full(n, T0)
    elif clock == "reset" and n > 2:
        times[n // 2 :] -= times[n // 2] - T0  # the trainer's timer restarted
    arrays = {"steps": steps, "values": values.copy(), "times": times}
    for name in broken:
        hit = rng.random(n) < share
        arrays[name][hit] = rng.choice([np.nan, np.inf, -np.inf], size=int(hit.sum()))
    index = np.arange(n)
    if order == "shuffled":
        index = rng.permutation(n)
    elif order == "reversed":
        index = index[::-1]
    elif order == "repeated":
        index = np.sort(rng.integers(0, max(n, 1), size=n))
    elif order == "restarted" and n > 4:
        index = np.concatenate((index[: 2 * n // 3], index[n // 3 :]))  # resumed from a checkpoint
    s, v, t = (arrays[k][index] for k in ("steps", "values", "times"))
    return Curve(s, v, t)


@st.composite
def curves(draw: st.DrawFn, *, max_size: int = 400) -> Curve:
    n = draw(st.one_of(st.integers(0, 3), st.integers(4, max_size)))
    shape = draw(st.sampled_from(["falling", "blow-up", "constant", "zero", "negative"]))
    seed = draw(st.integers(0, 2**32 - 1))
    base = curve(n, seed=seed).values
    if shape == "blow-up" and n:
        base[n // 2 :] *= 9.0
    elif shape in ("constant", "zero", "negative"):
        base = np.full(n, {"constant": 2.5, "zero": 0.0, "negative": -1.0}[shape])
    return curve(
        n,
        values=base,
        order=draw(st.sampled_from(["sorted", "shuffled", "reversed", "repeated", "restarted"])),
        broken=tuple(draw(st.sets(st.sampled_from(["steps", "values", "times"])))),
        share=draw(st.sampled_from([0.02, 0.3, 1.0])),
        scale=draw(st.sampled_from([1.0, 1e-300, 1e200])),
        clock=draw(st.sampled_from(["steady", "stopped", "reset"])),
        seed=seed,
    )


def nows(c: Curve) -> st.SearchStrategy[float]:
    """The server's clock: after the last point, or before some of them (late batches)."""
    last = c.last_time()
    return st.sampled_from([last, last + 30.0, last + 7200.0, T0 - 100.0, T0 + 10.0])


def as_json(result: Any) -> None:
    """Each result as the services store it: to_dict() into JSON without NaN."""
    items = result if isinstance(result, list) else [result]
    for item in items:
        if item is not None and hasattr(item, "to_dict"):
            json.dumps(item.to_dict(), allow_nan=False)


EMPTY = curve(0)
ONE = curve(1)
ALL_NAN = curve(50, broken=("values",), share=1.0)
SHUFFLED = curve(300, order="shuffled", broken=("steps", "times"), share=0.1)
HUGE = curve(60, scale=1e200)


# -- ETA, loss and divergence (forecasting/compute.py) -----------------------------------------


@ROBUST
@given(c=curves(), total=st.sampled_from([None, 1.0, 1000.0, 1e6, float("nan")]), data=st.data())
@example(c=EMPTY, total=1000.0, data=None)
@example(c=ONE, total=1000.0, data=None)
@example(c=SHUFFLED, total=1e6, data=None)
def test_forecast_eta(c: Curve, total: float | None, data: Any) -> None:
    now = data.draw(nows(c)) if data is not None else None
    as_json(eta.forecast_eta(c.steps, c.times, total, now=now))
    # A clock that is no time says nothing about a silence (it once raised in the sampler).
    as_json(eta.forecast_eta(c.steps, c.times, total, now=float("inf")))


@ROBUST
@given(
    c=curves(),
    lr=curves(),
    total=st.sampled_from([None, 1.0, 1e4, 1e9]),
    target=st.sampled_from([None, 2.0, -1.0, 0.0]),
)
@example(c=EMPTY, lr=EMPTY, total=1e4, target=2.0)
@example(c=ONE, lr=ONE, total=1e4, target=2.0)
@example(c=ALL_NAN, lr=ALL_NAN, total=1e4, target=None)
# A blow-up to 1e200 is a finite loss: the interval's sd squared it (OverflowError) ...
@example(c=HUGE, lr=EMPTY, total=1e4, target=None)
# ... and an lr logged at an infinite step made the schedule grid NaN (LinAlgError).
@example(c=curve(60), lr=curve(60, broken=("steps",), share=0.3, seed=2), total=1e6, target=None)
def test_forecast_loss(c: Curve, lr: Curve, total: float | None, target: float | None) -> None:
    as_json(
        loss.forecast_loss(
            c.steps, c.values, total_steps=total, lr_steps=lr.steps, lr_values=lr.values
        )
    )
    as_json(loss.forecast_loss(c.steps, c.values, total_steps=total, target=target))


@ROBUST
@given(c=curves(), grad=curves(), evaluation=st.booleans(), data=st.data())
@example(c=EMPTY, grad=EMPTY, evaluation=False, data=None)
@example(c=ONE, grad=ONE, evaluation=True, data=None)
@example(c=ALL_NAN, grad=ALL_NAN, evaluation=False, data=None)
@example(c=SHUFFLED, grad=SHUFFLED, evaluation=False, data=None)
def test_detect_divergence(c: Curve, grad: Curve, evaluation: bool, data: Any) -> None:
    now = data.draw(nows(c)) if data is not None else None
    flags = divergence.detect_divergence(
        c.steps,
        c.values,
        times=c.times,
        checkpoints=[float(s) for s in c.steps[:: max(1, c.steps.size // 3)]],
        grad_norms={"grad_norm/layers.0": (grad.steps, grad.values)},
        gpu_count=8,
        gpu_hour_price=2.5,
        now=now,
        evaluation=evaluation,
    )
    as_json(flags)
    divergence.spike_alarms(c.steps, c.values)


# -- loss episodes (forecasting/episodes.py) ---------------------------------------------------


@ROBUST
@given(c=curves(), at=st.sampled_from([0.0, 0.5, 1.0, 2.0]), level=st.sampled_from([0.7, 5.0]))
@example(c=EMPTY, at=0.5, level=0.7)
@example(c=ONE, at=0.5, level=0.7)
@example(c=ALL_NAN, at=0.5, level=0.7)
def test_episode_reference_judgement_and_back_at(c: Curve, at: float, level: float) -> None:
    finite = c.steps[np.isfinite(c.steps)]
    onset = float(np.quantile(finite, min(at, 1.0)) * max(at, 1.0)) if finite.size else 0.0
    ref = ep.reference_before(c.steps, c.values, onset)
    as_json(ref)
    ep.onset_search(c.steps, c.values, onset, not_before=onset / 2)
    judged = ep.judge(c.steps, c.values, ref or ep.Reference(onset, 0.7, 0.01, 2.0, 50))
    as_json(judged)
    ep.back_at(c.steps, c.values, c.times, level=level, onset_step=onset)
    ep.back_at(c.steps, c.values, None, level=level, onset_step=onset)


# -- liveness (forecasting/liveness.py) --------------------------------------------------------


@ROBUST
@given(
    beats=curves(),
    progress=curves(),
    declared=st.sampled_from([None, 15.0, 0.0]),
    data=st.data(),
)
@example(beats=EMPTY, progress=EMPTY, declared=None, data=None)
@example(beats=ONE, progress=ONE, declared=15.0, data=None)
@example(beats=SHUFFLED, progress=ALL_NAN, declared=None, data=None)
def test_detect_stall(beats: Curve, progress: Curve, declared: float | None, data: Any) -> None:
    now = data.draw(nows(beats)) if data is not None else beats.last_time() + 600.0
    result = stalled.detect_stall(
        beats.times,
        progress.times,
        progress.steps,
        now=now,
        listening_since=T0,
        opened_at=T0 - 5.0,
        declared_interval_s=declared,
        unknown_cadence_limit_s=3600.0,
    )
    as_json(result)


# -- stragglers (forecasting/stragglers.py) ----------------------------------------------------


@ROBUST
@given(
    c=curves(max_size=300),
    ranks=st.sampled_from([1, 2, 8]),
    missing=st.sampled_from([0.0, 0.3, 1.0]),
    parts=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
@example(c=EMPTY, ranks=8, missing=0.0, parts=True, seed=0)
@example(c=ONE, ranks=8, missing=0.0, parts=True, seed=0)
@example(c=curve(200), ranks=8, missing=1.0, parts=True, seed=0)
@example(c=SHUFFLED, ranks=2, missing=0.3, parts=False, seed=0)
# A row at a NaN step: its stride was NaN, and the steps a finding affects int(NaN).
@example(c=curve(200, broken=("steps",), share=0.3), ranks=8, missing=0.0, parts=False, seed=0)
def test_detect_stragglers(c: Curve, ranks: int, missing: float, parts: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    compute = 1.0 + rng.normal(0.0, 0.02, (c.steps.size, ranks))
    compute[:, -1] *= 1.3  # one slow rank
    compute[rng.random(compute.shape) < missing] = np.nan
    hosts = [f"node-{r // 4}" for r in range(ranks)]
    wait = np.maximum(compute.max(axis=1, initial=0.0)[:, None] - compute, 0.0) if parts else None
    report = sd.detect_stragglers(
        c.steps, compute, hosts, wait, None if wait is None else compute + wait
    )
    as_json(report)


# -- GPU activity (forecasting/gpu/check.py) ---------------------------------------------------


@ROBUST
@given(
    gpu=curves(max_size=600),
    run=curves(max_size=300),
    phase_end=st.sampled_from(["open", "nan", "before"]),
    data=st.data(),
)
@example(gpu=EMPTY, run=EMPTY, phase_end="open", data=None)
@example(gpu=ONE, run=ONE, phase_end="open", data=None)
@example(gpu=ALL_NAN, run=SHUFFLED, phase_end="nan", data=None)
# The agent stopped before the run started: no progress at or before the last sample (raised
# "zero-size array to reduction operation maximum" in find_hang).
@example(gpu=curve(300), run=curve(300, scale=1.0), phase_end="before", data=None)
def test_gpu_activity(gpu: Curve, run: Curve, phase_end: str, data: Any) -> None:
    util = np.clip(gpu.values * 30.0, -5.0, 105.0)
    start = float(run.times[0]) if run.times.size else T0
    end = {"open": gpu.last_time() + 1.0, "nan": float("nan"), "before": start - 1.0}[phase_end]
    later = run.times + (gpu.last_time() - T0 + 300.0 if phase_end == "before" else 0.0)
    events = ga.RunEvents(
        phases=[ga.Phase(start, end, "train"), ga.Phase(start + 100.0, start + 120.0, "eval")],
        marks=[ga.Mark(start + 50.0, "checkpoint", before_s=5.0), ga.Mark(float("nan"), "custom")],
        step_times=later,
        steps=run.steps,
    )
    peers = util + 1.0
    as_json(ga.find_episodes(gpu.times, util, events))
    as_json(ga.find_episodes(gpu.times, util, events, peers=peers))
    now = data.draw(nows(gpu)) if data is not None else None
    as_json(ga.find_hang(gpu.times, util, events, busy_level=90.0, now=now))
    ga.phase_labels(gpu.times, events.phases)
    ga.step_change_marks(later, run.steps)
