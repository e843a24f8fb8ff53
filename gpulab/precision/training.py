"""Training in each precision (chapter 04): the same GPT trained in fp32, bf16 and fp16 (with
and without GradScaler) on a corpus every Python install has, its losses recorded, and its
step timed."""

from __future__ import annotations

import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gpulab.measure import synchronize
from gpulab.models import GPT, GPTConfig


# ------------------------------------------------------------------------------------------
# Training in each precision, on text every Python install has

PRECISIONS = ("fp32", "bf16", "fp16", "fp16 without scaler")


def text_corpus(n_bytes: int = 500_000) -> torch.Tensor:
    """The first ``n_bytes`` bytes of the standard library's own source (sorted file names): a
    byte-level corpus (vocabulary 256) that needs no download."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    chunks, size = [], 0
    for path in sorted(stdlib.glob("*.py")):
        chunks.append(path.read_bytes())
        size += len(chunks[-1])
        if size >= n_bytes:
            break
    return torch.tensor(list(b"".join(chunks)[:n_bytes]), dtype=torch.long)


def sample_batch(data: torch.Tensor, batch: int, seq_len: int, generator: torch.Generator,
                 device) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` random windows of ``seq_len`` tokens and, as targets, the next token of each."""
    starts = torch.randint(0, len(data) - seq_len, (batch,), generator=generator)  # last start: len − seq_len − 1
    idx = torch.stack([data[s:s + seq_len] for s in starts])
    targets = torch.stack([data[s + 1:s + seq_len + 1] for s in starts])
    return idx.to(device), targets.to(device)


@dataclass
class TrainingRun:
    precision: str
    losses: list[float] = field(default_factory=list)
    scales: list[float] = field(default_factory=list)   # GradScaler's scale after each step
    skipped: int = 0                                     # steps GradScaler skipped (inf/NaN)


def _setup(config: GPTConfig, precision: str, device: torch.device, lr: float, seed: int,
           init_scale: float = 2.0 ** 16, growth_interval: int = 2000, fused: bool = False):
    """A fresh GPT (same seed for every precision), AdamW on its fp32 parameters (they are the
    master weights), the autocast dtype, and a GradScaler enabled for "fp16" only."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    torch.manual_seed(seed)
    model = GPT(config, device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, fused=fused or None)
    low = {"bf16": torch.bfloat16}.get(precision, torch.float16)
    scaler = torch.amp.GradScaler(device.type, init_scale=init_scale,
                                  growth_interval=growth_interval, enabled=precision == "fp16")
    return model, optimizer, low, scaler


def _step(model, optimizer, scaler, low, precision, idx, targets, device_type) -> torch.Tensor:
    """One training step; returns the loss as a tensor (reading it would wait for the GPU)."""
    with torch.autocast(device_type, dtype=low, enabled=precision != "fp32"):
        _, loss = model(idx, targets)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def train(config: GPTConfig, precision: str, steps: int, batch: int, seq_len: int,
          device, data: torch.Tensor | None = None, lr: float = 3e-3, seed: int = 0,
          init_scale: float = 2.0 ** 16, growth_interval: int = 2000) -> TrainingRun:
    """Train a fresh GPT (same seed, same batches for every precision) with AdamW on fp32 master
    weights and record every step's loss. "fp32": no autocast. "bf16"/"fp16":
    ``torch.autocast`` with that dtype; "fp16" uses ``torch.amp.GradScaler`` (``init_scale``,
    ``growth_interval``), "fp16 without scaler" does not. Reads the loss (and the scale) after
    every step, which waits for the GPU: for timing use ``step_seconds``."""
    device = torch.device(device)
    data = text_corpus() if data is None else data
    model, optimizer, low, scaler = _setup(config, precision, device, lr, seed, init_scale,
                                           growth_interval)
    generator = torch.Generator().manual_seed(seed)
    run = TrainingRun(precision)
    for _ in range(steps):
        idx, targets = sample_batch(data, batch, seq_len, generator, device)
        before = scaler.get_scale() if scaler.is_enabled() else 1.0
        run.losses.append(_step(model, optimizer, scaler, low, precision, idx, targets,
                                device.type).item())
        if scaler.is_enabled():
            run.scales.append(scaler.get_scale())
            run.skipped += run.scales[-1] < before     # update() backed off: the step was skipped
    return run


def step_seconds(config: GPTConfig, precision: str, batch: int, seq_len: int, device,
                 data: torch.Tensor | None = None, steps: int = 10, warmup: int = 3,
                 lr: float = 3e-4) -> float:
    """Seconds per training step in ``precision``, timed so that a GPU shows its real speed.
    Chapter 04, "Experiment 7: training speed per precision".

    - Warm-up: the first steps pay one-time costs (cuBLAS handles and kernel selection, Adam's
      state allocated at the first ``step()``, the allocator growing its cache, GradScaler's
      scale tensor): ``warmup`` untimed steps first.
    - No host syncs inside the timed steps: every batch is sampled and copied to the device
      beforehand (a copy from pageable host memory synchronises the stream), no loss is read,
      and AdamW is ``fused``, whose step takes GradScaler's inf check on the device
      (``_step_supports_amp_scaling``; otherwise ``GradScaler.step`` reads it with ``.item()``
      every step, a host sync on a GPU). The clock stops after one ``synchronize`` at the end.
    - Size: each step must do enough arithmetic per kernel launch that the GPU is not waiting
      for Python (chapter 03, "Compute-, memory- and overhead-bound"); a tiny model shows no
      gain from bf16 on a GPU.
    """
    device = torch.device(device)
    data = text_corpus() if data is None else data
    model, optimizer, low, scaler = _setup(config, precision, device, lr, seed=0,
                                           fused=True)
    generator = torch.Generator().manual_seed(0)
    batches = [sample_batch(data, batch, seq_len, generator, device) for _ in range(warmup + steps)]
    for idx, targets in batches[:warmup]:
        _step(model, optimizer, scaler, low, precision, idx, targets, device.type)
    synchronize(device)
    start = time.perf_counter()
    for idx, targets in batches[warmup:]:
        _step(model, optimizer, scaler, low, precision, idx, targets, device.type)
    synchronize(device)
    return (time.perf_counter() - start) / steps
