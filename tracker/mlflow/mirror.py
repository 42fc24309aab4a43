"""A live mirror of an MLflow tracking server: what `runcast_import_mlflow` does once, done every
few seconds and incrementally (docs/mlflow.md, "Mirror an MLflow server").

Each sync lists the server's experiments and its runs, creates what is new, and copies new
points through the same batch ingestion as live logging (so forecasts, alerts and the run's
life follow as if the points were logged here). What it costs per tick is bounded:
- runs: after a full pass, a tick searches only the runs that are RUNNING and those that ended
  recently; a full pass every FULL_PASS_S catches anything else. An ended run wholly copied is
  not fetched again.
- points: MLflow's history has no "since", but it pages in a fixed order (timestamp, step,
  value) with stateless page tokens. Each key keeps a cursor: the token of the page where the
  copy stands, that page's first point and how many of its points are copied. A tick fetches
  from there, so a live key costs one page plus what is new. If that page no longer starts with
  the point it did, points were inserted before it: the key is walked again from the start, and
  ingestion drops what is already stored. A key is not fetched at all while MLflow reports the
  same latest point for it as when its copy last reached the end; a run that ends gets one last
  walk of every key from its cursor, so a point that did not move "latest" is not left behind.
- time: a sync stops starting work after its budget and the next tick continues.

Idempotent and resumable as the importer: a cursor is saved after its page is stored, a page
stored twice adds nothing (ingestion keeps each (key, timestamp, step, value) once).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from config import outbound
from tracker.mlflow import importer, selectors, services
from tracker.mlflow.errors import MlflowError
from tracker.mlflow.models import Mirror, MirroredRun, RunLink
from tracker.mlflow.parsing import MetricIn
from tracker.mlflow.remote import RemoteError, RemoteMetric, RemoteMlflow
from tracker.models import Project

logger = logging.getLogger(__name__)

# A tick's work stops being started after this; well inside the task's 60 s soft limit.
SYNC_BUDGET_S = 30.0
# A claim outlives any sync (the task's hard limit is 90 s): a worker killed mid-sync leaves a
# claim that lapses by itself.
LEASE_S = 120.0
# Points per history request: a live key's tick re-reads at most this many points it has.
HISTORY_PAGE = 2_000
# How often a sync looks at every run rather than the live and recently ended ones.
FULL_PASS_S = 600.0
# "Recently ended" reaches this far before the last successful sync, for clocks that differ
# between the trainer, MLflow's server and Runcast.
END_MARGIN_S = 600.0
ERROR_CHARS = 500


class MirrorConfigError(Exception):
    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.field = field


@dataclass
class SyncSummary(importer.ImportSummary):
    runs_unchanged: int = 0
    keys_fetched: int = 0
    pages: int = 0
    rewalks: int = 0
    # False when the budget ran out before every run was looked at: the next tick goes on.
    complete: bool = True


# --- configuration -------------------------------------------------------------------------


def mirror_configure(
    *,
    project: Project,
    url: str,
    experiment_name: str = "",
    token: str | None = None,
    username: str | None = None,
    enabled: bool = True,
    operator: bool = False,
) -> Mirror:
    """Create or change a project's mirror. `token`: None keeps the stored one, "" clears it;
    with a `username` (None keeps it) it is the password of HTTP basic auth.
    `operator`: the URL was chosen by the server's operator (a Django staff user, the management
    command), so it may be a private address; a URL changed by anyone else loses that."""
    url = url.strip()
    if len(url) > 500:
        raise MirrorConfigError("at most 500 characters", field="url")
    if token is not None and len(token) > 1000:
        raise MirrorConfigError("at most 1,000 characters", field="token")
    if username is not None and (":" in username or any(c in username for c in "\r\n")):
        raise MirrorConfigError("one line, without a colon", field="username")
    if token is not None and any(c in token for c in "\r\n"):
        raise MirrorConfigError("one line", field="token")
    with transaction.atomic():
        mirror = Mirror.objects.select_for_update().filter(project=project).first()
        if mirror is None:
            mirror = Mirror(project=project)
        changed_url = mirror.url != url
        # An owner may change the token or the experiment of a mirror an operator pointed at a
        # private address; changing the address itself is the operator's choice again.
        private_ok = operator or (mirror.private_ok and not changed_url)
        problem = _url_problem(url, private_ok=private_ok)
        if problem:
            raise MirrorConfigError(problem, field="url")
        mirror.url = url
        mirror.private_ok = private_ok
        mirror.experiment_name = experiment_name.strip()[:500]
        if token is not None:
            mirror.token = token.strip()
        if username is not None:
            mirror.username = username.strip()[:150]
        mirror.enabled = enabled
        if changed_url:
            mirror.last_error = ""
            mirror.last_error_at = None
            mirror.last_full_sync_at = None
        mirror.updated_at = timezone.now()
        mirror.save()
    return mirror


def _url_problem(url: str, *, private_ok: bool) -> str | None:
    if not url:
        return "the MLflow server's URL is required"
    if "?" in url or "#" in url:
        # The token has its own field: a URL is shown on the page and logged.
        return "the URL is the server's address only, without a query (?…) or fragment (#…)"
    if private_ok:
        # An operator's URL: no address check, but still an http(s) URL the seam can request.
        try:
            parts = urlsplit(url)
        except ValueError as e:
            return f"not a valid URL: {e}"
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return "an http(s) URL with a host, e.g. http://mlflow:5000"
        if parts.username or parts.password:
            return "credentials in the URL are not supported: use the token"
        return None
    problem = outbound.target_problem(url)
    if problem and "RUNCAST_ALERTS_ALLOW_PRIVATE_TARGETS" in problem:
        return (
            problem.split(" (")[0]
            + " (a server on a private network can be mirrored when a Runcast administrator"
            " sets the mirror up, or with manage.py runcast_mirror_mlflow)"
        )
    return problem


# --- claiming ------------------------------------------------------------------------------


def mirror_claim(*, mirror_id: int) -> Mirror | None:
    """The mirror, held for one sync, or None when it is disabled or another sync holds it: a
    conditional UPDATE, so two workers (or a slow tick and the next) never sync it at once."""
    now = timezone.now()
    claimed = Mirror.objects.filter(
        Q(lease_until__isnull=True) | Q(lease_until__lt=now), pk=mirror_id, enabled=True
    ).update(lease_until=now + timedelta(seconds=LEASE_S))
    if not claimed:
        return None
    return Mirror.objects.select_related("project").get(pk=mirror_id)


def mirror_release(*, mirror: Mirror) -> None:
    Mirror.objects.filter(pk=mirror.pk).update(lease_until=None)


# --- syncing -------------------------------------------------------------------------------


def mirror_sync_one(
    *, mirror_id: int, client: Any = None, budget_s: float = SYNC_BUDGET_S
) -> SyncSummary | None:
    """Claim, sync and record the outcome on the mirror (what the periodic task runs). None when
    it was not claimed. A failure is recorded, never raised: the next tick tries again."""
    mirror = mirror_claim(mirror_id=mirror_id)
    if mirror is None:
        return None
    started = timezone.now()
    # Filled as the sync goes, so what a failed sync copied before failing is counted too.
    summary = SyncSummary()
    try:
        mirror_sync(mirror=mirror, client=client, budget_s=budget_s, summary=summary)
    except Exception as e:
        if isinstance(e, RemoteError | MlflowError):
            message = e.message[:ERROR_CHARS]
            # The message names the server, never the token (RemoteError's contract).
            logger.warning("MLflow mirror of project %s failed: %s", mirror.project.slug, message)
        else:
            # A fault of ours (or of the database): its traceback for the operator, the page
            # gets its kind; the next tick tries again like after an outage.
            message = f"unexpected error in the sync ({type(e).__name__}); see the worker's log"
            logger.exception("MLflow mirror of project %s failed", mirror.project.slug)
        Mirror.objects.filter(pk=mirror.pk).update(
            last_sync_at=started,
            last_error=message,
            last_error_at=started,
            syncs=F("syncs") + 1,
            failures=F("failures") + 1,
            runs_created=F("runs_created") + summary.runs_created,
            points_copied=F("points_copied") + summary.points_copied,
            lease_until=None,
        )
        return None
    except BaseException:
        mirror_release(mirror=mirror)
        raise
    fields: dict[str, Any] = {
        "last_sync_at": started,
        "last_success_at": started,
        "last_error": "",
        "syncs": F("syncs") + 1,
        "runs_created": F("runs_created") + summary.runs_created,
        "points_copied": F("points_copied") + summary.points_copied,
        "lease_until": None,
    }
    if summary.complete and _full_pass_due(mirror, started):
        fields["last_full_sync_at"] = started
    Mirror.objects.filter(pk=mirror.pk).update(**fields)
    return summary


def _full_pass_due(mirror: Mirror, now: Any) -> bool:
    last = mirror.last_full_sync_at
    return last is None or (now - last).total_seconds() >= FULL_PASS_S


def mirror_sync(
    *,
    mirror: Mirror,
    client: Any = None,
    budget_s: float = SYNC_BUDGET_S,
    summary: SyncSummary | None = None,
) -> SyncSummary:
    """One sync of the mirror's server into its project. Raises RemoteError (the server could
    not be read) or MlflowError (an experiment named in the mirror is not there)."""
    started = time.monotonic()
    deadline = started + budget_s
    client = client or RemoteMlflow(
        mirror.url, token=mirror.token, username=mirror.username, private_ok=mirror.private_ok
    )
    project = mirror.project
    summary = summary if summary is not None else SyncSummary()
    names = [mirror.experiment_name] if mirror.experiment_name else None
    queries = _run_queries(mirror)
    for source in importer._experiments(client, names):
        target, _ = importer._target_experiment(project, source)
        summary.experiments += 1
        seen: set[str] = set()
        for query in queries:
            for run in importer._runs(client, source.experiment_id, query):
                if run.info.run_id in seen:
                    continue
                seen.add(run.info.run_id)
                if time.monotonic() > deadline:
                    summary.complete = False
                    summary.seconds = time.monotonic() - started
                    return summary
                summary.runs_seen += 1
                if not _run_sync(
                    client=client,
                    mirror=mirror,
                    experiment=target,
                    run=run,
                    summary=summary,
                    deadline=deadline,
                ):
                    summary.complete = False
    summary.seconds = time.monotonic() - started
    return summary


def _run_queries(mirror: Mirror) -> list[str]:
    now = timezone.now()
    if _full_pass_due(mirror, now) or mirror.last_success_at is None:
        return [""]
    since = mirror.last_success_at - timedelta(seconds=END_MARGIN_S)
    since_ms = int(since.timestamp() * 1000)
    # MLflow's filters have no OR: the live runs, then those that ended since.
    return ["attributes.status = 'RUNNING'", f"attributes.end_time >= {since_ms}"]


def _mark(m: RemoteMetric | None) -> list[Any] | None:
    # JSON-friendly and exact: the value as hex keeps NaN, infinities and every bit.
    return None if m is None else [m.timestamp, m.step, float(m.value).hex()]


def _run_sync(
    *,
    client: Any,
    mirror: Mirror,
    experiment: Any,
    run: Any,
    summary: SyncSummary,
    deadline: float,
) -> bool:
    """Bring one run up to date; False when the budget ran out before it was."""
    info, data = run.info, run.data
    link = selectors.run_link(project=mirror.project, run_id=info.run_id)
    if link is not None and not link.imported_from:
        summary.skipped.append(info.run_id)
        return True
    ended = info.status in importer.ENDED
    state = MirroredRun.objects.filter(mirror=mirror, link=link).first() if link else None
    if (
        state is not None
        and state.complete
        and ended
        and (link is not None and link.status == info.status)
        and link.end_time_ms == info.end_time
    ):
        summary.runs_unchanged += 1
        return True
    if link is None:
        link = importer.run_link_create(
            project=mirror.project,
            experiment=experiment,
            run=run,
            source=mirror.url,
            summary=summary,
        )
    if state is None:
        state, _ = MirroredRun.objects.get_or_create(mirror=mirror, link=link)
    importer.params_tags_copy(link=link, params=data.params, tags=data.tags, summary=summary)
    if info.status == "RUNNING" and link.status in importer.ENDED:
        # Resumed on MLflow (start_run(run_id=...)): a new attempt here too, as the API's own
        # resume, so its points form a new segment.
        link = services.run_update(link=link, status="RUNNING", end_time_ms=None, run_name=None)
        state.complete = False
        state.save(update_fields=["complete"])
    latest = getattr(data, "latest", {})
    # A run that has just ended is walked from every cursor once more, whatever "latest" says.
    final = ended and not state.complete
    done = True
    for key in sorted(data.metrics):
        mark = _mark(latest.get(key))
        cursor = state.cursors.get(key) or {}
        if not final and mark is not None and cursor.get("latest") == mark:
            continue
        if not _key_sync(
            client=client,
            link=link,
            state=state,
            key=key,
            mark=mark,
            summary=summary,
            deadline=deadline,
        ):
            done = False
            break
    if ended and done:
        if link.status != info.status or link.end_time_ms != info.end_time:
            services.run_update(
                link=link, status=info.status, end_time_ms=info.end_time, run_name=None
            )
        state.complete = True
        state.save(update_fields=["complete"])
    return done


def _key_sync(
    *,
    client: Any,
    link: RunLink,
    state: MirroredRun,
    key: str,
    mark: list[Any] | None,
    summary: SyncSummary,
    deadline: float,
) -> bool:
    """Copy a key's points past its cursor; False when the budget ran out first."""
    cursor = state.cursors.get(key) or {}
    token: str | None = cursor.get("token") or None
    first = cursor.get("first")
    seen = int(cursor.get("seen", 0))
    summary.keys_fetched += 1
    while True:
        if time.monotonic() > deadline:
            return False
        page = client.metric_history_page(
            link.run.public_id, key, page_token=token, max_results=HISTORY_PAGE
        )
        summary.pages += 1
        if first is not None and (not page or _mark(page[0]) != first):
            # Points were inserted before where the copy stands (logged with older
            # timestamps): walk again from the start; ingestion drops what is stored.
            if token is None and seen == 0:
                return True  # nothing to walk again (defensive: cannot loop)
            token, first, seen = None, None, 0
            summary.rewalks += 1
            continue
        new = page[seen:]
        if new:
            result = services.run_log(
                link=link,
                metrics=[
                    MetricIn(
                        key=key,
                        value=float(m.value),
                        timestamp_ms=int(m.timestamp),
                        step=int(m.step),
                    )
                    for m in new
                ],
                params=[],
                tags=[],
            )
            summary.points_copied += result.points
            summary.points_present += len(new) - result.points
        cursor = {
            "token": token or "",
            "first": _mark(page[0]) if page else None,
            "seen": len(page),
        }
        if page.token is None:
            cursor["latest"] = mark
        state.cursors[key] = cursor
        state.save(update_fields=["cursors"])
        if page.token is None:
            return True
        # The cursor stays on this page until the next is stored: resuming re-reads one page.
        token, first, seen = page.token, None, 0


def mirror_ids_enabled() -> list[int]:
    return list(Mirror.objects.filter(enabled=True).order_by("pk").values_list("pk", flat=True))
