"""Host GPU telemetry: hosts, their batches (stored packed, one row per batch), the processes
seen on their GPUs, the runs' own process identities, and the episodes found in the activity.

Why one row per batch and not per key (like MetricChunk): a host sends ~8 keys per GPU plus one
per process every second; a row per key per batch would be ~100 rows a second per host. One row
per (host, batch) holding every key's points packed (zlib of float64 columns) is one INSERT per
batch and 8,640 rows per host-day at the agent's 10-s batches (bench/gpu_store.py measures both).
"""

from __future__ import annotations

from django.db import models
from django.utils.timezone import now

# Models referred to by name: tracker.models imports this module, so importing it back would
# make a cycle (tests/test_architecture.py).
PROJECT = "tracker.Project"
RUN = "tracker.Run"


class Host(models.Model):
    project = models.ForeignKey(PROJECT, on_delete=models.CASCADE, related_name="gpu_hosts")
    name = models.CharField(max_length=200)
    boot_id = models.CharField(max_length=64, blank=True)
    gpus = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(default=now)
    last_seen_at = models.DateTimeField(default=now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "name"], name="host_unique_name")]

    def __str__(self) -> str:
        return self.name


class HostBatch(models.Model):
    """One agent batch: (host, session, seq) makes a replay a no-op; its points, packed."""

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="batches")
    session = models.CharField(max_length=64)
    seq = models.BigIntegerField()
    t0 = models.FloatField()
    t1 = models.FloatField()
    keys = models.JSONField(default=list)
    # zlib(JSON header + float64 columns): see tracker.gpu.services.pack.
    data = models.BinaryField()
    # Per GPU [mean, max] utilisation of the batch (tracker.gpu.services.util_summary).
    summary = models.JSONField(default=dict)
    received_at = models.DateTimeField(default=now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["host", "session", "seq"], name="hostbatch_unique_seq")
        ]
        # Reading a host's time window (pages, the episode check) walks this index.
        indexes = [models.Index(fields=["host", "t0"], name="hostbatch_time_idx")]

    def __str__(self) -> str:
        return f"{self.host_id} batch {self.seq}"


class HostProcess(models.Model):
    """A process seen on a host's GPUs, as the agent described it."""

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="processes")
    pid = models.IntegerField()
    start_ticks = models.BigIntegerField()
    ns_pid = models.IntegerField()
    ancestors = models.JSONField(default=list, blank=True)
    cmdline = models.TextField(blank=True)
    user = models.CharField(max_length=64, blank=True)
    cgroup = models.CharField(max_length=300, blank=True)
    container = models.CharField(max_length=80, blank=True)
    env_run_id = models.CharField(max_length=64, blank=True)
    first_seen = models.FloatField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["host", "pid", "start_ticks"], name="hostprocess_unique_identity"
            )
        ]

    def __str__(self) -> str:
        return f"pid {self.pid} {self.cmdline[:40]}"


class RunProcess(models.Model):
    """A run's own process identity, recorded by the training client at start."""

    run = models.ForeignKey(RUN, on_delete=models.CASCADE, related_name="gpu_processes")
    session = models.CharField(max_length=64)
    host = models.CharField(max_length=200, blank=True)
    boot_id = models.CharField(max_length=64, blank=True)
    ns_pid = models.IntegerField(null=True)
    start_ticks = models.BigIntegerField(null=True)
    launcher = models.JSONField(null=True, blank=True)
    cuda_visible_devices = models.CharField(max_length=200, blank=True)
    container = models.CharField(max_length=80, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "session"], name="runprocess_unique_session")
        ]
        indexes = [models.Index(fields=["boot_id"], name="runprocess_boot_idx")]

    def __str__(self) -> str:
        return f"{self.run_id} pid {self.ns_pid}"


class GpuEpisode(models.Model):
    """A departure of a host's GPU activity from its run's normal, explained or not."""

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="episodes")
    run = models.ForeignKey(RUN, null=True, on_delete=models.SET_NULL, related_name="gpu_episodes")
    gpus = models.JSONField(default=list)
    start = models.FloatField()
    end = models.FloatField()
    kind = models.CharField(max_length=16)
    explained = models.BooleanField()
    reason = models.CharField(max_length=200, blank=True)
    expected = models.FloatField()
    observed = models.FloatField()
    attribution = models.JSONField(default=dict)
    text = models.TextField(blank=True)
    created_at = models.DateTimeField(default=now)

    class Meta:
        # One episode is one row per verdict: a run's checkpoint on GPU 0 and a stranger's
        # burst on GPU 1 at the same time are two rows with the same start.
        constraints = [
            models.UniqueConstraint(
                fields=["host", "start", "kind", "gpus"], name="gpuepisode_unique_gpus"
            )
        ]
        ordering = ["start"]

    def __str__(self) -> str:
        return f"{self.kind} on {self.host_id} at {self.start:.0f}"
