"""PyTorch Lightning: ``Trainer(logger=RuncastLogger(project="llm"))``.

Needs ``lightning`` (``pip install 'runcast[lightning]'``). What goes to Runcast:

* metrics: everything Lightning hands its loggers (``self.log(...)``); while fitting, at
  ``trainer.global_step`` after the batch's optimizer step (as the HF Trainer's
  ``global_step``), so the last batch of a complete run lands on the planned total;
* hyperparameters (``save_hyperparameters()``, the datamodule's) as the run's config;
* the world size: ``trainer.world_size`` (devices x nodes; 1 on one device);
* the planned total: ``trainer.max_steps`` when set, else ``trainer.estimated_stepping_batches``
  (epochs x batches / accumulation), so the server can forecast the finish;
* every checkpoint ``ModelCheckpoint`` saves, as a ``checkpoint`` event with its step and path
  (the rollback targets of divergence flags);
* ``grad_norms_every=N``: per-layer gradient norms (``grad_norm/<layer>``) every N optimizer
  steps, measured after backward and before clipping and the optimizer step;
* the end of ``fit``: ``finished``, or ``failed`` when it raised.

Only global rank 0 talks to the server; other ranks' calls do nothing.

The run is started lazily, once Lightning has reported the hyperparameters and the model (its
``log_graph`` call at the start of ``fit``), because the config and total steps can only be
sent when the run is created. ``logger.experiment`` is the run (``log``, ``event``, ``id``,
``url``...); using it starts the run if ``fit`` has not.
"""

from __future__ import annotations

import logging
import math
import os
import uuid
from argparse import Namespace
from collections.abc import Callable, Mapping
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities.rank_zero import rank_zero_only

import runcast
from runcast.integrations._gradnorms import GradNorms
from runcast.run import AnyRun, NoOpRun

logger = logging.getLogger("runcast")

# Lightning's finalize() statuses -> the run's final status. "finished" is what Lightning's
# SLURM requeue handler passes before it checkpoints and requeues the job.
_STATUS = {"success": "finished", "finished": "finished", "failed": "failed"}


class RuncastLogger(Logger):
    """A Lightning logger that sends the run to Runcast (see the module docstring)."""

    def __init__(
        self,
        project: str | None = None,
        name: str | None = None,
        *,
        id: str | None = None,
        total_steps: int | None = None,
        config: Mapping[str, Any] | None = None,
        deadline: str | None = None,
        tags: list[str] | None = None,
        grad_norms_every: int = 0,
        grad_norm_group: Callable[[str], str] | None = None,
        log_checkpoints: bool = True,
        finish_on_finalize: bool = True,
        **init_kwargs: Any,
    ) -> None:
        """Arguments are those of ``runcast.init`` (``init_kwargs``: ``url``, ``token``,
        ``settings``...). ``total_steps`` overrides what the trainer plans;
        ``grad_norm_group`` maps a parameter name to its layer (default: the module path cut
        after the first numeric index). ``finish_on_finalize=False`` keeps the run open after
        ``fit`` (to ``test()`` or ``fit()`` again into the same run); then call ``finish()``."""
        super().__init__()
        if not isinstance(grad_norms_every, int) or grad_norms_every < 0:
            raise ValueError(f"grad_norms_every must be a whole number >= 0: {grad_norms_every!r}")
        self._project = project
        self._name = name
        # The id is fixed now: Lightning names the checkpoint folder after `version` at setup,
        # before the run starts.
        self._id = id or os.environ.get("RUNCAST_RUN_ID") or uuid.uuid4().hex
        self._total_steps = total_steps
        self._config: dict[str, Any] = dict(config or {})
        self._deadline = deadline
        self._tags = tags
        self._init_kwargs = init_kwargs
        self._grad_norms_every = grad_norms_every
        self._grad_norm_group = grad_norm_group
        self._log_checkpoints = log_checkpoints
        self._finish_on_finalize = finish_on_finalize
        self._trainer: pl.Trainer | None = None
        self._run: AnyRun | None = None
        self._finished = False

    # -- Logger interface -----------------------------------------------------------

    @property
    def name(self) -> str | None:
        return self._name or self._project

    @property
    def version(self) -> str | None:
        return self._id

    @property
    def experiment(self) -> Any:
        """The runcast run. Lightning reads this before fit to "create" loggers early; the
        run itself starts on first use so that it carries the config and total steps."""
        return _LazyRun(self)

    @rank_zero_only
    def log_hyperparams(
        self, params: dict[str, Any] | Namespace, *args: Any, **kwargs: Any
    ) -> None:
        values = vars(params) if isinstance(params, Namespace) else dict(params or {})
        if self._run is None:
            self._config.update(values)
            return
        # The config is sent when the run is created; later hyperparameters become an event.
        self._run.event("custom", name="hyperparameters", values=_jsonable(values))

    @rank_zero_only
    def log_graph(self, model: Any, input_array: Any = None) -> None:
        # Lightning calls this right after log_hyperparams at the start of every fit: the
        # first moment the logger sees the trainer (and so its planned steps).
        trainer = getattr(model, "_trainer", None)
        if trainer is not None:
            self._attach(trainer)
        self._ensure_run()

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        self._ensure_run().log(metrics, step=self._fit_step(step))

    @rank_zero_only
    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        if not self._log_checkpoints:
            return
        step = getattr(checkpoint_callback, "_last_global_step_saved", None)
        if step is None and self._trainer is not None:
            step = self._trainer.global_step
        path = (
            getattr(checkpoint_callback, "_last_checkpoint_saved", None)
            or getattr(checkpoint_callback, "last_model_path", None)
            or getattr(checkpoint_callback, "best_model_path", None)
        )
        payload: dict[str, Any] = {"path": str(path)} if path else {}
        monitor = getattr(checkpoint_callback, "monitor", None)
        score = getattr(checkpoint_callback, "current_score", None)
        if monitor and score is not None:
            payload[str(monitor)] = _scalar(score)
        self._ensure_run().event("checkpoint", step=step, **payload)

    @rank_zero_only
    def finalize(self, status: str) -> None:
        """End of fit: finish the run (``success`` -> finished, ``failed`` -> failed)."""
        final = _STATUS.get(status, "crashed")
        if self._finish_on_finalize or final != "finished":
            self.finish(final)

    @rank_zero_only
    def finish(self, status: str = "finished") -> None:
        """Flush and end the run (``finished`` / ``failed`` / ``crashed``). Idempotent."""
        if self._run is None or self._finished:
            return
        self._finished = True
        self._run.finish(status)

    # -- internals --------------------------------------------------------------------

    def _attach(self, trainer: pl.Trainer) -> None:
        if self._trainer is trainer:
            return
        self._trainer = trainer
        # A plain list Lightning's callback connector sets on the trainer (not in its stubs);
        # hooks are looked up in it at each call, so a callback added now runs from now on.
        callbacks: list[Any] = trainer.callbacks  # type: ignore[attr-defined]
        if self._grad_norms_every and not any(
            isinstance(cb, _GradNormCallback) and cb.owner is self for cb in callbacks
        ):
            # The optimizer hooks are callback hooks: the logger brings its own callback.
            callbacks.append(_GradNormCallback(self))

    def _fit_step(self, step: int | None) -> int | None:
        """The step a metric goes to: while fitting, Lightning's own step (its count of batches
        that stepped, read *before* it counts the current one) becomes ``global_step``, the
        optimizer steps taken so far. Lightning logs a batch after its optimizer step, so
        batch i of a 40-step run would land on step i - 1 and the run would end at 39 of 40
        (97.5%); ``global_step`` is also what ``max_steps`` counts. A step of another axis (an
        evaluation's own batch counter, a ``step`` the user logged) is kept."""
        trainer = self._trainer
        if trainer is None or step is None or trainer.sanity_checking:
            return step
        if trainer.state.fn != "fit":
            return step
        # The private counter Lightning passes as the default step (loops/training_epoch_loop).
        default = getattr(trainer.fit_loop.epoch_loop, "_batches_that_stepped", step)
        return int(trainer.global_step) if step == default else step

    def _planned_steps(self) -> int | None:
        if self._total_steps is not None:
            return self._total_steps
        trainer = self._trainer
        if trainer is None:
            return None
        if trainer.max_steps is not None and trainer.max_steps > 0:
            return int(trainer.max_steps)
        try:
            estimated = trainer.estimated_stepping_batches
        except Exception as exc:  # no dataloader yet, or an iterable of unknown length
            logger.info("runcast: total steps unknown (%s)", exc)
            return None
        return int(estimated) if math.isfinite(estimated) and estimated > 0 else None

    def _ensure_run(self) -> AnyRun:
        if self._run is None:
            config = dict(self._config)
            if self._trainer is not None:
                config.setdefault("trainer", _trainer_config(self._trainer))
            kwargs = dict(self._init_kwargs)
            if self._trainer is not None:
                # The trainer knows its processes (devices x nodes) before any process group
                # exists, and on one device no launcher sets WORLD_SIZE: the cost needs it.
                kwargs.setdefault("world_size", self._trainer.world_size)
            self._run = runcast.init(
                project=self._project,
                name=self._name,
                id=self._id,
                total_steps=self._planned_steps(),
                config=config,
                deadline=self._deadline,
                tags=self._tags,
                **kwargs,
            )
        # After finish() the run itself ignores log() / event() with one warning, and still
        # answers id / url.
        return self._run


class _LazyRun:
    """`logger.experiment`: the run, started on the first attribute use, not on the lookup."""

    def __init__(self, owner: RuncastLogger) -> None:
        self._owner = owner

    def __getattr__(self, name: str) -> Any:
        if rank_zero_only.rank != 0:  # type: ignore[attr-defined]  # set by Lightning
            return getattr(NoOpRun(), name)
        return getattr(self._owner._ensure_run(), name)


class _GradNormCallback(pl.Callback):
    """Per-layer gradient norms every N optimizer steps, before clipping and the step."""

    def __init__(self, owner: RuncastLogger) -> None:
        self.owner = owner
        self._norms: GradNorms | None = None

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any
    ) -> None:
        if not trainer.is_global_zero:
            return
        if self._norms is None:
            self._norms = GradNorms(
                pl_module.named_parameters(),
                self.owner._grad_norms_every,
                self.owner._grad_norm_group,
            )
        # The batch's metrics are logged at global_step after this optimizer step
        # (RuncastLogger._fit_step): the norms land on the same step as that batch's loss.
        step = trainer.global_step + 1
        if self._norms.due(step):
            values = self._norms.compute()
            if values:
                self.owner._ensure_run().log(values, step=step)


def _trainer_config(trainer: pl.Trainer) -> dict[str, Any]:
    keys = ("max_epochs", "max_steps", "accumulate_grad_batches", "precision", "world_size")
    out: dict[str, Any] = {}
    for key in keys:
        value = getattr(trainer, key, None)
        if value is not None:
            out[key] = _scalar(value)
    return out


def _scalar(value: Any) -> Any:
    if hasattr(value, "item"):
        try:
            return value.item()
        except Exception:
            return str(value)
    return value if isinstance(value, (int, float, str, bool)) else str(value)


def _jsonable(values: Mapping[str, Any]) -> dict[str, Any]:
    return {str(k): _scalar(v) for k, v in values.items()}
