"""Per-layer gradient norms for the framework integrations (needs torch; imported lazily).

One key per *layer*, not per tensor: parameters are grouped by the module path up to the first
numeric index (``transformer.h.3.attn.c_attn.weight`` -> ``transformer.h.3``), and modules
outside any numbered stack keep their own path (``transformer.wte``, ``lm_head``). A GPT of L
blocks gives L + a few keys. The server's divergence diagnosis reads every ``grad_norm/<layer>``
series and names the layers that moved first (forecasting/estimators/divergence.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

logger = logging.getLogger("runcast")

PREFIX = "grad_norm/"


def layer_of(name: str) -> str:
    """The layer a parameter belongs to: its module path, cut after the first numeric index."""
    parts = name.split(".")
    module = parts[:-1] or parts  # drop the tensor's own name (weight, bias, ...)
    for i, part in enumerate(module):
        if part.isdigit():
            return ".".join(module[: i + 1])
    return ".".join(module)


def _strip_common_prefix(groups: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """Drop leading path parts every layer shares (a wrapper's ``model.``): shorter keys, same
    meaning. A single layer keeps its full path."""
    if len(groups) < 2:
        return groups
    split = [name.split(".") for name in groups]
    common = 0
    # Stop before a bare index would lead a key ("net.0" stays "net.0", not "0").
    while (
        all(len(p) > common + 1 and not p[common + 1].isdigit() for p in split)
        and len({p[common] for p in split}) == 1
    ):
        common += 1
    if common == 0:
        return groups
    return {".".join(p[common:]): params for p, params in zip(split, groups.values())}


class GradNorms:
    """Groups a model's parameters once; `compute()` returns {"grad_norm/<layer>": norm}.

    `every` > 0: only steps that are multiples of it are measured (`due(step)`). The cost of one
    measurement is one norm kernel per tensor and a single device-to-host copy for all layers.
    """

    def __init__(
        self,
        named_parameters: Iterable[tuple[str, Any]],
        every: int,
        group: Callable[[str], str] | None = None,
    ) -> None:
        if not isinstance(every, int) or isinstance(every, bool) or every < 0:
            raise ValueError(f"grad_norms_every must be a whole number >= 0, got {every!r}")
        self.every = every
        by_layer: dict[str, list[Any]] = {}
        group = group or layer_of
        for name, param in named_parameters:
            if getattr(param, "requires_grad", False):
                by_layer.setdefault(group(name), []).append(param)
        self.groups = _strip_common_prefix(by_layer)
        self._failed = False
        self._captured: dict[int, Any] = {}
        self._handles: list[Any] = []

    def due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0 and not self._failed

    def arm(self) -> None:
        """Record each gradient's norm the moment backward has accumulated it.

        For trainers that clip gradients before the last hook a callback gets (Hugging Face
        clips before ``on_pre_optimizer_step``): the norms are then measured before clipping,
        as Lightning's ``on_before_optimizer_step`` sees them. Armed only for measured steps,
        so other steps pay nothing. With gradient accumulation the last micro-batch's hook
        sees the accumulated gradient and overwrites the earlier readings.
        """
        if self._failed or self._handles:
            return
        try:
            import torch

            def record(param: Any) -> None:
                grad = param.grad
                if grad is not None and not grad.is_sparse:
                    self._captured[id(param)] = torch.linalg.vector_norm(
                        grad.detach(), dtype=torch.float32
                    )

            self._captured = {}
            self._handles = [
                p.register_post_accumulate_grad_hook(record)
                for params in self.groups.values()
                for p in params
            ]
        except Exception as exc:  # an old torch or a parameter type without the hook
            self.disarm()
            logger.info("runcast: gradient hooks unavailable (%r); norms read at the step", exc)

    def disarm(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def compute(self) -> dict[str, float]:
        """Norm of each layer's gradients (as recorded by `arm()`, else as they are now);
        {} if nothing has a gradient.

        Never raises: a model this cannot measure (sharded or sparse gradients of an exotic
        kind) turns the measurement off with one warning, and training goes on.
        """
        try:
            return self._compute()
        except Exception as exc:
            self._failed = True
            logger.warning("runcast: per-layer gradient norms turned off: %r", exc)
            return {}
        finally:
            self.disarm()
            self._captured = {}

    def _compute(self) -> dict[str, float]:
        import torch

        names: list[str] = []
        norms: list[Any] = []
        device = None
        with torch.no_grad():
            captured = self._captured
            for layer, params in self.groups.items():
                if captured:
                    parts = [captured[id(p)] for p in params if id(p) in captured]
                else:
                    grads = [p.grad for p in params if p.grad is not None]
                    # float32 accumulation without copying a bf16/fp16 gradient first.
                    parts = [
                        torch.linalg.vector_norm(
                            g.coalesce().values() if g.is_sparse else g, dtype=torch.float32
                        )
                        for g in grads
                    ]
                if not parts:
                    continue
                device = device or parts[0].device
                parts = [part.to(device) for part in parts]
                norms.append(torch.linalg.vector_norm(torch.stack(parts)))
                names.append(layer)
            if not norms:
                return {}
            values = torch.stack(norms).tolist()  # the one host sync of a measurement
        return {PREFIX + name: float(v) for name, v in zip(names, values)}
