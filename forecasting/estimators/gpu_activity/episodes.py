"""GPU activity, episodes: departures from the regimes' levels (levels.py), grouped into episodes
and judged explained or not by the run's own events (docs/gpu.md has the figures).

3. **Expected band.** Near a phase boundary a sample may belong to either side (timestamps and
   sampling jitter), so it is held against the band of every regime present within +-tolerance
   (where idle meets the run, the job's setup level too); a reading still moving between two
   levels (a ramp) gets the whole span between them. With peers (the run's other nodes/GPUs at
   the same times) a second band follows them: synchronous training moves all of them at once,
   foreign work only one.
   A sample departs when it lies outside the band(s) by more than max(z * spread, rel * level).
4. **Episodes.** Consecutive departing samples (short gaps bridged) with `min_duration_s` of
   evidence: a burst (up), a plateau (up, long) or a drop (down). Evidence is each reading's
   time to the next; for a burst, weighed by how far past the expected level it lies in bands
   (a sequential test: a strong burst needs fewer readings, never fewer than two). An episode
   is *explained* when what remains of it outside the windows of the run's point events
   (checkpoint, resume, architecture change, step-time change, custom; +-tolerance) and the
   warm-up (until the run's readings ramp up to their level) has less evidence than that;
   otherwise it is *unexplained*, and `detected_at` is when the evidence was reached (online
   delay). An idle rise to the run's init level that lasts until idle ends is a job's setup
   (explained).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from forecasting.estimators.gpu_activity.levels import (
    interior,
    nearest_level,
    noise,
    regime_keys,
    regime_levels,
    resolved_labels,
    rolling_level,
    sampling_period,
    step_change_marks,
)
from forecasting.estimators.gpu_activity.model import (
    DEFAULT,
    IDLE_PHASES,
    Episode,
    Mark,
    RunEvents,
    Settings,
)
from forecasting.estimators.gpu_activity.profile import PeerProfile

# -- departures -----------------------------------------------------------------------------


def _band(
    times: np.ndarray, expected: np.ndarray, slack: np.ndarray, half_width_s: float
) -> tuple[np.ndarray, np.ndarray]:
    """Min/max of (expected -+ slack) over samples within +-half_width_s of each sample."""
    lo_src, hi_src = expected - slack, expected + slack
    left = np.searchsorted(times, times - half_width_s, side="left")
    right = np.searchsorted(times, times + half_width_s, side="right")
    lo = np.empty_like(expected)
    hi = np.empty_like(expected)
    # Windows are a handful of samples at ~1 Hz: a loop over (left, right) stays cheap, and a
    # sparse table is not worth its code here.
    for i, (a, b) in enumerate(zip(left, right, strict=False)):
        lo[i] = lo_src[a:b].min()
        hi[i] = hi_src[a:b].max()
    return lo, hi


def departures(
    times: np.ndarray,
    values: np.ndarray,
    events: RunEvents,
    peers: np.ndarray | None = None,
    settings: Settings = DEFAULT,
    profile: PeerProfile | None = None,
) -> dict[str, Any]:
    """Per sample: the expected level, the band and the signed departure outside it.

    Several passes: each learns the levels without the samples the previous ones found
    departing, so a long burst or throttle does not drag the level after it (which would make
    the return to normal look like an episode of its own).
    """
    labels = resolved_labels(times, events.phases, sampling_period(times))
    marks = list(events.marks) + step_change_marks(events.step_times, events.steps, settings)
    keys = regime_keys(times, labels, marks)
    use_peers = peers is not None and np.isfinite(peers).sum() > 0.5 * peers.size
    mask: np.ndarray | None = None
    peer_x = peer_resid = None
    for _ in range(settings.passes):
        # Against peers the phase pass's departures are replaced: no need to resolve its edges.
        level, lo, hi, dev, setup, scale = _phase_pass(
            times, values, keys, labels, settings, mask, edges=not use_peers
        )
        if use_peers:
            assert peers is not None
            dev, scale, peer_x, peer_resid = _peer_departure(
                times, values, peers, keys, settings, mask, profile
            )
        found = _dilate(dev != 0, 2)
        # Each pass unmasks nothing and may mask more: the next pass learns the rolling level
        # without what this one found, so a long episode does not pull the level near it.
        found = found if mask is None else (found | mask)
        if mask is not None and np.array_equal(found, mask):
            break
        mask = found
    marks += _warmups(times, values, keys, events, settings, mask)
    return {
        "level": level,
        "lo": lo,
        "hi": hi,
        "dev": dev,
        # The band's half-width at each sample: how far past it a departure goes, in bands.
        "scale": scale,
        "labels": labels,
        "marks": marks,
        "setup": setup,
        "peers": use_peers,
        "values": values,
        # What a profile learns from (profile.py): the peers' relative level (log), the log
        # ratio's residual against the usual ratio, and the readings found departing.
        "peer_x": peer_x,
        "peer_resid": peer_resid,
        "mask": mask,
    }


def _warmups(
    times: np.ndarray,
    values: np.ndarray,
    keys: np.ndarray,
    events: RunEvents,
    settings: Settings,
    mask: np.ndarray | None,
) -> list[Mark]:
    """A covered window after training starts (the first train phase) and after each resume,
    as long as this run's readings take to settle at the level of the regime they enter.

    A fixed window (30 s) covered a burst in the first half minute of every single-node run,
    whose power ramps in <= 6 s; a run that compiles or autotunes for longer stays off its
    level for longer and gets a longer window (up to warmup_s).
    """
    trains = [p.start for p in events.phases if p.kind == "train"]
    starts = [min(trains)] if trains else []
    starts += [m.time for m in events.marks if m.kind in ("resume", "restart")]
    if not starts:
        return []
    dt = sampling_period(times)
    level, spread = regime_levels(times, values, keys, settings, mask)
    sigma = np.array([spread[k] for k in keys])
    slack = np.maximum(settings.z * sigma, settings.rel * np.abs(level))
    # A warm-up ramps up to the level (compilation, autotuning, the data pipeline filling);
    # a reading above the level's band is past the ramp, and what lifts it is not the run's
    # warm-up (foreign work across the start of training kept the readings off the band, and
    # the warm-up ran to its cap over it).
    near = values >= level - slack
    out = []
    for start in starts:
        ramp = _ramp_s(times, near, start, settings.warmup_s)
        # Its start is the logged one, known to a sampling period of the readings; it ends at
        # a reading's own time, the first settled at the level (the run at its level, not its
        # ramp, so not covered): a period past it covered the first settled readings, and a
        # burst over them (UNet3D's first two after a 17-s gap in the readings, above the
        # band) was the warm-up.
        out.append(Mark(start, "warmup", margin_s=dt, after_s=ramp))
    return out


def _ramp_s(times: np.ndarray, near: np.ndarray, start: float, cap: float) -> float:
    """Seconds from `start` until two consecutive readings lie at the regime's level (one
    reading may pass through the band on its way); `cap` when they never do within it."""
    idx = np.flatnonzero((times >= start) & (times <= start + cap))
    for i, j in itertools.pairwise(idx):
        if near[i] and near[j]:
            return float(times[i] - start)
    return cap


def _dilate(mask: np.ndarray, n: int) -> np.ndarray:
    out = mask.copy()
    for k in range(1, n + 1):
        out[k:] |= mask[:-k]
        out[:-k] |= mask[k:]
    return out


def _phase_pass(
    times: np.ndarray,
    values: np.ndarray,
    keys: np.ndarray,
    labels: np.ndarray,
    settings: Settings,
    mask: np.ndarray | None,
    *,
    edges: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, tuple[float, float], np.ndarray]:
    level, spread = regime_levels(times, values, keys, settings, mask)
    sigma = np.array([spread[k] for k in keys])
    slack = np.maximum(settings.z * sigma, settings.rel * np.abs(level))
    idle = np.isin(labels, list(IDLE_PHASES))
    lo, hi = _band(times, level, slack, settings.tolerance_s)
    # Foreign work only adds to an idle GPU; a lower idle reading is nobody's episode.
    lo = np.where(idle, -np.inf, lo)
    dev = np.where(values > hi, values - hi, np.where(values < lo, values - lo, 0.0))
    setup = _setup_band(labels, level, slack)
    if edges:
        dev = _either_side(
            times, values, keys, idle, level, slack, dev, setup, settings.tolerance_s
        )
    return level, lo, hi, dev, setup, slack


def _either_side(
    times: np.ndarray,
    values: np.ndarray,
    keys: np.ndarray,
    idle: np.ndarray,
    level: np.ndarray,
    slack: np.ndarray,
    dev: np.ndarray,
    setup: tuple[float, float],
    half_width_s: float,
) -> np.ndarray:
    """Near a phase boundary a reading belongs to one side or the other, or is on its way
    between them: it is held against the band of each regime present (their union), and only
    a reading still moving (a neighbour more than its band away) gets the whole span between
    them (their hull, `dev` as given).

    The hull let a burst that held the readings between two levels pass as the boundary: a
    +15% burst over SSD's last 5 s of eval (3.6 -> 4.2 kW, training at 7 kW) and one over
    DLRM's ramp down to its post-run floor (3.2-3.4 kW for 6 s, training at 7.1 kW, idle at
    2.7) lay inside it. A real transition is a ramp: its readings move, they do not stay.
    Where the node's idle meets the run (init starting, the run ending) the job's setup level
    is a side too: DLRM's own teardown holds its init level (2.7 kW) for 6 s after run_stop
    before the node drops to its floor.
    """
    step = np.abs(np.diff(values))
    moving = np.zeros(values.shape, bool)
    moving[1:] |= step > slack[1:]
    moving[:-1] |= step > slack[:-1]
    left = np.searchsorted(times, times - half_width_s, side="left")
    right = np.searchsorted(times, times + half_width_s, side="right")
    lo_src = np.where(idle, -np.inf, level - slack)
    hi_src = level + slack
    out = dev.copy()
    # Whether another regime lies within reach: a change of key between the window's ends.
    changes = np.concatenate(([0], np.cumsum(keys[1:] != keys[:-1])))
    mixed = changes[right - 1] > changes[left]
    # Readings inside the hull, settled, near a boundary: a handful per boundary, so the loop
    # stays cheap.
    for i in np.flatnonzero((dev == 0) & ~moving & mixed):
        a, b = left[i], right[i]
        near = keys[a:b]
        v = values[i]
        best = np.inf
        bands = []
        for key in np.unique(near):
            own = near == key
            bands.append((lo_src[a:b][own].min(), hi_src[a:b][own].max()))
        if idle[a:b].any() and not idle[a:b].all() and np.isfinite(setup[1]):
            bands.append(setup)
        for band_lo, band_hi in bands:
            gap = v - band_hi if v > band_hi else (v - band_lo if v < band_lo else 0.0)
            if abs(gap) < abs(best):
                best = gap
        out[i] = best
    return out


def _setup_band(labels: np.ndarray, level: np.ndarray, slack: np.ndarray) -> tuple[float, float]:
    """The band of the run's setup level (its init), which a node between jobs also reaches.

    Before a run's init and after its end the node sits at its idle floor, or at the setup
    level of a job starting (this one's init, the next one's): the readings after a run's end
    rise to the init level and stay there. NaN when the run's init is not covered.
    """
    init = labels == "init"
    if not init.any():
        return float("nan"), float("nan")
    return float(np.median(level[init] - slack[init])), float(np.median(level[init] + slack[init]))


def _is_setup(
    t: np.ndarray, v: np.ndarray, d: dict[str, Any], a: int, b: int, gap: float, min_s: float
) -> bool:
    """An idle rise to the setup level that lasts until idle ends (the node goes on into a
    job's init or training, or the readings end): a job starting, not foreign work, which
    ends and returns the node to its floor, or stays between the floor and the setup level."""
    labels = d["labels"]
    idle = np.isin(labels, list(IDLE_PHASES))
    low, high = d["setup"]
    if not idle[a : b + 1].all() or not np.isfinite(high):
        return False
    # Foreign work on top of a job's setup lifts part of it above the setup level.
    if int((v[a : b + 1] > high).sum()) * sampling_period(t) >= min_s:
        return False
    # A job's setup draws what this run's setup drew (the same node, the same kind of work);
    # a rise that stays below that band is something else on the node.
    if float(np.median(v[a : b + 1])) < low:
        return False
    after = np.flatnonzero(~idle[b + 1 :])
    stretch_end = float(t[b + 1 + after[0]]) if after.size else float(t[-1])
    return stretch_end - float(t[b]) <= gap


def _is_init_warmup(v: np.ndarray, d: dict[str, Any], a: int, b: int) -> bool:
    """A rise during init that stays within the run's own training band: the job warming up.

    Init is where a job compiles, captures its graphs and runs its warm-up steps (MLPerf's
    rules allow it before run_start), each node at its own pace: on Dell's 8xXE9680 runs one
    node reaches its training draw 20 s before run_start while its peers still load at 3 kW,
    and against them it departed +150%. It is the run's own work while it does not go past
    what the run draws when it trains: up to that draw, and not past it.
    """
    labels = d["labels"]
    seg = slice(a, b + 1)
    departing = d["dev"][seg] != 0
    if not departing.any() or not (labels[seg][departing] == "init").all():
        return False
    train = labels == "train"
    if not train.any():
        return False
    # Reaching the training draw, not merely under it (its readings ramp up to it): a +23%
    # burst on BERT's 2.5-kW init is far below its 7-kW training and is nobody's warm-up.
    # "The training draw": what the run's training readings hold (above their lowest tenth;
    # 1-s readings dip 10-20% at single steps), up to the top of its band.
    low = float(np.quantile(d["values"][train], 0.1))
    top = float(np.median(d["hi"][train]))
    peak = float(v[seg][departing].max())
    return low <= peak <= top


def _peer_departure(
    times: np.ndarray,
    values: np.ndarray,
    peers: np.ndarray,
    keys: np.ndarray,
    settings: Settings,
    mask: np.ndarray | None,
    profile: PeerProfile | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Departure from the peers' same-time level times this series' usual ratio to them.

    Peers are the sharper reference: the run's intra-step swings and its phases move them in
    step, so they cancel; only what happens on this series alone remains. With a `profile`
    (learnt from this series' earlier runs, profile.py) the ratio is first corrected for how
    it depends on the peers' level. Also returns the peers' relative level (log) and the log
    ratio's residual against the usual ratio (uncorrected), for learning a profile.
    """
    filled = pd.Series(peers).interpolate(limit_direction="both").to_numpy(dtype=float)
    raw = values / np.where(filled == 0, np.nan, filled)
    dt = sampling_period(times)
    window = max(3, round(settings.window_s / dt) | 1)
    # The ratio as the median of the readings spanning smooth_s: 1-s meters (Dell's) read
    # each node at its own instant of a step, 3% apart reading to reading against 1-1.5% for
    # the 2-s meters of the dev set, and a band of 5 such noises hid +15% bursts.
    n = _smoothing_readings(dt, settings)
    log_ratio = _rolling_median(np.log(np.where(raw > 0, raw, np.nan)), n)
    # The peers' level relative to their training level: what a node's own surplus in watts
    # makes its ratio depend on.
    train = np.array([k.split("#")[0] == "train" for k in keys])
    positive = filled[(filled > 0) & (train if train.any() else True)]
    reference = float(np.median(positive)) if positive.size else float("nan")
    x = np.log(np.where(filled > 0, filled, np.nan) / reference)
    offset = profile.offset(x) if profile is not None else np.zeros(x.shape)
    log_ratio = log_ratio - offset
    ratio = np.exp(log_ratio)
    compared = filled * ratio
    learn = ratio if mask is None else np.where(mask, np.nan, ratio)
    expected = np.empty_like(values)
    slack = np.empty_like(values)
    usual = np.empty_like(values)
    # The noise against the peers is relative (of the log ratio), not in watts: one regime
    # holds levels 2.3x apart (Dell's Llama-2 runs fall to 3.5 kW for 30 s before their
    # first eval, inside the training block), and a noise learnt in watts at 8 kW made a
    # band of 30% at 3.5 kW, where a +28% burst passed.
    pooled = _smoothed_noise(log_ratio, times, dt, n)
    pooled = 0.0 if not np.isfinite(pooled) else pooled
    for key in np.unique(keys):
        idx = np.flatnonzero(keys == key)
        own_learn = learn[idx] if np.isfinite(learn[idx]).any() else ratio[idx]
        inner = interior(idx)
        if mask is None:
            spread = _smoothed_noise(log_ratio[inner], times[inner], dt, n)
            r = np.full(idx.size, _usual_ratio(own_learn, spread, settings))
        else:
            r = _drifting_level(times[idx], own_learn, window, dt)
        exp = filled[idx] * r
        usual[idx] = r
        # The noise of this series against its peers (what the peers do not share), relative.
        mad = _smoothed_noise(log_ratio[inner], times[inner], dt, n)
        mad = mad if np.isfinite(mad) else pooled
        expected[idx] = exp
        slack[idx] = np.abs(exp) * max(settings.z * max(mad, settings.min_rel_spread), settings.rel)
    expected = np.where(np.isfinite(expected), expected, values)
    slack = np.where(np.isfinite(slack), slack, np.inf)
    # Peers are read at slightly different instants: one sampling period of alignment jitter.
    lo, hi = _band(times, expected, slack, 1.01 * dt)
    compared = np.where(np.isfinite(compared), compared, values)
    dev = np.where(compared > hi, compared - hi, np.where(compared < lo, compared - lo, 0.0))
    residual = log_ratio + offset - np.log(np.where(usual > 0, usual, np.nan))
    return dev, slack, x, residual


def _drifting_level(t: np.ndarray, ratio: np.ndarray, window: int, dt: float) -> np.ndarray:
    """The series' usual ratio to its peers, allowed a steady drift over the window.

    A node's own draw need not keep one ratio to its peers: node 3 of Dell's 8xXE9680 starts
    every run 20% above them and ends 4% above, a steady slide over 5 minutes. A level that
    stays flat read the start as a burst and the end as a drop, in every run. The drift is the
    Theil-Sen slope of the learnt (unmasked) readings: a burst or throttle is a step that the
    median of pairwise slopes does not follow, while a slide moves every pair alike.
    """
    flat = rolling_level(ratio, window, 0.5)
    ok = np.flatnonzero(np.isfinite(ratio))
    span = float(t[-1] - t[0]) if t.size else 0.0
    if ok.size < 20 or span <= 0 or t.size > window:
        return flat
    pick = ok[:: max(1, ok.size // 300)]
    x, y = t[pick], np.log(ratio[pick])
    dx = x[:, None] - x[None, :]
    dy = y[:, None] - y[None, :]
    # Pairs at least a quarter of the span apart: neighbours' slopes are the readings' noise.
    far = dx > span / 4
    if far.sum() < 10:
        return flat
    slope = float(np.median(dy[far] / dx[far]))
    centre = float(np.median(y - slope * x))
    return np.exp(centre + slope * t)


def _smoothing_readings(dt: float, settings: Settings) -> int:
    """Readings per compared value: as many as span `smooth_s` (odd, at least one)."""
    n = max(1, round(settings.smooth_s / dt))
    return n if n % 2 else n + 1 if n > 1 else 1


def _rolling_median(x: np.ndarray, n: int) -> np.ndarray:
    if n <= 1:
        return x
    return np.asarray(pd.Series(x).rolling(n, center=True, min_periods=1).median(), dtype=float)


def _smoothed_noise(x: np.ndarray, times: np.ndarray, dt: float, n: int) -> float:
    """The noise of values that are medians of n readings: from every n-th of them (windows
    that share no reading), whose neighbours are n periods apart."""
    if n <= 1:
        return noise(x, times, dt)
    return noise(x[::n], times[::n], dt * n)


def _usual_ratio(ratio: np.ndarray, spread: float, settings: Settings) -> float:
    """This series' usual ratio to its peers: of the levels it holds for a fair share of the
    regime, the one closest to the peers'.

    The nodes (or GPUs) of one job do the same work, so a series' usual ratio to the others is
    near 1 (within 2.5% on every multi-node run of the dev set). A throttle or foreign work
    covering most of a short run is the regime's mode, and the untouched rest would look like
    the episode; the level nearest the peers' is the usual one. `spread`: the log ratio's
    noise over neighbouring interior readings (regime_levels' noise); the noise of all its
    differences counted the step from one eval's ratio to the next one's, and from a
    throttled eval to the untouched last one (a band of 32% on Llama-2's evals: one level).
    """
    x = np.log(ratio[np.isfinite(ratio) & (ratio > 0)])
    if x.size == 0:
        return float("nan")
    band = max(settings.z * (spread if np.isfinite(spread) else noise(x)), settings.rel)
    return float(np.exp(nearest_level(x, band, 0.0, settings.level_share)))


# -- episodes -------------------------------------------------------------------------------


def find_episodes(
    times: Sequence[float] | np.ndarray,
    values: Sequence[float] | np.ndarray,
    events: RunEvents | None = None,
    *,
    peers: np.ndarray | None = None,
    settings: Settings = DEFAULT,
    profile: PeerProfile | None = None,
) -> list[Episode]:
    """Every episode departing from the run's normal activity, explained or not.

    `profile`: this series' dependence on its peers' level, learnt from its earlier runs
    (learn_peer_profile); None, or an empty one, changes nothing.
    """
    t, v, peers = _prepared(times, values, peers)
    if t.size < 3:
        return []
    ev = events or RunEvents()
    d = departures(t, v, ev, peers, settings, profile)
    window = settings.event_window_s
    # Against peers that warm up alike, the warm-up cancels like any other phase of the run:
    # it covers nothing there (it exists because a lone series' level is not known yet).
    marks = [m for m in d["marks"] if not (d["peers"] and m.kind == "warmup")]
    covered = _covered(t, marks, settings.tolerance_s if window is None else window)
    episodes = []
    for a, b in _runs(t, np.sign(d["dev"]), settings.merge_gap_s):
        episode = _episode(t, v, d, covered, a, b, settings)
        if episode is not None:
            episodes.append(episode)
    return episodes


def learn_peer_profile(
    times: Sequence[float] | np.ndarray,
    values: Sequence[float] | np.ndarray,
    events: RunEvents | None,
    *,
    peers: np.ndarray,
    profile: PeerProfile,
    settings: Settings = DEFAULT,
) -> None:
    """Add a finished run to this series' profile against its peers (profile.py).

    Called after the run was judged, never before: the run that is judged is held against
    what its series' earlier runs showed. Every reading counts, the ones found departing too:
    what one run cannot tell from foreign work (node 3's surplus at its peers' 3.5 kW) is
    what it finds departing, and left out it was never learnt. What keeps foreign work out
    is the runs' agreement (profile.py): a burst in one run is outvoted by the others.
    """
    t, v, p = _prepared(times, values, peers)
    if t.size < 3 or p is None:
        return
    d = departures(t, v, events or RunEvents(), p, settings, profile)
    if not d["peers"] or d["peer_resid"] is None:
        return
    residual = d["peer_resid"]
    # A bin counts where it holds an episode's worth of readings.
    least = max(2, round(settings.min_duration_s / sampling_period(t)))
    profile.learn(d["peer_x"], residual, least)


def _prepared(
    times: Sequence[float] | np.ndarray,
    values: Sequence[float] | np.ndarray,
    peers: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Finite readings in time order, the peers' with them."""
    t = np.asarray(times, float)
    v = np.asarray(values, float)
    ok = np.isfinite(t) & np.isfinite(v)
    if peers is not None:
        peers = np.asarray(peers, float)[ok]
    t, v = t[ok], v[ok]
    order = np.argsort(t, kind="stable")
    return t[order], v[order], (peers[order] if peers is not None else None)


def _runs(t: np.ndarray, sign: np.ndarray, gap_s: float) -> list[tuple[int, int]]:
    """Index ranges [a, b] of same-signed departures, bridging gaps up to gap_s."""
    out: list[tuple[int, int]] = []
    for direction in (1.0, -1.0):
        idx = np.flatnonzero(sign == direction)
        if idx.size == 0:
            continue
        # A gap in the readings (the sensor skips 3-5 of them about once a minute) is not a
        # return to normal: departing samples with no other sample between them stay one
        # episode across a gap of up to 5 x gap_s.
        dt_gap = np.diff(t[idx])
        adjacent = np.diff(idx) == 1
        breaks = np.flatnonzero((dt_gap > gap_s) & ~(adjacent & (dt_gap <= 5 * gap_s)))
        starts = np.concatenate(([0], breaks + 1))
        ends = np.concatenate((breaks, [idx.size - 1]))
        out += [(int(idx[s]), int(idx[e])) for s, e in zip(starts, ends, strict=False)]
    return sorted(out)


def _covered(t: np.ndarray, marks: Sequence[Mark], tol: float) -> np.ndarray:
    covered = np.zeros(t.shape, bool)
    for m in marks:
        pad = tol if m.margin_s is None else m.margin_s
        start = t >= m.time - m.before_s - pad
        end = t <= m.time + pad if m.after_s is None else t < m.time + m.after_s
        covered |= start & end
    return covered


def _episode(
    t: np.ndarray,
    v: np.ndarray,
    d: dict[str, Any],
    covered: np.ndarray,
    a: int,
    b: int,
    settings: Settings,
) -> Episode | None:
    dt = sampling_period(t)
    start, end = float(t[a]), float(t[b]) + dt
    seg = slice(a, b + 1)
    departing = d["dev"][seg] != 0
    # Each sample stands for the time until the next one (a period; more across a gap in the
    # readings, up to what _runs bridges), weighed by how far it lies from the expected level
    # in bands (1 at the band's edge): a sequential test, where a strong excursion needs fewer
    # readings than a weak one. 2-3 readings of a +20% burst on a sensor that skips readings
    # are evidence enough; a weak blip of the same length is not, nor is one reading.
    # Bursts only: foreign work adds, and a throttle lasts; a short strong drop is the run's
    # own (a data-loader stall, the start of an eval: two to three readings each on GPT-3).
    up = float(np.median(d["dev"][seg][departing])) > 0
    weight = np.minimum(np.diff(t, append=t[-1] + dt), 5 * settings.merge_gap_s)
    scale = d["scale"][seg]
    strength = 1.0 + np.abs(d["dev"][seg]) / np.where(scale > 0, scale, np.inf)
    evidence = weight[seg] * (strength if up else 1.0)
    if end - start < settings.min_duration_s and not _enough(
        evidence[departing], settings.min_duration_s
    ):
        return None
    free = departing & ~covered[seg]
    free_s = float(weight[seg][free].sum())
    setup = up and _is_setup(t, v, d, a, b, settings.merge_gap_s + dt, settings.min_duration_s)
    setup = setup or (up and _is_init_warmup(v, d, a, b))
    explained = setup or (
        free_s < settings.min_duration_s and not _enough(evidence[free], settings.min_duration_s)
    )
    expected = float(np.median(d["level"][seg]))
    observed = float(np.median(v[seg]))
    labels = d["labels"][seg]
    phase = str(pd.Series(labels).mode().iloc[0])
    kind = "drop" if not up else ("plateau" if end - start > settings.plateau_s else "burst")
    window = settings.tolerance_s if settings.event_window_s is None else settings.event_window_s
    reason = _reason(d["marks"], start, end, window) if explained else ""
    reason = "setup level until the node's next phase" if setup else reason
    detected_at = _confirmation(
        t[seg][departing], weight[seg][departing], evidence[departing], settings.min_duration_s
    )
    return Episode(
        start=start,
        end=end,
        kind=kind,
        phase=phase,
        explained=explained,
        reason=reason,
        detected_at=detected_at,
        expected=expected,
        observed=observed,
        delta_rel=(observed - expected) / expected if expected else 0.0,
        peak=float(v[seg].max() if up else v[seg].min()),
        samples=int(departing.sum()),
    )


def _enough(evidence: np.ndarray, min_s: float) -> bool:
    """At least two readings whose band-weighted time adds up to min_s."""
    return evidence.size >= 2 and float(evidence.sum()) >= min_s


def _confirmation(
    times: np.ndarray, weight: np.ndarray, evidence: np.ndarray, min_s: float
) -> float:
    """When the departing samples first add up to min_s of evidence (their time, or their
    band-weighted time, from the second reading on): an online detector's alarm time."""
    if times.size == 0:
        return float("nan")
    plain = np.cumsum(weight) >= min_s
    strong = (np.cumsum(evidence) >= min_s) & (np.arange(times.size) >= 1)
    hit = np.flatnonzero(plain | strong)
    i = int(hit[0]) if hit.size else times.size - 1
    return float(times[i] + weight[i])


def _reason(marks: Sequence[Mark], start: float, end: float, tol: float) -> str:
    def pad(m: Mark) -> float:
        return tol if m.margin_s is None else m.margin_s

    def reaches(m: Mark) -> bool:
        # Its window reaches the episode's start (after_s: an exclusive end).
        return m.time + pad(m) >= start if m.after_s is None else m.time + m.after_s > start

    near = [m.kind for m in marks if reaches(m) and m.time - m.before_s - pad(m) <= end]
    return ", ".join(sorted(set(near))) or "phase change"
