"""What MLflow has and Runcast's own models do not: named experiments and each run's MLflow facts.

An MLflow experiment is a named group of runs inside one Runcast project (a token is scoped to
one project, so it sees that project's experiments only). Every project has the experiment
`Default` with id "0", which stock clients use when no experiment is set. The MLflow run is a
Runcast `Run` (its public id is the MLflow run id); `RunLink` keeps what MLflow reports about it
and Runcast does not model: every tag, the MLflow status and lifecycle stage, the user, and the
attempt whose ingestion session its metrics belong to.
"""

from __future__ import annotations

from django.db import models
from django.utils.timezone import now

from tracker.models import Project, Run

DEFAULT_EXPERIMENT_ID = "0"
DEFAULT_EXPERIMENT_NAME = "Default"


class Experiment(models.Model):
    class Stage(models.TextChoices):
        ACTIVE = "active"
        DELETED = "deleted"

    project = models.ForeignKey(
        Project, on_delete=models.CASCADE, related_name="mlflow_experiments"
    )
    # The id clients see: "0" for the default experiment, random digits otherwise (MLflow's
    # own ids are digits, and some clients compare them as strings of digits).
    public_id = models.CharField(max_length=32)
    name = models.CharField(max_length=500)
    lifecycle_stage = models.CharField(max_length=16, choices=Stage.choices, default=Stage.ACTIVE)
    tags = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=now)
    updated_at = models.DateTimeField(default=now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "public_id"], name="mlflow_exp_unique_id"),
            models.UniqueConstraint(fields=["project", "name"], name="mlflow_exp_unique_name"),
        ]

    def __str__(self) -> str:
        return f"{self.project.slug}/{self.name}"


class RunLink(models.Model):
    class Stage(models.TextChoices):
        ACTIVE = "active"
        DELETED = "deleted"

    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="mlflow")
    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="runs")
    # Every MLflow tag as logged, system tags (mlflow.*) included.
    tags = models.JSONField(default=dict, blank=True)
    # MLflow's own status (RUNNING, SCHEDULED, FINISHED, FAILED, KILLED): Runcast's status is
    # coarser (KILLED is Runcast's crashed) and get_run must answer what the client set.
    status = models.CharField(max_length=16, default="RUNNING")
    lifecycle_stage = models.CharField(max_length=16, choices=Stage.choices, default=Stage.ACTIVE)
    user_id = models.CharField(max_length=256, blank=True)
    end_time_ms = models.BigIntegerField(null=True, blank=True)
    # Each start or resume (update to RUNNING) is an attempt: its metrics are ingested under the
    # session `mlflow-<attempt>`, so a resume from an earlier checkpoint is a new segment.
    attempt = models.PositiveIntegerField(default=1)
    # The MLflow server a run was imported from (`runcast_import_mlflow`); blank when logged here.
    imported_from = models.CharField(max_length=500, blank=True)
    # `log_input(s)`: the datasets a run read, as MLflow's DatasetInput JSON ({"tags": [...],
    # "dataset": {name, digest, source_type, source, schema, profile}}), each (name, digest)
    # once; and the logged models it read (`model_inputs`: [{"model_id"}]).
    dataset_inputs = models.JSONField(default=list, blank=True)
    model_inputs = models.JSONField(default=list, blank=True)
    # `log_outputs` (what log_model sends): [{"model_id", "step"}].
    model_outputs = models.JSONField(default=list, blank=True)

    def __str__(self) -> str:
        return f"mlflow run {self.run.public_id}"

    @property
    def session(self) -> str:
        return f"mlflow-{self.attempt}"


class LoggedModel(models.Model):
    """An MLflow 3 logged model (`mlflow.<flavor>.log_model` creates one, uploads its files to
    its artifact location, then finalizes it). Its files live in the artifact store under the
    model's own prefix (tracker.artifacts.model_prefix)."""

    class Status(models.TextChoices):
        PENDING = "LOGGED_MODEL_PENDING"
        READY = "LOGGED_MODEL_READY"
        FAILED = "LOGGED_MODEL_UPLOAD_FAILED"

    class Stage(models.TextChoices):
        ACTIVE = "active"
        DELETED = "deleted"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="mlflow_models")
    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="models")
    # MLflow's form: "m-" and 32 hex digits, made by the server.
    model_id = models.CharField(max_length=64, unique=True)
    name = models.CharField(max_length=500)
    model_type = models.CharField(max_length=500, blank=True)
    # The run that logged it; a model outlives its run in MLflow, so the id is kept as text.
    source_run_id = models.CharField(max_length=64, blank=True)
    status = models.CharField(max_length=32, choices=Status.choices, default=Status.PENDING)
    status_message = models.TextField(blank=True)
    lifecycle_stage = models.CharField(max_length=16, choices=Stage.choices, default=Stage.ACTIVE)
    tags = models.JSONField(default=dict, blank=True)
    params = models.JSONField(default=dict, blank=True)
    # Metrics logged with this model's id: [{key, value, timestamp, step, run_id, dataset_name,
    # dataset_digest}], each point once.
    metrics = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(default=now)
    updated_at = models.DateTimeField(default=now)

    class Meta:
        indexes = [models.Index(fields=["project", "experiment"], name="mlflow_model_exp_idx")]

    def __str__(self) -> str:
        return f"{self.model_id} ({self.name})"


class Mirror(models.Model):
    """A project following an MLflow tracking server: a periodic task copies its new
    experiments, runs and points here (tracker.mlflow.mirror), through the same ingestion as
    live logging. One per project."""

    project = models.OneToOneField(Project, on_delete=models.CASCADE, related_name="mlflow_mirror")
    url = models.CharField(max_length=500)
    # One experiment's name, or blank for every experiment on the server.
    experiment_name = models.CharField(max_length=500, blank=True)
    # Sent as `Authorization: Bearer` (MLFLOW_TRACKING_TOKEN's form), or with `username` as
    # HTTP basic auth (MLflow's basic-auth app: MLFLOW_TRACKING_USERNAME / _PASSWORD). Never
    # rendered back whole, never logged, never in a URL; readable (not hashed) because it is sent.
    token = models.CharField(max_length=1000, blank=True)
    username = models.CharField(max_length=150, blank=True)
    enabled = models.BooleanField(default=True)
    # The address check of the outbound seam is skipped: set only when an operator chose the URL
    # (a Django staff user, or the management command), cleared when anyone else changes it.
    private_ok = models.BooleanField(default=False)
    # A sync holds the mirror until then (a conditional UPDATE claims it), so ticks never overlap.
    lease_until = models.DateTimeField(null=True, blank=True)
    last_sync_at = models.DateTimeField(null=True, blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    # The last sync that looked at every run, not only the live and recently ended ones.
    last_full_sync_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True)
    last_error_at = models.DateTimeField(null=True, blank=True)
    syncs = models.PositiveIntegerField(default=0)
    failures = models.PositiveIntegerField(default=0)
    runs_created = models.PositiveIntegerField(default=0)
    points_copied = models.BigIntegerField(default=0)
    created_at = models.DateTimeField(default=now)
    updated_at = models.DateTimeField(default=now)

    def __str__(self) -> str:
        return f"{self.project.slug} ← {self.url}"

    @property
    def token_hint(self) -> str:
        """What the page shows of the token: that one is set, and its last 4 characters when
        it is long enough for them to give nothing away."""
        if not self.token:
            return ""
        return f"…{self.token[-4:]}" if len(self.token) >= 16 else "set"


class MirroredRun(models.Model):
    """Where a mirror stands in one run: per metric key, a cursor into MLflow's history, so a
    live run's tick fetches only its newest page, and whether an ended run is wholly copied
    (then it is not fetched again)."""

    mirror = models.ForeignKey(Mirror, on_delete=models.CASCADE, related_name="runs")
    link = models.ForeignKey(RunLink, on_delete=models.CASCADE, related_name="mirrored")
    # {key: {"token": page token or "", "first": [ts, step, value hex] of that page's first
    #  point, "seen": points of that page copied, "latest": [step, ts, value hex] MLflow
    #  reported as the key's latest when the copy reached the end}}
    cursors = models.JSONField(default=dict, blank=True)
    complete = models.BooleanField(default=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["mirror", "link"], name="mlflow_mirrored_run_unique")
        ]

    def __str__(self) -> str:
        return f"mirrored {self.link_id} of mirror {self.mirror_id}"
