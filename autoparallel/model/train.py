"""A tiny training loop: the same data, seed and schedule for every FP8 policy, so that the loss
curves of BF16, delayed, current and blockwise scaling differ only by the recipe.

It is deliberately plain (AdamW, warm-up + cosine, BF16 autocast, one ``update_fp8_scales``
per step); profiling jobs time their own steps and do not use it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from autoparallel.model.data import BatchSampler, encode, generate_corpus
from autoparallel.model.fp8 import update_fp8_scales
from autoparallel.model.recipes import Fp8Policy
from autoparallel.model.transformer import TINY, Recompute, Transformer
from autoparallel.specs.model import ModelSpec


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 200
    batch_size: int = 8
    seq_length: int = 32
    lr: float = 3e-3
    warmup: int = 20
    weight_decay: float = 0.1
    seed: int = 0
    corpus_chars: int = 200_000
    autocast_bf16: bool = True
    # The tiny model's GEMMs are too small to gain from intra-op threads, and a second thread
    # makes steps several times slower when other processes share the cores (measured 4.4x on
    # a busy 2-core machine). None leaves torch's setting alone.
    num_threads: int | None = 1

    def __post_init__(self) -> None:
        for key in ("steps", "batch_size", "seq_length", "corpus_chars"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key}={getattr(self, key)} must be >= 1")
        if self.lr <= 0:
            raise ValueError(f"lr={self.lr} must be positive")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads={self.num_threads} must be >= 1 or None")


@dataclass
class TrainResult:
    policy: str
    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0

    def final_loss(self, last: int = 20) -> float:
        """Mean training loss of the last ``last`` steps (less noisy than the last step)."""
        tail = self.losses[-last:]
        return sum(tail) / len(tail)


def lr_at(step: int, config: TrainConfig) -> float:
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    progress = (step - config.warmup) / max(1, config.steps - config.warmup)
    return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def build_model(policy: Fp8Policy, spec: ModelSpec = TINY, seed: int = 0,
                recompute: Recompute | None = None) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(spec, policy, recompute)


def train(policy: Fp8Policy, config: TrainConfig = TrainConfig(), spec: ModelSpec = TINY,
          model: Transformer | None = None, on_step=None) -> TrainResult:
    """Train from a fixed initialisation; ``on_step(step, model)`` runs after each step."""
    threads = torch.get_num_threads()
    if config.num_threads is not None:
        torch.set_num_threads(config.num_threads)
    try:
        return _train(policy, config, spec, model, on_step)
    finally:
        torch.set_num_threads(threads)


def _train(policy: Fp8Policy, config: TrainConfig, spec: ModelSpec, model: Transformer | None,
           on_step) -> TrainResult:
    if config.seq_length > spec.seq_length:
        raise ValueError(f"seq_length={config.seq_length} exceeds the model's {spec.seq_length}")
    model = model if model is not None else build_model(policy, spec, config.seed)
    sampler = BatchSampler(encode(generate_corpus(config.corpus_chars, config.seed)),
                           config.batch_size, config.seq_length, config.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, 0.95),
                                  weight_decay=config.weight_decay)
    device = next(model.parameters()).device
    result = TrainResult(policy.name)
    start = time.perf_counter()
    for step in range(config.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, config)
        inputs, targets = (t.to(device) for t in sampler.next())
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=config.autocast_bf16):
            logits = model(inputs)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        update_fp8_scales(model)
        result.losses.append(loss.item())
        if on_step is not None:
            on_step(step, model)
    result.seconds = time.perf_counter() - start
    return result
