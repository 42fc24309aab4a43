"""Train a tiny GPT with PyTorch Lightning and log it to Runcast.

Needs: pip install 'runcast[lightning]' transformers  (the tiny GPT is a transformers GPT2Config)
RUNCAST_URL, RUNCAST_TOKEN and RUNCAST_PROJECT come from the environment.
Run: python docs/examples/lightning_example.py [folder for checkpoints; default: a new temp dir]
"""

import tempfile

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from runcast.integrations.lightning import RuncastLogger
from tiny_gpt import TokenDataset, tiny_gpt


class TinyGPT(pl.LightningModule):
    def __init__(self, lr: float = 3e-3, n_layer: int = 2) -> None:
        super().__init__()
        self.save_hyperparameters()  # -> the run's config
        self.model = tiny_gpt(n_layer=n_layer)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = self.model(**batch).loss
        self.log("loss", loss)
        self.log("lr", self.optimizers().param_groups[0]["lr"])
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self.log("val_loss", self.model(**batch).loss)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


def main(root: str | None = None) -> None:
    root = root or tempfile.mkdtemp(prefix="runcast-lightning-")  # not the working tree
    train = torch.utils.data.DataLoader(TokenDataset(8 * 40, seed=1), batch_size=8)
    val = torch.utils.data.DataLoader(TokenDataset(32, seed=2), batch_size=16)
    logger = RuncastLogger(name="tiny-gpt-lightning", grad_norms_every=5)
    trainer = pl.Trainer(
        max_epochs=1,  # 40 batches: the run's total steps come from the trainer
        logger=logger,
        log_every_n_steps=1,
        val_check_interval=20,
        callbacks=[ModelCheckpoint(every_n_train_steps=10, save_top_k=-1)],
        enable_progress_bar=False,
        default_root_dir=root,  # checkpoints: <root>/tiny-gpt-lightning/<run id>/checkpoints
    )
    trainer.fit(TinyGPT(), train, val)
    print("run:", logger.experiment.id, logger.experiment.url)
    print("checkpoints in:", root)


if __name__ == "__main__":
    import sys

    main(*sys.argv[1:])
