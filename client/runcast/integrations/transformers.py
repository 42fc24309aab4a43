"""Hugging Face Transformers: ``Trainer(..., callbacks=[RuncastCallback(project="llm")])``.

Needs ``transformers`` (``pip install 'runcast[transformers]'``). What goes to Runcast:

* ``on_train_begin``: the run starts with ``state.max_steps`` as its planned total,
  ``TrainingArguments.world_size`` as its world size and the ``TrainingArguments`` (and the
  model's config) as its config;
* ``on_log``: every number the Trainer logs (``loss``, ``grad_norm``, ``eval_*``...) at its
  global step; ``learning_rate`` is sent as ``lr``, the key the server reads the LR schedule
  from. The end-of-training summary (``train_runtime``, ``train_loss``...) becomes a
  ``custom`` event ``train_summary`` rather than one-point series;
* ``on_evaluate``: an ``eval`` event with the metrics (the metrics themselves arrive through
  ``on_log``);
* ``on_save``: a ``checkpoint`` event with the step and the checkpoint folder;
* ``on_train_end``: the run finishes. A training that raises never reaches it; the client's
  exit hook then marks the run ``failed``;
* ``grad_norms_every=N``: per-layer gradient norms (``grad_norm/<layer>``) every N optimizer
  steps, read as backward leaves them (before the Trainer clips them).

Only the world's main process logs. ``report_to="runcast"``: see `register`.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping
from typing import Any

from transformers import TrainerCallback

import runcast
from runcast.integrations._gradnorms import GradNorms
from runcast.run import AnyRun

logger = logging.getLogger("runcast")

# Keys of the Trainer's final log call (train() returns them too): one value each, a summary.
_SUMMARY_MARKER = "train_runtime"
# The server reads the LR schedule from "lr" (forecasting uses it for the loss forecast).
_RENAME = {"learning_rate": "lr"}


class RuncastCallback(TrainerCallback):
    """A Trainer callback that sends the run to Runcast (see the module docstring)."""

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
        **init_kwargs: Any,
    ) -> None:
        """Arguments are those of ``runcast.init`` (``init_kwargs``: ``url``, ``token``,
        ``settings``...); with none, RUNCAST_URL / RUNCAST_TOKEN / RUNCAST_PROJECT apply and
        the run is named after ``TrainingArguments.run_name``."""
        if not isinstance(grad_norms_every, int) or grad_norms_every < 0:
            raise ValueError(f"grad_norms_every must be a whole number >= 0: {grad_norms_every!r}")
        self._project = project
        self._name = name
        self._id = id
        self._total_steps = total_steps
        self._config = dict(config or {})
        self._deadline = deadline
        self._tags = tags
        self._init_kwargs = init_kwargs
        self._grad_norms_every = grad_norms_every
        self._grad_norm_group = grad_norm_group
        self._log_checkpoints = log_checkpoints
        self._norms: GradNorms | None = None
        self._armed_step: int | None = None
        self.run: AnyRun | None = None

    # -- lifecycle ------------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_world_process_zero or self.run is not None:
            return
        model = kwargs.get("model")
        config: dict[str, Any] = {"training_args": _training_args(args)}
        model_config = getattr(model, "config", None)
        if model_config is not None and hasattr(model_config, "to_dict"):
            config["model"] = model_config.to_dict()
        config.update(self._config)
        total = self._total_steps or (state.max_steps if state.max_steps > 0 else None)
        run_name = getattr(args, "run_name", None)
        kwargs = dict(self._init_kwargs)
        world = _world_size(args)
        if world is not None:
            kwargs.setdefault("world_size", world)
        self.run = runcast.init(
            project=self._project,
            # TrainingArguments.run_name defaults to output_dir; a name the user gave wins.
            name=self._name or run_name,
            id=self._id,
            total_steps=total,
            config=config,
            deadline=self._deadline,
            tags=self._tags,
            **kwargs,
        )
        if self._grad_norms_every and model is not None:
            self._norms = GradNorms(
                model.named_parameters(), self._grad_norms_every, self._grad_norm_group
            )

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.run is not None and state.is_world_process_zero:
            self.run.finish("finished")

    # -- metrics and events ---------------------------------------------------------

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if self.run is None or not state.is_world_process_zero or not logs:
            return
        numbers = {
            _RENAME.get(k, k): v
            for k, v in logs.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        if _SUMMARY_MARKER in logs:
            summary = {k: _finite(float(v)) for k, v in numbers.items()}
            self.run.event("custom", step=state.global_step, name="train_summary", **summary)
            return
        if numbers:
            self.run.log(numbers, step=state.global_step)

    def on_evaluate(
        self,
        args: Any,
        state: Any,
        control: Any,
        metrics: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if self.run is None or not state.is_world_process_zero:
            return
        payload = {k: _finite(v) for k, v in (metrics or {}).items() if _is_number(v)}
        self.run.event("eval", step=state.global_step, **payload)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.run is None or not state.is_world_process_zero or not self._log_checkpoints:
            return
        # Trainer._save_checkpoint writes <output_dir>/checkpoint-<global_step>.
        path = os.path.join(str(args.output_dir), f"checkpoint-{state.global_step}")
        self.run.event("checkpoint", step=state.global_step, path=path)

    # -- gradient norms -------------------------------------------------------------

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # The update this step makes is counted as global_step + 1 (its loss is logged there).
        step = state.global_step + 1
        if self._norms is not None and state.is_world_process_zero and self._norms.due(step):
            self._norms.arm()
            self._armed_step = step

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._norms is None or self._armed_step is None or self.run is None:
            return
        step, self._armed_step = self._armed_step, None
        values = self._norms.compute()
        if values:
            self.run.log(values, step=step)


def register() -> None:
    """Make ``TrainingArguments(report_to="runcast")`` work (opt-in, call once before).

    Transformers looks report_to names up in ``integration_utils.INTEGRATION_TO_CALLBACK``, a
    plain dict with no public way to add to it; this adds ``"runcast": RuncastCallback`` there.
    The callback is then built without arguments, so it reads RUNCAST_URL / RUNCAST_TOKEN /
    RUNCAST_PROJECT from the environment. ``callbacks=[RuncastCallback(...)]`` needs none of
    this and takes arguments; prefer it.
    """
    from transformers.integrations import integration_utils

    registry = getattr(integration_utils, "INTEGRATION_TO_CALLBACK", None)
    if not isinstance(registry, dict):
        raise RuntimeError(
            "this transformers version has no INTEGRATION_TO_CALLBACK registry; "
            "use Trainer(callbacks=[RuncastCallback(...)]) instead of report_to='runcast'"
        )
    registry["runcast"] = RuncastCallback


def _training_args(args: Any) -> dict[str, Any]:
    # to_sanitized_dict: the Trainer's own flat, JSON-friendly view (what TensorBoard gets).
    for method in ("to_sanitized_dict", "to_dict"):
        if hasattr(args, method):
            try:
                return dict(getattr(args, method)())
            except Exception as exc:  # a custom subclass that cannot be serialised
                logger.info("runcast: TrainingArguments.%s failed: %r", method, exc)
    return {}


def _world_size(args: Any) -> int | None:
    """The Trainer's process count (accelerate's state: 1 for one process, where no launcher
    sets WORLD_SIZE), or None when the arguments cannot say."""
    try:
        return int(args.world_size)
    except Exception as exc:  # a stand-in for TrainingArguments, or no torch backend
        logger.info("runcast: TrainingArguments.world_size unknown (%r)", exc)
        return None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _finite(value: float) -> Any:
    # Event payloads cannot hold NaN / Infinity (the server's JSON column refuses them).
    return value if math.isfinite(value) else str(value)
