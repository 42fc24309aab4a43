"""GPU activity, level learning: each sample's phase and regime, and each regime's normal level
and noise (docs/gpu.md has the figures).

1. **Phases and regimes.** Every sample gets the phase the run was in (init, train, eval,
   checkpoint, idle ...) from the logged phase intervals. A phase's level changes for a reason
   the run logs: an architecture change (neurons grown or pruned), a resume, a step-time change.
   Those split the phase into regimes, each learning its own level. A phase shorter than two
   sampling periods cannot show and keeps the phase before it.
2. **Normal activity per regime.** First pass: the regime's mode or, where other levels hold
   a fair share of it, the level nearest a reference (the peers' ratio 1; the phase's level over
   all its regimes); a lone series' training, with no reference, takes the level it settles at
   first (training starts clean; foreign work comes and goes). Later passes: a centred
   rolling median of the samples no earlier pass found departing. Spread: the noise of
   neighbouring samples (MAD of first differences). Idle uses a low quantile: the GPU's idle is
   its floor, and foreign work only ever adds to it. Noise comes from a regime's interior
   readings (its edges are mid-transition).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from forecasting.estimators.gpu_activity.model import DEFAULT, IDLE_PHASES, Mark, Phase, Settings

# -- phases, marks, regimes ----------------------------------------------------------------


def phase_labels(times: np.ndarray, phases: Sequence[Phase]) -> np.ndarray:
    """The phase kind of every sample; later phases win where logged intervals overlap."""
    labels = np.full(times.shape, "idle", dtype=object)
    for phase in sorted(phases, key=lambda p: (p.start, _rank(p.kind))):
        labels[(times >= phase.start) & (times < phase.end)] = phase.kind
    return labels


def resolved_labels(times: np.ndarray, phases: Sequence[Phase], period: float) -> np.ndarray:
    """Phase labels, with phases too short for the series to show given the phase before them.

    A 1-s eval read every 2 s is one sample or none. As a regime of its own it learns a level
    from a handful of samples minutes apart, which a long burst or throttle then sets, and its
    band (+-tolerance around every eval) covers the whole of training; dropped, the gap it
    leaves between two blocks would read as idle. Its samples show the phase around it.
    """
    short = [p for p in phases if p.end - p.start < 2.0 * period]
    labels = phase_labels(times, [p for p in phases if p not in short])
    for p in short:
        inside = np.flatnonzero((times >= p.start) & (times < p.end))
        if inside.size and inside[0] > 0:
            labels[inside] = labels[inside[0] - 1]
    return labels


def _rank(kind: str) -> int:
    # Nested phases: an eval inside a training block is an eval.
    return {"train": 1, "init": 1}.get(kind, 2)


def step_change_marks(
    step_times: np.ndarray, steps: np.ndarray, settings: Settings = DEFAULT
) -> list[Mark]:
    """Times where the median step duration shifts by step_change_rel and stays shifted."""
    t, s = np.asarray(step_times, float), np.asarray(steps, float)
    ok = np.isfinite(t) & np.isfinite(s)
    t, s = t[ok], s[ok]
    w = settings.step_change_window
    if t.size < 2 * w + 2:
        return []
    order = np.argsort(t)
    t, s = t[order], s[order]
    ds = np.diff(s)
    keep = ds > 0
    per_step = np.diff(t)[keep] / ds[keep]
    at = t[1:][keep]
    marks: list[Mark] = []
    i = w
    while i <= per_step.size - w:
        if _shift(per_step, i, w) < settings.step_change_rel:
            i += 1
            continue
        # The first window that sees the shift sees it early (a median flips half-way):
        # the change is where the shift is largest in the next window.
        last = min(i + w, per_step.size - w)
        # Means, not medians, to place it: the median's shift is flat over half a window.
        best = max(range(i, last + 1), key=lambda j: _mean_shift(per_step, j, w))
        marks.append(Mark(float(at[best - 1]), "step_change"))
        i = best + 2 * w
    return marks


def _mean_shift(per_step: np.ndarray, i: int, w: int) -> float:
    return abs(float(per_step[i : i + w].mean()) - float(per_step[i - w : i].mean()))


def _shift(per_step: np.ndarray, i: int, w: int) -> float:
    before = float(np.median(per_step[i - w : i]))
    after = float(np.median(per_step[i : i + w]))
    return abs(after - before) / before if before > 0 else 0.0


def regime_keys(times: np.ndarray, labels: np.ndarray, marks: Iterable[Mark]) -> np.ndarray:
    """Phase kind plus how many level-changing marks came before: each its own level."""
    cuts = np.sort(
        [m.time for m in marks if m.kind in ("arch_change", "resume", "restart", "step_change")]
    )
    regime = np.searchsorted(cuts, times, side="right")
    # Idle is the node's floor, not the run's: one regime however the run's work changed, so
    # the idle before a run's init and after its end share a floor.
    regime = np.where(np.isin(labels, list(IDLE_PHASES)), 0, regime)
    return np.array([f"{lab}#{r}" for lab, r in zip(labels, regime, strict=False)], dtype=object)


# -- the level per regime -------------------------------------------------------------------


def rolling_level(values: np.ndarray, window: int, quantile: float) -> np.ndarray:
    """Centred rolling quantile of the regime's samples, NaN (samples found departing) left out.

    Centred, over a long window (on a short run: the whole regime): the level is what the
    regime does most of the time, so a burst or throttle covering less than half the window
    cannot become the reference. (A trailing level let a throttle covering most of a short run
    set it, and the untouched start then looked like a burst.) The checks re-run on a sliding
    window, so the level of the samples near its end is known from the samples before them.
    """
    series = pd.Series(values)
    roll = series.rolling(window, min_periods=1, center=True)
    out = np.array(roll.median() if quantile == 0.5 else roll.quantile(quantile), dtype=float)
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return np.full(values.shape, np.nan)
    whole = float(np.median(finite) if quantile == 0.5 else np.quantile(finite, quantile))
    return np.array(pd.Series(out).ffill().bfill().fillna(whole), dtype=float)


def regime_levels(
    times: np.ndarray,
    values: np.ndarray,
    keys: np.ndarray,
    settings: Settings = DEFAULT,
    mask: np.ndarray | None = None,
) -> tuple[np.ndarray, dict[str, float]]:
    """Each sample's regime level, and the spread of each regime (masked samples left out)."""
    dt = sampling_period(times)
    window = max(3, round(settings.window_s / dt) | 1)
    level = np.empty(values.shape, float)
    spread: dict[str, float] = {}
    learn = values if mask is None else np.where(mask, np.nan, values)
    # A regime too short for its own noise (a few samples per eval) takes the series' noise.
    pooled = noise(learn, times, dt)
    pooled = 0.0 if not np.isfinite(pooled) else pooled
    labels = np.array([k.split("#")[0] for k in keys], dtype=object)
    for key in np.unique(keys):
        idx = np.flatnonzero(keys == key)
        q = settings.idle_quantile if key.split("#")[0] in IDLE_PHASES else 0.5
        own_learn = learn[idx] if np.isfinite(learn[idx]).any() else values[idx]
        if mask is None and q == 0.5:
            # A regime the run split off (a step-time change) is shorter than its phase, and
            # a throttle may be most of it: of its levels, the one nearest the phase's usual
            # level across all its regimes (a real change of level is the regime's only one).
            same = values[labels == key.split("#")[0]]
            split = np.unique(keys[labels == labels[idx[0]]]).size > 1
            phase_mode = half_sample_mode(same)
            reference = phase_mode if split else float("nan")
            band = max(settings.z * pooled, settings.rel * abs(phase_mode))
            if split or labels[idx[0]] != "train":
                usual = nearest_level(own_learn, band, reference, settings.level_share)
            else:
                # Training starts clean: foreign work and throttles come and go during a run,
                # and a lone series (no peers to hold it against) that holds two levels, each
                # for a fair share, is at its usual one where it first settled. The mode took
                # a throttle over 60% of a 4-min run as the level and the untouched training
                # before it as foreign work.
                usual = earliest_level(own_learn, band, settings.level_share)
            lv = np.full(idx.size, usual)
        else:
            lv = rolling_level(own_learn, window, q)
        level[idx] = lv
        inner = interior(idx)
        own = noise(learn[inner], times[inner], dt)
        sigma = own if np.isfinite(own) else pooled
        spread[key] = max(sigma, settings.min_rel_spread * abs(float(np.median(lv))))
    return level, spread


def interior(idx: np.ndarray) -> np.ndarray:
    """A regime's samples less the first and last of each contiguous piece.

    An edge reading is taken mid-transition (the power falling into an eval): one of the
    three differences of a four-reading eval, enough to double its noise and hide a burst
    of +11% in it. Where too few are left for a noise (< 3 pairs) the series' noise is used.
    """
    if idx.size == 0:
        return idx
    step = np.diff(idx) != 1
    first = np.concatenate(([True], step))
    last = np.concatenate((step, [True]))
    return idx[~first & ~last]


def half_sample_mode(values: np.ndarray) -> float:
    """The densest point of the values (Bickel's half-sample mode); NaN left out.

    The first pass's level: a regime's samples are its usual level plus whatever departs from
    it (the run's own short dips, a burst, a throttle). The median lands between the clusters
    when they are large together (a 125-s throttle and the 1-s eval dips of a 280-s BERT run
    put it 11% under the usual level); the mode stays on the largest cluster.
    """
    x = np.sort(values[np.isfinite(values)])
    if x.size == 0:
        return float("nan")
    while x.size > 3:
        half = (x.size + 1) // 2
        widths = x[half - 1 :] - x[: x.size - half + 1]
        start = int(np.argmin(widths))
        x = x[start : start + half]
    if x.size == 3:
        # The closer pair of the three.
        x = x[:2] if x[1] - x[0] < x[2] - x[1] else (x[1:] if x[1] - x[0] > x[2] - x[1] else x)
    return float(np.mean(x))


def noise(values: np.ndarray, times: np.ndarray | None = None, dt: float | None = None) -> float:
    """Sample-to-sample noise: 1.4826 x MAD of first differences / sqrt 2.

    Differences, not residuals from the level: a burst or throttle covering half the data
    inflates the residuals' MAD (and hides itself), but moves only the two differences at its
    edges. With `times`, only differences of neighbours (<= 1.5 periods apart) count: a regime's
    samples come in pieces (one per eval), and the step from one eval's last sample to the
    next one's first is the run's drift over minutes, not noise. NaN when under 3 such pairs.
    """
    ok = np.isfinite(values)
    finite = values[ok]
    if finite.size < 3:
        return 0.0 if times is None else float("nan")
    d = np.diff(finite)
    if times is not None:
        gap = np.diff(times[ok])
        d = d[gap <= 1.5 * (dt or sampling_period(times))]
        if d.size < 3:
            return float("nan")
    return float(np.median(np.abs(d - np.median(d)))) * 1.4826 / np.sqrt(2.0)


def sampling_period(times: np.ndarray) -> float:
    gaps = np.diff(times)
    gaps = gaps[gaps > 0]
    return float(np.median(gaps)) if gaps.size else 1.0


def _levels(x: np.ndarray, band: float, share: float) -> list[float]:
    """The levels x holds for at least `share` of its samples: the mode, then the mode of what
    lies `band` or more from every level found so far, while that holds its share.

    Not two at most: a throttle over most of a BERT run is the mode, its own eval dips (a
    reading in every 18 s) the mode of the rest, and the untouched training only the third.
    """
    levels = [half_sample_mode(x)]
    while True:
        rest = x[np.all(np.abs(x[:, None] - np.array(levels)[None, :]) >= band, axis=1)]
        if rest.size < share * x.size:
            return levels
        level = half_sample_mode(rest)
        if int((np.abs(rest - level) < band).sum()) < share * x.size:
            return levels
        levels.append(level)


def nearest_level(x: np.ndarray, band: float, reference: float, share: float) -> float:
    """Of the levels x holds for a fair share (_levels), the one nearest `reference`.

    One level only, or no reference (NaN): the mode.
    """
    x = x[np.isfinite(x)]
    if x.size == 0:
        return float("nan")
    levels = _levels(x, band, share)
    if not np.isfinite(reference):
        return levels[0]
    # On a tie, the mode.
    return min(levels, key=lambda level: abs(level - reference))


def earliest_level(x: np.ndarray, band: float, share: float) -> float:
    """Of the levels x (in time order) holds for a fair share (_levels), the one it settles at
    first: two consecutive readings within `band` of it (a ramp passes through a level on its
    way, it does not stay)."""
    x = x[np.isfinite(x)]
    if x.size == 0:
        return float("nan")

    def settles(level: float) -> int:
        near = np.abs(x - level) < band
        hit = np.flatnonzero(near[:-1] & near[1:])
        return int(hit[0]) if hit.size else x.size

    return min(_levels(x, band, share), key=settles)
