"""Writes behind the project settings page: the project itself, members, deadlines.

Tokens are created and revoked through `tracker.services.token_create/token_revoke`.
Who may call what is decided by the caller (the page checks the role); these only keep the
data consistent, e.g. a project never loses its last owner.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.utils.text import slugify

from tracker.models import Deadline, Membership, Project, Run, validate_timezone
from tracker.services import Conflict, NotFound, ServiceError

# Pages compute cutoff - buffer and draw axes out to twice the time to the cutoff; outside these
# bounds that arithmetic leaves datetime's range and every page showing the deadline fails.
MAX_BUFFER = timedelta(days=366)
_EARLIEST_TRAIN_BY = datetime(1970, 1, 1, tzinfo=UTC)
_LATEST_CUTOFF = datetime(9000, 1, 1, tzinfo=UTC)


def project_update(
    *,
    project: Project,
    gpu_hour_price: Decimal | None,
    currency: str,
    timezone: str,
) -> Project:
    validate_timezone(timezone)
    project.gpu_hour_price = gpu_hour_price
    project.currency = currency.upper()
    project.timezone = timezone
    project.save(update_fields=["gpu_hour_price", "currency", "timezone"])
    return project


def project_targets_update(*, project: Project, targets: dict[str, float]) -> Project:
    project.targets = {k: float(v) for k, v in targets.items() if k}
    project.save(update_fields=["targets"])
    return project


def local_to_aware(*, local: datetime, timezone: str) -> datetime:
    """A wall-clock time as announced in `timezone` (e.g. 23:59 in Asia/Shanghai) made aware.

    A time skipped by a DST jump is taken as the instant after the jump (fold=0 semantics).
    """
    validate_timezone(timezone)
    return local.replace(tzinfo=ZoneInfo(timezone))


def _deadline_slug(project: Project, name: str, slug: str | None) -> str:
    base = slugify(slug or name)[:60] or "deadline"
    candidate, n = base, 2
    while Deadline.objects.filter(project=project, slug=candidate).exists():
        candidate, n = f"{base}-{n}", n + 1
    return candidate


@transaction.atomic
def deadline_create(
    *,
    project: Project,
    name: str,
    cutoff: datetime,
    timezone: str,
    buffer: timedelta = timedelta(0),
    notes: str = "",
    slug: str | None = None,
) -> Deadline:
    _check_cutoff(cutoff, buffer)
    validate_timezone(timezone)
    if slug and Deadline.objects.filter(project=project, slug=slug).exists():
        raise Conflict(f"a deadline {slug!r} already exists", field="slug")
    return Deadline.objects.create(
        project=project,
        slug=_deadline_slug(project, name, slug),
        name=name,
        cutoff=cutoff,
        timezone=timezone,
        buffer=buffer,
        notes=notes,
    )


def deadline_update(
    *,
    deadline: Deadline,
    name: str,
    cutoff: datetime,
    timezone: str,
    buffer: timedelta,
    notes: str = "",
) -> Deadline:
    # The slug stays: trainers refer to it in `runcast.init(deadline=...)`.
    _check_cutoff(cutoff, buffer)
    validate_timezone(timezone)
    deadline.name, deadline.cutoff, deadline.timezone = name, cutoff, timezone
    deadline.buffer, deadline.notes = buffer, notes
    deadline.save(update_fields=["name", "cutoff", "timezone", "buffer", "notes"])
    return deadline


def _check_cutoff(cutoff: datetime, buffer: timedelta) -> None:
    if cutoff.tzinfo is None:
        raise ServiceError("the cutoff needs a timezone", field="cutoff")
    if buffer < timedelta(0):
        raise ServiceError("the buffer cannot be negative", field="buffer")
    if buffer > MAX_BUFFER:
        raise ServiceError(f"the buffer cannot exceed {MAX_BUFFER.days} days", field="buffer")
    if cutoff < _EARLIEST_TRAIN_BY + buffer or cutoff > _LATEST_CUTOFF:
        raise ServiceError("the cutoff is not a plausible date", field="cutoff")


def membership_add(*, project: Project, username_or_email: str, role: str) -> Membership:
    user_model = get_user_model()
    ident = username_or_email.strip()
    user = (
        user_model.objects.filter(username=ident).first()
        or user_model.objects.filter(email__iexact=ident).first()
    )
    if user is None:
        raise NotFound(f"no user {ident!r}", field="user")
    if role not in Membership.Role.values:
        raise ServiceError(f"unknown role {role!r}", field="role")
    try:
        with transaction.atomic():
            return Membership.objects.create(project=project, user=user, role=role)
    except IntegrityError as exc:
        raise Conflict(f"{ident} is already a member", field="user") from exc


@transaction.atomic
def membership_change_role(*, membership: Membership, role: str) -> Membership:
    if role not in Membership.Role.values:
        raise ServiceError(f"unknown role {role!r}", field="role")
    _keep_an_owner(membership, leaving=role != Membership.Role.OWNER)
    membership.role = role
    membership.save(update_fields=["role"])
    return membership


@transaction.atomic
def membership_remove(*, membership: Membership) -> None:
    _keep_an_owner(membership, leaving=True)
    membership.delete()


def _keep_an_owner(membership: Membership, *, leaving: bool) -> None:
    # Locking the project's owner rows serialises two owners demoting each other at once.
    if not leaving or membership.role != Membership.Role.OWNER:
        return
    owners = list(
        Membership.objects.select_for_update()
        .filter(project_id=membership.project_id, role=Membership.Role.OWNER)
        .values_list("pk", flat=True)
    )
    if owners == [membership.pk]:
        raise Conflict("a project needs at least one owner", field="role")


def parse_targets(raw: dict[str, Any]) -> dict[str, float]:
    """{"val_loss": "3.28", ...} from a form; raises ServiceError naming the bad key."""
    out: dict[str, float] = {}
    for key, value in raw.items():
        if value in (None, ""):
            continue
        try:
            number = float(value)
        except (TypeError, ValueError) as exc:
            raise ServiceError(f"{value!r} is not a number", field=key) from exc
        if not math.isfinite(number):
            # Targets are stored as JSON, which PostgreSQL's jsonb keeps to finite numbers.
            raise ServiceError(f"{value!r} is not a finite number", field=key)
        out[key] = number
    return out


@transaction.atomic
def project_create(
    *,
    creator: Any,
    name: str,
    slug: str = "",
    timezone: str = "UTC",
    gpu_hour_price: Decimal | None = None,
    currency: str = "USD",
) -> Project:
    """A new project owned by its creator (who may create projects is the caller's check)."""
    name = name.strip()
    if not name:
        raise ServiceError("a project needs a name", field="name")
    validate_timezone(timezone)
    slug = slugify(slug or name)[:64]
    if not slug:
        raise ServiceError("the name or slug needs a letter or digit", field="slug")
    if Project.objects.filter(slug=slug).exists():
        raise Conflict(f"a project {slug!r} already exists", field="slug")
    project = Project.objects.create(
        slug=slug,
        name=name,
        timezone=timezone,
        gpu_hour_price=gpu_hour_price,
        currency=currency.upper(),
    )
    Membership.objects.create(project=project, user=creator, role=Membership.Role.OWNER)
    return project


def run_plan_update(*, run: Run, total_steps: int | None, deadline_slug: str) -> Run:
    """The plan forecasts use: total steps and the deadline, as a member corrects them (e.g. for
    a run logged through the MLflow API, whose plan came from its params)."""
    deadline = None
    if deadline_slug:
        deadline = Deadline.objects.filter(project=run.project_id, slug=deadline_slug).first()
        if deadline is None:
            raise NotFound(f"no deadline {deadline_slug!r} in this project", field="deadline")
    if total_steps is not None and not 1 <= total_steps <= 2**62:
        raise ServiceError("total steps must be between 1 and 2**62", field="total_steps")
    Run.objects.filter(pk=run.pk).update(total_steps=total_steps, deadline=deadline)
    run.total_steps, run.deadline = total_steps, deadline
    return run
