"""The runs explorer (a project's runs, or every run of the user's projects) with its CSV export,
and the deadline page. The view's whole state is its query string: plain GET forms and links,
so a view is shareable and the back button walks through its changes.

Parse (RunFilter, columns, cursor) -> authorise (membership) -> one composer of
forecasting.explorer -> render.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseRedirect,
    QueryDict,
    StreamingHttpResponse,
)
from django.http.response import HttpResponseBase
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from forecasting.explorer import RunsTable, TableRow, deadline_page, runs_table
from tracker import bulk, explorer, query
from tracker.access import membership_for
from tracker.explorer import RunFilter
from tracker.models import Membership, Project, Run
from tracker.saved_views import saved_view_delete, saved_view_list, saved_view_save
from tracker.selectors import membership_list_for_user
from tracker.services import ServiceError

# Columns a view may hide; the run's name always shows.
COLUMNS = (
    ("status", "Status"),
    ("experiment", "Experiment"),
    ("tags", "Tags"),
    ("host", "Host"),
    ("user", "User"),
    ("started", "Started"),
    ("duration", "Duration"),
    ("steps", "Steps"),
    ("forecast", "Finish / outcome"),
    ("episodes", "Loss episodes"),
    ("cost", "Cost"),
)
# What each sortable column sorts by, in the filter language's names.
SORTS = {
    "name": "name",
    "status": "status",
    "experiment": "experiment",
    "user": "user",
    "started": "start_time",
    "ended": "end_time",
    "steps": "steps",
    "deadline": "deadline",
}
CSV_ROWS_MAX = 50_000
CSV_CHUNK = 500


class BadInput(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass
class ViewState:
    where: RunFilter
    group: str
    sort: str  # a column id, "m:<key>" or "p:<key>"; "" for the default order
    descending: bool
    metrics: list[str]
    params: list[str]
    hidden: set[str]
    after: str | None
    limit: int


def _date(params: QueryDict, name: str) -> date | None:
    raw = params.get(name) or ""
    if not raw:
        return None
    try:
        return date.fromisoformat(raw)
    except ValueError:
        raise BadInput(name, f"'{raw[:40]}' is not a date (YYYY-MM-DD)") from None


def _order(sort: str, descending: bool) -> list[str]:
    if not sort:
        return []
    direction = " DESC" if descending else " ASC"
    entity, _, key = sort.partition(":")
    if entity == "m" and key:
        return [f"metrics.`{key}`{direction}"]
    if entity == "p" and key:
        return [f"params.`{key}`{direction}"]
    if sort in SORTS:
        return [SORTS[sort] + direction]
    raise BadInput("sort", f"cannot sort by '{sort[:40]}'")


def parse_state(params: QueryDict) -> ViewState:
    """The view a query string describes. BadInput names a field it cannot read."""
    sort = params.get("sort", "")
    descending = params.get("dir", "desc" if sort in ("", "started") else "asc") == "desc"
    try:
        limit = int(params.get("n") or explorer.PAGE_SIZE)
    except ValueError:
        raise BadInput("n", "the page size is a whole number") from None
    where = RunFilter(
        text=params.get("q", ""),
        status=params.get("status", ""),
        experiment=params.get("experiment", ""),
        deadline=params.get("deadline", ""),
        started_from=_date(params, "from"),
        started_to=_date(params, "to"),
        name=params.get("name", ""),
        order=_order(sort, descending),
        deleted=params.get("deleted", "") == "1",
    )
    return ViewState(
        where=where,
        group=params.get("group", ""),
        sort=sort,
        descending=descending,
        metrics=[k for k in params.getlist("m") if k][:20],
        params=[k for k in params.getlist("p") if k][:20],
        hidden=set(params.getlist("hide")),
        after=params.get("after") or None,
        limit=max(1, min(explorer.PAGE_SIZE_MAX, limit)),
    )


def _projects_of(request: HttpRequest, project: str | None) -> tuple[list[Project], Any]:
    """The projects a view searches: one the user belongs to (404 otherwise), or all of theirs."""
    if project is not None:
        membership = membership_for(user=request.user, project_slug=project)
        return [membership.project], membership
    return [m.project for m in membership_list_for_user(user=request.user)], None


def _links(params: QueryDict, state: ViewState) -> dict[str, Any]:
    """Query strings of the page's links: each header's sort, the next and first pages."""

    def with_(**changes: str | None) -> str:
        q = params.copy()
        for name, value in changes.items():
            q.pop(name, None)
            if value is not None:
                q[name] = value
        return q.urlencode()

    current = state.sort or "started"  # the default order is the newest start first

    def sort_link(column: str) -> str:
        if column == current:  # the same column again: the other way
            return with_(sort=column, dir="asc" if state.descending else "desc", after=None)
        return with_(sort=column, dir="desc" if column == "started" else "asc", after=None)

    return {
        "sort": {c: sort_link(c) for c in SORTS},
        "metrics": [(k, sort_link(f"m:{k}")) for k in state.metrics],
        "params": [(k, sort_link(f"p:{k}")) for k in state.params],
        "first": with_(after=None),
        "csv": with_(after=None),
    }


@login_required
@require_GET
def runs_page(request: HttpRequest, project: str | None = None) -> HttpResponse:
    projects, membership = _projects_of(request, project)
    context: dict[str, Any] = {
        "project": membership.project if membership else None,
        "projects": projects,
        "columns": COLUMNS,
        "statuses": Run.Status.values,
        "experiments": explorer.experiment_choices(projects=projects),
        "deadlines": list(explorer.deadline_list_all(projects=projects)),
        "params": request.GET,
        "group_choices": [g for g in explorer.GROUP_BY if project is None or g != "project"],
        "saved_views": saved_view_list(project=membership.project) if membership else [],
        "can_edit": bool(membership and membership.can_edit),
        "view_query": request.GET.urlencode(),
        "keep_days": settings.RUNCAST_DELETED_RUN_KEEP_DAYS,
    }
    if membership and membership.can_edit:  # the bulk move's choices (one query, members only)
        context["move_targets"] = explorer.experiment_targets(project=membership.project)
    try:
        state = parse_state(request.GET)
        table = runs_table(
            projects=projects,
            where=state.where,
            after=state.after,
            limit=state.limit,
            metrics=state.metrics,
            params=state.params,
            now=timezone.now(),
            group_by=state.group,
        )
    except (BadInput, query.QueryError) as exc:
        context["error"] = _error(exc, request.GET.get("q", ""))
        return render(request, "dashboard/runs.html", context, status=400)
    state.metrics = table.metrics
    context.update(
        state=state,
        table=table,
        links=_links(request.GET, state),
        groups=_group_rows(request.GET, state, table),
        now=timezone.now(),
    )
    return render(request, "dashboard/runs.html", context)


# Groups whose quick filter narrows the view to them; other groups add a comparison to `q`.
_QUICK = ("status", "experiment", "deadline")


def _group_rows(params: QueryDict, state: ViewState, table: RunsTable) -> list[dict[str, Any]]:
    """Each group with the query string of the view narrowed to it (None: no link)."""
    out: list[dict[str, Any]] = []
    entity, _, key = state.group.partition(":")
    for group in table.groups or []:
        value = group.value
        q = params.copy()
        for name in ("after", "group"):
            q.pop(name, None)
        if state.group in _QUICK and value is not None:
            q[state.group] = value
        elif value is None and entity != "p":
            out.append({"group": group, "link": None})  # the language has no IS NULL for these
            continue
        else:
            ident = f"params.`{key}`" if entity == "p" else state.group
            quoted = "IS NULL" if value is None else "= '" + value.replace("'", "\\'") + "'"
            q["q"] = " and ".join(t for t in (params.get("q", ""), f"{ident} {quoted}") if t)
        out.append({"group": group, "link": q.urlencode()})
    return out


def _error(exc: Exception, text: str) -> dict[str, Any]:
    """The message, and for a filter error the filter split at the token it names."""
    position = getattr(exc, "position", None)
    out: dict[str, Any] = {"message": str(exc), "field": getattr(exc, "field", "q")}
    if isinstance(exc, query.QueryError) and position is not None and position <= len(text):
        out.update(before=text[:position], token=text[position:] or " ", field="q")
    return out


# --- saved views -----------------------------------------------------------------------------


@login_required
@require_POST
def view_save(request: HttpRequest, project: str) -> HttpResponse:
    """Save the current view under a name (members): the page then opens it."""
    membership = membership_for(
        user=request.user, project_slug=project, need=Membership.Role.MEMBER
    )
    try:
        view = saved_view_save(
            project=membership.project,
            user=request.user,
            name=request.POST.get("name", ""),
            query=request.POST.get("query", ""),
        )
    except ServiceError as exc:
        message = f"{exc.field}: {exc.message}" if exc.field else exc.message
        return HttpResponse(message, status=400, content_type="text/plain; charset=utf-8")
    return redirect(reverse("dashboard:runs", args=[project]) + "?" + view.query)


@login_required
@require_POST
def view_delete(request: HttpRequest, project: str, view_id: int) -> HttpResponse:
    membership = membership_for(
        user=request.user, project_slug=project, need=Membership.Role.MEMBER
    )
    saved_view_delete(project=membership.project, view_id=view_id)
    return redirect("dashboard:runs", project=project)


# --- bulk actions ----------------------------------------------------------------------------

BULK_ACTIONS = ("compare", "tag", "untag", "delete", "restore", "move")


@login_required
@require_POST
def runs_bulk(request: HttpRequest, project: str) -> HttpResponse:
    """The selected runs of a project's explorer page, tagged, untagged, deleted, restored or
    moved to another MLflow experiment (members), then back to the same view (its query string
    is the `view` field). "compare" only forwards the selection to the compare page: the
    selection is one POST form (its CSRF token must not travel in a GET URL)."""
    membership = membership_for(
        user=request.user, project_slug=project, need=Membership.Role.MEMBER
    )
    action = request.POST.get("action", "")
    run_ids = request.POST.getlist("run")
    back = reverse("dashboard:runs", args=[project]) + "?" + _view_query(request.POST)
    if action not in BULK_ACTIONS:
        message = f"action: one of {', '.join(BULK_ACTIONS)}, not '{action[:40]}'"
        return HttpResponse(message, status=400, content_type="text/plain; charset=utf-8")
    if action == "compare":
        selected = QueryDict(mutable=True)
        selected.setlist("run", run_ids)
        return redirect(reverse("dashboard:compare", args=[project]) + "?" + selected.urlencode())
    try:
        if action in ("tag", "untag"):
            tag = request.POST.get("tag", "")
            n = bulk.runs_tag(
                project=membership.project, run_ids=run_ids, tag=tag, remove=action == "untag"
            )
            said = f"Tagged {n} run{'s' if n != 1 else ''} {tag.strip()!r}."
            if action == "untag":
                said = f"Removed the tag {tag.strip()!r} from {n} run{'s' if n != 1 else ''}."
        elif action == "delete":
            now = timezone.now()
            n = bulk.runs_delete(project=membership.project, run_ids=run_ids, now=now)
            until = bulk.keep_until(now).strftime("%Y-%m-%d %H:%M UTC")
            said = (
                f"Deleted {n} run{'s' if n != 1 else ''}: they are restorable until {until} "
                "from the deleted runs view (Show deleted), with Restore."
            )
        elif action == "move":
            n = bulk.runs_move(
                project=membership.project,
                run_ids=run_ids,
                experiment_id=request.POST.get("experiment_id", ""),
            )
            said = f"Moved {n} run{'s' if n != 1 else ''} to another experiment."
        else:
            n = bulk.runs_restore(project=membership.project, run_ids=run_ids)
            said = f"Restored {n} run{'s' if n != 1 else ''}."
    except ServiceError as exc:
        if exc.status == 404:
            raise
        messages.error(request, f"{exc.field}: {exc.message}" if exc.field else exc.message)
        return HttpResponseRedirect(back)
    messages.success(request, said)
    return HttpResponseRedirect(back)


def _view_query(form: QueryDict) -> str:
    """The explorer view a form came from, less its page position (a run just deleted may
    have been the page's cursor)."""
    view = QueryDict(form.get("view", ""), mutable=True)
    view.pop("after", None)
    return view.urlencode()


# --- CSV -------------------------------------------------------------------------------------


def _csv_header(table: RunsTable) -> list[str]:
    head = ["project", "run_id", "name", "status", "experiment", "tags", "hosts", "user"]
    head += ["started", "ended", "duration_s", "steps", "deadline", "finish_p50"]
    head += ["p_on_time", "outcome", "loss_episode", "gpu_hours", "cost"]
    for key in table.metrics:
        head += [f"metrics.{key}", f"metrics.{key}.best"]
    return head + [f"params.{key}" for key in table.params]


def _csv_row(row: TableRow, table: RunsTable) -> list[Any]:
    run, view = row.run, row.view
    out: list[Any] = [
        run.project.slug,
        run.public_id,
        str(run),
        run.status,
        row.experiment,
        " ".join(run.tags or []),
        " ".join(run.hosts or []),
        row.user,
        run.started_at.isoformat(),
        run.ended_at.isoformat() if run.ended_at else "",
        round(row.duration_s),
        run.last_step if run.last_step is not None else "",
        run.deadline.slug if run.deadline else "",
        _iso(view.finish[1]) if view.finish else "",
        "" if view.p_on_time is None else round(view.p_on_time, 4),
        view.outcome or "",
        view.episode_end_text or "",
        "" if view.gpu_hours_so_far is None else round(view.gpu_hours_so_far, 3),
        "" if view.cost_so_far is None else round(view.cost_so_far, 2),
    ]
    for key in table.metrics:
        m = row.metrics.get(key)
        out += ["" if m is None else ("nan" if m.is_nan else m.latest), "" if m is None else m.best]
    return out + [row.params.get(key, "") for key in table.params]


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat()


class _Echo:
    def write(self, value: str) -> str:
        return value


def _csv_lines(projects: list[Project], state: ViewState) -> Iterator[str]:
    """The whole view, page after keyset page, as CSV lines (the rows of one page at a time in
    memory, a constant number of queries per page)."""
    writer = csv.writer(_Echo())
    after, sent, header = None, 0, False
    while sent < CSV_ROWS_MAX:
        now = timezone.now()
        table = runs_table(
            projects=projects,
            where=state.where,
            after=after,
            limit=CSV_CHUNK,
            metrics=state.metrics,
            params=state.params,
            now=now,
        )
        if not header:
            yield writer.writerow(_csv_header(table))
            header = True
        for row in table.rows:
            yield writer.writerow(_csv_row(row, table))
        sent += len(table.rows)
        after = table.next_cursor
        if after is None:
            break


@login_required
@require_GET
def runs_csv(request: HttpRequest, project: str | None = None) -> HttpResponseBase:
    projects, membership = _projects_of(request, project)
    try:
        state = parse_state(request.GET)
        # Refused before the first byte: a bad filter is a 400, not a broken download.
        explorer.run_search_compiled(projects=projects, where=state.where)
    except (BadInput, query.QueryError) as exc:
        return HttpResponse(str(exc), status=400, content_type="text/plain; charset=utf-8")
    name = membership.project.slug if membership else "runs"
    response = StreamingHttpResponse(_csv_lines(projects, state), content_type="text/csv")
    response["Content-Disposition"] = f'attachment; filename="{name}-runs.csv"'
    return response


# --- deadlines -------------------------------------------------------------------------------


@login_required
@require_GET
def deadlines_page(request: HttpRequest, project: str) -> HttpResponse:
    projects, membership = _projects_of(request, project)
    now = timezone.now()
    context = {
        "project": membership.project,
        "deadlines": deadline_page(projects=projects, now=now),
        "now": now,
    }
    return render(request, "dashboard/deadlines.html", context)
