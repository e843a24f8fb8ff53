"""Timing whole training steps of the course GPT.

- ``training_step_timing`` and ``step_seconds``: the time of a training step with and without
  activation checkpointing (chapter 05, "What recomputation costs").
- ``training_step_throughput``: tokens per second and FLOP/s of a training step, measured the
  same way, for the MFU (chapter 03, "Tokens per second and MFU of a real training step").
"""

from __future__ import annotations

import torch

from gpulab import arith
from gpulab.device import best_device
from gpulab.measure.memory import make_optimizer, train_step
from gpulab.measure.throughput import _float_dtype, _label
from gpulab.measure.timing import Timing, time_fn
from gpulab.models import GPT, GPTConfig


def training_step_timing(config: GPTConfig | None = None, batch_size: int = 8,
                         seq_len: int = 128, dtype=torch.float32, optimizer: str = "adamw",
                         checkpointing: bool | int = False, device=None, steps: int = 3,
                         micro_batches: int = 1) -> Timing:
    """Time full training steps of ``GPT(config, checkpointing=...)``: warm-up steps, then
    ``steps`` timed ones (``gpulab.measure.memory.train_step``, with ``micro_batches`` > 1 for gradient
    accumulation). Returns the ``Timing``; look at its spread before trusting the median on a
    busy CPU. Chapter 05, "What recomputation costs".

    Warm-up: the first step creates the optimizer's state (and on a GPU the cuBLAS handle and
    workspace, and loads each kernel on first use). On a GPU a second warm-up step: it is the
    first to hold that state through forward and backward, so its peak is higher and the caching
    allocator grows its cache with cudaMalloc, which is slow and synchronises the device; from
    the third step on, every block comes from the cache.
    """
    config = config if config is not None else GPTConfig()
    arith.check_positive_integers(batch_size=batch_size, seq_len=seq_len, steps=steps,
                                  micro_batches=micro_batches)
    if seq_len > config.block_size:
        raise ValueError(f"seq_len={seq_len} is longer than config.block_size="
                         f"{config.block_size}")
    dtype = _float_dtype(dtype)
    device = torch.device(device) if device is not None else best_device()
    torch.manual_seed(0)
    model = GPT(config, dtype=dtype, device=device, checkpointing=checkpointing)
    opt = make_optimizer(model, optimizer)
    idx = torch.randint(config.vocab_size, (batch_size, seq_len), device=device)
    targets = torch.randint(config.vocab_size, (batch_size, seq_len), device=device)
    return time_fn(lambda: train_step(model, opt, idx, targets, micro_batches), device,
                   warmup=2 if device.type == "cuda" else 1, repeats=steps)


def step_seconds(config: GPTConfig | None = None, batch_size: int = 8, seq_len: int = 128,
                 dtype=torch.float32, optimizer: str = "adamw", checkpointing: bool | int = False,
                 device=None, steps: int = 3, micro_batches: int = 1) -> float:
    """Median seconds of a training step: ``training_step_timing(...).median``.

    Checkpointing every block runs the blocks' forward again, less each segment's last matmul
    (PyTorch's early stop): expect about the FLOP ratio of ``arith.gpt_step_flops_per_token``,
    1.215 for the course GPT (batch 8, seq 128), a little more for larger segments (1.26 with
    segments of 2, 1.29 with one of 4). Measured on a shared 2-core CPU before issue 29: 0.18-0.20
    s a step without checkpointing, 0.23-0.27 s with it (1.25-1.4x, noisy: element-wise work and
    per-op costs are recomputed too, the optimizer is not). Chapter 05, "What recomputation costs".
    """
    return training_step_timing(config, batch_size, seq_len, dtype, optimizer, checkpointing,
                                device, steps, micro_batches).median


def training_step_throughput(config: GPTConfig | None = None, batch_size: int = 4,
                             seq_len: int = 64, dtype=torch.float32, device=None,
                             optimizer: str = "adamw", steps: int = 3) -> dict:
    """Tokens per second and FLOP/s of full training steps of ``GPT(config)``.

    Warm-up steps (one on a CPU, two on a GPU: ``training_step_timing`` says why), then
    ``steps`` timed steps (``gpulab.measure.memory.train_step``: forward, backward, optimizer step, zero
    grads; the model built in ``dtype``). Returns a dict:

    - ``seconds_per_step``: the median step; ``tokens_per_step`` = batch_size · seq_len
    - ``tokens_per_second`` = tokens_per_step / seconds_per_step
    - ``n_params``: the parameters that do matmuls, ``GPT.count_params(config)`` less the two
      embedding tables (a lookup does no arithmetic; the untied head is a real matmul)
    - ``flops_per_token`` = ``arith.training_flops(n_params, 1, n_layer=L, hidden=n_embd,
      seq_len=seq_len)`` = 6·N + 12·L·h·s (model FLOPs, PaLM appendix B)
    - ``achieved_flops_per_second`` = flops_per_token · tokens_per_second; divide by
      ``hardware.peak_flops(spec, dtype)`` for the MFU (``arith.mfu``)
    - ``timing`` (the ``Timing``), ``device``, ``dtype``

    Sizes: the default GPTConfig (4 layers, n_embd 256, vocab 1000) with batch 4, seq 64 takes
    about 0.1-0.3 s a step in float32 on an idle 2-core CPU (bfloat16 is several times slower
    on CPUs without native bf16 instructions: the matmuls are emulated). On a CPU shared with
    other work, steps can take 10x longer (PyTorch's OpenMP threads wait for each other at every
    op): look at ``timing.spread`` before trusting a median. On a GPU use e.g. GPTConfig(vocab_size=32000,
    block_size=1024, n_layer=12, n_head=12, n_embd=768) with batch 4, seq 512, in bfloat16
    (``arith.predict_training_memory``: about 2.0 GiB peak, inside the course's 4 GiB budget);
    this model writes attention out, so expect an MFU well below the fused-attention figures.
    Chapter 03, "MFU".
    """
    config = config if config is not None else GPTConfig()
    timing = training_step_timing(config, batch_size, seq_len, dtype, optimizer, device=device,
                                  steps=steps)
    n_params = GPT.count_params(config) - (config.vocab_size + config.block_size) * config.n_embd
    flops_per_token = arith.training_flops(n_params, 1, n_layer=config.n_layer,
                                           hidden=config.n_embd, seq_len=seq_len)
    tokens_per_step = batch_size * seq_len
    tokens_per_second = tokens_per_step / timing.median
    return {"seconds_per_step": timing.median, "tokens_per_step": tokens_per_step,
            "tokens_per_second": tokens_per_second, "n_params": n_params,
            "flops_per_token": flops_per_token,
            "achieved_flops_per_second": flops_per_token * tokens_per_second,
            "timing": timing, "device": timing.device, "dtype": _label(_float_dtype(dtype))}
