"""The divergence diagnosis on a real training, not a synthetic curve.

A tiny GPT (2 blocks, CPU) trains through RuncastLogger into a live server, checkpointing every
40 steps and logging per-layer gradient norms every 2 steps. At step JUMP its learning rate
jumps 100x (a LambdaLR, as a bad schedule or a resumed job with the wrong LR would): the
update after step JUMP (the one that makes global_step JUMP + 1) is the first to use it, and
a batch's loss is logged at global_step after its own update, so the first loss it spoils (the
next batch's) is logged at FIRST_BAD = JUMP + 2. The forecasting service, run on the live run,
must raise the divergence flag with:

* its onset within ONSET_TOLERANCE steps of FIRST_BAD: the spike detector names the first bad
  point, while the rise detector works on block medians (the recent tail in 100 bins, here
  2-3 steps each), so its onset may sit up to a bin before the first bad point;
* the last checkpoint before that onset (step 160) as the rollback target;
* the layers whose gradient norms moved first named in its explanation, each of which
  really did jump (checked here on the stored series, independently of the estimator).
"""

from __future__ import annotations

import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")
pytest.importorskip("transformers")

from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from runcast.integrations.lightning import RuncastLogger  # noqa: E402
from tiny_gpt import TokenDataset, tiny_gpt  # noqa: E402

from forecasting import compute  # noqa: E402
from forecasting import selectors as forecast_selectors  # noqa: E402
from forecasting.models import Flag  # noqa: E402
from forecasting.receivers import _on_ingested  # noqa: E402
from tracker import selectors  # noqa: E402
from tracker.models import Event, Run  # noqa: E402
from tracker.signals import run_ingested  # noqa: E402

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

STEPS, JUMP, FACTOR, CKPT_EVERY = 240, 170, 100.0, 40
FIRST_BAD = JUMP + 2
ONSET_TOLERANCE = 3


class JumpingGPT(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.model = tiny_gpt(n_layer=2, n_embd=32)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = self.model(**batch).loss
        self.log("loss", loss)
        self.log("lr", self.lr_schedulers().get_last_lr()[0])
        return loss

    def configure_optimizers(self) -> dict:
        opt = torch.optim.AdamW(self.parameters(), lr=3e-3)
        jump = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: FACTOR if s >= JUMP else 1.0)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": jump, "interval": "step"}}


def _wait_for(run_id: str, last_step: int, checkpoints: int, timeout: float = 120.0) -> Run:
    """The run stays open (the flag must be raised on a live run): wait for its data instead."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = Run.objects.filter(public_id=run_id).first()
        if (
            run is not None
            and run.last_step is not None
            and run.last_step >= last_step
            and Event.objects.filter(run=run, kind=Event.Kind.CHECKPOINT).count() >= checkpoints
        ):
            return run
        time.sleep(0.2)
    raise AssertionError(f"run {run_id} did not reach step {last_step} in {timeout} s")


def test_an_lr_jump_is_flagged_with_onset_rollback_and_first_layers(
    live_server, live_token, make_settings, tmp_path
) -> None:
    torch.set_num_threads(1)
    logger = RuncastLogger(
        project="live",
        name="lr-jump",
        grad_norms_every=2,
        finish_on_finalize=False,
        settings=make_settings(live_server.url, token=live_token, finish_timeout=60.0),
    )
    data = torch.utils.data.DataLoader(TokenDataset(STEPS * 8, seed=1), batch_size=8)
    trainer = pl.Trainer(
        max_steps=STEPS,
        logger=logger,
        log_every_n_steps=1,
        gradient_clip_val=1.0,  # clipping as usual: it does not stop a 100x LR
        callbacks=[ModelCheckpoint(every_n_train_steps=CKPT_EVERY, save_top_k=-1)],
        default_root_dir=tmp_path,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    # Forecasts run when this test calls the service (as the worker would after its debounce),
    # not on each arriving batch: the flag is then computed once, on the whole curve.
    run_ingested.disconnect(_on_ingested)
    try:
        trainer.fit(JumpingGPT(), data)
        run = _wait_for(logger.version, STEPS, STEPS // CKPT_EVERY)
        compute.forecast_compute(run_id=run.pk)
    finally:
        run_ingested.connect(_on_ingested)

    loss = selectors.series_load(run=run, key="loss")
    before = np.median(loss.values[(loss.steps > JUMP - 40) & (loss.steps <= JUMP)])
    assert loss.values[loss.steps == FIRST_BAD][0] > 2 * before, "the LR jump did not bite"

    open_flags = forecast_selectors.flags_open(run=run)
    diverged = {k: f for k, f in open_flags.items() if k in Flag.DIVERGENCE_KINDS}
    assert diverged, f"no divergence flag; open: {list(open_flags)}"
    assert Flag.Kind.SPIKE in diverged
    for flag in diverged.values():
        assert flag.state == Flag.State.RAISED
        assert abs(flag.onset_step - FIRST_BAD) <= ONSET_TOLERANCE, flag.explanation
        assert flag.data["rollback_step"] == 160, flag.explanation
        assert "Last checkpoint before onset: step 160." in flag.explanation

    spike = diverged[Flag.Kind.SPIKE]
    print(*(f"{f.kind} @ {f.onset_step}: {f.explanation}" for f in diverged.values()), sep="\n")
    layers = spike.data["layers_first"]
    assert layers, spike.explanation
    named = ", ".join(name.removeprefix("grad_norm/") for name in layers)
    assert f"Gradient norms moved first in {named}." in spike.explanation
    for name in layers:  # each named layer's norm really jumped right after the LR did
        norms = selectors.series_load(run=run, key=name)
        pre = np.median(norms.values[(norms.steps > JUMP - 40) & (norms.steps <= JUMP)])
        post = norms.values[(norms.steps > JUMP) & (norms.steps <= FIRST_BAD + 6)]
        assert post.max() > 3 * pre, (name, pre, post)

    logger.finish()
    run.refresh_from_db()
    assert run.status == "finished"
