"""Forecasts (full history for a week, hourly before: forecasting/retention.py) and flags
(state changes as rows, all kept)."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from tracker.models import Run


class Forecast(models.Model):
    class Kind(models.TextChoices):
        ETA = "eta"
        LOSS = "loss"
        DEADLINE = "deadline"
        SLIP = "slip"
        # The straggler detector's report and the what-if finish without the straggler.
        STRAGGLER = "straggler"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="forecasts")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    computed_at = models.DateTimeField(default=timezone.now)
    # The input it was computed from: recomputing on the same input updates, never duplicates.
    segment = models.PositiveIntegerField()
    input_last_step = models.BigIntegerField()
    # Queryable copies of the ETA's finish times (epoch seconds) for history charts and slip.
    finish_p10 = models.FloatField(null=True)
    finish_p50 = models.FloatField(null=True)
    finish_p90 = models.FloatField(null=True)
    data = models.JSONField(default=dict)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["run", "kind", "segment", "input_last_step"],
                name="forecast_unique_input",
            )
        ]
        indexes = [models.Index(fields=["run", "kind", "computed_at"], name="forecast_history_idx")]

    def __str__(self) -> str:
        return f"{self.kind} forecast of {self.run} at step {self.input_last_step}"


class ConditionReading(models.Model):
    """What one computation found before hysteresis: the flags' working history.

    `forecasting.hysteresis` raises a trending flag only when every reading over a window found
    it. Keyed by the computation's second, not its input: a stalled run brings no new steps and
    its readings must still accumulate; recomputing within the same second updates the row.
    Kept RUNCAST_CONDITIONS_KEEP_HOURS (forecasting/retention.py).
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="condition_readings")
    segment = models.PositiveIntegerField()
    second = models.BigIntegerField()  # epoch second of the computation: the key
    computed_at = models.DateTimeField()
    found = models.JSONField(default=list)  # the flag kinds this computation found, sorted
    deadline_p = models.FloatField(null=True)  # its chance of making the cutoff, if any
    input_step = models.BigIntegerField(null=True)  # the progress report it read
    slip_s = models.FloatField(null=True)  # how far the finish had slipped, if it found a slip

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["run", "segment", "second"], name="reading_unique_second"
            )
        ]
        # The hysteresis reads one run's readings of the last windows, oldest first.
        indexes = [models.Index(fields=["run", "computed_at"], name="reading_history_idx")]

    def __str__(self) -> str:
        return f"conditions of {self.run} at {self.computed_at:%Y-%m-%d %H:%M:%S}"


class Flag(models.Model):
    """One state change of one condition on one run: the outbox alerts read (healthchecks Flip).

    The current state of (run, kind) is its newest row.
    """

    class Kind(models.TextChoices):
        # Found on the loss curve by forecasting.estimators.divergence.
        NAN = "nan", "loss NaN/Inf"
        SPIKE = "spike", "loss spike"
        RISE = "rise", "loss rising"
        OSCILLATION = "oscillation", "loss oscillating"
        REGRESSION = "regression", "loss regressed"
        # Found on the ETA and the deadline risk.
        SLIP = "slip", "ETA slipping"
        DEADLINE = "deadline", "deadline at risk"
        # Found by the liveness sweep.
        STALLED = "stalled", "stalled or crashed"
        # Found on the per-rank step timings: the rank (or host) the whole job waits for.
        STRAGGLER = "straggler", "straggler rank"
        # Found on the host agent's GPU series (forecasting.gpu.check).
        GPU_UNEXPLAINED = "gpu_unexplained", "unexplained GPU activity"
        HANG = "hang", "GPUs busy, no progress"

    class State(models.TextChoices):
        RAISED = "raised"
        UPDATED = "updated"
        RESOLVED = "resolved"

    # Kinds raised on the loss curve: the run page marks their onset on the loss chart.
    DIVERGENCE_KINDS: tuple[str, ...] = (
        Kind.NAN,
        Kind.SPIKE,
        Kind.RISE,
        Kind.OSCILLATION,
        Kind.REGRESSION,
    )

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="flags")
    kind = models.CharField(max_length=32, choices=Kind.choices)
    state = models.CharField(max_length=16, choices=State.choices)
    previous_state = models.CharField(max_length=16, blank=True)
    severity = models.FloatField(null=True)
    explanation = models.TextField()
    onset_step = models.BigIntegerField(null=True)
    data = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=timezone.now)
    # Set when the alerts layer has turned this change into notifications.
    processed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["run", "kind", "created_at"], name="flag_run_kind_idx"),
            # The alerts dispatcher scans unprocessed rows oldest first.
            models.Index(fields=["processed_at", "created_at"], name="flag_outbox_idx"),
        ]
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.kind} {self.state} on {self.run}"


class ServerClock(models.Model):
    """When the server was listening, from the liveness sweeper's own ticks (one row).

    A gap between two ticks much longer than their period means the server (or its worker) was
    stopped: a run's silence during that gap is the server's, not the run's. A tick is taken
    only while the web tier answers (forecasting.liveness.server_listening).
    """

    last_tick_at = models.DateTimeField(null=True)
    listening_since = models.DateTimeField(null=True)
    # The web tier's last answer to the sweeper's probe (RUNCAST_WEB_PROBE_URL): the worker can
    # tick on while the web that clients reach is down. Null: no probe, or it never answered.
    web_answered_at = models.DateTimeField(null=True)

    def __str__(self) -> str:
        return f"listening since {self.listening_since}"


class SeriesSample(models.Model):
    """One key's forecast input as state: the sample `forecasting.sampling` keeps of its points
    up to a cursor, so a forecast reads this row and the chunks after the cursor, not the whole
    history (`forecasting.inputs`, its one writer, inside the forecast's transaction).

    The cursor is the last chunk it covers in storage order (segment, min_step, chunk id) and
    `points` how many points the chunks up to it hold: when they hold a different number (a
    batch that committed late with an earlier position, a chunk merged across the cursor, a run
    purged) the row is rebuilt from every chunk, so a stale row is never used.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="series_samples")
    key = models.CharField(max_length=200)
    limit = models.PositiveIntegerField()  # at most this many points kept
    keep_nonfinite = models.BooleanField()
    stride = models.PositiveIntegerField()
    points = models.BigIntegerField()
    cursor_segment = models.PositiveIntegerField()
    cursor_min_step = models.BigIntegerField()
    cursor_chunk = models.BigIntegerField()
    # The kept points and their positions in storage order, packed small (forecasting.inputs:
    # delta or XOR coded, deflated); the last point covered likewise (it is always an input).
    positions = models.BinaryField()
    steps = models.BinaryField()
    values = models.BinaryField()
    times = models.BinaryField()
    segments = models.BinaryField()
    last_steps = models.BinaryField()
    last_values = models.BinaryField()
    last_times = models.BinaryField()
    last_segments = models.BinaryField()
    firsts = models.JSONField(default=dict)  # segment -> first step over every point covered
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["run", "key", "limit", "keep_nonfinite"], name="series_sample_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.key} sample of {self.run} ({self.points} points, 1 in {self.stride})"
