"""`python -m bench.chaos [--profile quick|full] [--json] [overrides]`: progress on stderr, the
result as one JSON line, last, on stdout."""

from __future__ import annotations

import argparse
import json
import sys

from bench.chaos.profile import PROFILES, SCENARIOS, with_overrides
from bench.chaos.runner import run
from bench.chaos.stack import missing_binaries
from bench.harness import log, sigterm_as_interrupt


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="quick")
    parser.add_argument("--json", action="store_true", help="print only the JSON line on stdout")
    parser.add_argument("--keep", action="store_true", help="keep the logs folder")
    parser.add_argument(
        "--scenarios", type=lambda s: tuple(x for x in s.split(",") if x),
        help=f"comma-separated, of: {', '.join(SCENARIOS)} (run in that order)",
    )  # fmt: skip
    parser.add_argument("--trainers", type=int, help="live trainers")
    parser.add_argument("--points-per-s", type=float, help="points a second, each trainer")
    for name in ("web-down-s", "postgres-down-s", "redis-down-s", "resume-timeout-s"):
        parser.add_argument(f"--{name}", type=float)
    clocks = parser.add_argument_group("liveness clocks (see bench/chaos/profile.py)")
    for name in ("sweep-period-s", "stall-min-s", "reconnect-grace-s", "heartbeat-s",
                 "probe-max-s"):  # fmt: skip
        clocks.add_argument(f"--{name}", type=float)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    missing = missing_binaries()
    if missing:
        log(f"the chaos bench needs {' and '.join(missing)}")
        return 2
    fields = ("scenarios", "trainers", "points_per_s", "web_down_s", "postgres_down_s",
              "redis_down_s", "resume_timeout_s")  # fmt: skip
    clocks = ("sweep_period_s", "stall_min_s", "reconnect_grace_s", "heartbeat_s", "probe_max_s")
    profile = with_overrides(
        PROFILES[args.profile],
        fields={f: getattr(args, f) for f in fields},
        clocks={c: getattr(args, c) for c in clocks},
    )
    with sigterm_as_interrupt():
        result = run(profile, keep=args.keep)
    if not args.json:
        print(json.dumps(result, indent=2))
    print(json.dumps(result, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
