"""The rank trace (../shared/data/ranks/): real jobs, their labelled episodes, and a noise model
for larger synthetic worlds built from the cross-worker CoV of 100 other jobs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

# The trace's clock: one sample every 10 `iteration` units, read as seconds (the publisher's
# figures label the axis "Seconds from beginning"). Job-days are counted on this clock.
SECONDS_PER_UNIT = 1.0


@dataclass
class Episode:
    rank: int
    lo: int  # first row of the episode
    hi: int  # last row
    primary: bool  # described by the publisher (not only found by the labelling rule)
    kind: str


@dataclass
class Job:
    name: str
    steps: np.ndarray  # (n,) the trace's `iteration`
    compute: np.ndarray  # (n, ranks)
    episodes: list[Episode] = field(default_factory=list)

    @property
    def days(self) -> float:
        span = float(self.steps[-1] - self.steps[0]) + self.stride
        return span * SECONDS_PER_UNIT / 86400.0

    @property
    def stride(self) -> float:
        return float(np.median(np.diff(self.steps))) if self.steps.size > 1 else 1.0

    @property
    def rows_per_day(self) -> float:
        return 86400.0 / (self.stride * SECONDS_PER_UNIT)


def load_jobs(root: Path) -> list[Job]:
    """Every job_*.csv with its LABELS.csv rows; rows where under 90% of ranks reported (a
    ragged end) are dropped, as the README advises for cross-rank work."""
    labels = pd.read_csv(root / "LABELS.csv") if (root / "LABELS.csv").exists() else None
    jobs = []
    for path in sorted(root.glob("job_*.csv"), key=lambda p: (len(p.stem), p.stem)):
        table = pd.read_csv(path)
        wide = table.pivot_table(index="iteration", columns="rank", values="step_time")
        wide = wide.sort_index()
        full = wide.notna().sum(axis=1) >= 0.9 * wide.shape[1]
        wide = wide[full]
        steps = wide.index.to_numpy(dtype=float)
        job = Job(path.stem, steps, wide.to_numpy(dtype=float))
        number = path.stem.split("_", 1)[1]
        if labels is not None:
            for row in labels[labels["job"].astype(str) == number].itertuples():
                lo = int(np.searchsorted(steps, float(row.first_iteration)))
                hi = int(np.searchsorted(steps, float(row.last_iteration), side="right")) - 1
                primary = not str(row.source).startswith("data rule only")
                job.episodes.append(Episode(int(row.rank), lo, max(lo, hi), primary, str(row.kind)))
        jobs.append(job)
    return jobs


def noise_blocks(jobs: list[Job], block: int = 32) -> np.ndarray:
    """Standardised residual blocks (block x count) of the real ranks outside labelled episodes:
    each rank's log ratio to the median rank, less its own moving level, over its robust scale.
    Resampling whole blocks keeps the rows' autocorrelation and heavy tail."""
    out = []
    for job in jobs:
        logc = np.log(job.compute)
        x = logc - np.nanmedian(logc, axis=1, keepdims=True)
        for r in range(x.shape[1]):
            bad = np.zeros(x.shape[0], dtype=bool)
            for ep in job.episodes:
                if ep.rank == r:
                    bad[max(0, ep.lo - 2) : ep.hi + 3] = True
            series = pd.Series(x[:, r]).rolling(64, center=True, min_periods=8).median()
            res = x[:, r] - series.to_numpy()
            scale = 1.4826 * np.nanmedian(np.abs(res - np.nanmedian(res)))
            if not np.isfinite(scale) or scale <= 0:
                continue
            res = res / scale
            for a in range(0, x.shape[0] - block + 1, block // 2):
                seg = res[a : a + block]
                if not bad[a : a + block].any() and np.isfinite(seg).all():
                    out.append(seg)
    return np.array(out).T


def cov_series(root: Path) -> list[np.ndarray]:
    table = pd.read_csv(root / "cov_100_jobs.csv")
    return [g.sort_values("sample")["cov"].to_numpy(float) for _, g in table.groupby("job")]


def synth_world(
    rng: np.random.Generator, cov: np.ndarray, blocks: np.ndarray, ranks: int, rows: int
) -> np.ndarray:
    """compute[t, i] = mu (1 + c(t) eps_i(t)), eps from resampled real residual blocks scaled to
    unit spread (the README's model). The CoV was measured over 10 workers; using it for 64 to
    1,024 ranks is an assumption."""
    start = int(rng.integers(0, max(1, cov.size - rows + 1)))
    c = cov[start : start + rows]
    if c.size < rows:  # a shorter job's series is played back and forth (no jump at the seam)
        c = np.resize(np.concatenate((c, c[::-1])), rows)
    n_blocks = -(-rows // blocks.shape[0])
    pick = rng.integers(0, blocks.shape[1], size=(n_blocks, ranks))
    eps = blocks[:, pick].transpose(1, 0, 2).reshape(n_blocks * blocks.shape[0], ranks)[:rows]
    eps = eps / (1.4826 * np.median(np.abs(blocks)))
    return np.clip(1.0 + c[:, None] * eps, 0.05, None)


def regime_world(
    rng: np.random.Generator,
    ranks: int,
    rows: int,
    levels: tuple[float, ...] = (0.13, 0.016, 0.06),
    cuts: tuple[float, ...] = (1 / 15, 1 / 5),
    ar: float = 0.6,
) -> np.ndarray:
    """A clean job whose noise changes for good (not a burst): the CoV is levels[i] from
    cuts[i-1] x rows on (13% -> 1.6% -> 6% at rows 100 and 300 of 1,500 by default: a job moved
    to a quieter, then a busier, share of the cluster). AR(1) rank noise (the trace's lag-1
    autocorrelation is 0.5-0.75) and fixed 1% rank offsets."""
    noise = np.full(rows, levels[0])
    for level, cut in zip(levels[1:], cuts, strict=True):
        noise[int(cut * rows) :] = level
    shocks = rng.standard_normal((rows, ranks)) * np.sqrt(1 - ar**2)
    eps = np.zeros((rows, ranks))
    for t in range(1, rows):
        eps[t] = ar * eps[t - 1] + shocks[t]
    return np.exp(noise[:, None] * eps) * (1.0 + 0.01 * rng.standard_normal(ranks))
