"""A tiny generated text corpus and a seeded batch sampler, so FP8 training runs need no download.

The text is byte-level (vocab 256) and has structure at several scales a small model learns in a
few hundred steps: spelling of a fixed word list, a toy grammar, and exact sums ("17 + 25 = 42")
whose last digits cannot be guessed from frequencies alone. Same seed, same text, same batches.
"""

from __future__ import annotations

import random

import torch

_NOUNS = ("cat", "dog", "bird", "model", "kernel", "tensor", "layer", "gradient", "river",
          "engine", "garden", "student")
_ADJECTIVES = ("small", "quick", "quiet", "bright", "heavy", "sparse", "narrow", "green")
_VERBS = ("sees", "likes", "moves", "scales", "follows", "builds", "trains", "finds")


def generate_corpus(num_chars: int = 200_000, seed: int = 0) -> str:
    rng = random.Random(seed)
    parts: list[str] = []
    size = 0
    while size < num_chars:
        if rng.random() < 0.3:
            a, b = rng.randrange(100), rng.randrange(100)
            sentence = f"{a} + {b} = {a + b}."
        else:
            sentence = (f"the {rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)} "
                        f"{rng.choice(_VERBS)} the {rng.choice(_NOUNS)}.")
        parts.append(sentence)
        size += len(sentence) + 1
    return " ".join(parts)[:num_chars]


def encode(text: str) -> torch.Tensor:
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)


class BatchSampler:
    """Random windows of ``seq_length + 1`` tokens: inputs and next-token targets."""

    def __init__(self, tokens: torch.Tensor, batch_size: int, seq_length: int, seed: int = 0
                 ) -> None:
        if tokens.numel() <= seq_length + 1:
            raise ValueError(f"corpus of {tokens.numel()} tokens is too short for "
                             f"seq_length={seq_length}")
        self.tokens, self.batch_size, self.seq_length = tokens, batch_size, seq_length
        self.generator = torch.Generator().manual_seed(seed)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(0, self.tokens.numel() - self.seq_length - 1, (self.batch_size,),
                               generator=self.generator)
        window = torch.stack([self.tokens[s:s + self.seq_length + 1] for s in starts.tolist()])
        return window[:, :-1], window[:, 1:]
