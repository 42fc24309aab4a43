"""What the deadline board and the run page show, composed from the selectors and rules of the
layers below: forecast outlooks and open flags (forecasting.selectors), cost and the risk order
(forecasting.board), run summaries and series (tracker.selectors).

Layout (where bars and ticks sit) is in dashboard.presenters; this module decides what is shown.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from forecasting.board import (
    RECENT_END,
    Board,
    RunView,
    board_arrange,
    board_deadlines,
    board_runs,
)
from forecasting.gpu import selectors as gpu_selectors
from forecasting.models import Flag, Forecast
from forecasting.selectors import (
    FlagSpan,
    eta_history,
    eta_history_rebuilt,
    flag_history,
    flag_spans,
    forecast_latest,
    outlook_for_run,
)
from tracker import rank_timings
from tracker.bulk import keep_until
from tracker.explorer import deadline_list_past
from tracker.models import Host, Run
from tracker.selectors import (
    Marker,
    loss_key_for,
    membership_list_for_user,
    run_markers,
    series_keys,
    series_last,
)

# --- the board -------------------------------------------------------------------------------

# Past deadlines listed under the board (the deadline page lists every one).
PAST_SHOWN = 10


def board_for_user(*, user: Any, now: datetime) -> Board:
    """The deadline board of every project the user belongs to (8 queries with session/user)."""
    memberships = membership_list_for_user(user=user)
    projects = [m.project for m in memberships]
    board = board_arrange(
        now=now,
        memberships=memberships,
        runs=board_runs(projects=projects, now=now),
        deadlines=board_deadlines(projects=projects, now=now),
    )
    board.past = deadline_list_past(projects=projects, before=now - RECENT_END, limit=PAST_SHOWN)
    return board


# The board links the GPU hosts an agent reported from within this long.
BOARD_HOSTS_SINCE_S = 86400.0


def board_hosts(*, board: Board) -> list[Host]:
    """The GPU hosts of the board's projects, each with its host page (one query)."""
    project_ids = [m.project_id for m in board.memberships]
    return gpu_selectors.hosts_for_projects(project_ids=project_ids, since_s=BOARD_HOSTS_SINCE_S)


# --- the run page ----------------------------------------------------------------------------


@dataclass
class RunPage:
    outlook: RunView
    flag_history: list[Flag]
    loss_key: str | None
    keys: list[str]
    # Whether any rank sent step timings: the ranks panel (heat map, slowest ranks) shows then.
    has_ranks: bool = False
    # An ended run's (step, loss) at its end: it has no forecast any more, and "healthy" alone
    # did not say what it reached.
    final_loss: tuple[float, float] | None = None
    # What its loss episode said when the run ended inside one ("... never recovered").
    episode_end: str | None = None
    # The run's config as (dotted key, value) rows (config_rows).
    config: list[tuple[str, str]] = field(default_factory=list)
    # Its hosts as (name, has a host page) (forecasting.gpu.selectors.run_host_pages).
    hosts: list[tuple[str, bool]] = field(default_factory=list)
    # A soft-deleted run (reached by its URL): until when it can be restored.
    deleted_until: datetime | None = None

    @property
    def config_shown(self) -> list[tuple[str, str]]:
        return self.config[:CONFIG_ROWS_SHOWN]

    @property
    def config_more(self) -> list[tuple[str, str]]:
        """The rows past CONFIG_ROWS_SHOWN: the page folds them away."""
        return self.config[CONFIG_ROWS_SHOWN:]

    @property
    def other_key(self) -> str | None:
        """The metric the "other metrics" chart opens on: the most telling one besides the
        loss (other_metric_rank), the first in key order among equals."""
        others = [k for k in self.keys if k != self.loss_key]
        return min(others, key=other_metric_rank) if others else self.loss_key


def run_page(*, run: Run, now: datetime) -> RunPage:
    """Summary of one run for its page (a constant handful of queries)."""
    outlook = RunView.of(outlook_for_run(run=run, now=now), now=now)
    # Only here, not on the board: it reads the run's hosts' batch summaries.
    outlook.gpu_split = gpu_selectors.run_gpu_hours(run=outlook.run, now=now.timestamp())
    keys = series_keys(run=run)
    history = list(flag_history(run=run, limit=100))
    loss_key = loss_key_for(keys)
    final = None
    ending = None
    if loss_key is not None and not outlook.run.is_active:
        final = series_last(run=run, key=loss_key)
        closed = outlook.episode_end
        ending = closed.explanation if closed is not None else None
    return RunPage(
        outlook=outlook,
        flag_history=history,
        loss_key=loss_key,
        keys=keys,
        has_ranks=rank_timings.has_rank_timings(run=run),
        final_loss=final,
        episode_end=ending,
        config=config_rows(run.config),
        hosts=gpu_selectors.run_host_pages(
            run=run, agent_hosts=outlook.gpu_split["hosts"] if outlook.gpu_split else []
        ),
        deleted_until=keep_until(run.deleted_at) if run.deleted_at else None,
    )


# What the "Other metrics" chart opens on, best first: a held-out loss, throughput, the total
# gradient norm, a layer's. Counters ("epoch", "step") and schedules ("lr") come last: keys sort
# alphabetically, and the HF callback's first, "epoch", is a flat ramp that says nothing.
_HELD_OUT_LOSS = re.compile(r"(val|valid|validation|eval|test)[_/.-]?loss")
_THROUGHPUT = re.compile(
    r"throughput|per[_-]?sec(ond)?|/s(ec)?$|tok(en)?s?[_/]s$|samples?[_/]s$|it[_/]s$|mfu"
)
_COUNTER = re.compile(
    r"epoch|step|global_step|iter(ation)?|batch(_idx)?|(consumed_|seen_)?(samples|tokens)"
    r"(_seen|_consumed)?|time|timestamp|runtime|progress"
)
_SCHEDULE = re.compile(r"lr|learning_rate|lr[-_].*|.*[-_]lr|momentum|beta\d?|weight_decay")


def other_metric_rank(key: str) -> int:
    """0 (show first) to 6 (a counter): see the patterns above. A key is judged by its last
    path part too ("trainer/global_step", "lr/pg0" is judged by "lr" via its first part)."""
    name = key.lower()
    last, first = name.rsplit("/", 1)[-1], name.split("/", 1)[0]
    if _HELD_OUT_LOSS.fullmatch(name) or _HELD_OUT_LOSS.fullmatch(last):
        return 0
    if _THROUGHPUT.search(name):
        return 1
    if name == "grad_norm" or last == "grad_norm":
        return 2
    if first == "grad_norm":
        return 3
    if _COUNTER.fullmatch(last):
        return 6
    if _SCHEDULE.fullmatch(last) or _SCHEDULE.fullmatch(first):
        return 5
    return 4


# A framework's config is hundreds of keys (the HF callback sends every TrainingArguments field
# and the model config): the page shows this many and folds the rest away.
CONFIG_ROWS_SHOWN = 12


def config_rows(config: Any) -> list[tuple[str, str]]:
    """A run's config as (key, value) rows: nested mappings flattened with dotted keys
    ("model.n_layer"), values as JSON (strings as they are). A nested dict printed whole was
    one row thousands of pixels tall. Top-level settings first, then the nested ones, each
    alphabetically: PostgreSQL's jsonb keeps no key order, so "as sent" is not an order the
    page can keep."""
    rows: list[tuple[str, str]] = []

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), inner)
        elif isinstance(value, str):
            rows.append((prefix, value))
        else:
            rows.append((prefix, json.dumps(value, ensure_ascii=False, default=str)))

    if isinstance(config, dict):
        for key, value in config.items():
            walk(str(key), value)
    elif config:  # not a mapping (an old client's list, say): one row, as it is
        walk("config", config)
    return sorted(rows, key=lambda row: ("." in row[0], row[0]))


def run_overview(*, run: Run) -> dict[str, Any]:
    """Everything the run's charts draw besides the series (overview.json): ETA history, cutoff,
    loss forecast, target and markers."""
    keys = series_keys(run=run)
    loss_key = loss_key_for(keys)
    deadline = run.deadline
    return {
        "run": run.public_id,
        "name": str(run),
        "active": run.is_active,
        "started_at": run.started_at.timestamp(),
        "loss_key": loss_key,
        "keys": keys,
        "eta_history": eta_history(run=run, limit=2000),
        "eta_history_rebuilt": eta_history_rebuilt(run=run),
        "deadline": None
        if deadline is None
        else {
            "name": deadline.name,
            "cutoff": deadline.cutoff.timestamp(),
            "train_by": deadline.train_by.timestamp(),
        },
        **_loss_overview(run),
        "target": run.project.targets.get(loss_key or "", None),
        "markers": [
            {"kind": m.kind, "step": m.step, "label": m.label} for m in chart_markers(run=run)
        ],
        "total_steps": run.total_steps,
        "last_step": run.last_step,
    }


def _loss_overview(run: Run) -> dict[str, Any]:
    """The latest loss forecast and its fan while the run is active; an ended run has none."""
    latest = forecast_latest(run=run, kind=Forecast.Kind.LOSS)
    loss = latest.data if latest is not None else {}
    fan = None
    if loss and run.is_active:
        fan = loss_forecast_path(loss, from_step=float(run.last_step or 0) or 1.0)
    return {"loss_forecast": fan, "loss": (loss or None) if run.is_active else None}


def chart_markers(*, run: Run) -> list[Marker]:
    """The run's own markers, plus each loss flag's onset and the checkpoint before it, open or
    closed (after the run's end and across its resumes), and an open straggler's onset."""
    out = run_markers(run=run)
    spans = flag_spans(run=run, kinds=(*Flag.DIVERGENCE_KINDS, Flag.Kind.STRAGGLER))
    # The open flags first, then the newest: one marker per step and kind, the one that matters.
    spans.sort(key=lambda s: (not s.is_open, -s.opened.pk))
    seen: set[tuple[str, float]] = set()
    for marker in (m for span in spans for m in _flag_markers(span)):
        if (marker.kind, marker.step) not in seen:
            seen.add((marker.kind, marker.step))
            out.append(marker)
    return sorted(out, key=lambda m: m.step)


def _flag_markers(span: FlagSpan) -> list[Marker]:
    if span.onset_step is None:
        return []
    if span.kind == Flag.Kind.STRAGGLER:
        if not span.is_open:
            return []  # the throughput chart marks where the job waits now
        who = _straggler_who(span.said.data)
        return [Marker("straggler", float(span.onset_step), f"straggler onset: {who}")]
    outcome = f" ({span.outcome})" if span.outcome else ""
    out = [Marker("onset", float(span.onset_step), f"{span.kind} onset{outcome}")]
    if span.rollback_step is not None:
        label = "suggested rollback" if span.is_open else f"checkpoint before the {span.kind}"
        out.append(Marker("rollback", span.rollback_step, label + outcome))
    return out


def _straggler_who(data: dict[str, Any]) -> str:
    ranks = [r for r in data.get("ranks") or [] if isinstance(r, int)]
    host = data.get("host") if isinstance(data.get("host"), str) else None
    if data.get("kind") == "host" and host:
        return host
    named = f"rank {ranks[0]}" if len(ranks) == 1 else f"{len(ranks)} ranks"
    return f"{named} on {host}" if host else named


@dataclass
class RanksView:
    """The ranks panel's data: the heat map (per host, or one host's ranks) and the slowest."""

    heatmap: rank_timings.Heatmap
    mode: str  # "hosts" or "ranks"
    hosts: list[str]
    ranks: int
    window: tuple[int, int] | None


# The heat map aggregates per host once a job has more ranks than this (thousands of rows
# would be one pixel each); below it every rank is a row.
RANK_ROWS_MAX = 64


def ranks_view(*, run: Run, host: str | None, buckets: int, last_steps: int) -> RanksView:
    timings = rank_timings.rank_timings_window(run=run, last_steps=last_steps)
    hosts = sorted({h or "(no host)" for h in timings.hosts})
    if host is None and timings.ranks.size <= RANK_ROWS_MAX:
        heat = rank_timings.heatmap(timings, buckets=buckets, by_host=False)
        mode = "ranks"
    else:
        heat = rank_timings.heatmap(timings, buckets=buckets, host=host)
        mode = "ranks" if host is not None else "hosts"
    window = (int(timings.steps[0]), int(timings.steps[-1])) if timings.steps.size else None
    return RanksView(heat, mode, hosts, int(timings.ranks.size), window)


def loss_forecast_path(
    loss: dict[str, Any], *, from_step: float, points: int = 24
) -> dict[str, list[float]] | None:
    """The loss forecast drawn as a fan from the current smoothed level to the planned end.

    Interpolated in log-step, the shape of a power-law tail; only its end is a forecast, the
    path between is a guide for the eye.
    """
    end, start_v = loss.get("final_step"), loss.get("smoothed_last")
    if end is None or start_v is None or from_step <= 0 or end <= from_step:
        return None
    steps = np.geomspace(from_step, end, points)
    frac = (np.log(steps) - math.log(from_step)) / (math.log(end) - math.log(from_step))
    out: dict[str, list[float]] = {"x": steps.tolist()}
    for q in ("p10", "p50", "p90"):
        v = loss.get(q)
        if v is None:
            return None
        out[q] = (start_v + (v - start_v) * frac).tolist()
    return out
