"""The data Runcast tracks: projects, members, tokens, deadlines, runs and what runs send.

Metric points are stored as columnar chunks (one row per key per ingested batch holding packed
arrays), not one row per point: a 1M-point series is ~1,000 rows that read back in milliseconds,
and a batch of 10,000 points is a handful of INSERTs. Each chunk keeps its step range and value
range so charts can draw coarse zoom levels without unpacking every array.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo, available_timezones

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Case, F, Q, Value, When
from django.utils.timezone import now


def validate_timezone(value: str) -> None:
    if value not in available_timezones():
        raise ValidationError(f"{value!r} is not an IANA timezone name")


class Project(models.Model):
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    # Cost of one GPU for one hour, used to price wasted compute (divergence, stalls).
    gpu_hour_price = models.DecimalField(max_digits=10, decimal_places=4, null=True, blank=True)
    currency = models.CharField(max_length=3, default="USD")
    timezone = models.CharField(max_length=64, default="UTC", validators=[validate_timezone])
    # Target value per metric key, e.g. {"val_loss": 3.28}: forecasts say when it is reached.
    targets = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=now)

    def __str__(self) -> str:
        return self.slug

    @property
    def tzinfo(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)


class Membership(models.Model):
    class Role(models.TextChoices):
        OWNER = "owner"
        MEMBER = "member"
        VIEWER = "viewer"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "user"], name="membership_unique_user")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.project} ({self.role})"

    @property
    def can_edit(self) -> bool:
        return self.role in (self.Role.OWNER, self.Role.MEMBER)


class ApiToken(models.Model):
    """A project-scoped bearer token. Only its prefix (for lookup) and a hash are stored.

    Tokens are 32 random bytes, so a plain SHA-256 is enough: there is nothing to brute-force
    that a slow hash would protect (unlike passwords).
    """

    class Scope(models.TextChoices):
        WRITE = "write", "write (ingest)"
        READ = "read", "read"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="tokens")
    name = models.CharField(max_length=100)
    scope = models.CharField(max_length=8, choices=Scope.choices, default=Scope.WRITE)
    prefix = models.CharField(max_length=16, unique=True)
    hashed = models.CharField(max_length=64)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(default=now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.name} (rc_{self.prefix}_…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class Deadline(models.Model):
    """A named cutoff (e.g. a conference's blind-evaluation submission) that runs aim at.

    `buffer` is the work that must follow training (evaluation, packaging): training must end by
    cutoff - buffer.
    """

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="deadlines")
    slug = models.SlugField(max_length=64)
    name = models.CharField(max_length=200)
    cutoff = models.DateTimeField()
    # The zone the cutoff was announced in, so it is shown as announced and in the viewer's zone.
    timezone = models.CharField(max_length=64, default="UTC", validators=[validate_timezone])
    buffer = models.DurationField(default=timedelta(0))
    notes = models.TextField(blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "slug"], name="deadline_unique_slug")
        ]
        ordering = ["cutoff"]

    def __str__(self) -> str:
        return self.name

    @property
    def train_by(self) -> datetime:
        return self.cutoff - self.buffer


# What a run that reports no world size is priced on (Run.priced_processes), and what every
# figure priced on it says beside it.
ASSUMED_PROCESSES = 1
ASSUMED_PROCESSES_NOTE = f"{ASSUMED_PROCESSES} process assumed"


class Run(models.Model):
    class Status(models.TextChoices):
        RUNNING = "running"
        FINISHED = "finished"
        FAILED = "failed"
        CRASHED = "crashed"
        STALLED = "stalled"

    class Unit(models.TextChoices):
        STEPS = "steps"
        TOKENS = "tokens"
        SAMPLES = "samples"

    # The lifecycle, in one place (services apply it with conditional UPDATEs, so concurrent
    # requests cannot step over each other):
    #   create, or the first batch of an unseen session (a new attempt) -> running, not ended
    #   a batch: stalled -> running; crashed as the sweeper inferred it -> running. An ending
    #     the client reported (ended_at set) stays: its spool may still deliver late batches.
    #   finish(status, session) from the current attempt, or without a session -> that status,
    #     ended_at set; from an older attempt (a spool replayed after a resume) -> ignored
    #   liveness sweep, active runs only: silent but beating -> stalled; no heartbeat ->
    #     crashed, inferred (no ended_at), so the next batch revives it
    ACTIVE_STATUSES = (Status.RUNNING, Status.STALLED)
    FINISH_STATUSES = (Status.FINISHED, Status.FAILED, Status.CRASHED)

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="runs")
    # Public id: supplied by the client so a restarted job resumes the same run.
    public_id = models.CharField(max_length=64)
    name = models.CharField(max_length=200, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    started_at = models.DateTimeField(default=now)
    ended_at = models.DateTimeField(null=True, blank=True)
    last_seen_at = models.DateTimeField(default=now)
    total_steps = models.BigIntegerField(null=True, blank=True)
    progress_unit = models.CharField(max_length=16, choices=Unit.choices, default=Unit.STEPS)
    config = models.JSONField(default=dict, blank=True)
    tags = models.JSONField(default=list, blank=True)
    world_size = models.PositiveIntegerField(null=True, blank=True)
    hosts = models.JSONField(default=list, blank=True)
    deadline = models.ForeignKey(
        Deadline, null=True, blank=True, on_delete=models.SET_NULL, related_name="runs"
    )
    # The token that created the run: provenance for operators, and how the demo tells the runs
    # its replay made (and may reset) from runs a person logged into the demo project.
    created_by_token = models.ForeignKey(
        "ApiToken", null=True, blank=True, on_delete=models.SET_NULL, related_name="runs_created"
    )
    # Summary fields kept up to date on every write so list pages never scan points.
    last_step = models.BigIntegerField(null=True, blank=True)
    current_segment = models.PositiveIntegerField(default=0)
    points_count = models.BigIntegerField(default=0)
    created_at = models.DateTimeField(default=now)
    # Set when a member deletes the run (tracker.bulk.runs_delete, or MLflow's delete_run, whose
    # RunLink.lifecycle_stage mirrors it): hidden from the board, the explorer and MLflow's
    # search, restorable for RUNCAST_DELETED_RUN_KEEP_DAYS after this time.
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "public_id"], name="run_unique_public_id")
        ]
        indexes = [
            # The sweeper and the board list a project's active runs.
            models.Index(fields=["status", "last_seen_at"], name="run_status_seen_idx"),
            # The runs explorer's default order (tracker.explorer: newest start, then id): its
            # first page reads 51 index entries, not a project's 100,000 runs
            # (bench/runs_page.py).
            models.Index(
                F("project"), F("started_at").desc(), F("id"), name="run_project_started_idx"
            ),
            # The purge of deleted runs past their keep (tracker.bulk.runs_purge): with nothing
            # to purge it reads this small index, not every run.
            models.Index(
                fields=["deleted_at"],
                condition=Q(deleted_at__isnull=False),
                name="run_deleted_at_idx",
            ),
        ]

    def __str__(self) -> str:
        return self.name or self.public_id

    @property
    def is_active(self) -> bool:
        return self.status in self.ACTIVE_STATUSES

    @property
    def priced_processes(self) -> tuple[int, bool]:
        """The processes a GPU cost is priced on, and whether that is assumed: a single
        process started without a launcher reports no world size, and one process is then the
        likely count (every figure priced on it says "1 process assumed")."""
        if self.world_size:
            return self.world_size, False
        return ASSUMED_PROCESSES, True

    @property
    def has_ended(self) -> bool:
        """Ended as the client reported it (not a crash the sweeper only inferred)."""
        return self.status in self.FINISH_STATUSES and self.ended_at is not None

    @property
    def crash_inferred(self) -> bool:
        return self.status == self.Status.CRASHED and self.ended_at is None

    def finish_applies(self, *, attempt: int | None) -> bool:
        """Does a finish from this attempt (segment number; None: unsaid) end the run?"""
        return attempt is None or attempt >= self.current_segment

    @classmethod
    def silent_status(cls, *, heartbeat_lost: bool) -> str:
        return cls.Status.CRASHED if heartbeat_lost else cls.Status.STALLED

    @classmethod
    def status_when_heard(cls) -> Case:
        """The status after a batch arrives, as an UPDATE expression (see the lifecycle)."""
        return Case(
            When(status=cls.Status.STALLED, then=Value(cls.Status.RUNNING)),
            When(status=cls.Status.CRASHED, ended_at__isnull=True, then=Value(cls.Status.RUNNING)),
            default=F("status"),
        )

    @classmethod
    def reopened(cls) -> dict[str, object]:
        """The fields a new attempt (a resume) sets."""
        return {"status": cls.Status.RUNNING, "ended_at": None}

    @property
    def progress(self) -> float | None:
        if not self.total_steps or self.last_step is None:
            return None
        return max(0.0, min(1.0, self.last_step / self.total_steps))


class RunSegment(models.Model):
    """One attempt of a run: a process that logged to it (the first start, then each resume).

    A resume from an earlier checkpoint makes steps go back; points carry their segment so the
    rollback and the progress it lost stay visible, and the latest segment wins when plotting.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="segments")
    number = models.PositiveIntegerField()
    session = models.CharField(max_length=64)
    started_at = models.DateTimeField(default=now)
    # First progress step logged in this segment and the furthest step of the one before.
    first_step = models.BigIntegerField(null=True, blank=True)
    previous_last_step = models.BigIntegerField(null=True, blank=True)
    # Retention deletes old batch rows (tracker.retention): the highest seq of this session it
    # deleted. A batch at or below it was stored already, so dedupe outlives the rows.
    seq_floor = models.BigIntegerField(null=True, blank=True)
    # Seconds between the heartbeats its process declared at create it sends while alive (the
    # runcast client's, when online); null: none declared (an MLflow client, an older client,
    # a session whose create never arrived). The liveness sweep's yardstick for a run too
    # young to have a cadence of its own.
    heartbeat_interval_s = models.FloatField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "number"], name="segment_unique_number"),
            models.UniqueConstraint(fields=["run", "session"], name="segment_unique_session"),
        ]
        ordering = ["run", "number"]

    def __str__(self) -> str:
        return f"{self.run} segment {self.number}"

    @property
    def lost_steps(self) -> int:
        if self.first_step is None or self.previous_last_step is None:
            return 0
        return max(0, self.previous_last_step - self.first_step)


class IngestBatch(models.Model):
    """One accepted batch. Its (run, session, seq) key makes a retried batch change nothing.

    Rows older than RUNCAST_BATCH_KEEP_DAYS are deleted by retention; their session's
    `RunSegment.seq_floor` keeps answering replays of them as duplicates.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="batches")
    session = models.CharField(max_length=64)
    seq = models.BigIntegerField()
    received_at = models.DateTimeField(default=now)
    points = models.PositiveIntegerField(default=0)
    # The client's heartbeat clock, so stall detection knows the run's usual interval.
    heartbeat_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "session", "seq"], name="batch_unique_seq")
        ]
        indexes = [models.Index(fields=["run", "received_at"], name="batch_run_received_idx")]

    def __str__(self) -> str:
        return f"{self.run} batch {self.session}/{self.seq}"


class MetricChunk(models.Model):
    """Packed points of one key from one batch: little-endian int64 steps, float64 values and
    float64 epoch-second times. NaN and Inf are stored as they came: a NaN loss is a signal.

    Later telemetry (per-rank step times `rank/<r>/step_ms`, GPU samples `gpu/<i>/util`) is
    metric keys too, so it shares this storage and its downsampling.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="chunks")
    # Null once retention has deleted the batch row (tracker.retention): the points stay.
    batch = models.ForeignKey(
        IngestBatch, null=True, blank=True, on_delete=models.SET_NULL, related_name="chunks"
    )
    key = models.CharField(max_length=200)
    segment = models.PositiveIntegerField()
    n = models.PositiveIntegerField()
    first_step = models.BigIntegerField()
    last_step = models.BigIntegerField()
    min_step = models.BigIntegerField()
    max_step = models.BigIntegerField()
    # Over finite values only; null when the chunk holds none.
    min_value = models.FloatField(null=True)
    max_value = models.FloatField(null=True)
    nonfinite = models.PositiveIntegerField(default=0)
    steps = models.BinaryField()
    values = models.BinaryField()
    times = models.BinaryField()
    # Per-64-point block summaries (tracker.series.rollup): coarse chart zooms read these.
    rollup = models.BinaryField(default=b"")

    # Compaction (tracker.compaction) merges a series' old chunks of fewer points than this
    # into chunks of up to COMPACT_POINTS. Its work-list index below repeats the number.
    COMPACT_BELOW = 2048
    COMPACT_POINTS = 4096

    class Meta:
        indexes = [
            # Serves "all chunks of one key of one run in order" (charts, forecasts).
            models.Index(fields=["run", "key", "segment", "min_step"], name="chunk_series_idx"),
            # The compaction sweep's work list (tracker.compaction): old small chunks only, so
            # a sweep with nothing to do reads a few rows per series, not every chunk.
            models.Index(
                fields=["run", "key", "segment"],
                name="chunk_compactable_idx",
                condition=models.Q(batch__isnull=True, n__lt=2048),  # COMPACT_BELOW
            ),
        ]

    def __str__(self) -> str:
        return f"{self.key} steps {self.min_step}-{self.max_step} ({self.n} points)"


class LatestMetric(models.Model):
    """Each key's latest point of a run: the highest step, and at an equal step the later batch.
    Kept on the write path (`tracker.services.batch_ingest`) so that searches filter and order on
    metrics in SQL and a page of runs reads its metrics without unpacking chunks (mlflow's
    `latest_metrics` table)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="latest_metrics")
    key = models.CharField(max_length=200)
    # Null for a NaN, told from a missing key by is_nan: SQLite stores a NaN as NULL anyway.
    value = models.FloatField(null=True)
    is_nan = models.BooleanField(default=False)
    step = models.BigIntegerField()
    timestamp_ms = models.BigIntegerField()

    class Meta:
        constraints = [
            # Also the index of the per-run, per-key subqueries of tracker.query.
            models.UniqueConstraint(fields=["run", "key"], name="latest_metric_unique_key"),
        ]
        indexes = [
            # One key's rows across runs, by value: a filter or sort on a metric (tracker.query's
            # join on (run, key)) reads them from the index alone (bench/runs_page.py).
            models.Index(
                fields=["key", "value"], include=["run", "is_nan"], name="latest_metric_value_idx"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.key} = {self.value} at step {self.step}"


class SavedView(models.Model):
    """A runs explorer view a member named for the project: its query string (filter, sort,
    columns, group), which is the whole state of the view (dashboard/explorer)."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="saved_views")
    name = models.CharField(max_length=100)
    query = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="saved_view_unique_name")
        ]
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.project}/{self.name}"


class Event(models.Model):
    class Kind(models.TextChoices):
        CHECKPOINT = "checkpoint"
        EVAL = "eval"
        RESUME = "resume"
        RESTART = "restart"
        LR_CHANGE = "lr_change"
        ARCH_CHANGE = "arch_change"
        CUSTOM = "custom"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events")
    batch = models.ForeignKey(
        IngestBatch, null=True, blank=True, on_delete=models.SET_NULL, related_name="events"
    )
    kind = models.CharField(max_length=32, choices=Kind.choices)
    step = models.BigIntegerField(null=True, blank=True)
    time = models.DateTimeField()
    segment = models.PositiveIntegerField(default=0)
    payload = models.JSONField(default=dict, blank=True)

    class Meta:
        indexes = [models.Index(fields=["run", "kind", "time"], name="event_run_kind_idx")]
        ordering = ["time", "id"]

    def __str__(self) -> str:
        return f"{self.kind} at step {self.step}"


class Invitation(models.Model):
    """An emailed, one-time invitation to join a project with a role.

    Only a SHA-256 of the link's token is stored (like ApiToken): a database read does not yield
    working links. It is spent once (accepted_at), expires, and can be revoked.
    """

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="invitations")
    email = models.EmailField()
    role = models.CharField(
        max_length=16, choices=Membership.Role.choices, default=Membership.Role.MEMBER
    )
    token_hash = models.CharField(max_length=64, unique=True)
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=now)
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.email} to {self.project} ({self.role})"

    def is_pending(self, at: datetime) -> bool:
        return self.accepted_at is None and self.revoked_at is None and at < self.expires_at


class RankTimingChunk(models.Model):
    """One batch of one rank's step timings (docs/architecture.md, "Per-rank timings").

    Every rank of a distributed job sends its own (session, seq) batches, so a rank's batch is
    one row: one INSERT per rank per batch, packed like MetricChunk (little-endian int64 steps,
    float32 seconds, NaN where a part was not given). float32 keeps 7 digits of a step time
    (0.1 µs of a 1 s step) at half the bytes: a 1,024-rank job writes 3 arrays per rank-step.
    Kept apart from MetricChunk/IngestBatch: those are the run's progress and heartbeat, and
    a non-zero rank is neither (it must not reopen the run or count as its attempt).
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="rank_timings")
    session = models.CharField(max_length=64)
    seq = models.BigIntegerField()
    rank = models.PositiveIntegerField()
    local_rank = models.PositiveIntegerField(null=True, blank=True)
    host = models.CharField(max_length=255, blank=True)
    n = models.PositiveIntegerField()
    min_step = models.BigIntegerField()
    max_step = models.BigIntegerField()
    steps = models.BinaryField()
    compute = models.BinaryField()
    wait = models.BinaryField()
    total = models.BinaryField()
    received_at = models.DateTimeField(default=now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "session", "seq"], name="rank_timing_unique_seq")
        ]
        indexes = [
            # "All ranks over a step range" (the detector's recent window, the heat map).
            models.Index(fields=["run", "max_step"], name="rank_timing_range_idx"),
            # "One rank over the run" (drill-down to a rank's history).
            models.Index(fields=["run", "rank", "min_step"], name="rank_timing_rank_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.run} rank {self.rank} steps {self.min_step}-{self.max_step}"


class RankTimingRollup(models.Model):
    """How far a run's rank timings are folded into its `RankTimingBlock`s (rank_timings.py).

    Every chunk of the run with id <= `through_id` is in the blocks, except those wholly below
    `floor_step` (no window the rollup serves starts that low). One row per run, locked by the
    fold: it is the claim that makes two folds of one run take turns.
    """

    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="rank_rollup")
    through_id = models.BigIntegerField(default=0)
    top_step = models.BigIntegerField(null=True, blank=True)  # newest step folded
    floor_step = models.BigIntegerField(null=True, blank=True)  # blocks are exact from here up

    def __str__(self) -> str:
        return f"{self.run} rank rollup through chunk {self.through_id}"


class RankTimingBlock(models.Model):
    """Every rank's timings over BLOCK_STEPS steps [lo, lo + BLOCK_STEPS) of a run: the steps x
    ranks matrices the forecast's window is cut from, so it reads ~30 rows, not 60,000 chunks.

    Packed like the chunks (int64 steps and ranks; float32 seconds, NaN where a rank reported no
    value, empty where no rank gave that part in the block; `present` a bit per cell: the rank
    sent that step, NaN or not). `owner` is, per
    cell, the max_step of the chunk its value came from: a step sent twice keeps the chunk later
    in (max_step, id) order, as the raw read does; only the fold reads it. `hosts` and
    `host_steps`, per rank, are the last non-empty host among the chunks whose max_step falls in
    this block and that chunk's max_step (the int64 minimum: none).
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="rank_blocks")
    lo = models.BigIntegerField()
    steps = models.BinaryField()
    ranks = models.BinaryField()
    hosts = models.JSONField(default=list)
    host_steps = models.BinaryField()
    compute = models.BinaryField()
    wait = models.BinaryField()
    total = models.BinaryField()
    present = models.BinaryField()
    owner = models.BinaryField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "lo"], name="rank_timing_block_unique_lo")
        ]

    def __str__(self) -> str:
        return f"{self.run} rank timings from step {self.lo}"


# GPU telemetry (hosts, agent batches, processes, episodes) lives in tracker/gpu/; imported here
# so that its models are registered in this app.
from tracker.gpu.models import (  # noqa: E402, F401
    GpuEpisode,
    Host,
    HostBatch,
    HostProcess,
    RunProcess,
)
