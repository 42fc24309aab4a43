"""Hysteresis of trending flags, as a pure function of the readings before it.

Each computation stores what it found before hysteresis (a `ConditionReading`); `sustained`
decides, from the readings of the last windows and the run's open flags, which findings are
reported: a new trending condition only when every computation over the window found it, an
open one until none has. No database here: `forecasting.compute` reads the history through
`forecasting.selectors` and passes it in, so a restarted worker decides as the old one would.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from forecasting.conditions import Condition, Reading
from forecasting.estimators import flag_bands
from forecasting.estimators import thresholds as th
from forecasting.models import Flag

SUSTAINED_KINDS = (
    Flag.Kind.RISE,
    Flag.Kind.REGRESSION,
    Flag.Kind.OSCILLATION,
    Flag.Kind.DEADLINE,
    Flag.Kind.SLIP,
    Flag.Kind.STRAGGLER,
)
# Kinds read off the ETA: a forecast between two progress reports recomputes the same data
# with a later clock, so a crossing counts as sustained only once it has held across new data
# (the divergence detectors carry their own sustain, in points).
SUSTAINED_ON_NEW_DATA = (Flag.Kind.DEADLINE, Flag.Kind.SLIP)
# Kinds whose open flag moves between bands of severity (forecasting.estimators.flag_bands).
BANDED_KINDS = (Flag.Kind.DEADLINE, Flag.Kind.SLIP)


@dataclass(frozen=True)
class Context:
    """What `sustained` weighs a computation's findings against."""

    now: datetime
    window: timedelta
    history: Sequence[Reading]  # oldest first, up to `now`, over window * FLAG_REOPEN_WINDOWS
    open_flags: dict[str, Flag]
    recently_resolved: frozenset[str]  # kinds resolved within FLAG_REOPEN_GUARD_S

    @property
    def longest(self) -> timedelta:
        return self.window * th.FLAG_REOPEN_WINDOWS

    def since(self, span: timedelta) -> list[Reading]:
        return [r for r in self.history if r.at >= self.now - span]


def sustain_window(*, ran_s: float) -> timedelta:
    """How long a trending finding must hold: a fraction of the run so far, within bounds."""
    seconds = min(
        th.FLAG_SUSTAIN_MAX_S, max(th.FLAG_SUSTAIN_MIN_S, th.FLAG_SUSTAIN_FRACTION * ran_s)
    )
    return timedelta(seconds=seconds)


def sustained(found: list[Condition], ctx: Context) -> list[Condition]:
    """Hysteresis: of trending conditions, report a new one only when every computation over
    the window found it, and keep an open one until none has (see FLAG_SUSTAIN_*). A deadline or
    slip must also have held over FLAG_SUSTAIN_MIN_INPUTS distinct progress reports (or, with no
    new report, over FLAG_REOPEN_WINDOWS windows): on a run that reports every few minutes, a
    window of recomputations of one report is one reading. Its odds must not be climbing back
    over those reports (unless under 50%), and an open deadline flag closes only on odds held
    at FLAG_DEADLINE_RESOLVE_P over the same span and reports. An open deadline or slip flag
    moves to a better band (of odds, of slip) only once that band has held as a raise must
    (`_band_change`); to a worse one at once.
    """
    out = []
    for cond in found:
        if cond.kind in ctx.open_flags:
            out.append(_band_change(cond, ctx.open_flags[cond.kind], ctx))
            continue
        span = ctx.longest if cond.kind in ctx.recently_resolved else ctx.window
        # A finding the detector already required to hold over several evaluations (a sparse
        # validation curve, a point every few minutes) is sustained in points: a time window on
        # top of it would outlast a short run. Kept open and closed like the others.
        in_points = bool(cond.data.get("sustained_points"))
        if cond.kind not in SUSTAINED_KINDS or in_points or _held(cond.kind, span, ctx):
            out.append(cond)
    reported = {c.kind for c in out}
    for kind, prev in ctx.open_flags.items():
        if kind in SUSTAINED_KINDS and kind not in reported and not _cleared(kind, ctx):
            # Still open: the same condition, so no new row.
            out.append(Condition(kind, prev.explanation, prev.severity, prev.onset_step, prev.data))
    return out


def _reading_band(kind: str, r: Reading) -> int | None:
    """The band of one reading: its odds for a deadline, its slip for a slip (a reading that
    found no slip is better than any band; one without odds is not known to be better)."""
    if kind == Flag.Kind.DEADLINE:
        return None if r.deadline_p is None else flag_bands.odds_band(r.deadline_p)
    if r.slip_s is None:
        return None if kind in r.found else -1
    return flag_bands.slip_band(r.slip_s)


def _band_change(cond: Condition, prev: Flag, ctx: Context) -> Condition:
    """What an open deadline or slip flag reports: the new reading when its band is worse or
    the same, or when a better band has held; otherwise what the flag already says.

    Hysteresis of the bands (FLAG_DEADLINE_BANDS: 75%, 50%, 25%, 10%, 1%), asymmetric because
    the two directions cost a lead differently. Worse goes out at once: odds that fall a band
    are what the deadline rule is for (a fall from 44% to 0% is sent through the cooldown, as a
    loss episode that gets worse is). Better is written only once every computation over the
    sustain window, on two progress reports (the raise's own rule), has found the odds in a
    better band than the flag's. Both compare with the band the flag last wrote, not with the
    previous computation, so odds that wobble about an edge write at most the one worsening: on
    a four-minute run the odds went 20 -> 42 -> 22 -> 31 -> 21 -> 27 -> 13 -> 27 -> 1 -> 9 -> 0%
    and each crossing wrote a row (ten updates); now the raise at 20% and the fall to 1% are
    written, and the climbs that did not hold are not. A slip's size (FLAG_SLIP_BAND_BASE_S,
    doubling) follows the same rule: a slip that grew a band is sent through the cooldown, one
    that shrank is written once the smaller slip has held (it wrote a row at once, and a slip
    that shrank and grew back wrote two).
    """
    now_band = flag_bands.band(cond.kind, cond.data)
    said_band = flag_bands.band(prev.kind, prev.data)
    if cond.kind not in BANDED_KINDS or now_band is None or said_band is None:
        return cond
    if now_band >= said_band:
        return cond

    def better(r: Reading) -> bool:
        band = _reading_band(cond.kind, r)
        return band is not None and band < said_band

    if _across_reports(better, ctx.window, ctx) is not None:
        return cond
    return Condition(prev.kind, prev.explanation, prev.severity, prev.onset_step, prev.data)


def _cleared(kind: str, ctx: Context) -> bool:
    if kind == Flag.Kind.DEADLINE:
        # Open until the odds are clearly back, in every computation of the window and on new
        # reports, as a raise must hold (one report's reading, recomputed, is one).
        return _across_reports(_odds_back, ctx.window, ctx) is not None
    rows = ctx.since(ctx.window)
    covered = (
        len(rows) >= th.FLAG_SUSTAIN_MIN_COMPUTATIONS
        and (ctx.now - min(r.at for r in rows)) >= ctx.window * th.FLAG_SUSTAIN_COVERAGE
    )
    return covered and not any(kind in r.found for r in rows)


def _throughout(test: Callable[[Reading], bool], span: timedelta, ctx: Context) -> tuple[bool, int]:
    """Whether every computation over the span passed the test, and on how many reports."""
    rows = ctx.since(span)
    passed = (
        len(rows) >= th.FLAG_SUSTAIN_MIN_COMPUTATIONS
        and ctx.now - rows[0].at >= span * th.FLAG_SUSTAIN_COVERAGE
        and all(test(r) for r in rows)
    )
    return passed, len({r.input_step for r in rows})


def _across_reports(
    test: Callable[[Reading], bool], span: timedelta, ctx: Context
) -> timedelta | None:
    """The span over which every computation passed the test on FLAG_SUSTAIN_MIN_INPUTS
    distinct progress reports, or None. With fewer reports in `span` (a run that reports
    rarely, or has stopped: the stall flag speaks for that) the reading must have held over
    the longest span: on a run that reports every few minutes, a window of recomputations
    of one report is one reading."""
    passed, inputs = _throughout(test, span, ctx)
    if passed and inputs < th.FLAG_SUSTAIN_MIN_INPUTS:
        span = ctx.longest
        passed = _throughout(test, span, ctx)[0]
    return span if passed else None


def _odds_recovering(span: timedelta, ctx: Context) -> bool:
    """Whether the chance of making the cutoff rose from the span's first progress report to
    its last, and is still at least even. A crossing that every new report takes back towards
    the line (the band narrowing after an early ETA, one slow interval of a sparse log, a
    downtime already over) is clearing as data arrive, not sustained: raising it opened a flag
    that resolved within minutes and came back as "new" when a real slowdown followed (issue
    9). A run more likely late than not is news whichever way its odds move (a slowed run's
    odds climb from 15% to 30% as its new pace is measured)."""
    by_report: dict[int | None, float] = {}
    for r in ctx.since(span):
        if r.deadline_p is not None:
            by_report[r.input_step] = r.deadline_p  # a report's latest reading
    odds = list(by_report.values())
    return len(odds) >= 2 and odds[-1] > odds[0] and odds[-1] >= th.DEADLINE_LIKELY_LATE_P


def _held(kind: str, span: timedelta, ctx: Context) -> bool:
    def has(r: Reading) -> bool:
        return kind in r.found

    if kind not in SUSTAINED_ON_NEW_DATA:
        return _throughout(has, span, ctx)[0]
    judged = _across_reports(has, span, ctx)
    return judged is not None and not _odds_recovering(judged, ctx)


def _odds_back(r: Reading) -> bool:
    return r.deadline_p is not None and r.deadline_p >= th.FLAG_DEADLINE_RESOLVE_P
