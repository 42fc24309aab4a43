"""A tiny character-level GPT and the text it learns: what bench/tinygpt/generate.py trains.

The text is the source of a fixed list of standard-library modules of the running Python: it
ships with every interpreter, so generating needs no download (a different Python version reads
slightly different text, which changes the curves' details, not their shape).
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

# Plain-text modules, a few hundred kB together; any missing on this Python is skipped.
CORPUS_MODULES = (
    "textwrap.py",
    "string.py",
    "argparse.py",
    "calendar.py",
    "difflib.py",
    "fractions.py",
    "heapq.py",
    "bisect.py",
    "shlex.py",
    "csv.py",
)
CORPUS_MAX_CHARS = 300_000
VOCAB = [chr(c) for c in range(32, 127)] + ["\n"]  # printable ASCII; anything else reads "?"


def corpus() -> str:
    root = Path(sysconfig.get_paths()["stdlib"])
    parts = [(root / m).read_text(encoding="utf-8") for m in CORPUS_MODULES if (root / m).exists()]
    return "\n".join(parts)[:CORPUS_MAX_CHARS]


def encode(text: str) -> torch.Tensor:
    index = {c: i for i, c in enumerate(VOCAB)}
    unknown = index["?"]
    return torch.tensor([index.get(c, unknown) for c in text], dtype=torch.long)


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, width: int, layers: int, heads: int, context: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Parameter(torch.zeros(context, width))
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)
        # True above the diagonal: a position never attends to later ones.
        self.mask = nn.Buffer(
            torch.triu(torch.ones(context, context, dtype=torch.bool), diagonal=1)
        )

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        x = self.embed(tokens) + self.position[:n]
        for block in self.blocks:
            x = block(x, self.mask[:n, :n])
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def layer_groups(self) -> dict[str, list[torch.Tensor]]:
        """Parameters per named layer, for the per-layer gradient norms the callbacks log."""
        groups: dict[str, list[torch.Tensor]] = {"embed": [self.embed.weight, self.position]}
        for i, block in enumerate(self.blocks):
            groups[f"block{i}"] = list(block.parameters())
        groups["head"] = [*self.ln.parameters(), *self.head.parameters()]
        return groups
