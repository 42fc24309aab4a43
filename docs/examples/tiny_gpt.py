"""A tiny GPT and a synthetic language for the integration examples and tests (CPU, seconds).

The "language" is a family of affine sequences: each sequence starts at a random token and
steps by a random stride (mod the vocabulary), so the next token is predictable from the
previous two. A model learns it in a few hundred steps, and its loss has the shape of a real
pretraining curve (fast drop, then a slow tail). Nothing is downloaded: the model is built
from a GPT2Config.
"""

from __future__ import annotations

import torch
from transformers import GPT2Config, GPT2LMHeadModel

VOCAB = 64
SEQ_LEN = 16


def tiny_gpt(n_layer: int = 2, n_embd: int = 32, seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = GPT2Config(
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=4,
        vocab_size=VOCAB,
        n_positions=SEQ_LEN,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return GPT2LMHeadModel(config)


def token_sequences(count: int, seed: int = 0) -> torch.Tensor:
    """`count` sequences of SEQ_LEN token ids (int64), deterministic per seed."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, VOCAB, (count, 1), generator=g)
    stride = torch.randint(1, 8, (count, 1), generator=g)
    return (start + stride * torch.arange(SEQ_LEN)) % VOCAB


class TokenDataset(torch.utils.data.Dataset):
    """Items as the HF Trainer wants them: input_ids and labels (the model shifts them)."""

    def __init__(self, count: int, seed: int = 0) -> None:
        self.ids = token_sequences(count, seed=seed)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}
