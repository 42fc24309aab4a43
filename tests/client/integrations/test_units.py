"""The integrations' own rules, against the in-memory server (no live server, no training)."""

from __future__ import annotations

import pytest
from runcast.integrations._gradnorms import GradNorms, layer_of

torch = pytest.importorskip("torch")


def test_parameters_group_into_layers() -> None:
    assert layer_of("transformer.h.3.attn.c_attn.weight") == "transformer.h.3"
    assert layer_of("transformer.wte.weight") == "transformer.wte"
    assert layer_of("lm_head.weight") == "lm_head"
    assert layer_of("bias") == "bias"
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    # Shared leading parts are dropped, but never down to a bare index.
    assert list(GradNorms(net.named_parameters(), 1).groups) == ["0", "2"]
    wrapped = torch.nn.Module()
    wrapped.net = net
    assert list(GradNorms(wrapped.named_parameters(), 1).groups) == ["net.0", "net.2"]


def test_norms_are_the_layers_gradient_norms() -> None:
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    net(torch.randn(5, 3)).pow(2).sum().backward()
    norms = GradNorms(net.named_parameters(), 2).compute()
    expect = {
        f"grad_norm/{i}": torch.cat([p.grad.flatten() for p in net[i].parameters()]).norm().item()
        for i in (0, 1)
    }
    assert norms == pytest.approx(expect, rel=1e-6)


def test_armed_hooks_read_gradients_before_clipping() -> None:
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    norms = GradNorms(net.named_parameters(), 1)
    norms.arm()
    (net(torch.randn(5, 3)) * 100).pow(2).sum().backward()
    raw = {
        f"grad_norm/{i}": torch.cat([p.grad.flatten() for p in net[i].parameters()]).norm().item()
        for i in (0, 1)
    }
    torch.nn.utils.clip_grad_norm_(net.parameters(), 1e-3)
    assert norms.compute() == pytest.approx(raw, rel=1e-6)
    assert norms._handles == []  # hooks come off after the measured step
    clipped = norms.compute()  # not armed: what .grad holds now
    assert sum(v**2 for v in clipped.values()) ** 0.5 == pytest.approx(1e-3, rel=1e-3)


def test_every_and_bad_values() -> None:
    net = torch.nn.Linear(2, 2)
    norms = GradNorms(net.named_parameters(), 50)
    assert [s for s in range(0, 201) if norms.due(s)] == [0, 50, 100, 150, 200]
    assert not GradNorms(net.named_parameters(), 0).due(0)
    with pytest.raises(ValueError, match="grad_norms_every"):
        GradNorms(net.named_parameters(), -1)
    assert norms.compute() == {}  # no gradients yet: nothing to log, no error


def test_lightning_logger_on_other_ranks_sends_nothing(server, make_settings, monkeypatch):
    pytest.importorskip("lightning")
    from lightning.pytorch.utilities.rank_zero import rank_zero_only
    from runcast.integrations.lightning import RuncastLogger

    monkeypatch.setattr(rank_zero_only, "rank", 1)
    logger = RuncastLogger(project="p", settings=make_settings(server.url))
    logger.log_hyperparams({"lr": 1.0})
    logger.log_metrics({"loss": 1.0}, step=0)
    logger.after_save_checkpoint(object())
    logger.experiment.log({"loss": 2.0})
    logger.finalize("success")
    assert logger._run is None and server.state.runs == {}


def test_lightning_fit_that_raises_marks_the_run_failed(server, make_settings, tmp_path):
    pl = pytest.importorskip("lightning.pytorch")
    from runcast.integrations.lightning import RuncastLogger

    class Boom(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            if batch_idx == 3:
                raise RuntimeError("out of memory, say")
            loss = self.layer(batch[0]).pow(2).mean()
            self.log("loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    logger = RuncastLogger(project="p", settings=make_settings(server.url))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 2)), 2)
    trainer = pl.Trainer(
        max_epochs=1,
        logger=logger,
        log_every_n_steps=1,
        default_root_dir=tmp_path,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    with pytest.raises(RuntimeError, match="out of memory"):
        trainer.fit(Boom(), data)
    run = server.run(logger.version)
    assert [f["status"] for f in run.finishes] == ["failed"]
    assert sorted(s for s, _ in run.points["loss"]) == [1, 2, 3]  # 3 optimizer steps taken
    assert run.body["total_steps"] == 8


def test_transformers_callback_on_other_processes_sends_nothing(server, make_settings):
    pytest.importorskip("transformers")
    from runcast.integrations.transformers import RuncastCallback
    from transformers import TrainerControl, TrainerState, TrainingArguments

    cb = RuncastCallback(project="p", settings=make_settings(server.url))
    state = TrainerState(max_steps=10, is_world_process_zero=False)
    args = TrainingArguments(output_dir="unused", report_to="none", use_cpu=True)
    control = TrainerControl()
    cb.on_train_begin(args, state, control)
    cb.on_log(args, state, control, logs={"loss": 1.0})
    cb.on_save(args, state, control)
    cb.on_train_end(args, state, control)
    assert cb.run is None and server.state.runs == {}


def test_report_to_runcast_after_register(monkeypatch) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from runcast.integrations.transformers import RuncastCallback, register
    from transformers import Trainer, TrainingArguments
    from transformers.integrations import integration_utils

    args = TrainingArguments(output_dir="unused", report_to="runcast", use_cpu=True)
    with pytest.raises(ValueError, match="runcast is not supported"):
        Trainer(model=torch.nn.Linear(2, 2), args=args)  # transformers alone does not know it
    # A copy: register() edits the registry, and other tests must not see "runcast" in it.
    registry = dict(integration_utils.INTEGRATION_TO_CALLBACK)
    monkeypatch.setattr(integration_utils, "INTEGRATION_TO_CALLBACK", registry)
    register()
    trainer = Trainer(model=torch.nn.Linear(2, 2), args=args)
    assert any(isinstance(cb, RuncastCallback) for cb in trainer.callback_handler.callbacks)


def test_lightning_logs_each_batch_at_the_optimizer_steps_taken_after_it(
    server, make_settings, tmp_path
):
    # A fit of 8 batches is 8 optimizer steps: the last batch's loss must land on step 8 (the
    # run's total, 100%), as the HF callback's global_step does, not on 7 ("finished at step 7",
    # 87.5%). Validation at the end, the final checkpoint and the grad norms share that step.
    pl = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.callbacks import ModelCheckpoint
    from runcast.integrations.lightning import RuncastLogger

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            loss = self.layer(batch[0]).pow(2).mean()
            self.log("loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", self.layer(batch[0]).pow(2).mean())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    logger = RuncastLogger(project="p", settings=make_settings(server.url), grad_norms_every=4)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 2)), 2)
    trainer = pl.Trainer(
        max_epochs=1,
        logger=logger,
        log_every_n_steps=1,
        val_check_interval=4,
        default_root_dir=tmp_path,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[ModelCheckpoint(every_n_train_steps=4, save_top_k=-1)],
    )
    trainer.fit(Tiny(), data, data)
    run = server.run(logger.version)
    assert run.body["total_steps"] == 8
    assert sorted(s for s, _ in run.points["loss"]) == list(range(1, 9))
    assert sorted(s for s, _ in run.points["val_loss"]) == [4, 8]
    assert sorted(s for s, _ in run.points["grad_norm/layer"]) == [4, 8]
    checkpoints = [e["step"] for e in run.events if e["kind"] == "checkpoint"]
    assert checkpoints == [4, 8]


def test_lightning_sends_the_trainers_world_size(server, make_settings, tmp_path):
    # One CPU device: no launcher sets WORLD_SIZE, but the trainer knows it runs 1 process.
    pl = pytest.importorskip("lightning.pytorch")
    from runcast.integrations.lightning import RuncastLogger

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    logger = RuncastLogger(project="p", settings=make_settings(server.url))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4, 2)), 2)
    trainer = pl.Trainer(
        max_epochs=1,
        logger=logger,
        default_root_dir=tmp_path,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    trainer.fit(Tiny(), data)
    assert server.run(logger.version).body["world_size"] == 1


def test_transformers_callback_sends_the_trainers_world_size(server, make_settings, tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from runcast.integrations.transformers import RuncastCallback
    from transformers import TrainerControl, TrainerState, TrainingArguments

    cb = RuncastCallback(project="p", settings=make_settings(server.url))
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    cb.on_train_begin(args, TrainerState(max_steps=10), TrainerControl())
    cb.run.finish()
    assert server.run(cb.run.id).body["world_size"] == 1
