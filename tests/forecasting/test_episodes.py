"""Loss divergences as episodes, on the real database: the blow-up of an LR x100 jump that
settles nine times higher (issue 22), replayed point by point with a forecast every few steps."""

from __future__ import annotations

import math

import numpy as np
import pytest

from forecasting import compute
from forecasting.estimators import episodes as ep
from forecasting.estimators.formatting import money, span
from forecasting.models import Flag
from tests.forecasting.test_services import T0, at, make_run
from tracker.services import EventIn, SeriesIn, batch_ingest

pytestmark = pytest.mark.django_db

ONSET = 2500
LOSS_KINDS = tuple(k for k in Flag.DIVERGENCE_KINDS)


def blown_up(
    steps: np.ndarray, *, settle: float = 3.3, recover: bool = False, again: int | None = None
) -> np.ndarray:
    """0.37 before the jump; ~80 for a few steps, then settled at `settle` (or back to ~0.37);
    `again`: a second blow-up to ~80 at that step."""
    rng = np.random.default_rng(7)
    base = 0.37 * (1 + 0.5 * np.exp(-steps / 400)) * np.exp(rng.normal(0, 0.02, steps.size))
    after = steps >= ONSET
    level = np.where(steps < ONSET + 15, 80.0, 0.37 if recover else settle)
    if again is not None:
        level = np.where((steps >= again) & (steps < again + 15), 80.0, level)
    return np.where(after, level * np.exp(rng.normal(0, 0.03, steps.size)), base)


def replay(run, steps: np.ndarray, loss: np.ndarray, *, every: int = 20) -> list[set[str]]:
    """Log `every` points per batch (checkpoints every 100 steps) and forecast after each;
    return the open loss flags' kinds after each forecast."""
    seen = []
    for seq, lo in enumerate(range(0, steps.size, every), start=1):
        s = steps[lo : lo + every]
        events = [
            EventIn("checkpoint", int(c), at(float(c)), {"path": f"ckpt/{c}"})
            for c in s
            if c % 100 == 0 and c > 0
        ]
        series = [SeriesIn("loss", s, loss[lo : lo + every], T0 + s.astype(float))]
        batch_ingest(run=run, session="s1", seq=seq, series=series, events=events, heartbeat=None)
        compute.forecast_compute(run_id=run.pk, now=at(float(s[-1]) + 1))
        seen.append(_open_loss_kinds(run))
    return seen


def _open_loss_kinds(run) -> set[str]:
    from forecasting import selectors

    return {k for k in selectors.flags_open(run=run) if k in LOSS_KINDS}


def test_the_reference_is_the_run_before_the_onset_not_the_diverged_stretch():
    steps = np.arange(3000)
    loss = blown_up(steps)
    ref = ep.reference_before(steps, loss, ONSET)
    assert ref is not None and ref.value == pytest.approx(0.37, rel=0.05)
    j = ep.judge(steps, loss, ref)
    assert j is not None and j.state == "diverged" and j.ratio == pytest.approx(3.3 / 0.37, rel=0.1)
    back = ep.judge(steps, blown_up(steps, recover=True), ref)
    # Back from the third good point on: the recent level is a median of five.
    assert back is not None and back.state == "recovered" and back.since_step == ONSET + 17
    spiking = ep.judge(steps[: ONSET + 10], loss[: ONSET + 10], ref)
    assert spiking is not None and spiking.state == "spiking"
    coming = ep.judge(steps[: ONSET + 25], blown_up(steps, recover=True)[: ONSET + 25], ref)
    assert coming is not None and coming.state == "recovering"


def _noisy_decay(steps: np.ndarray, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return 2.0 * (1 + steps / 200.0) ** -0.3 * np.exp(rng.normal(0, 0.03, steps.size))


def test_the_onset_of_a_growing_oscillation_is_searched_back_to_where_it_began():
    """The oscillation test fires on its second window, 100 points into swings that began
    earlier: the episode's onset (and so its rollback) is where the spread began to grow."""
    steps, start = np.arange(3000), 1500
    for seed in range(5):
        loss = _noisy_decay(steps, seed)
        d = np.maximum(steps - start, 0)
        loss = loss * np.exp(0.002 * d * np.sin(2 * np.pi * d / 40))
        # As the oscillation test says it: the start of its second window, 100 points before
        # the last point it read.
        found = ep.onset_search(steps[:1750], loss[:1750], 1650.0)
        # The checkpoint to roll back to (every 100 steps, strictly before the onset) is the
        # one before the swings began (1,600 from the test's own onset), and not far before.
        rollback = 100 * ((found - 1) // 100)
        assert rollback == start, (seed, found)


def test_a_sharp_blow_up_keeps_its_onset():
    steps = np.arange(3000)
    loss = _noisy_decay(steps, 3)
    loss[steps >= 2000] *= 9.0
    assert ep.onset_search(steps[:2030], loss[:2030], 2000.0) == pytest.approx(2000.0, abs=5)
    # Never later than the detectors' onset, never before an earlier episode's recovery.
    assert ep.onset_search(steps[:2030], loss[:2030], 1990.0) <= 1990.0
    assert ep.onset_search(steps, loss, 2600.0, not_before=2500.0) >= 2500.0


def test_a_blow_up_that_settles_higher_stays_one_open_flag_to_the_end(project, client, member):
    run = make_run(project, total=6000)
    steps = np.arange(4000)
    seen = replay(run, steps, blown_up(steps, again=3300))
    first = next(i for i, kinds in enumerate(seen) if kinds)
    assert first * 20 <= ONSET + 40  # detected within two batches of the jump
    # Never shown healthy while diverged: a loss flag is open after every forecast from then on.
    assert all(seen[first:])
    rows = list(Flag.objects.filter(run=run, kind__in=LOSS_KINDS).order_by("created_at", "id"))
    # One episode: one raise, escalated in the same flag, never resolved and raised again.
    assert [r.state for r in rows].count("raised") == 1
    assert "resolved" not in [r.state for r in rows]
    # Every row of the episode advises the checkpoint before the onset, never one inside it.
    assert {r.data.get("rollback_step") for r in rows} == {2400.0}
    assert {r.onset_step for r in rows} <= {ONSET, ONSET - 1}
    assert rows[-1].data["episode"]["state"] == "diverged"
    assert "has not come back" in rows[-1].explanation
    # The second blow-up joins the episode as news (an update the alert gate always sends).
    again = [r for r in rows if len(r.data["episode"].get("blowups", [])) == 2]
    assert again and again[0].state == "updated"
    assert "It blew up again at step 3,30" in again[0].explanation

    # The run ends still diverged: the record says so.
    from django.utils import timezone

    from tracker.models import Run

    Run.objects.filter(pk=run.pk).update(status=Run.Status.FINISHED, ended_at=timezone.now())
    compute.forecast_compute(run_id=run.pk, now=at(4100))
    closed = Flag.objects.filter(run=run, kind__in=LOSS_KINDS).order_by("-created_at", "-id")[0]
    assert closed.state == "resolved" and "never recovered" in closed.explanation
    assert closed.data["closed_by_run_end"] is True
    # ... and so does the end-of-run message the lead gets.
    from alerts.messages import context_for, render

    run.refresh_from_db()
    ctx = context_for(run=run, kind="finished", event="ended", severity="info", flag=None, at=at(0))
    # Its loss (3.3) stands above anything before the onset (0.56 at step 0): all of the
    # 3,999 s of training is undone, at 64 GPUs x 2.50 an hour.
    assert render(ctx, {}).headline.endswith(
        "— diverged at step 2,500, not recovered; above its level at the start (step 0):"
        " all 1.1 h of training undone (≈ $178)"
    )
    # ... and the run's page: its loss card, not "healthy".
    client.force_login(member)
    page = client.get(f"/runs/{run.project.slug}/{run.public_id}/").content.decode()
    card = page[page.index("<h4>Loss") :][:600]
    assert '<div class="big">diverged</div>' in card and "never recovered" in card


def test_a_spike_that_comes_back_resolves_once_back_for_a_sustained_stretch(project):
    run = make_run(project, total=6000)
    steps = np.arange(3200)
    seen = replay(run, steps, blown_up(steps, recover=True))
    assert any(seen) and not seen[-1]  # raised, then closed
    rows = list(Flag.objects.filter(run=run, kind__in=LOSS_KINDS).order_by("created_at", "id"))
    assert [r.state for r in rows].count("raised") == 1
    resolved = [r for r in rows if r.state == "resolved"]
    assert len(resolved) == 1 and "recovered from the blow-up at step" in resolved[0].explanation
    # How long it lasted and, at the run's rate, what it cost (issue 22, item 4).
    assert "It lasted " in resolved[0].explanation


def test_a_run_without_a_world_size_is_priced_on_one_process_and_says_so(project):
    """The board prices a run that reports no world size as one process ("1 process
    assumed"); the episode's costs did not price it at all. One rule: the flag, its undone
    training and the alert's facts all carry the cost, each saying it is assumed."""
    from alerts.messages import context_for, render
    from tracker.models import ASSUMED_PROCESSES_NOTE, Run

    run = make_run(project, total=6000)
    Run.objects.filter(pk=run.pk).update(world_size=None)
    run.refresh_from_db()
    steps = np.arange(3000)
    replay(run, steps, falling_then_blown_up(steps))
    flag = Flag.objects.filter(run=run, kind__in=LOSS_KINDS).order_by("-created_at", "-id")[0]
    episode = flag.data["episode"]
    assert flag.data["cost"] == pytest.approx(flag.data["wasted_s"] / 3600 * 1 * 2.5)
    assert episode["undone_cost"] == pytest.approx(episode["undone_s"] / 3600 * 1 * 2.5)
    assert f"in GPU cost ({ASSUMED_PROCESSES_NOTE})." in flag.explanation
    assert f"at the run's rate, {ASSUMED_PROCESSES_NOTE})." in flag.explanation
    ctx = context_for(
        run=run, kind=flag.kind, event="raised", severity="warning", flag=flag, at=at(0)
    )
    facts = dict(render(ctx, {}).facts)
    assert facts["Cost since onset"].endswith(f"({ASSUMED_PROCESSES_NOTE})")


def test_a_spike_back_under_a_loss_still_falling_fast_is_recovered():
    # A warm-down drops the loss ~40% over the last twenty points: a trend, not a swing (it
    # held 37 of 49 spikes injected into modded-nanogpt curves open to the runs' ends).
    steps = np.arange(1200)
    rng = np.random.default_rng(3)
    loss = 3.5 * np.exp(rng.normal(0, 0.01, steps.size))
    loss[(steps >= 1000) & (steps < 1010)] = 20.0
    fall = steps >= 1180
    loss[fall] *= np.exp(-0.5 * (steps[fall] - 1180) / 20)
    ref = ep.reference_before(steps, loss, 1000)
    assert ref is not None
    j = ep.judge(steps, loss, ref)
    assert j is not None and j.state == "recovered", j


def test_a_run_that_ends_with_its_loss_just_back_did_not_end_diverged(project):
    """Back inside its band for fewer points than a recovery asks when the run ends (a sparse
    validation loss may never have twenty left): the flag closes saying the loss was back."""
    from django.utils import timezone

    from forecasting import selectors
    from tracker.models import Run

    run = make_run(project, total=6000)
    steps = np.arange(ONSET + 30)
    replay(run, steps, blown_up(steps, recover=True), every=10)
    assert _open_loss_kinds(run)  # still open: back for 15 points only
    Run.objects.filter(pk=run.pk).update(status=Run.Status.FINISHED, ended_at=timezone.now())
    compute.forecast_compute(run_id=run.pk, now=at(ONSET + 100))
    closed = Flag.objects.filter(run=run, kind__in=LOSS_KINDS).order_by("-created_at", "-id")[0]
    assert closed.state == "resolved" and closed.data["closed_by_run_end"] is True
    assert "back near its level before it" in closed.explanation
    assert "never recovered" not in closed.explanation
    assert selectors.episode_at_end(run=run) is None  # not "diverged" on the card or board


def test_two_detectors_seeing_one_blow_up_at_once_raise_one_flag():
    # After the hysteresis, two kinds of one episode (the same reference onset) raised two flags
    # (tinygpt noclip x1.005: a spike and a regression in the same computation), and the
    # second's escalation was held as a repeat. One flag, the first's kind, the worse news.
    from forecasting import episodes
    from forecasting.conditions import Condition

    def found(kind: str, onset: float, state: str) -> Condition:
        episode = {"reference": {"onset_step": onset}, "state": state}
        return Condition(kind, kind, 1.0, onset, {"episode": episode})

    other = Condition("deadline", "odds", 0.5, None, {})
    out = episodes.one_flag_each(
        [found("spike", 2645.0, "spiking"), found("regression", 2645.0, "diverged"), other]
    )
    assert [(c.kind, c.data["episode"]["state"]) for c in out[:1]] == [("spike", "diverged")]
    assert out[1:] == [other]
    # Two episodes (two onsets) stay two.
    assert (
        len(
            episodes.one_flag_each(
                [found("spike", 10.0, "spiking"), found("rise", 900.0, "spiking")]
            )
        )
        == 2
    )


def test_a_decaying_spike_told_and_resolved_is_not_raised_again(project, monkeypatch):
    """Its onset, searched back on each computation, moves by a point or two as the points
    arrive (made to move here on every computation, as noise does on a real curve); the
    detectors keep the spike in view for 200 points: the same episode, told once."""
    search = ep.onset_search

    def moving(steps, values, onset, not_before=None):  # type: ignore[no-untyped-def]
        found = search(steps, values, onset, not_before)
        return found - len(values) % 7

    monkeypatch.setattr(ep, "onset_search", moving)
    run = make_run(project, total=6000)
    steps = np.arange(3200)
    d = np.maximum(steps - ONSET, 0)
    loss = _noisy_decay(steps, 11) * np.where(steps >= ONSET, 1 + 5 * np.exp(-d / 30), 1.0)
    seen = replay(run, steps, loss)
    assert any(seen) and not seen[-1]
    states = list(
        Flag.objects.filter(run=run, kind__in=LOSS_KINDS)
        .order_by("created_at", "id")
        .values_list("state", flat=True)
    )
    assert states.count("raised") == 1 and states[-1] == "resolved", states


def test_an_oscillation_about_the_old_level_is_not_a_recovery():
    # Its median stands at the level before the onset, its swings grow to x3 either way: the
    # median alone read it as back (a Nemotron replay hid 35,600 s that way).
    steps = np.arange(3000)
    loss = blown_up(steps, recover=True)
    after = steps >= ONSET
    swing = np.linspace(0.1, 1.1, int(after.sum())) * np.sign(np.sin(steps[after] * 1.3))
    loss = np.where(after, 0.37 * np.exp(np.concatenate([np.zeros((~after).sum()), swing])), loss)
    ref = ep.reference_before(steps, loss, ONSET)
    assert ref is not None
    j = ep.judge(steps, loss, ref)
    assert j is not None and j.state == "diverged"
    # A spike alarm amid its swings is the episode going on, not another blow-up to send;
    # one from a loss settled (at any level) is.
    assert not ep.calm_before(steps, loss, 2900.0, ref)
    settled = blown_up(steps)
    assert ep.calm_before(steps, settled, 2900.0, ref)
    # A slow swing (a period of 50 points): twenty points of its rising side are a line; the
    # reference's fifty are a swing.
    slow = np.where(after, 0.37 * np.exp(0.3 * np.sin(2 * np.pi * steps / 50)), loss)
    assert not ep.calm_before(steps, slow, 2912.0, ref)


def test_a_finding_whose_loss_never_left_the_band_is_no_episode_yet():
    steps = np.arange(3000)
    loss = blown_up(steps, recover=True)
    ref = ep.reference_before(steps, loss, ONSET - 300)  # before the blow-up: it left
    assert ref is not None and ep.judge(steps, loss, ref).left  # type: ignore[union-attr]
    calm = ep.judge(steps[: ONSET - 100], loss[: ONSET - 100], ref)
    assert calm is not None and not calm.left and calm.state == "recovered"


def test_one_point_far_outside_its_noise_has_left_the_band():
    """A single point at x4 moves a median of five not at all, and is what the spike detector
    pages on purpose: it is an episode (asking the median alone lost 30% of injected spikes)."""
    rng = np.random.default_rng(3)
    steps = np.arange(600)
    loss = 0.5 * np.exp(rng.normal(0.0, 0.01, steps.size))
    ref = ep.reference_before(steps, loss, 500)
    assert ref is not None
    calm = ep.judge(steps, loss, ref)
    assert calm is not None and not calm.left
    spiked = loss.copy()
    spiked[520] *= 4.0
    j = ep.judge(steps, spiked, ref)
    assert j is not None and j.left and j.state == "recovered"


# --- "back at its level of ...": the training a blow-up undid (issue 22, item 3)

BACK_ONSET = 2510


def falling_then_blown_up(steps: np.ndarray, *, bad_batch: bool = False) -> np.ndarray:
    """A loss falling from ~8 to 0.37 (it stood at 3.3 near step 143), blown up at step 2,510 to
    ~80 for 15 steps and settled at 3.3; with `bad_batch`, one batch of 5.0 at step 1,800."""
    rng = np.random.default_rng(11)
    loss = (0.37 + 7.6 * np.exp(-steps / 150)) * np.exp(rng.normal(0, 0.02, steps.size))
    if bad_batch:
        loss[steps == 1800] = 5.0
    after = steps >= BACK_ONSET
    level = np.where(steps < BACK_ONSET + 15, 80.0, 3.3)
    return np.where(after, level * np.exp(rng.normal(0, 0.03, steps.size)), loss)


def step_at(level: float) -> float:
    """Where the noiseless falling curve stands at `level`."""
    return -150 * math.log((level - 0.37) / 7.6)


def _judged(steps: np.ndarray, loss: np.ndarray) -> ep.Judgement:
    ref = ep.reference_before(steps, loss, BACK_ONSET)
    assert ref is not None
    j = ep.judge(steps, loss, ref)
    assert j is not None
    return j


def test_back_at_names_the_last_step_before_the_onset_where_the_loss_stood_this_high():
    steps = np.arange(3000)
    loss = falling_then_blown_up(steps, bad_batch=True)
    j = _judged(steps, loss)
    times = 1.76e9 + 2.0 * steps
    found = ep.back_at(steps, loss, times, level=math.log(j.level_value), onset_step=BACK_ONSET)
    assert found is not None and not found.beyond
    # Near step 143, where the falling loss stood at 3.3: not 1,800, where one batch of 5.0
    # stood higher (the smoothed level is a median of five).
    assert abs(found.step - step_at(j.level_value)) <= 5
    assert found.time == pytest.approx(1.76e9 + 2.0 * found.step)
    assert found.undone_steps == 2999 - found.step
    assert found.undone_s == pytest.approx(2.0 * (2999 - found.step))


def test_back_at_without_times_counts_steps_only():
    steps = np.arange(3000)
    loss = falling_then_blown_up(steps)
    level = math.log(_judged(steps, loss).level_value)
    for times in (None, np.full(steps.size, np.nan)):
        found = ep.back_at(steps, loss, times, level=level, onset_step=BACK_ONSET)
        assert found is not None and found.time is None and found.undone_s is None
        assert found.undone_steps == 2999 - found.step and found.step < 200


def test_back_at_above_every_level_before_the_onset_is_the_start():
    # Loss 80 is more than it ever was (8 at step 0): all the training since the start is undone.
    steps = np.arange(2520)
    loss = falling_then_blown_up(steps)
    j = _judged(steps, loss)
    assert j.state == "spiking" and j.level_value > 60
    found = ep.back_at(steps, loss, None, level=math.log(j.level_value), onset_step=BACK_ONSET)
    assert found is not None and found.beyond and found.step == 0
    assert found.undone_steps == 2519


def test_back_at_is_nothing_when_the_loss_stands_no_higher_than_just_before_the_onset():
    steps = np.arange(3000)
    loss = falling_then_blown_up(steps)
    # Below everything before; at the level of the points just before the onset, which its
    # noise crosses (the smoothed level stood at 0.37 four steps before the onset).
    for level in (0.3, 0.37):
        assert ep.back_at(steps, loss, None, level=math.log(level), onset_step=BACK_ONSET) is None
    assert ep.back_at(steps, loss, None, level=math.log(3.3), onset_step=0) is None


def test_the_episode_flag_says_what_training_the_blow_up_undid(project):
    run = make_run(project, total=6000)  # 64 GPUs; the project pays 2.50 a GPU-hour
    steps = np.arange(3000)
    replay(run, steps, falling_then_blown_up(steps))
    rows = list(Flag.objects.filter(run=run, kind__in=LOSS_KINDS).order_by("created_at", "id"))
    # Raised while the loss stood at ~80: above anything before, so everything is undone.
    spiking = rows[0].data["episode"]
    assert spiking["state"] == "spiking" and spiking["back_at_beyond"] is True
    assert "is above its level at the start (step 0): all " in rows[0].explanation
    # Escalated once it settled at 3.3: its level near step 143, some 40 min earlier.
    diverged = next(r for r in rows if r.data["episode"]["state"] == "diverged")
    episode = diverged.data["episode"]
    step = episode["back_at_step"]
    assert episode["back_at_beyond"] is False and abs(step - step_at(episode["level"])) <= 5
    last = diverged.created_at.timestamp() - T0 - 1  # forecast 1 s after its batch's last step
    undone = last - step  # the replay logs step s at T0 + s
    cost = undone / 3600 * 64 * 2.5
    assert episode["undone_s"] == pytest.approx(undone)
    assert episode["undone_cost"] == pytest.approx(cost)
    assert (
        f" Loss {episode['level']:.4g} is its level at step {step:,.0f}: {span(undone)} of"
        f" training undone (≈ {money(cost)} at the run's rate)."
    ) in diverged.explanation

    # The run ends diverged: the closing row says what the whole episode undid, and so does
    # the end-of-run message.
    from django.utils import timezone

    from alerts.messages import context_for, render
    from tracker.models import Run

    Run.objects.filter(pk=run.pk).update(status=Run.Status.FINISHED, ended_at=timezone.now())
    compute.forecast_compute(run_id=run.pk, now=at(3100))
    closed = Flag.objects.filter(run=run, kind__in=LOSS_KINDS).order_by("-created_at", "-id")[0]
    end = closed.data["episode"]
    assert abs(end["back_at_step"] - step_at(end["level"])) <= 5
    assert end["undone_s"] == pytest.approx(2999 - end["back_at_step"])
    assert closed.explanation.endswith(
        f"never recovered. Loss {end['level']:.4g} is its level at step"
        f" {end['back_at_step']:,.0f}: {span(end['undone_s'])} of training undone"
        f" (≈ {money(end['undone_cost'])} at the run's rate)."
    )
    run.refresh_from_db()
    ctx = context_for(run=run, kind="finished", event="ended", severity="info", flag=None, at=at(0))
    message = render(ctx, {})
    assert message.headline.endswith(
        f"not recovered; back at its level of step {end['back_at_step']:,.0f}:"
        f" {span(end['undone_s'])} of training undone (≈ {money(end['undone_cost'])})"
    )
    assert ("Training undone", span(end["undone_s"])) in message.facts
