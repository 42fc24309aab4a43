"""Train a tiny GPT with the Hugging Face Trainer and log it to Runcast.

Needs: pip install 'runcast[transformers]'
RUNCAST_URL, RUNCAST_TOKEN and RUNCAST_PROJECT come from the environment.
Run: python docs/examples/transformers_example.py [output folder; default: a new temp dir]
"""

import tempfile

from runcast.integrations.transformers import RuncastCallback
from tiny_gpt import TokenDataset, tiny_gpt
from transformers import Trainer, TrainingArguments


def main(output_dir: str | None = None) -> None:
    output_dir = output_dir or tempfile.mkdtemp(prefix="runcast-hf-")  # not the working tree
    args = TrainingArguments(
        output_dir=output_dir,
        run_name="tiny-gpt-hf",
        max_steps=40,  # the run's total steps
        per_device_train_batch_size=8,
        learning_rate=3e-3,
        lr_scheduler_type="cosine",
        warmup_steps=5,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=20,
        save_steps=10,
        report_to="none",  # or "runcast" after runcast.integrations.transformers.register()
        use_cpu=True,
        disable_tqdm=True,
    )
    callback = RuncastCallback(grad_norms_every=5)
    trainer = Trainer(
        model=tiny_gpt(),
        args=args,
        train_dataset=TokenDataset(8 * 40, seed=1),
        eval_dataset=TokenDataset(32, seed=2),
        callbacks=[callback],
    )
    trainer.train()
    print("run:", callback.run.id, callback.run.url)
    print("checkpoints in:", output_dir)


if __name__ == "__main__":
    import sys

    main(*sys.argv[1:])
