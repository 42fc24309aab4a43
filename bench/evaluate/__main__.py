"""`python -m bench.evaluate DIR [--json] [--seed N] [--eta-only]`: score every forecaster on a
run set.

Prints the tables; with --json the last line is one JSON object with every figure (ETA here,
loss and divergence from their own modules when those are installed).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
from collections.abc import Callable
from typing import Any

from bench.evaluate.eta_eval import evaluate_eta
from curveset import CurveRun, load_runs

Evaluator = Callable[[list[CurveRun], int], tuple[dict, str]]

# Evaluated by other modules; a missing one is reported and skipped, never fatal.
OPTIONAL = (
    ("bench.evaluate.loss_eval", "evaluate_loss"),
    ("bench.evaluate.divergence_eval", "evaluate_divergence"),
)


def _load_optional(module: str, name: str) -> Evaluator | None:
    try:
        return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]
    except (ImportError, AttributeError) as exc:
        # Only "not written yet" is skipped: an import error *inside* the module is a bug.
        missing = getattr(exc, "name", None)
        if isinstance(exc, ImportError) and missing not in (module, None):
            raise
        print(f"[skip] {module}.{name} not available ({exc})", file=sys.stderr)
        return None


def _clean_json(value: Any) -> Any:
    """NaN/inf are not JSON: they become null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean_json(v) for v in value]
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.evaluate", description=__doc__)
    parser.add_argument("directory", help="run set: INDEX.csv, EVENTS.csv, runs/*.csv")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    parser.add_argument("--seed", type=int, default=0, help="seed for injected faults")
    parser.add_argument(
        "--eta-only",
        action="store_true",
        help="the ETA and deadline odds only (seconds), not loss and divergence (minutes)",
    )
    args = parser.parse_args(argv)

    runs = load_runs(args.directory)
    result: dict[str, Any] = {"runs": len(runs), "seed": args.seed}
    fields, text = evaluate_eta(runs, args.seed)
    result.update(fields)
    print(text)
    for module, name in () if args.eta_only else OPTIONAL:
        evaluator = _load_optional(module, name)
        if evaluator is None:
            continue
        extra, extra_text = evaluator(runs, args.seed)
        result.update(extra)
        print()
        print(extra_text)
    if args.json:
        print(json.dumps(_clean_json(result), sort_keys=True, allow_nan=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
