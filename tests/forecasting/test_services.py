"""Forecasting services on the real database: forecasts stored, flags as state changes."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
from django.utils import timezone

from forecasting import compute, conditions, flags, liveness, selectors
from forecasting.estimators import formatting as fmt
from forecasting.estimators import thresholds as th
from forecasting.models import ConditionReading, Flag, Forecast
from tracker.models import Deadline, Run, RunSegment
from tracker.services import EventIn, SeriesIn, batch_ingest, from_epoch, run_start

pytestmark = pytest.mark.django_db

T0 = 1.76e9  # epoch seconds where the synthetic runs start


def make_run(project, *, total=10_000, deadline=None, run_id="r1") -> Run:
    return run_start(
        project=project,
        public_id=run_id,
        session="s1",
        started_at=from_epoch(T0),
        fields={"name": run_id, "total_steps": total, "world_size": 64},
        deadline_slug=deadline,
    ).run


def send(run, steps, loss, *, seq, step_s=1.0, session="s1", events=()):
    times = T0 + steps * step_s
    batch_ingest(
        run=run,
        session=session,
        seq=seq,
        series=[SeriesIn("loss", steps, loss, times)],
        events=list(events),
        heartbeat=None,
    )


def healthy_loss(steps):
    rng = np.random.default_rng(0)
    return 2.0 + 8.0 * (steps + 10.0) ** -0.3 + rng.normal(0, 0.01, steps.size)


def at(seconds):
    return from_epoch(T0 + seconds)


def halve_pace(run, *, rounds=8):
    """From step 2,000 (t = 2,000 s) on, steps take 2 s instead of 1; forecasts follow."""
    seq, t, step = 2, 2000.0, 2000
    for _ in range(rounds):
        more = np.arange(step, step + 500)
        times = t + (more - step + 1) * 2.0
        series = [SeriesIn("loss", more, healthy_loss(more), T0 + times)]
        batch_ingest(run=run, session="s1", seq=seq, events=[], heartbeat=None, series=series)
        seq, t, step = seq + 1, t + 1000, step + 500
        compute_sustained(run, t)


def compute_sustained(run, seconds, *, windows=1):
    """Forecasts over the hysteresis window (5% of the run so far, at least 45 s) that a
    trending condition must hold through before it raises; returns the last time used.

    A deadline or slip read again and again off one progress report must hold four windows
    (`windows=4`): over one window it would be one reading recomputed."""
    window = max(45.0, 0.05 * seconds) * windows
    for k in range(3 * windows + 1):
        compute.forecast_compute(run_id=run.pk, now=at(seconds + k * window / (3 * windows)))
    return seconds + window


def test_it_stores_eta_and_loss_forecasts_idempotently(project):
    run = make_run(project)
    steps = np.arange(4000)
    send(run, steps, healthy_loss(steps), seq=1)
    compute.forecast_compute(run_id=run.pk, now=at(4000))
    compute.forecast_compute(run_id=run.pk, now=at(4000))
    eta = Forecast.objects.exclude(data__has_key="as_of_history").get(run=run, kind="eta")
    assert Forecast.objects.filter(run=run, kind="loss").count() == 1
    assert selectors.eta_history_rebuilt(run=run) == th.ETA_BACKFILL_POINTS  # once only
    # 6,000 steps left at one step per second.
    assert eta.finish_p50 == pytest.approx(T0 + 10_000, abs=60)
    assert eta.finish_p10 <= eta.finish_p50 <= eta.finish_p90
    assert eta.data["current_step"] == 3999
    assert not Flag.objects.filter(run=run).exists()


def test_a_run_first_forecast_after_hours_of_history_gets_that_history_rebuilt(project):
    # An import, a client that spooled through an outage, the demo's replay: 4,000 s logged
    # before the first forecast. Its ETA chart would be one point at the end of an empty axis.
    run = make_run(project)
    steps = np.arange(4000)
    send(run, steps, healthy_loss(steps), seq=1)
    compute.forecast_compute(run_id=run.pk, now=at(4000))
    history = selectors.eta_history(run=run)
    assert len(history) == th.ETA_BACKFILL_POINTS + 1
    made = [h[0] - T0 for h in history]
    assert made[0] == pytest.approx(0.05 * 3999, abs=1) and made[-1] == pytest.approx(4000)
    assert made == sorted(made)
    rebuilt = Forecast.objects.filter(run=run, kind="eta", data__has_key="as_of_history")
    for f in rebuilt:
        # Each from the points logged by its own time: the step it had reached then.
        assert f.data["current_step"] == pytest.approx(f.computed_at.timestamp() - T0, abs=1.5)
        assert f.finish_p50 == pytest.approx(T0 + 10_000, rel=0.01)
    # A run forecast from its first points on has nothing to rebuild.
    live = make_run(project, run_id="live")
    few = np.arange(100)
    send(live, few, healthy_loss(few), seq=1)
    compute.forecast_compute(run_id=live.pk, now=at(100))
    assert selectors.eta_history_rebuilt(run=live) == 0


def test_a_slip_in_rebuilt_history_raises_nothing(project):
    # The pace halves halfway through the history logged before the first forecast: the
    # rebuilt forecasts slip, but that is the past of an import, not news for an alert.
    run = make_run(project, total=20_000)
    fast = np.arange(2000)
    send(run, fast, healthy_loss(fast), seq=1)
    slow = np.arange(2000, 4000)
    batch_ingest(
        run=run,
        session="s1",
        seq=2,
        series=[SeriesIn("loss", slow, healthy_loss(slow), T0 + 2000 + (slow - 1999) * 2.0)],
        events=[],
        heartbeat=None,
    )
    compute.forecast_compute(run_id=run.pk, now=at(6000))
    rebuilt = selectors.eta_history(run=run)[:-1]
    assert rebuilt[-1][2] - rebuilt[0][2] > 3600  # the rebuilt finish slipped by over an hour
    # The slip detector reads the live forecasts only: read with the rebuilt ones, this one
    # finds "finish slipped from 14:35 to 19:45 over 1.1 h" in the past of an import.
    assert compute._slip_condition(run=run, now=at(6000)) == []
    assert not Flag.objects.filter(run=run, kind="slip").exists()


def test_it_raises_a_nan_flag_once_and_names_the_rollback_checkpoint(project):
    run = make_run(project)
    steps = np.arange(3000)
    loss = healthy_loss(steps)
    loss[2990:] = np.nan
    ckpt = EventIn(kind="checkpoint", step=2500, time=at(2500), payload={"path": "/ck/2500"})
    send(run, steps, loss, seq=1, events=[ckpt])
    compute.forecast_compute(run_id=run.pk, now=at(3000))
    compute.forecast_compute(run_id=run.pk, now=at(3001))
    flag = Flag.objects.get(run=run, kind="nan")
    assert flag.state == "raised"
    assert flag.onset_step == 2990
    assert flag.data["rollback_step"] == 2500
    # 64 GPUs at 2.5/h for the ~10 s since onset.
    assert flag.data["cost"] == pytest.approx(64 * 2.5 * 10 / 3600, rel=0.2)


def test_it_resolves_a_flag_when_the_condition_clears(project):
    run = make_run(project)
    now = timezone.now()
    flags.flags_sync(
        run=run,
        conditions=[conditions.Condition("spike", "loss spiked", 6.0, 100)],
        kinds=("spike",),
        now=now,
    )
    flags.flags_sync(run=run, conditions=[], kinds=("spike",), now=now + timedelta(minutes=1))
    states = list(
        Flag.objects.filter(run=run).order_by("created_at").values_list("state", flat=True)
    )
    assert states == ["raised", "resolved"]
    assert selectors.flags_open(run=run) == {}


def test_it_updates_a_flag_only_when_its_onset_moves(project):
    run = make_run(project)
    now = timezone.now()
    for onset in (100, 100, 250):
        cond = conditions.Condition("rise", "loss rising", 1.0, onset)
        flags.flags_sync(run=run, conditions=[cond], kinds=("rise",), now=now)
    states = list(Flag.objects.filter(run=run).order_by("id").values_list("state", flat=True))
    assert states == ["raised", "updated"]


def test_a_loss_finding_whose_onset_moves_is_news_only_when_its_rollback_checkpoint_does(project):
    run = make_run(project)
    now = timezone.now()
    for onset, rollback in ((4100, 4000), (4150, 4000), (4180, 4000), (3950, 3000), (3960, None)):
        cond = conditions.Condition(
            "regression", "loss regressed", 1.0, onset, {"rollback_step": rollback}
        )
        flags.flags_sync(run=run, conditions=[cond], kinds=("regression",), now=now)
    rows = Flag.objects.filter(run=run).order_by("id")
    assert [(f.state, f.onset_step) for f in rows] == [
        ("raised", 4100),
        ("updated", 3950),  # before the checkpoint it named: roll back further
        ("updated", 3960),  # no checkpoint before it any more
    ]


def test_it_flags_a_deadline_the_run_cannot_make(project):
    Deadline.objects.create(
        project=project, slug="eval", name="blind eval", cutoff=at(7000), buffer=timedelta(0)
    )
    run = make_run(project, deadline="eval")
    steps = np.arange(4000)
    send(run, steps, healthy_loss(steps), seq=1)
    compute.forecast_compute(run_id=run.pk, now=at(4000))
    assert not Flag.objects.filter(run=run, kind="deadline").exists()  # one forecast: not yet
    compute_sustained(run, 4000)
    # One report, recomputed through a window: one reading, not yet a sustained one.
    assert not Flag.objects.filter(run=run, kind="deadline").exists()
    compute_sustained(run, 4000, windows=4)
    risk = Forecast.objects.filter(run=run, kind="deadline").latest("computed_at").data
    assert risk["p_on_time"] < 0.05  # needs ~6,000 s more, has 3,000
    flag = Flag.objects.get(run=run, kind="deadline")
    assert "blind eval" in flag.explanation
    assert risk["speedup_for_p90"] > 0.9  # about twice the throughput


def test_it_flags_a_slipping_eta(project):
    run = make_run(project, total=20_000)
    steps = np.arange(2000)
    send(run, steps, healthy_loss(steps), seq=1)
    compute.forecast_compute(run_id=run.pk, now=at(2000))
    halve_pace(run)  # every later forecast moves the finish later
    flag = Flag.objects.get(run=run, kind="slip")
    # One sentence, not two run together: the demo's flag history read "ETA slipping finish
    # slipped from ...".
    assert flag.explanation.startswith("ETA slipping: finish slipped from "), flag.explanation


def test_a_run_aimed_at_a_cutoff_has_one_flag_whose_why_is_its_slip(project):
    """The lead's question is the cutoff: a slipping ETA that puts it at risk is said in the
    deadline flag (one flag, one message), not as a slip flag of its own."""
    Deadline.objects.create(
        project=project, slug="eval", name="blind eval", cutoff=at(26_000), buffer=timedelta(0)
    )
    run = make_run(project, total=20_000, deadline="eval")
    steps = np.arange(2000)
    send(run, steps, healthy_loss(steps), seq=1)
    compute.forecast_compute(run_id=run.pk, now=at(2000))
    halve_pace(run)  # 18,000 steps at 2 s: a finish near 38,000 s, the cutoff at 26,000 s
    assert not Flag.objects.filter(run=run, kind="slip").exists()
    flag = Flag.objects.get(run=run, kind="deadline", state="raised")
    assert "blind eval" in flag.explanation and "; finish slipped from" in flag.explanation
    assert flag.data["slip"]["amount_s"] > 3600


def test_it_marks_a_silent_run_crashed(project):
    run = make_run(project)
    for i in range(20):
        steps = np.arange(i * 10, (i + 1) * 10)
        send(run, steps, healthy_loss(steps), seq=i + 1)
    liveness.run_check_liveness(run_id=run.pk, now=timezone.now())
    assert Run.objects.get(pk=run.pk).status == "running"
    liveness.run_check_liveness(run_id=run.pk, now=timezone.now() + timedelta(hours=1))
    assert Run.objects.get(pk=run.pk).status == "crashed"
    assert Flag.objects.get(run=run, kind="stalled").state == "raised"


def test_a_nan_in_a_killed_runs_last_data_is_raised_before_it_looks_crashed(project):
    """The demo's drill: the job is killed seconds after its loss blew up, before a forecast
    saw the NaN. The sweep finds it dead; the NaN, the why, must come first (it came after)."""
    run = make_run(project)
    RunSegment.objects.filter(run=run).update(started_at=at(0))  # on the test's clock
    for i in range(20):
        steps = np.arange(i * 10, (i + 1) * 10)
        loss = healthy_loss(steps)
        if i == 19:
            loss[-3:] = np.nan
        send(run, steps, loss, seq=i + 1)
    later = timezone.now() + timedelta(hours=1)
    liveness.run_check_liveness(run_id=run.pk, now=later)
    liveness.run_check_liveness(run_id=run.pk, now=later + timedelta(minutes=1))
    rows = list(Flag.objects.filter(run=run).order_by("created_at", "id"))
    assert [(f.kind, f.state) for f in rows] == [("nan", "raised"), ("stalled", "raised")]


def test_edge_cases_do_not_break_the_service(project):
    run = make_run(project, total=None)
    send(run, np.array([0, 1]), np.array([np.nan, 5.0]), seq=1)
    assert compute.forecast_compute(run_id=run.pk, now=at(2)) is not None
    assert not Forecast.objects.filter(run=run, kind="eta").exists()
    assert Flag.objects.filter(run=run, kind="nan").exists()
    assert compute.forecast_compute(run_id=999_999) == []


def test_it_updates_a_deadline_flag_when_its_odds_cross_a_band(project):
    run = make_run(project)
    now = timezone.now()
    for p in (0.8, 0.78, 0.6, 0.3):
        cond = conditions.Condition("deadline", f"{p:.0%} likely", 1 - p, None, {"p_on_time": p})
        flags.flags_sync(run=run, conditions=[cond], kinds=("deadline",), now=now)
    rows = Flag.objects.filter(run=run).order_by("id")
    assert [(f.state, f.data["p_on_time"]) for f in rows] == [
        ("raised", 0.8),
        ("updated", 0.6),
        ("updated", 0.3),
    ]


def test_it_keeps_a_deadline_flag_open_while_no_eta_can_be_made(project):
    Deadline.objects.create(
        project=project, slug="eval", name="blind eval", cutoff=at(7000), buffer=timedelta(0)
    )
    run = make_run(project, deadline="eval")
    steps = np.arange(4000)
    send(run, steps, healthy_loss(steps), seq=1)
    later = compute_sustained(run, 4000, windows=4)
    assert selectors.flags_open(run=run)["deadline"].state == "raised"
    # The plan is gone (the job restarted without its total): no ETA can be made.
    Run.objects.filter(pk=run.pk).update(total_steps=None)
    compute.forecast_compute(run_id=run.pk, now=at(later + 10))
    assert "deadline" in selectors.flags_open(run=run)
    # A finished run resolves what it left open, saying why.
    Run.objects.filter(pk=run.pk).update(status=Run.Status.FINISHED, ended_at=at(later + 15))
    compute.forecast_compute(run_id=run.pk, now=at(later + 20))
    assert "deadline" not in selectors.flags_open(run=run)
    resolved = Flag.objects.filter(run=run, kind="deadline").latest("id")
    assert resolved.explanation == "deadline resolved: the run finished"
    assert resolved.data["closed_by_run_end"] is True  # alerts send nothing more for it


def test_a_nan_in_a_dead_runs_last_data_is_raised_once(project):
    """A job that dies seconds after its loss blew up: the end's forecast raises the NaN (so the
    alert says why) and closes it. The forecasts still queued then ran again and raised it anew
    each time: three NaN alerts for the demo's drill where the README promises one."""
    run = make_run(project)
    steps = np.arange(1000)
    loss = healthy_loss(steps)
    loss[990:] = np.nan
    send(run, steps, loss, seq=1)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.CRASHED, ended_at=at(1000))
    for seconds in (1001, 1004, 1014):
        compute.forecast_compute(run_id=run.pk, now=at(seconds))
    states = list(
        Flag.objects.filter(run=run, kind="nan").order_by("id").values_list("state", flat=True)
    )
    assert states == ["raised", "resolved"]
    # A new attempt (a resume) that ends on a NaN again is a new end, judged anew.
    resume = run.current_segment + 1
    RunSegment.objects.create(run=run, number=resume, session="s2", started_at=at(1500))
    Run.objects.filter(pk=run.pk).update(current_segment=resume, ended_at=at(2000))
    compute.forecast_compute(run_id=run.pk, now=at(2001))
    assert Flag.objects.filter(run=run, kind="nan", state="raised").count() == 2


def test_rows_written_in_one_instant_count_once_newest_by_id(project):
    run = make_run(project)
    now = timezone.now()
    for onset in (100, 250):
        cond = conditions.Condition("rise", "loss rising", 1.0, onset)
        flags.flags_sync(run=run, conditions=[cond], kinds=("rise",), now=now)
    open_rows = selectors.open_flags_by_run([run.pk])[run.pk]
    assert [(f.kind, f.state, f.onset_step) for f in open_rows] == [("rise", "updated", 250)]
    assert selectors.flags_open(run=run)["rise"].onset_step == 250


def test_a_nan_the_job_died_of_is_raised_before_its_flags_close(project):
    run = make_run(project)
    steps = np.arange(400)
    loss = healthy_loss(steps)
    loss[-3:] = np.nan  # the loss blew up and the job died seconds later: no forecast saw it
    send(run, steps, loss, seq=1)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.CRASHED, ended_at=at(400))
    compute.forecast_compute(run_id=run.pk, now=at(401))
    rows = list(
        Flag.objects.filter(run=run, kind="nan").order_by("id").values_list("state", flat=True)
    )
    assert rows == ["raised", "resolved"]  # the alert says why; the crash closes it


def test_a_nan_a_forecast_raised_before_the_crash_is_not_raised_again_by_the_end(project):
    """The demo's drill: a forecast raised the NaN (4 values), the run crashed and the end
    closed it, then the end's look at the final data raised it again (41 values)."""
    run = make_run(project)
    RunSegment.objects.filter(run=run).update(started_at=at(0))  # on the test's clock
    steps = np.arange(1000)
    loss = healthy_loss(steps)
    loss[990:] = np.nan
    send(run, steps[:994], loss[:994], seq=1)
    compute.forecast_compute(run_id=run.pk, now=at(994))
    send(run, steps[994:], loss[994:], seq=2)  # more NaN, then the job dies
    # The sweep finds it dead and closes its flags before the end's forecast looks.
    Run.objects.filter(pk=run.pk).update(status=Run.Status.CRASHED, ended_at=at(1000))
    flags.flags_close(run=Run.objects.get(pk=run.pk), reason="the run crashed", now=at(1000))
    compute.forecast_compute(run_id=run.pk, now=at(1001))
    rows = list(
        Flag.objects.filter(run=run, kind="nan").order_by("id").values_list("state", flat=True)
    )
    assert rows == ["raised", "resolved"]


def test_a_slip_that_leaves_the_cutoff_safe_raises_nothing(project):
    Deadline.objects.create(
        project=project, slug="far", name="far away", cutoff=at(10 * 86400), buffer=timedelta(0)
    )
    run = make_run(project, total=20_000, deadline="far")
    steps = np.arange(2000)
    send(run, steps, healthy_loss(steps), seq=1)
    compute.forecast_compute(run_id=run.pk, now=at(2000))
    halve_pace(run)
    assert not Flag.objects.filter(run=run, kind__in=["slip", "deadline"]).exists()


def test_an_early_eta_raises_a_deadline_flag_only_when_the_run_is_likely_late(project):
    """An early forecast (a few intervals seen) is wide by design: its 70% says how little is
    known. It raises only below 50%; the same odds from a settled forecast do raise."""
    from forecasting.estimators.eta import EtaForecast

    Deadline.objects.create(
        project=project, slug="eval", name="blind eval", cutoff=at(7000), buffer=timedelta(0)
    )
    run = make_run(project, deadline="eval")

    def eta(p50: float, *, early: bool) -> EtaForecast:
        # Finish P10/P50/P90 around p50 seconds from now (t = 1,000 s), log-spread 0.3.
        lo, hi = p50 * np.exp(-0.3), p50 * np.exp(0.3)
        return EtaForecast(
            now=T0 + 1000, current_step=500, total_steps=10_000, rate_steps_per_s=1.0,
            compute_p10=lo, compute_p50=p50, compute_p90=hi, wall_p10=lo, wall_p50=p50,
            wall_p90=hi, interruptions_seen=0, downtime_s=0.0, lost_steps=0.0, early=early,
        )  # fmt: skip

    def conditions(forecast: EtaForecast) -> tuple[list[conditions.Condition], float]:
        return compute._deadline_condition(run=run, eta=forecast, last_step=500, now=at(1000))

    # 6,000 s left; a P50 of 5,000 s with this spread is about 73% on time.
    unsure, odds = conditions(eta(5000.0, early=True))
    assert 0.5 < odds < 0.9 and unsure == []
    settled, odds = conditions(eta(5000.0, early=False))
    assert 0.5 < odds < 0.9 and [c.kind for c in settled] == ["deadline"]
    # Its words follow the odds: "will likely miss" beside "73% likely on time" was a
    # contradiction on the run page.
    assert "is at risk of missing blind eval" in settled[0].explanation
    # The fix for 90% in the one wording of the board, the card and the message ("+141%
    # speed", not "140% more throughput").
    needed = fmt.speedup(settled[0].data["speedup_for_p90"])
    assert f"for 90% it needs {needed} or " in settled[0].explanation
    # Likely late even for an early forecast: raised.
    late, odds = conditions(eta(9000.0, early=True))
    assert odds < 0.5 and [c.kind for c in late] == ["deadline"]
    assert "will likely miss blind eval" in late[0].explanation


@pytest.mark.django_db(transaction=True)
def test_a_computation_that_dies_after_its_first_row_leaves_none_of_its_rows(project, monkeypatch):
    """A worker killed mid-computation left only its ETA row (issue 24 item 7): a computation's
    rows are stored together or not at all, and its rerun stores them whole."""
    run = make_run(project)
    steps = np.arange(4000)
    send(run, steps, healthy_loss(steps), seq=1)
    compute.forecast_compute(run_id=run.pk, now=at(4000))
    more = np.arange(4000, 4100)
    send(run, more, healthy_loss(more), seq=2)
    rows = (Forecast.objects.count(), ConditionReading.objects.count(), Flag.objects.count())
    real_forecast_loss = compute.forecast_loss
    stored_before_the_kill = []

    def killed(*args, **kwargs):
        # The loss estimator runs after the computation stored its ETA.
        stored_before_the_kill.extend(
            Forecast.objects.filter(run=run, input_last_step=4099).values_list("kind", flat=True)
        )
        raise RuntimeError("the worker was killed")

    monkeypatch.setattr(compute, "forecast_loss", killed)
    with pytest.raises(RuntimeError, match="the worker was killed"):
        compute.forecast_compute(run_id=run.pk, now=at(4100))
    assert stored_before_the_kill == ["eta"]
    assert (
        Forecast.objects.count(),
        ConditionReading.objects.count(),
        Flag.objects.count(),
    ) == rows

    monkeypatch.setattr(compute, "forecast_loss", real_forecast_loss)
    compute.forecast_compute(run_id=run.pk, now=at(4100))
    kinds = Forecast.objects.filter(run=run, input_last_step=4099).values_list("kind", flat=True)
    assert sorted(kinds) == ["eta", "loss"]


def test_an_onset_between_logged_steps_reads_the_same_on_the_chart_and_in_the_email(
    client, owner, project
):
    """Seen: onset 2497 on the chart (the flag's onset_step, cut by int()) and 2,498 in the
    email (the data's 2497.6, rounded)."""
    from alerts.messages import context_for

    run = make_run(project)
    spike = conditions.Condition(
        "spike", "Loss spiked", 3.0, 2497.6, {"onset_step": 2497.6, "rollback_step": 2400.0}
    )
    (flag,) = flags.flags_sync(run=run, conditions=[spike], kinds=("spike",), now=at(3000))
    assert flag.onset_step == 2498
    ctx = context_for(
        run=run, kind="spike", event="raised", severity="warning", flag=flag, at=at(3000)
    )
    assert ctx["d"]["onset"] == "2,498"
    client.force_login(owner)
    markers = client.get(f"/runs/{project.slug}/{run.public_id}/overview.json").json()["markers"]
    assert [m["step"] for m in markers if m["kind"] == "onset"] == [2498]
