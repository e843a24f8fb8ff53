"""The course's knobs under each tool's name, and the bookkeeping each tool does with them
(chapter 09, "The same knobs in the tools you use"). Imports no framework: answer keys use it.

``KNOBS`` is the side-by-side table the chapter prints, as two narrower tables: the tools where
the loop is yours (plain PyTorch, Accelerate) and those that run it for you (the HF Trainer,
Lightning, a DeepSpeed JSON config). Each entry is Markdown, short enough for a table cell; the
keyword arguments go to ``Accelerator(...)``, ``TrainingArguments(...)`` and Lightning's
``Trainer(...)``. tests/test_frameworks.py checks the arguments against the installed versions
(accelerate 1.16, transformers 5.24, pytorch-lightning 2.6, deepspeed 0.19).

The bookkeeping (checked by running the tools and against their samplers):

- the optimizer steps per epoch are the same in Accelerate, the HF Trainer and Lightning:
  ceil(N / (b k R)) for N samples, micro-batch b, k accumulation steps and R ranks: every k
  micro-batches, and once more at the end of the epoch for a last, shorter group;
- what the last step learns from is not. Lightning (and plain PyTorch) put a
  ``DistributedSampler`` in front: each rank gets ceil(N / R) samples, and its last micro-batch is
  smaller when b does not divide that. Accelerate and the HF Trainer (which runs on Accelerate)
  deal whole batches to the ranks with ``BatchSamplerShard(even_batches=True)``, which fills the
  last batches with samples from the start of the epoch: every micro-batch is full;
- and neither is the weight of its gradient: Accelerate and Lightning divide each micro-batch's
  loss by k, so a last group of r < k micro-batches steps with r/k of its mean gradient; the HF
  Trainer divides by the group's real length. DeepSpeed's engine steps on a counter and takes no
  extra step at the end of an epoch (tests and chapter say where each is read).
"""

from __future__ import annotations

import math

from gpulab.arith import global_batch

# (technique, plain PyTorch, Accelerate, HF Trainer, Lightning, DeepSpeed JSON): Markdown cells.
KNOBS: list[tuple[str, str, str, str, str, str]] = [
    ("micro-batch per GPU", "`DataLoader(batch_size=8)`", "`DataLoader(batch_size=8)`",
     "`per_device_train_batch_size=8`", "`DataLoader(batch_size=8)`", '`"train_micro_batch_size_per_gpu": 8`'),
    ("accumulation steps", "`loss / 4`, step every 4", "`gradient_accumulation_steps=4`",
     "`gradient_accumulation_steps=4`", "`accumulate_grad_batches=4`", '`"gradient_accumulation_steps": 4`'),
    ("global batch", "you compute it", "you compute it", 'logged as "Total train batch size"',
     "you compute it", '`"train_batch_size": 256`'),
    ("precision", '`torch.autocast("cuda", torch.bfloat16)`', '`mixed_precision="bf16"`', "`bf16=True`",
     '`precision="bf16-mixed"`', '`"bf16": {"enabled": true}`'),
    ("activation checkpointing", "`checkpoint(block, x)`", "in the model", "`gradient_checkpointing=True`",
     "in the model", '`"activation_checkpointing"`'),
    ("data parallel", "`torchrun` + `DDP(model)`", "`accelerate launch`", "`torchrun`",
     '`devices=8, strategy="ddp"`', "the `deepspeed` launcher"),
    ("ZeRO / FSDP", "`fully_shard(model)`", "`fsdp_plugin=...`", '`fsdp="full_shard auto_wrap"`', '`strategy="fsdp"`',
     '`"zero_optimization": {"stage": 2}`'),
    ("DataLoader workers", "`DataLoader(num_workers=4)`", "`DataLoader(num_workers=4)`",
     "`dataloader_num_workers=4`", "`DataLoader(num_workers=4)`", "its own loader"),
    ("compile", "`torch.compile(model)`", '`dynamo_backend="inductor"`', "`torch_compile=True`",
     "`torch.compile(model)`", "`engine.compile()`"),
    ("gradient clipping", "`clip_grad_norm_(params, 1.0)`", "`accelerator.clip_grad_norm_(params, 1.0)`",
     "`max_grad_norm=1.0`", "`gradient_clip_val=1.0`", '`"gradient_clipping": 1.0`'),
]
TOOLS = ("plain PyTorch", "Accelerate", "HF Trainer", "Lightning", "DeepSpeed JSON")
YOUR_LOOP = ("plain PyTorch", "Accelerate")                 # you write the loop
TOOL_LOOP = ("HF Trainer", "Lightning", "DeepSpeed JSON")   # the tool runs it (DeepSpeed: the step)
HEADINGS = {"plain PyTorch": "plain PyTorch", "Accelerate": "Accelerate (`Accelerator(...)`)",
            "HF Trainer": "HF Trainer (`TrainingArguments(...)`)", "Lightning": "Lightning (`Trainer(...)`)",
            "DeepSpeed JSON": "DeepSpeed (its JSON config)"}


def knobs_markdown(tools: tuple[str, ...] = TOOLS) -> str:
    """``KNOBS`` as a Markdown table, one row per technique, a column for each of ``tools``."""
    columns = [TOOLS.index(tool) for tool in tools]
    rows = ["| knob | " + " | ".join(HEADINGS[tool] for tool in tools) + " |", "|---" * (len(tools) + 1) + "|"]
    for technique, *cells in KNOBS:
        rows.append(f"| {technique} | " + " | ".join(cells[i].replace("|", "\\|") for i in columns) + " |")
    return "\n".join(rows)


def samples_per_rank(dataset_size: int, ranks: int) -> int:
    """Samples a rank sees per epoch behind a ``DistributedSampler`` (Lightning, plain PyTorch;
    drop_last=False, the default): it pads the dataset with repeated samples up to a multiple of
    ``ranks``, so every rank gets ceil(N / R)."""
    _positive(dataset_size=dataset_size, ranks=ranks)
    return math.ceil(dataset_size / ranks)


def batches_per_rank(dataset_size: int, micro_batch: int, ranks: int = 1) -> int:
    """Micro-batches per rank per epoch, ceil(N / (b R)), in every tool: behind a
    DistributedSampler ceil(ceil(N / R) / b), the last one smaller when b does not divide; behind
    Accelerate's even batches ceil(ceil(N / b) / R), all full. For whole numbers the two nested
    ceilings are equal: both are ceil(N / (b R))."""
    _positive(micro_batch=micro_batch)
    return math.ceil(samples_per_rank(dataset_size, ranks) / micro_batch)


def optimizer_steps_per_epoch(dataset_size: int, micro_batch: int, accumulation: int,
                              ranks: int = 1) -> int:
    """Optimizer steps in one epoch, ceil(N / (b k R)): every ``accumulation`` micro-batches, and
    once more at the end of the epoch for a last, shorter group. The same in Accelerate
    (``accumulate`` syncs at the end of the loader), the HF Trainer ("Num update steps per epoch"
    = ceil(len(loader) / k)) and Lightning (``ceil(num_training_batches / accumulate_grad_batches)``).
    Not in DeepSpeed's engine, which steps every k micro-batches counted across epochs."""
    _positive(accumulation=accumulation)
    return math.ceil(batches_per_rank(dataset_size, micro_batch, ranks) / accumulation)


def samples_per_step(dataset_size: int, micro_batch: int, accumulation: int, ranks: int = 1,
                     even_batches: bool = False) -> list[int]:
    """The samples (all ranks together) each optimizer step of one epoch learns from.

    ``even_batches=False``: a DistributedSampler gives each rank ceil(N / R) samples (Lightning,
    plain PyTorch), cut into micro-batches of b, the last one smaller. ``even_batches=True``:
    Accelerate and the HF Trainer on more than one rank deal whole batches of b round the ranks
    and fill the last ones from the start of the epoch (``BatchSamplerShard``), so every rank
    runs ceil(ceil(N / b) / R) full micro-batches. One rank is never filled."""
    steps = optimizer_steps_per_epoch(dataset_size, micro_batch, accumulation, ranks)
    if even_batches and ranks > 1:
        batches = [micro_batch] * batches_per_rank(dataset_size, micro_batch, ranks)
    else:
        per_rank = samples_per_rank(dataset_size, ranks)
        batches = [micro_batch] * (per_rank // micro_batch) + ([per_rank % micro_batch] if per_rank % micro_batch else [])
    return [ranks * sum(batches[i * accumulation:(i + 1) * accumulation]) for i in range(steps)]


def gradient_weights(dataset_size: int, micro_batch: int, accumulation: int, ranks: int = 1,
                     divide_by_window: bool = False) -> list[float]:
    """The weight each optimizer step of one epoch gives its micro-batches' mean gradient: 1.0,
    except that a last group of r < k micro-batches gets r / k where the tool divides every loss
    by k (Accelerate, Lightning). ``divide_by_window=True``: the HF Trainer, which divides by the
    group's real length (``current_gradient_accumulation_steps``), always 1.0."""
    batches = batches_per_rank(dataset_size, micro_batch, ranks)
    steps = optimizer_steps_per_epoch(dataset_size, micro_batch, accumulation, ranks)
    last = batches - (steps - 1) * accumulation
    return [1.0] * (steps - 1) + [1.0 if divide_by_window else last / accumulation]


def tokens_per_step(micro_batch: int, accumulation: int, ranks: int, seq_len: int) -> int:
    """Tokens one optimizer step learns from: global batch x sequence length (a full step; the
    epoch's last step may be smaller)."""
    return global_batch(micro_batch, accumulation, ranks) * seq_len


def deepspeed_batch(world_size: int, train_batch_size: int | None = None,
                    micro_batch: int | None = None, accumulation: int | None = None) -> dict:
    """DeepSpeed's batch triple from the two (or three) a config gives, as
    ``DeepSpeedConfig._set_batch_related_parameters`` derives it (deepspeed 0.19): integer
    division, then the check train_batch_size == micro x accumulation x world_size."""
    if train_batch_size is not None and micro_batch is not None and accumulation is None:
        accumulation = train_batch_size // micro_batch // world_size
    elif train_batch_size is not None and accumulation is not None and micro_batch is None:
        micro_batch = train_batch_size // world_size // accumulation
    elif micro_batch is not None and accumulation is not None and train_batch_size is None:
        train_batch_size = micro_batch * accumulation * world_size
    elif train_batch_size is None or micro_batch is None or accumulation is None:
        raise ValueError("give two of train_batch_size, micro_batch, accumulation (or all three)")
    if train_batch_size != micro_batch * accumulation * world_size:
        raise ValueError(f"train_batch_size {train_batch_size} != {micro_batch} x {accumulation} x "
                         f"{world_size}: DeepSpeed refuses this config")
    return {"train_batch_size": train_batch_size, "train_micro_batch_size_per_gpu": micro_batch,
            "gradient_accumulation_steps": accumulation}


# Bits per parameter Lightning's model summary assumes (pytorch_lightning 2.6,
# utilities/model_summary/model_summary.py): "-mixed" precisions are not in its table and fall
# back to 32 bits, which is right for the weights: mixed precision keeps them in fp32.
SUMMARY_BITS = {"64": 64, "32": 32, "16": 16, "bf16": 16, "16-true": 16, "bf16-true": 16,
                "32-true": 32, "64-true": 64}


def lightning_summary_mb(n_params: int, precision: str) -> float:
    """"Total estimated model params size (MB)" in Lightning's summary: parameters x bytes per
    parameter of ``precision``, in decimal MB (10^6 bytes)."""
    return n_params * SUMMARY_BITS.get(precision, 32) / 8 / 1e6


def weight_bytes_per_param(precision: str) -> int:
    """Bytes per weight a training process keeps: "-true" precisions store the weights in 16 bits;
    "-mixed" ones (and Accelerate's mixed_precision, the Trainer's bf16=True) keep fp32 weights
    and run matmuls in 16 bits under autocast."""
    return 2 if precision in ("16-true", "bf16-true") else 8 if precision.startswith("64") else 4


def _positive(**values) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
