"""Framework integrations (optional extras; each module imports its framework):

* ``runcast.integrations.lightning.RuncastLogger``: PyTorch Lightning (``runcast[lightning]``)
* ``runcast.integrations.transformers.RuncastCallback``: Hugging Face Trainer
  (``runcast[transformers]``)

Both can log per-layer gradient norms (``grad_norms_every=N``) as ``grad_norm/<layer>``.
"""
