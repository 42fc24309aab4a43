"""The chaos bench (issue 24): the real client against the real stack while its dependencies
die, and what was lost, duplicated, falsely alarmed or left open, in one JSON line.

    python -m bench.chaos --json                   # the quick profile (a few minutes)
    python -m bench.chaos --profile full --json    # issue 24's durations (about half an hour)

Modules, one concern each: profile (what a run does), stack (PostgreSQL, Redis, web, worker,
beat as processes), hooks (loaded into the worker: thresholds and task markers), trainer and
fleet (the real client in processes of their own, and the bench's side of them), scenarios
(break, mend, wait), measure (what the database holds), runner (one run, one result).
"""
