"""`python -m bench.tinygpt.generate OUTDIR [--seed N] [--jobs N] [--only NAME] [--steps N]`:
tiny GPTs trained on the CPU, some driven into divergence at a known step, written as a curve
set in the shared format (INDEX.csv, EVENTS.csv, runs/*.csv; see bench/data/tinygpt/README.md).

Each scenario is one real training (torch, one thread): a learning-rate jump kept or reverted,
a stretch of corrupted data, clipping removed under a rising learning rate, a NaN, or a healthy
control. The fault's step, the checkpoints and the measured recovery are documented events.
"""

from __future__ import annotations

import argparse
import csv
import math
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from bench.tinygpt.labels import left_step, recovered_step
from bench.tinygpt.model import VOCAB, TinyGPT, corpus, encode

WIDTH, LAYERS, HEADS, CONTEXT, BATCH = 64, 2, 4, 64, 16
STEPS = 3000
WARMUP = 100
CLIP = 1.0
LOG_EVERY = 5  # a row per 5 steps: their mean train loss and step time
GRAD_EVERY = 10  # per-layer gradient norms (before clipping) on every other row
EVAL_EVERY = 100
CHECKPOINT_EVERY = 100
EVAL_BATCHES = 4
SOURCE = "runcast/bench.tinygpt"


@dataclass(frozen=True)
class Scenario:
    name: str
    seed: int
    lr: float
    fault: str = "healthy"  # healthy | lr_kept | lr_reverted | corrupt | noclip_rising | nan
    at: int = 0  # first step the fault acts on (a checkpoint is saved after step at - 1)
    factor: float = 1.0  # learning-rate multiplier, or per-step growth for noclip_rising
    length: int = 0  # steps the fault lasts (reverted jump, corrupted stretch, NaN until stop)
    variant: str = ""  # corrupt: "random" | "shuffled"; nan: "continue" | "stop"


SCENARIOS = (
    Scenario("healthy-lr3e-3-s1", 1, 3e-3),
    Scenario("healthy-lr2e-3-s2", 2, 2e-3),
    Scenario("healthy-lr4e-3-s3", 3, 4e-3),
    Scenario("healthy-lr1.5e-3-s4", 4, 1.5e-3),
    Scenario("lr-x100-kept", 5, 3e-3, "lr_kept", 1801, 100.0),
    Scenario("lr-x30-kept", 6, 2e-3, "lr_kept", 1501, 30.0),
    Scenario("lr-x300-kept-late", 15, 3e-3, "lr_kept", 2401, 300.0),
    Scenario("lr-x50-reverted-50", 7, 3e-3, "lr_reverted", 1501, 50.0, 50),
    Scenario("lr-x20-reverted-20", 8, 2e-3, "lr_reverted", 1201, 20.0, 20),
    Scenario("corrupt-random-300", 9, 3e-3, "corrupt", 1501, 1.0, 300, "random"),
    Scenario("corrupt-shuffled-200", 10, 3e-3, "corrupt", 1801, 1.0, 200, "shuffled"),
    Scenario("noclip-lr-rising-1.003", 11, 2e-3, "noclip_rising", 1201, 1.003),
    Scenario("noclip-lr-rising-1.005", 12, 3e-3, "noclip_rising", 1501, 1.005),
    Scenario("nan-continue", 13, 3e-3, "nan", 2001, 1.0, 0, "continue"),
    Scenario("nan-stop", 14, 3e-3, "nan", 1601, 1.0, 30, "stop"),
)


@dataclass(frozen=True)
class Shape:
    """The model and batch a training uses: the set's, or a smaller one for a test that must
    finish in seconds (tests/forecasting/test_episode_end_to_end.py)."""

    width: int = WIDTH
    layers: int = LAYERS
    heads: int = HEADS
    context: int = CONTEXT
    batch: int = BATCH


@dataclass
class Result:
    scenario: Scenario
    rows: list[dict[str, Any]] = field(default_factory=list)


def learning_rate(sc: Scenario, step: int, total: int) -> float:
    """Warm-up, cosine decay to a tenth, and the scenario's change from its step on."""
    base = sc.lr * min(1.0, step / WARMUP)
    base *= 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, step / total)))
    if sc.fault == "lr_kept" and step >= sc.at:
        return base * sc.factor
    if sc.fault == "lr_reverted" and sc.at <= step < sc.at + sc.length:
        return base * sc.factor
    if sc.fault == "noclip_rising" and step >= sc.at:
        return base * sc.factor ** (step - sc.at)
    return base


def batch(
    data: torch.Tensor, gen: torch.Generator, sc: Scenario, step: int, shape: Shape = Shape()
) -> tuple[torch.Tensor, torch.Tensor]:
    starts = torch.randint(0, len(data) - shape.context - 1, (shape.batch,), generator=gen)
    seq = torch.stack([data[s : s + shape.context + 1] for s in starts.tolist()])
    if sc.fault == "corrupt" and sc.at <= step < sc.at + sc.length:
        if sc.variant == "random":
            seq = torch.randint(0, len(VOCAB), seq.shape, generator=gen)
        else:  # the right characters in a random order: text statistics without its sequence
            seq = seq[:, torch.randperm(seq.shape[1], generator=gen)]
    return seq[:, :-1], seq[:, 1:]


def grad_norms(model: TinyGPT) -> dict[str, float]:
    out = {}
    for name, params in model.layer_groups().items():
        sq = sum(float(p.grad.pow(2).sum()) for p in params if p.grad is not None)
        out[f"grad_norm/{name}"] = math.sqrt(sq)
    return out


def evaluate(model: TinyGPT, held_out: torch.Tensor, shape: Shape = Shape()) -> float:
    gen = torch.Generator().manual_seed(0)  # the same batches at every evaluation
    plain = Scenario("", 0, 0)
    with torch.no_grad():
        losses = [float(model(*batch(held_out, gen, plain, 0, shape))) for _ in range(EVAL_BATCHES)]
    return sum(losses) / len(losses)


def train(
    sc: Scenario,
    total: int,
    text: torch.Tensor,
    *,
    shape: Shape = Shape(),
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> Result:
    """Train one scenario; `on_row` is handed each row as it is made (a test logs it through
    the runcast client while the training goes on, checkpoints after the rows of their steps)."""
    torch.manual_seed(sc.seed)
    split = int(0.9 * len(text))
    train_data, held_out = text[:split], text[split:]
    model = TinyGPT(len(VOCAB), shape.width, shape.layers, shape.heads, shape.context)
    opt = torch.optim.AdamW(model.parameters(), lr=sc.lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(sc.seed)
    out = Result(sc)
    began = time.perf_counter()
    window: list[float] = []
    window_began = began
    norms: dict[str, float] = {}
    for step in range(1, total + 1):
        for group in opt.param_groups:
            group["lr"] = learning_rate(sc, step, total)
        x, y = batch(train_data, gen, sc, step, shape)
        loss = model(x, y)
        if sc.fault == "nan" and step == sc.at:
            # A bad op in the loss: NaN gradients, NaN weights, NaN from here on.
            loss = loss * torch.log(torch.tensor(-1.0))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if step % GRAD_EVERY == 0:
            norms = grad_norms(model)
        if not (sc.fault == "noclip_rising" and step >= sc.at):
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        window.append(float(loss.detach()))
        if step % LOG_EVERY == 0:
            now = time.perf_counter()
            row: dict[str, Any] = {
                "step": step,
                "total_steps": total,
                "elapsed_s": round(now - began, 3),
                "train_loss": float(np.mean(window)),  # NaN when any step of it was
                "val_loss": evaluate(model, held_out, shape) if step % EVAL_EVERY == 0 else None,
                "step_ms": round(1000 * (now - window_began) / len(window), 3),
                **norms,
            }
            out.rows.append(row)
            if on_row is not None:
                on_row(row)
            window, window_began, norms = [], time.perf_counter(), {}
        if sc.variant == "stop" and step >= sc.at + sc.length:
            break  # the job's NaN guard gives up
    return out


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.6g}"
    return str(value)


def write_run(outdir: Path, res: Result) -> Path:
    path = outdir / "runs" / f"tinygpt__{res.scenario.name}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = ["step", "total_steps", "elapsed_s", "train_loss", "val_loss", "step_ms"]
    keys += [f"grad_norm/{name}" for name in ("embed", *[f"block{i}" for i in range(LAYERS)])]
    keys.append("grad_norm/head")
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(keys)
        for row in res.rows:
            w.writerow([_fmt(row.get(k)) for k in keys])
    return path


def read_run(path: Path) -> pd.DataFrame:
    return pd.read_csv(path)


def episode_events(sc: Scenario, frame: pd.DataFrame, file: str) -> list[list[str]]:
    """The documented rows of a run, read off its file: its checkpoints (saved right after the
    row of their step), the fault's step, the first NaN, the recovery (labels.py)."""
    steps = frame["step"].to_numpy(float)
    loss = frame["train_loss"].to_numpy(float)
    clock = dict(zip(frame["step"], frame["elapsed_s"], strict=True))
    out = [
        [file, str(s), str(clock[s]), "checkpoint", "checkpoint saved", "documented"]
        for s in range(CHECKPOINT_EVERY, int(steps[-1]) + 1, CHECKPOINT_EVERY)
    ]
    if sc.fault == "healthy":
        return out
    at_t = float(np.interp(sc.at, steps, frame["elapsed_s"].to_numpy(float)))
    what = f"{sc.fault} {sc.variant} x{sc.factor:g} for {sc.length or 'the rest of the'} steps"
    if left_step(steps, loss, sc.at) is None:
        # The fault never moved the loss out of its pre-onset band (labels.py): no episode a
        # loss could show, so none to score; the row keeps the run out of the healthy ones.
        what += ": the loss never left its pre-onset band"
        out.append([file, str(sc.at), f"{at_t:.3f}", "fault", what, "documented"])
        return out
    out.append([file, str(sc.at), f"{at_t:.3f}", "divergence_onset", what, "documented"])
    nan_rows = steps[~np.isfinite(loss) & (steps >= sc.at)]
    if nan_rows.size:
        s = int(nan_rows[0])
        out.append([file, str(s), str(clock[s]), "nan", "train loss not finite", "documented"])
    back = recovered_step(steps, loss, sc.at)
    if back is not None:
        s = int(back)
        desc = "train loss back inside its pre-onset band (bench/tinygpt/labels.py)"
        out.append([file, str(s), str(clock[s]), "recovered", desc, "documented"])
    return out


def index_row(sc: Scenario, frame: pd.DataFrame, file: str, commit: str) -> list[str]:
    loss = frame["train_loss"].to_numpy(float)
    steps = frame["step"].to_numpy(float)
    pre = loss[(steps < (sc.at or steps[-1])) & np.isfinite(loss)][-40:]
    tail = loss[-40:]
    ok = pre.size and np.isfinite(tail).all()
    ratio = f"{np.median(tail) / np.median(pre):.2f}x" if ok else "n/a"
    notes = (
        f"tiny GPT {WIDTH}x{LAYERS} ctx {CONTEXT} batch {BATCH}, AdamW lr {sc.lr:g} "
        f"seed {sc.seed}; fault {sc.fault} at step {sc.at or '-'}; end/pre-onset median loss "
        f"{ratio}; trained in {frame['elapsed_s'].iloc[-1]:.0f}s on 1 thread"
    )
    return [
        file, SOURCE, "bench/tinygpt/generate.py", commit, "MIT", str(len(frame)), "1",
        str(int(frame["val_loss"].notna().any())), "1", notes, f"tinygpt/{sc.name}",
        str(frame["step"].iloc[0]), str(frame["step"].iloc[-1]),
        str(frame["total_steps"].iloc[0]), "1", "1", "optimizer step",
    ]  # fmt: skip


INDEX_HEADER = [
    "file", "source_repo", "source_path", "commit", "license", "n_points", "has_time", "has_val",
    "has_train", "notes", "family", "first_step", "last_step", "total_steps", "has_elapsed",
    "has_step_ms", "step_semantics",
]  # fmt: skip
EVENTS_HEADER = ["file", "step", "elapsed_s", "event_type", "description", "origin"]


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
        return out.stdout.strip()
    except OSError:
        return ""


def write_tables(outdir: Path, seed: int) -> None:
    """INDEX.csv and EVENTS.csv for every scenario whose run file is in outdir (all labels are
    read off the files, so regenerating some runs relabels the set)."""
    commit, index, events = _commit(), [], []
    for base in SCENARIOS:
        sc = replace(base, seed=base.seed + seed)
        path = outdir / "runs" / f"tinygpt__{sc.name}.csv"
        if not path.exists():
            continue
        file, frame = path.relative_to(outdir).as_posix(), read_run(path)
        index.append(index_row(sc, frame, file, commit))
        events += episode_events(sc, frame, file)
    for name, header, table in (
        ("INDEX.csv", INDEX_HEADER, index),
        ("EVENTS.csv", EVENTS_HEADER, events),
    ):
        with (outdir / name).open("w", newline="") as fh:
            csv.writer(fh).writerows([header, *table])


def _train_one(args: tuple[Scenario, int]) -> Result:
    torch.set_num_threads(1)  # tiny matrices: more threads only contend
    sc, total = args
    return train(sc, total, encode(corpus()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--seed", type=int, default=0, help="added to every scenario's seed")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument(
        "--only",
        default=None,
        help="only scenarios whose name contains one of these (comma-separated)",
    )
    parser.add_argument("--jobs", type=int, default=1, help="trainings at once")
    parser.add_argument(
        "--relabel", action="store_true", help="train nothing: rewrite INDEX.csv and EVENTS.csv"
    )
    args = parser.parse_args(argv)
    chosen = [
        replace(sc, seed=sc.seed + args.seed)
        for sc in SCENARIOS
        if not args.relabel
        and (not args.only or any(part in sc.name for part in args.only.split(",")))
    ]
    began = time.perf_counter()
    work = [(sc, args.steps) for sc in chosen]
    if args.jobs > 1:
        import multiprocessing

        with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
            results = pool.map(_train_one, work, chunksize=1)
    else:
        results = [_train_one(w) for w in work]
    for res in results:
        write_run(args.outdir, res)
        print(f"{res.scenario.name}: {len(res.rows)} rows, {res.rows[-1]['elapsed_s']:.0f}s")
    write_tables(args.outdir, args.seed)
    print(f"generated {len(results)} runs in {time.perf_counter() - began:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
