"""The course's knobs under each tool's name, and the bookkeeping each tool does with them
(chapter 09, "The same knobs in the tools you use"). Imports no framework: answer keys use it.

``KNOBS`` is the side-by-side table the chapter prints: for each technique, the line in plain
PyTorch, in Hugging Face Accelerate (``Accelerator(...)`` or ``accelerate config``), in the HF
Trainer (``TrainingArguments``), in PyTorch Lightning (``Trainer(...)``) and in a DeepSpeed JSON
config. tests/test_frameworks.py checks every argument named here against the installed versions
(accelerate 1.15, transformers 5.24, pytorch-lightning 2.6, deepspeed 0.19).

The bookkeeping is the same in every tool, with one rounding rule each (checked by running them):
a rank gets ceil(N / ranks) samples (DistributedSampler pads the dataset to a multiple of the
ranks, drop_last=False), so ceil(that / micro-batch) batches; with k accumulation steps the
optimizer steps every k batches AND at the end of the epoch, so ceil(batches / k) times.
"""

from __future__ import annotations

import math
import re

from gpulab.arith import global_batch

# (technique, plain PyTorch, Accelerate, HF Trainer, Lightning, DeepSpeed JSON)
KNOBS: list[tuple[str, str, str, str, str, str]] = [
    ("micro-batch per GPU",
     "DataLoader(batch_size=8)",
     "DataLoader(batch_size=8), then accelerator.prepare(loader)",
     "per_device_train_batch_size=8",
     "DataLoader(batch_size=8) in train_dataloader()",
     '"train_micro_batch_size_per_gpu": 8'),
    ("accumulation steps",
     "loss / k; optimizer.step() every k micro-batches",
     "Accelerator(gradient_accumulation_steps=4) + with accelerator.accumulate(model)",
     "gradient_accumulation_steps=4",
     "Trainer(accumulate_grad_batches=4)",
     '"gradient_accumulation_steps": 4'),
    ("global batch",
     "micro x k x ranks (you compute it)",
     "loader.total_batch_size x accelerator.gradient_accumulation_steps",
     'logged: "Total train batch size (w. parallel, distributed & accumulation)"',
     "world_size x accumulate_grad_batches x batch_size (you compute it)",
     '"train_batch_size": 256 (must equal micro x k x ranks)'),
    ("precision",
     'torch.autocast("cuda", dtype=torch.bfloat16)',
     'Accelerator(mixed_precision="bf16")  ("fp16", "fp8")',
     "bf16=True  (fp16=True)",
     'Trainer(precision="bf16-mixed")  ("16-mixed", "bf16-true", "32-true")',
     '"bf16": {"enabled": true}  ("fp16": {"enabled": true, "loss_scale": 0})'),
    ("activation checkpointing",
     "torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)",
     "FullyShardedDataParallelPlugin(activation_checkpointing=True), else in the model",
     "gradient_checkpointing=True (models with gradient_checkpointing_enable)",
     "FSDPStrategy(activation_checkpointing_policy={Block}), else in the model",
     '"activation_checkpointing": {...} (with deepspeed.checkpointing in the model)'),
    ("data parallel",
     "torchrun + DistributedDataParallel(model) + DistributedSampler",
     "accelerate launch --num_processes 8 train.py (prepare wraps in DDP)",
     "torchrun --nproc_per_node 8 train.py (Trainer wraps in DDP)",
     'Trainer(devices=8, strategy="ddp")',
     "deepspeed --num_gpus 8 train.py (the engine all-reduces)"),
    ("ZeRO stage / FSDP",
     "fully_shard(block) on each block, then on the model (FSDP2)",
     "FullyShardedDataParallelPlugin(fsdp_version=2, reshard_after_forward=True)",
     'fsdp="full_shard auto_wrap"  or  deepspeed="ds_config.json"',
     'Trainer(strategy="fsdp")  or  strategy="deepspeed_stage_2"',
     '"zero_optimization": {"stage": 2}  (3 also shards the weights)'),
    ("DataLoader workers",
     "DataLoader(num_workers=4, pin_memory=True)",
     "DataLoader(num_workers=4, pin_memory=True), then prepare",
     "dataloader_num_workers=4, dataloader_pin_memory=True",
     "DataLoader(num_workers=4) in train_dataloader()",
     "deepspeed.initialize(training_data=...) builds its own loader"),
    ("compile",
     "model = torch.compile(model)",
     'Accelerator(dynamo_backend="inductor")',
     "torch_compile=True",
     "model = torch.compile(model) before trainer.fit(model)",
     "engine.compile() after deepspeed.initialize"),
    ("gradient clipping",
     "clip_grad_norm_(model.parameters(), 1.0)",
     "accelerator.clip_grad_norm_(model.parameters(), 1.0)",
     "max_grad_norm=1.0",
     "Trainer(gradient_clip_val=1.0)",
     '"gradient_clipping": 1.0'),
]
TOOLS = ("plain PyTorch", "Accelerate", "HF Trainer", "Lightning", "DeepSpeed JSON")


def knobs_markdown() -> str:
    """``KNOBS`` as a Markdown table, one row per technique."""
    rows = ["| technique | " + " | ".join(TOOLS) + " |", "|---" * (len(TOOLS) + 1) + "|"]
    for technique, *lines in KNOBS:
        cells = [f"`{line}`" if re.search(r'\w\(|=|": ', line) else line for line in lines]
        rows.append(f"| {technique} | " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)


def samples_per_rank(dataset_size: int, ranks: int) -> int:
    """Samples a rank sees per epoch: DistributedSampler (drop_last=False, the default in every
    tool) pads the dataset with repeated samples up to a multiple of ``ranks``."""
    _positive(dataset_size=dataset_size, ranks=ranks)
    return math.ceil(dataset_size / ranks)


def batches_per_rank(dataset_size: int, micro_batch: int, ranks: int = 1) -> int:
    """Micro-batches per rank per epoch: the last one is smaller when they do not divide."""
    _positive(micro_batch=micro_batch)
    return math.ceil(samples_per_rank(dataset_size, ranks) / micro_batch)


def optimizer_steps_per_epoch(dataset_size: int, micro_batch: int, accumulation: int,
                              ranks: int = 1) -> int:
    """Optimizer steps in one epoch: every ``accumulation`` micro-batches, and once more at the end
    of the epoch for a last, incomplete group. The same in Accelerate (``accumulate`` syncs at the
    end of the loader), the HF Trainer ("Num update steps per epoch" = ceil(len(loader) / k)) and
    Lightning (``ceil(num_training_batches / accumulate_grad_batches)``)."""
    _positive(accumulation=accumulation)
    return math.ceil(batches_per_rank(dataset_size, micro_batch, ranks) / accumulation)


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
