"""Signals a lead can trust: trending flags need a sustained finding to raise and a sustained
absence to resolve, and silence while the server itself was down is not a run's."""

from __future__ import annotations

import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from forecasting import compute, conditions, flags, liveness, selectors
from forecasting.estimators.stalled import detect_stall
from forecasting.models import Flag, Forecast
from tests.forecasting.test_services import at, healthy_loss, make_run, send
from tracker.models import Run

pytestmark = pytest.mark.django_db

RISE = conditions.Condition("rise", "Loss has been rising", 9.0, 100.0)


def sync(
    run: Run, found: list[conditions.Condition], seconds: float, input_step: int | None = None
) -> dict[str, Flag]:
    """One computation; by default on new data (a progress report per computation)."""
    now = at(seconds)
    step = int(seconds) if input_step is None else input_step
    odds = _odds_at(run, now)
    kept = compute._sustained(run=run, found=found, odds=odds, now=now, input_step=step)
    flags.flags_sync(run=run, conditions=kept, kinds=compute.FORECAST_FLAG_KINDS, now=now)
    return selectors.flags_open(run=run)


def _odds_at(run: Run, now) -> float | None:
    row = Forecast.objects.filter(run=run, kind="deadline", computed_at=now).first()
    return None if row is None else row.data.get("p_on_time")


def test_one_noisy_computation_neither_raises_nor_resolves(project):
    run = make_run(project)
    run.started_at = at(0)
    run.save()
    # 1,000 s into the run the window is 50 s: three computations 15 s apart do not cover it.
    assert "rise" not in sync(run, [RISE], 1000)
    assert "rise" not in sync(run, [], 1015)  # it came and went: nothing to say
    assert "rise" not in sync(run, [RISE], 1030)
    assert "rise" not in sync(run, [RISE], 1045)
    assert "rise" not in sync(run, [RISE], 1060)
    assert "rise" in sync(run, [RISE], 1075)  # found in every computation of the window
    # One computation without it does not resolve it, nor two...
    assert "rise" in sync(run, [], 1090)
    assert "rise" in sync(run, [RISE], 1105)
    # ... only a whole window without it does.
    for t in (1120, 1135, 1150, 1165):
        open_flags = sync(run, [], t)
    assert "rise" not in open_flags
    assert Flag.objects.filter(run=run, kind="rise", state="raised").count() == 1


def test_a_finding_sustained_in_evaluations_raises_without_a_time_window(project):
    run = make_run(project)
    run.started_at = at(0)
    run.save()
    val_rise = conditions.Condition(
        "rise", "Validation loss has risen", 9.0, 100.0, {"sustained_points": 2}
    )
    assert "rise" not in sync(run, [RISE], 1000)  # a train-loss rise waits for its window
    assert "rise" in sync(run, [val_rise], 1015)  # held over two evaluations already


def test_events_raise_at_once(project):
    run = make_run(project)
    nan = conditions.Condition("nan", "loss became NaN", 1.0, 10.0)
    assert "nan" in sync(run, [nan], 1000)


def _odds(run: Run, seconds: float, p: float) -> list[conditions.Condition]:
    Forecast.objects.create(
        run=run,
        kind=Forecast.Kind.DEADLINE,
        segment=run.current_segment,
        input_last_step=int(seconds),
        computed_at=at(seconds),
        data={"p_on_time": p},
    )
    if p >= 0.9:
        return []
    return [conditions.Condition("deadline", f"{p:.0%} likely", 1 - p, None, {"p_on_time": p})]


def test_a_deadline_flag_closes_only_when_the_odds_are_clearly_back(project):
    run = make_run(project)
    run.started_at = at(0)
    run.save()
    t = 1000.0
    for _ in range(5):
        open_flags = sync(run, _odds(run, t, 0.6), t)
        t += 15
    assert "deadline" in open_flags
    for _ in range(8):  # hovering at 91-92%: above the raise line, below the resolve line
        open_flags = sync(run, _odds(run, t, 0.92), t)
        t += 15
    assert "deadline" in open_flags
    for _ in range(5):
        open_flags = sync(run, _odds(run, t, 0.97), t)
        t += 15
    assert "deadline" not in open_flags


def test_a_deadline_crossing_must_hold_across_new_data(project):
    """Between two progress reports every forecast recomputes the same report with a later
    clock: however many of them find the odds low, that is one reading, not a sustained one."""
    run = make_run(project)
    run.started_at = at(0)
    run.save()
    t = 1000.0
    for _ in range(8):  # two minutes of forecasts, all on the report of step 500
        open_flags = sync(run, _odds(run, t, 0.6), t, input_step=500)
        t += 15
    assert "deadline" not in open_flags
    for step in (510, 520, 530, 540):  # new reports keep saying the same: now it is sustained
        open_flags = sync(run, _odds(run, t, 0.6), t, input_step=step)
        t += 15
    assert "deadline" in open_flags
    Flag.objects.filter(run=run).delete()
    for _ in range(18):  # no new report at all: four windows of the same low reading suffice
        open_flags = sync(run, _odds(run, t, 0.6), t, input_step=540)
        t += 15
    assert "deadline" in open_flags
    # A divergence kind carries its own sustain (in points): recomputations count for it.
    for _ in range(6):
        open_flags = sync(run, [RISE], t, input_step=540)
        t += 15
    assert "rise" in open_flags


def test_a_deadline_crossing_that_each_new_report_takes_back_is_not_sustained(project):
    """Right after an early ETA its band narrows with every report, and the odds climb back
    (74%, 73%, 78%, 85%, 89%, then 91%+) on a run that lands well inside its cutoff: raising on
    that crossing opened a flag that resolved minutes later, and a real slowdown that followed
    within the hour came back as a flip-flop (issue 9)."""
    run = make_run(project)
    run.started_at = at(0)
    run.save()
    t = 1000.0
    for p in (0.74, 0.73, 0.78, 0.85, 0.87, 0.89, 0.91, 0.93, 0.96, 0.97, 0.98, 0.99):
        open_flags = sync(run, _odds(run, t, p), t)
        assert "deadline" not in open_flags, p
        t += 15
    # The same crossing when the odds do not come back: raised once it held a window.
    for p in (0.74, 0.72, 0.70, 0.68, 0.66, 0.64):
        open_flags = sync(run, _odds(run, t, p), t)
        t += 15
    assert "deadline" in open_flags


def test_a_run_more_likely_late_than_not_raises_though_its_odds_climb(project):
    """After a slowdown the odds fall to 15% and climb as the new pace is measured: still a run
    more likely late than not, which is news whichever way its odds move."""
    run = make_run(project)
    run.started_at = at(0)
    run.save()
    t = 1000.0
    for p in (0.15, 0.17, 0.19, 0.22, 0.25, 0.27):
        open_flags = sync(run, _odds(run, t, p), t)
        t += 15
    assert "deadline" in open_flags


def test_a_deadline_flag_resolves_only_when_the_odds_hold_across_new_reports(project):
    """Like a raise, a resolve is a reading held across progress reports: one report recomputed
    over a window with a later clock is one reading."""
    run = make_run(project)
    run.started_at = at(0)
    run.save()
    t, step = 1000.0, 500
    for _ in range(5):
        open_flags = sync(run, _odds(run, t, 0.6), t, input_step=step)
        t, step = t + 15, step + 10
    assert "deadline" in open_flags
    for _ in range(6):  # 90 s of forecasts, all on the one report of a sparse log
        open_flags = sync(run, _odds(run, t, 0.97), t, input_step=step)
        t += 15
    assert "deadline" in open_flags
    for _ in range(4):  # new reports say the same: now the odds are back
        step += 10
        open_flags = sync(run, _odds(run, t, 0.97), t, input_step=step)
        t += 15
    assert "deadline" not in open_flags


def test_silence_while_the_server_was_down_is_not_the_runs() -> None:
    beats = np.arange(0.0, 600.0, 15.0)
    # Heard last at 585 s; the server was down from ~600 s to 1,200 s and is back since then.
    assert detect_stall(beats, beats, np.arange(beats.size), now=1260.0).stalled
    spared = detect_stall(beats, beats, np.arange(beats.size), now=1260.0, listening_since=1200.0)
    assert spared is not None and not spared.stalled
    # Back for 60 s (the client's longest probe) and then the usual limit (60 s on this steady
    # 15 s cadence: three times its longest interval, at least a minute): now it counts.
    grace = detect_stall(beats, beats, np.arange(beats.size), now=1315.0, listening_since=1200.0)
    assert grace is not None and not grace.stalled
    late = detect_stall(beats, beats, np.arange(beats.size), now=1400.0, listening_since=1200.0)
    assert late is not None and late.stalled


def test_a_server_outage_does_not_crash_a_run_it_could_not_hear(project):
    run = make_run(project)
    for i in range(20):
        steps = np.arange(i * 10, (i + 1) * 10)
        send(run, steps, healthy_loss(steps), seq=i + 1)
    last = Run.objects.get(pk=run.pk).last_seen_at
    liveness.server_tick(now=last)
    # The server (web and worker) stops for ten minutes; its first tick back finds the gap.
    back = last + timedelta(minutes=10)
    assert liveness.server_tick(now=back) == back
    liveness.run_check_liveness(run_id=run.pk, now=back + timedelta(seconds=5))
    assert Run.objects.get(pk=run.pk).status == "running"
    assert not Flag.objects.filter(run=run, kind="stalled").exists()
    # Still silent well after the server came back: that silence is the run's.
    for minutes in (1, 2, 3):
        liveness.server_tick(now=back + timedelta(minutes=minutes))
    liveness.run_check_liveness(run_id=run.pk, now=back + timedelta(minutes=3))
    assert Run.objects.get(pk=run.pk).status == "crashed"


class _Web:
    """The web tier's /healthz on a real socket: up answers 200, down refuses connections."""

    def __init__(self) -> None:
        self.port = 0
        self.server: ThreadingHTTPServer | None = None
        self.up()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/healthz"

    def up(self) -> None:
        class Healthz(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Healthz)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def down(self) -> None:
        assert self.server is not None
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def sweep(settings, monkeypatch):
    """The worker's beat sweep at a chosen time, its probe pointed at `web` (a _Web or a URL)."""
    from django.utils import timezone

    from forecasting import tasks

    monkeypatch.setattr(tasks, "forecast_enqueue", lambda **kw: False)  # not under test here
    web = _Web()

    def at_time(now, *, url: str | None = None) -> None:
        settings.RUNCAST_WEB_PROBE_URL = web.url if url is None else url
        monkeypatch.setattr(timezone, "now", lambda: now)
        tasks.sweep_active_runs()

    at_time.web = web  # type: ignore[attr-defined]
    yield at_time
    if web.server is not None:
        web.server.server_close()


def _silent_run(project) -> tuple[Run, object]:
    run = make_run(project)
    for i in range(20):
        steps = np.arange(i * 10, (i + 1) * 10)
        send(run, steps, healthy_loss(steps), seq=i + 1)
    return run, Run.objects.get(pk=run.pk).last_seen_at


def test_a_web_outage_the_worker_ticks_through_crashes_no_run(project, sweep):
    run, last = _silent_run(project)
    sweep(last)
    # The web tier goes down for ten minutes (a redeploy): clients cannot reach the server and
    # spool, while the worker's beat sweeps on every minute. Before, each sweep was a tick, the
    # server seemed to be listening, and the run was "crashed" after 75 s.
    sweep.web.down()
    for minute in range(1, 11):
        sweep(last + timedelta(minutes=minute))
    assert Run.objects.get(pk=run.pk).status == "running"
    assert not Flag.objects.filter(run=run, kind="stalled").exists()
    # Back: the first sweep finds the gap in its ticks, and the client's replay has its grace.
    sweep.web.up()
    back = last + timedelta(minutes=11)
    sweep(back)
    assert Run.objects.get(pk=run.pk).status == "running"
    # Still silent well after the web came back: that silence is the run's.
    for minutes in (1, 2, 3):
        sweep(back + timedelta(minutes=minutes))
    assert Run.objects.get(pk=run.pk).status == "crashed"


def test_a_probe_that_never_answered_does_not_hide_a_crash(project, sweep):
    run, last = _silent_run(project)
    sweep.web.down()
    # A wrong RUNCAST_WEB_PROBE_URL: never answered, so it is taken for a misconfiguration.
    for minutes in range(0, 4):
        sweep(last + timedelta(minutes=minutes))
    assert Run.objects.get(pk=run.pk).status == "crashed"


def test_a_web_silent_for_over_an_hour_no_longer_holds_the_checks_back(project, sweep):
    run, last = _silent_run(project)
    sweep(last)
    sweep.web.down()
    out = last + timedelta(seconds=liveness.WEB_OUTAGE_MAX_S)
    for minutes in range(0, 4):
        sweep(out + timedelta(minutes=minutes))
    assert Run.objects.get(pk=run.pk).status == "running"  # within the hour: an outage
    for minutes in range(5, 9):
        sweep(out + timedelta(minutes=minutes))
    assert Run.objects.get(pk=run.pk).status == "crashed"


def test_regular_ticks_keep_the_server_listening(project):
    first = liveness.server_tick(now=at(0))
    for k in range(1, 5):
        assert liveness.server_tick(now=at(60 * k + 20 * (k % 2))) == first  # late, not missed
    assert liveness.server_tick(now=at(60 * 4 + 150)) == at(390)  # a missed tick: a gap


def test_a_resume_from_an_earlier_checkpoint_is_not_a_stall(project):
    from django.utils import timezone

    from tracker.models import IngestBatch
    from tracker.services import SeriesIn, batch_ingest

    run = make_run(project)
    for i in range(20):
        steps = np.arange(500 + i * 10, 500 + (i + 1) * 10)
        send(run, steps, healthy_loss(steps), seq=i + 1)
    # The first attempt died five minutes ago at step 699 ...
    died = timezone.now() - timedelta(minutes=5)
    for k, batch in enumerate(IngestBatch.objects.filter(run=run).order_by("seq")):
        IngestBatch.objects.filter(pk=batch.pk).update(received_at=died - timedelta(seconds=20 - k))
    # ... and the job resumed from the checkpoint at step 200: below the old furthest step.
    for i in range(20):
        steps = np.arange(200 + i * 5, 200 + (i + 1) * 5)
        times = np.full(steps.size, timezone.now().timestamp())
        series = [SeriesIn("loss", steps, healthy_loss(steps), times)]
        batch_ingest(run=run, session="s2", seq=i + 1, series=series, events=[], heartbeat=None)
    resumed = IngestBatch.objects.filter(run=run, session="s2").order_by("seq")
    for k, batch in enumerate(resumed):  # one batch a second, the last just now
        when = timezone.now() - timedelta(seconds=20 - k)
        IngestBatch.objects.filter(pk=batch.pk).update(received_at=when)
    liveness.run_check_liveness(run_id=run.pk)
    assert not Flag.objects.filter(run=run, kind="stalled").exists()
    assert Run.objects.get(pk=run.pk).status == "running"


def test_a_flag_that_just_resolved_needs_four_windows_to_come_back(project):
    run = make_run(project)
    run.started_at = at(0)
    run.save()
    t = 1000.0
    for _ in range(6):  # raised: found through one 50 s window
        open_flags = sync(run, [RISE], t)
        t += 15
    assert "rise" in open_flags
    for _ in range(6):  # resolved: absent through one window
        open_flags = sync(run, [], t)
        t += 15
    assert "rise" not in open_flags
    for _ in range(6):  # back for one window only, within the hour: not yet
        open_flags = sync(run, [RISE], t)
        t += 15
    assert "rise" not in open_flags
    for _ in range(16):  # held four windows (of 5% of the run so far): it is back
        open_flags = sync(run, [RISE], t)
        t += 15
    assert "rise" in open_flags


# A short run's deadline odds over four minutes, each a new progress report (issue 23): every
# band crossing wrote an "updated" row, ten in all. "1%" and "0%" as the page printed them.
WOBBLE = (0.42, 0.22, 0.31, 0.21, 0.27, 0.13, 0.27, 0.008, 0.09, 0.002)


def _replay(run: Run, odds: tuple[float, ...], t: float, every_s: float = 24.0) -> float:
    for p in odds:
        sync(run, _odds(run, t, p), t)
        t += every_s
    return t


def test_a_wobbling_deadline_writes_only_the_changes_a_lead_acts_on(project):
    run = make_run(project)
    run.started_at = at(0)
    run.save()
    t = _replay(run, (0.20,) * 4, 1000.0)  # the raise, held over its window
    _replay(run, WOBBLE, t)

    rows = Flag.objects.filter(run=run, kind="deadline").order_by("id")
    # The climbs back to 22-42% never held a window: not news. The fall to 1% is, at once.
    assert [(f.state, f.data["p_on_time"]) for f in rows] == [
        ("raised", 0.20),
        ("updated", 0.008),
    ]


def test_a_better_band_of_odds_is_written_once_it_has_held(project):
    run = make_run(project)
    run.started_at = at(0)
    run.save()
    t = _replay(run, (0.20,) * 4, 1000.0)
    t = _replay(run, (0.55, 0.58), t)  # two computations: not yet a window's worth
    assert Flag.objects.filter(run=run, kind="deadline").count() == 1
    t = _replay(run, (0.60,), t)  # three over the window, on new reports: held
    rows = Flag.objects.filter(run=run, kind="deadline").order_by("id")
    assert [(f.state, f.data["p_on_time"]) for f in rows] == [
        ("raised", 0.20),
        ("updated", 0.60),
    ]
    # Worse again is written at once, against the band the flag last wrote (50-75%).
    _replay(run, (0.40,), t)
    assert Flag.objects.filter(run=run, kind="deadline").latest("id").data["p_on_time"] == 0.40


def _slips(run: Run, amounts: tuple[float, ...], t: float, every_s: float = 24.0) -> float:
    for amount in amounts:
        slip = conditions.Condition("slip", "finish slipped", amount, None, {"amount_s": amount})
        sync(run, [slip], t)
        t += every_s
    return t


def test_a_slip_follows_the_deadline_bands_rule(project):
    """A slip that shrank a band was written at once (and alerted as an update), so one that
    shrank for a reading and grew back wrote two rows; worse goes out at once, better once it
    has held, as a deadline's odds do."""
    run = make_run(project)
    run.started_at = at(0)
    run.save()
    hour = 3600.0
    t = _slips(run, (5 * hour,) * 4, 1000.0)  # the raise, held over its window (4-8 h band)
    t = _slips(run, (1.5 * hour, 5 * hour), t)  # smaller for one reading, then back: no news
    rows = Flag.objects.filter(run=run, kind="slip").order_by("id")
    assert [(f.state, f.data["amount_s"]) for f in rows] == [("raised", 5 * hour)]
    t = _slips(run, (1.5 * hour,) * 3, t)  # the smaller slip held over the window: written
    t = _slips(run, (9 * hour,), t)  # worse than what the flag says: written at once
    rows = Flag.objects.filter(run=run, kind="slip").order_by("id")
    assert [(f.state, f.data["amount_s"]) for f in rows] == [
        ("raised", 5 * hour),
        ("updated", 1.5 * hour),
        ("updated", 9 * hour),
    ]
