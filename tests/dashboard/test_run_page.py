from __future__ import annotations

import re
from datetime import UTC, timedelta

import numpy as np
import pytest
from django.utils import timezone

from dashboard.pages import CONFIG_ROWS_SHOWN, RunPage, config_rows
from tests.dashboard.factories import (
    T0,
    ended_inside,
    episode,
    episode_recovered,
    flag,
    forecast,
    forecast_set,
    make_run,
)
from tracker.models import Event, Run
from tracker.selectors import loss_key_for, series_last, throughput_view
from tracker.services import EventIn, SeriesIn, batch_ingest, from_epoch, run_finish, run_start

pytestmark = pytest.mark.django_db

RUN_URLS = (
    "/runs/llm/r/",
    "/runs/llm/r/summary/",
    "/runs/llm/r/series.json?key=loss",
    "/runs/llm/r/throughput.json",
    "/runs/llm/r/overview.json",
    "/projects/llm/compare/?run=r",
)


@pytest.fixture
def run(project):
    run = make_run(project, "r", points=2000, chunk=500)
    forecast_set(run, timezone.now(), finish_in=7200)
    flag(run, "spike", onset=1500, rollback_step=1000, cost=12.5)
    return run


@pytest.mark.parametrize("url", RUN_URLS)
def test_every_run_url_is_404_for_an_outsider(client, outsider, other_project, run, url):
    client.force_login(outsider)
    assert client.get(url).status_code == 404


@pytest.mark.parametrize("url", RUN_URLS)
def test_every_run_url_asks_anonymous_to_log_in(client, run, url):
    assert client.get(url).status_code == 302


@pytest.mark.parametrize("url", RUN_URLS)
def test_every_run_url_serves_a_viewer(client, viewer, run, url):
    client.force_login(viewer)
    assert client.get(url).status_code == 200


def test_run_page_answers_finish_loss_and_cost(client, member, run):
    client.force_login(member)
    html = client.get("/runs/llm/r/").content.decode()
    assert "Finish" in html and "1 open flag" in html
    assert "Roll back to the checkpoint at step 1000" in html
    assert "spike explained" in html  # open flag and history
    assert 'data-loss-key="loss"' in html
    assert "GPU·h on 8 GPUs" in html


def test_a_deleted_run_s_page_says_so_and_until_when_it_can_be_restored(
    client, member, run, settings
):
    """Reached by its URL, a soft-deleted run's page read like a live one's."""
    client.force_login(member)
    assert 'id="run-deleted"' not in client.get("/runs/llm/r/").content.decode()
    settings.RUNCAST_DELETED_RUN_KEEP_DAYS = 30
    deleted = timezone.now()
    Run.objects.filter(pk=run.pk).update(deleted_at=deleted)
    html = client.get("/runs/llm/r/").content.decode()
    notice = html[html.index('id="run-deleted"') :][:700]
    until = deleted + timedelta(days=30)
    assert f'datetime="{until.astimezone(UTC).isoformat()}"' in notice
    assert "restore it until" in notice and "?deleted=1" in notice


def test_run_page_prices_a_run_without_a_world_size_as_one_process_and_says_so(
    client, member, project
):
    make_run(project, "solo", points=200, world_size=None)
    client.force_login(member)
    html = client.get("/runs/llm/solo/summary/").content.decode()
    cost = html.split("<h4>Cost</h4>")[1].split('<div class="card">')[0]
    assert "on 1 process (assumed: the run did not report its world size)" in cost
    assert '<div class="big muted">\N{EN DASH}</div>' not in cost


def test_a_finished_run_says_what_loss_it_ended_at(
    client, member, project, django_assert_max_num_queries
):
    run = make_run(project, "done", points=2000, chunk=500)
    run_finish(run=run, status="finished", ended_at=timezone.now())
    client.force_login(member)
    with django_assert_max_num_queries(14):  # the run page's 12, and the loss's last chunks
        html = client.get("/runs/llm/done/summary/").content.decode()
    # The median of its last 50 points (steps 1950-1999 of 3 + exp(-step / 5000)), not a forecast.
    assert "ended at 3.674 at step 1,999" in html
    assert "→" not in html.split("final-loss")[0].split("<h4>Loss")[1]


def test_run_page_queries_are_bounded(client, member, run, django_assert_max_num_queries):
    client.force_login(member)
    # A constant per panel, whatever the run's size: session, user, membership, run, forecasts,
    # open flags, flag history, chunk index, the run's GPU processes (cost split), whether ranks
    # reported (the Ranks panel) and the project's deadlines (the plan form); the page alone
    # also reads the datasets an MLflow run logged (the Files panel; its files are on disk).
    with django_assert_max_num_queries(13):
        assert client.get("/runs/llm/r/").status_code == 200
    with django_assert_max_num_queries(12):  # the same panels, refreshed
        assert client.get("/runs/llm/r/summary/").status_code == 200
    with django_assert_max_num_queries(14):
        assert client.get("/runs/llm/r/overview.json").status_code == 200
    with django_assert_max_num_queries(7):
        assert client.get("/runs/llm/r/throughput.json").status_code == 200


@pytest.mark.parametrize("points", [2_000, 40_000])
def test_chart_json_queries_do_not_grow_with_points(
    client, member, project, points, django_assert_max_num_queries
):
    make_run(project, "big", points=points, chunk=1000)
    client.force_login(member)
    with django_assert_max_num_queries(7):
        assert client.get("/runs/llm/big/series.json?key=loss&buckets=500").status_code == 200
    with django_assert_max_num_queries(7):
        data = client.get("/runs/llm/big/throughput.json?buckets=200").json()
    assert data["source"] == ("raw" if points <= 200_000 else "chunks")


def test_overview_carries_eta_history_forecast_fan_and_markers(client, member, project, run):
    batch_ingest(
        run=run,
        session="s",
        seq=99,
        series=[],
        events=[EventIn(Event.Kind.CHECKPOINT, 1000, from_epoch(1.7e9 + 500), {"path": "c/1000"})],
        heartbeat=None,
    )
    client.force_login(member)
    d = client.get("/runs/llm/r/overview.json").json()
    assert len(d["eta_history"]) == 2
    assert d["eta_history"][0][2] < d["eta_history"][1][2]
    fan = d["loss_forecast"]
    assert fan["x"][0] == pytest.approx(1999) and fan["x"][-1] == pytest.approx(100_000)
    assert fan["p50"][-1] == pytest.approx(3.0)
    kinds = {(m["kind"], m["step"]) for m in d["markers"]}
    assert {("checkpoint", 1000.0), ("onset", 1500.0), ("rollback", 1000.0)} <= kinds


def _marks(client, run_id: str) -> list[tuple[str, float, str]]:
    markers = client.get(f"/runs/llm/{run_id}/overview.json").json()["markers"]
    return [(m["kind"], m["step"], m["label"]) for m in markers if m["kind"] != "checkpoint"]


@pytest.mark.parametrize("earlier", [1, 30])
def test_a_finished_runs_chart_keeps_the_onset_and_rollback_of_its_episodes(
    client, member, project, earlier, django_assert_max_num_queries
):
    # Issue 22: after the run finished, the chart had no onset or rollback marker: they were
    # drawn from the open flags only, and the run's end closes every flag.
    run = make_run(project, "ended", points=10)
    now = timezone.now()
    for i in range(earlier):  # spikes that came back, each its own episode
        onset = 100 + 10 * i
        at = now - timezone.timedelta(hours=2, minutes=-i)
        episode(run, at, kind="spike", onset=onset, rollback=float(onset - 50), state="spiking")
        episode_recovered(run, at + timezone.timedelta(seconds=30), kind="spike", onset=onset)
    t = now - timezone.timedelta(hours=1)
    episode(run, t, state="spiking", ratio=80.0)
    episode(run, t + timezone.timedelta(seconds=15))  # escalated in the same flag: diverged
    ended_inside(run, t + timezone.timedelta(minutes=5))
    client.force_login(member)
    with django_assert_max_num_queries(14):  # as many whatever the number of episodes
        marks = _marks(client, "ended")
    # One marker per onset and per rollback, though its rows raised, updated and closed it.
    assert [m for m in marks if m[1] >= 2400] == [
        ("rollback", 2400.0, "checkpoint before the regression (not recovered)"),
        ("onset", 2500.0, "regression onset (not recovered)"),
    ]
    assert ("onset", 100.0, "spike onset (recovered)") in marks
    assert ("rollback", 50.0, "checkpoint before the spike (recovered)") in marks
    assert len(marks) == 2 * earlier + 2


def test_an_open_episode_keeps_its_markers_beside_the_closed_ones(client, member, project):
    run = make_run(project, "live", points=10)
    now = timezone.now()
    episode(run, now - timezone.timedelta(hours=1), kind="spike", onset=300, rollback=200.0)
    episode_recovered(run, now - timezone.timedelta(minutes=50), kind="spike", onset=300)
    episode(run, now, kind="spike", onset=900, rollback=800.0, state="spiking")
    client.force_login(member)
    assert _marks(client, "live") == [
        ("rollback", 200.0, "checkpoint before the spike (recovered)"),
        ("onset", 300.0, "spike onset (recovered)"),
        ("rollback", 800.0, "suggested rollback"),
        ("onset", 900.0, "spike onset"),
    ]


def test_the_drill_keeps_where_it_went_nan_across_its_crash_and_resume(client, member, project):
    # The demo's drill (demo/replay.py `drill`): checkpoints, the loss goes NaN, the job dies;
    # it is resumed from the last checkpoint before the NaN and finishes. The resumed attempt
    # re-logs those steps (so the chart's NaN points are gone) and the crash closed the NaN
    # flag: nothing marked where it went NaN any more.
    from forecasting import compute
    from tracker.models import RunSegment

    def at(seconds: float):
        return from_epoch(T0 + seconds)

    run = make_run(project, "drill", points=1000, chunk=500)  # steps 0-999 at 2 a second
    RunSegment.objects.filter(run=run).update(started_at=at(0))  # on the test's clock
    steps = np.arange(1000, 1200)
    checkpoints = [EventIn("checkpoint", s, at(s / 2), {"path": f"ckpt/{s}"}) for s in (400, 800)]
    nan = [SeriesIn("loss", steps, np.full(steps.size, np.nan), T0 + steps / 2)]
    batch_ingest(run=run, session="s", seq=3, series=nan, events=checkpoints, heartbeat=None)
    compute.forecast_compute(run_id=run.pk, now=at(600))
    run = run_finish(run=run, status="crashed", ended_at=at(601))
    compute.forecast_compute(run_id=run.pk, now=at(602))

    run_start(project=project, public_id="drill", session="s2", started_at=at(720), fields={})
    RunSegment.objects.filter(run=run, session="s2").update(started_at=at(720))
    steps = np.arange(801, 2000)
    again = [SeriesIn("loss", steps, 3.0 + np.exp(-steps / 5000), T0 + 720 + (steps - 800) / 2)]
    resumed = [EventIn("resume", 800, at(720), {"checkpoint": "ckpt/800"})]
    batch_ingest(run=run, session="s2", seq=1, series=again, events=resumed, heartbeat=None)
    compute.forecast_compute(run_id=run.pk, now=at(1330))
    run = run_finish(run=run, status="finished", ended_at=at(1340), session="s2")
    compute.forecast_compute(run_id=run.pk, now=at(1341))

    client.force_login(member)
    marks = _marks(client, "drill")
    assert ("onset", 1000.0, "nan onset (not recovered)") in marks
    assert ("rollback", 800.0, "checkpoint before the nan (not recovered)") in marks
    # Resumed from the checkpoint before the NaN, it finished: it did not end inside an episode.
    html = client.get("/runs/llm/drill/summary/").content.decode()
    assert "never recovered" not in html


def test_throughput_is_steps_per_second_from_the_progress_series(member, project):
    run = make_run(project, "fast", points=5000, chunk=250, rate=4.0)
    view = throughput_view(run=run, buckets=50)
    assert view.key == "loss" and view.source == "raw"
    assert view.rate == pytest.approx(4.0)
    assert len(view.x) == 50


def test_throughput_from_chunk_endpoints_matches_raw(member, project, monkeypatch):
    run = make_run(project, "fast", points=20_000, chunk=1000, rate=4.0)
    monkeypatch.setattr("tracker.selectors.THROUGHPUT_RAW_MAX", 100)
    view = throughput_view(run=run, buckets=50)
    assert view.source == "chunks"
    assert view.rate == pytest.approx(4.0)


def test_throughput_ignores_a_resume_rollback(member, project):
    run = make_run(project, "r2", points=1000, chunk=500, rate=2.0)
    run_start(
        project=project, public_id="r2", session="s2", started_at=from_epoch(1.7e9 + 600), fields={}
    )
    import numpy as np

    steps = np.arange(800, 1600, dtype=np.int64)
    times = 1.7e9 + 900 + (steps - 800) / 2.0
    batch_ingest(
        run=run,
        session="s2",
        seq=1,
        series=[SeriesIn("loss", steps, np.full(steps.size, 3.0), times)],
        events=[],
        heartbeat=None,
    )
    view = throughput_view(run=run, buckets=20)
    assert view.rate == pytest.approx(2.0)
    assert view.x.max() <= 1600


def test_the_final_loss_is_the_resumed_segments_and_skips_a_last_nan(project):
    import numpy as np

    run = make_run(project, "r3", points=1000, chunk=500, rate=2.0)  # 3.0 + exp(-s/5000)
    run_start(
        project=project, public_id="r3", session="s2", started_at=from_epoch(1.7e9 + 600), fields={}
    )
    steps = np.arange(800, 1601, dtype=np.int64)  # resumed from step 800, re-logged
    values = np.full(steps.size, 2.5)
    values[-1] = np.nan  # the run's last point: a NaN is a flag's business, not its final loss
    times = 1.7e9 + 900 + (steps - 800) / 2.0
    batch_ingest(
        run=run,
        session="s2",
        seq=1,
        series=[SeriesIn("loss", steps, values, times)],
        events=[],
        heartbeat=None,
    )
    assert series_last(run=run, key="loss") == (1599.0, 2.5)
    assert series_last(run=run, key="no-such-key") is None


def test_compare_overlays_only_this_projects_runs(client, member, project, other_project, run):
    make_run(other_project, "theirs", points=10)
    client.force_login(member)
    html = client.get("/projects/llm/compare/?run=r&run=theirs").content.decode()
    assert '"id": "r"' in html and "theirs" not in html


def _blind_eval_in_8_hours(project):
    from tracker.project_settings.services import deadline_create

    return deadline_create(
        project=project,
        name="Blind eval",
        slug="blind-eval",
        cutoff=timezone.now() + timezone.timedelta(hours=8),
        timezone="UTC",
        buffer=timezone.timedelta(0),
    )


def test_the_deadline_flag_and_the_card_say_the_same_number(client, member, project):
    deadline = _blind_eval_in_8_hours(project)
    run = make_run(project, "late", points=10, deadline=deadline)
    forecast_set(run, timezone.now(), finish_in=12 * 3600, p=0.15)
    flag(run, "deadline", p_on_time=0.19)  # raised when the odds were 19%
    client.force_login(member)
    page = client.get(f"/runs/{project.slug}/late/summary/").content.decode()
    assert "15% likely" in page and "Now 15% likely" in page


@pytest.mark.parametrize(
    ("key", "title"), [("loss", "<h4>Loss</h4>"), ("val_loss", "Loss · val_loss")]
)
def test_the_loss_card_names_its_key_only_when_it_is_not_loss(client, member, project, key, title):
    # The demo's cards read "LOSS · LOSS": the key said again in the title (the service stores
    # the forecast key beside the estimator's figures).
    run = make_run(project, "k", points=10)
    forecast(run, "loss", timezone.now(), p10=2.9, p50=3.0, p90=3.1, smoothed_last=3.2, key=key)
    client.force_login(member)
    page = client.get(f"/runs/{project.slug}/k/summary/").content.decode()
    assert title in page and "Loss · loss" not in page


def test_an_ended_run_is_not_told_to_aim_at_a_deadline(client, member, project):
    # "no deadline · aim it with runcast.init(deadline=…)" is advice for a run still to start or
    # running; on a finished run it only says there was no deadline.
    run = make_run(project, "done", points=10)
    run.status, run.ended_at = "finished", timezone.now()
    run.save(update_fields=["status", "ended_at"])
    client.force_login(member)
    page = client.get(f"/runs/{project.slug}/done/summary/").content.decode()
    assert "no deadline" in page and "runcast.init(deadline" not in page
    make_run(project, "live", points=10)
    assert (
        "runcast.init(deadline"
        in client.get(f"/runs/{project.slug}/live/summary/").content.decode()
    )


def test_the_eta_history_mentions_a_cutoff_only_for_a_run_that_has_one(client, member, project):
    # The demo drill has no deadline, yet its ETA history read "..., against the cutoff".
    deadline = _blind_eval_in_8_hours(project)
    make_run(project, "free", points=10)
    make_run(project, "aimed", points=10, deadline=deadline)
    client.force_login(member)
    assert "against the cutoff" not in client.get(f"/runs/{project.slug}/free/").content.decode()
    assert "against the cutoff" in client.get(f"/runs/{project.slug}/aimed/").content.decode()


def hf_like_config() -> dict:
    """The shape the HF callback sends: every TrainingArguments field and the model config."""
    return {
        "lr": 0.003,
        # 110 fields with names and values as long as TrainingArguments' (16 characters on
        # average; numbers, flags, strings).
        "training_args": {
            f"arg_{i:03d}_{'x' * (i % 20)}": [i * 0.5, i % 2 == 0, f"value-{i}"][i % 3]
            for i in range(110)
        },
        "model": {
            "n_layer": 2,
            "architectures": ["GPT2LMHeadModel"],
            "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
            "id2label": {},
            "bos_token_id": None,
            "name_or_path": "tiny-gpt",
        },
    }


LAST_CONFIG_KEY = "training_args.arg_109_" + "x" * 9


def test_config_rows_flatten_nested_mappings_with_dotted_keys() -> None:
    rows = dict(config_rows(hf_like_config()))
    assert rows["lr"] == "0.003"
    assert (
        rows["training_args.arg_001_x"] == "false" and rows["training_args.arg_002_xx"] == "value-2"
    )
    assert rows["model.n_layer"] == "2"
    assert rows["model.task_specific_params.text-generation.do_sample"] == "true"
    assert rows["model.architectures"] == '["GPT2LMHeadModel"]'
    assert rows["model.id2label"] == "{}" and rows["model.bos_token_id"] == "null"
    assert rows["model.name_or_path"] == "tiny-gpt"  # a string as it is, not '"tiny-gpt"'
    assert len(rows) == 1 + 110 + 7
    assert config_rows([1, 2]) == [("config", "[1, 2]")] and config_rows({}) == []


def test_run_page_shows_the_config_as_rows_and_folds_the_long_tail(client, member, project):
    run = make_run(project, "hf", points=10)
    Run.objects.filter(pk=run.pk).update(config=hf_like_config())
    client.force_login(member)
    html = client.get("/runs/llm/hf/").content.decode()
    panel = html.split("<h3>Config</h3>")[1].split("</section>")[0]
    shown, _, folded = panel.partition('<details class="config-more">')
    assert "<th>lr</th><td><code>0.003</code>" in shown
    # The run's own top-level settings first, then each group, alphabetically (on any database).
    keys = re.findall(r"<th>([^<]+)</th>", panel)
    config_keys = keys[keys.index("lr") :]
    assert config_keys == [k for k, _ in config_rows(hf_like_config())]
    assert config_keys[:2] == ["lr", "model.architectures"]
    assert "training_args.arg_050" not in shown
    assert f"<summary>{118 - CONFIG_ROWS_SHOWN} more config keys</summary>" in folded
    assert "<th>model.task_specific_params.text-generation.max_length</th>" in shown
    assert f"<th>{LAST_CONFIG_KEY}</th>" in folded
    assert "{&#x27;" not in panel  # no dict printed whole


def page_with_keys(keys: list[str]) -> RunPage:
    # The chart's key depends on the keys alone: no outlook needed.
    return RunPage(
        outlook=None,  # type: ignore[arg-type]
        flag_history=[],
        loss_key=loss_key_for(keys),
        keys=sorted(keys),
    )


@pytest.mark.parametrize(
    ("keys", "opens_on"),
    [
        # The HF callback's keys: "epoch" sorts first and is a flat ramp; the eval loss says more.
        (["epoch", "eval_loss", "grad_norm", "loss", "lr"], "eval_loss"),
        (["epoch", "grad_norm", "loss", "lr"], "grad_norm"),
        (["epoch", "grad_norm", "loss", "lr", "tokens_per_sec"], "tokens_per_sec"),
        (["epoch", "grad_norm/h.0", "grad_norm/wte", "loss", "lr-AdamW"], "grad_norm/h.0"),
        (["epoch", "gpu/util", "loss", "lr", "trainer/global_step"], "gpu/util"),
        (["epoch", "loss", "lr", "step"], "lr"),  # a schedule at least moves
        (["epoch", "loss"], "epoch"),
        (["loss"], "loss"),
        (["val_loss"], "val_loss"),  # the only loss is the loss chart's; nothing else to show
    ],
)
def test_other_metrics_open_on_a_telling_series_not_a_counter(keys, opens_on) -> None:
    assert page_with_keys(keys).other_key == opens_on


def test_the_run_page_selects_that_series(client, member, project):
    run = make_run(project, "hf", points=10)
    for key in ("epoch", "eval_loss"):
        batch_ingest(
            run=run,
            session="s",
            seq=100 + len(key),
            series=[SeriesIn(key, np.arange(3), np.ones(3), T0 + np.arange(3.0))],
            events=[],
            heartbeat=from_epoch(T0 + 3),
        )
    client.force_login(member)
    html = client.get("/runs/llm/hf/").content.decode()
    assert '<option value="eval_loss" selected>' in html
    assert '<option value="epoch">' in html
