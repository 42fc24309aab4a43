"""`python -m bench.stragglers.clean_worlds [DIR] [--seed N]`: false alarms of the straggler scan
in clean synthetic worlds (no injection) of 64, 256 and 1,024 ranks, one per every second
non-stress CoV series of the rank trace (every third for 1,024 ranks), per job-day. The budget
is one; the main bench's worlds all carry injections, so this is where a lower noise estimate
shows its false alarms first.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from bench.stragglers import data
from bench.stragglers.__main__ import DEFAULT_DATA, STRESS_COV
from bench.stragglers.score import Truth, runcast, score

PER_DAY = 86400.0 / 10.0  # one row per 10 s, as in the trace
SIZES = ((64, 2), (256, 2), (1024, 3))  # ranks, every n-th CoV series
CELLS = 400_000  # ranks x rows, as the main bench's synthetic worlds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stragglers.clean_worlds")
    parser.add_argument("data_dir", nargs="?", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    jobs = data.load_jobs(args.data_dir)
    blocks = data.noise_blocks(jobs)
    covs = [
        c
        for c in data.cov_series(args.data_dir)
        if c.size >= 100 and float(np.median(c)) <= STRESS_COV
    ]
    rng = np.random.default_rng(args.seed)
    for size, every in SIZES:
        rows = int(np.clip(CELLS // size, 300, 2000))
        hosts = {f"node-{i}": list(range(i * 8, i * 8 + 8)) for i in range(size // 8)}
        alarms = worlds = 0
        for cov in covs[::every]:
            compute = data.synth_world(rng, cov, blocks, size, rows)
            above, host_above = runcast(compute, PER_DAY, hosts)
            alarms += score(above, host_above, hosts, Truth()).false_alarms
            worlds += 1
        print(
            f"seed {args.seed}: {size} ranks x {rows} rows, {worlds} clean worlds: {alarms} "
            f"alarms, {alarms / (worlds * rows / PER_DAY):.2f} per job-day",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
