"""A training plan as a one-line config (chapter 12, section 4), and what the course predicts.

A plan is text, as a config file or a command line would hold it::

    micro_batch=4 accumulation=4 precision=fp32 checkpointing=off optimizer=adamw_fused workers=2

``micro_batch`` and ``accumulation`` are required; the others default to the naive run's
choices. ``Plan.parse`` reads the text strictly (known keys, each once, values from a short
list or a small range): the same parser reads a learner's answer cell, the grader's record and
a result file the workshop's board reads, so nothing else of the text is ever used.

The knobs, and the chapter that measured each:

- ``micro_batch`` x ``accumulation``: the sequences per forward/backward pass, and how many such
  passes add up their gradients before one optimizer step (chapter 05). Their product is the
  global batch, which must be the budget's.
- ``precision``: ``fp32``, or ``bf16``: the whole model, its gradients and AdamW's moments in
  bfloat16 (the ``bf16_adam`` recipe of chapter 02: 8 bytes of model state per parameter
  instead of 16; chapter 04 says what it risks).
- ``checkpointing``: ``off``, or ``every`` block (chapter 05: keeps each block's input only,
  and recomputes the rest in backward).
- ``optimizer``: ``adamw`` (AdamW ``foreach=True``, CUDA's default) or ``adamw_fused`` (one
  fused kernel, no temporary: chapter 02's ``make_optimizer``).
- ``workers``: DataLoader worker processes (chapter 07): 0 loads in the training loop.

This module imports no torch (the workshop's board parses plans); the memory prediction
imports ``gpulab.arith`` when it is asked for.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields

MAX_TEXT = 200           # characters: what a graded record keeps of a text answer
MAX_MICRO_BATCH = 256
MAX_ACCUMULATION = 256
MAX_WORKERS = 8
CHOICES = {"precision": ("fp32", "bf16"), "checkpointing": ("off", "every"),
           "optimizer": ("adamw", "adamw_fused")}
_PAIR = re.compile(r"([a-z_]+)=([A-Za-z0-9_]+)")


class PlanError(ValueError):
    """A plan's text that cannot be read, with what is wrong in plain words."""


@dataclass(frozen=True)
class Plan:
    micro_batch: int
    accumulation: int
    precision: str = "fp32"
    checkpointing: str = "off"
    optimizer: str = "adamw"
    workers: int = 0

    def __post_init__(self):
        for name, top in (("micro_batch", MAX_MICRO_BATCH), ("accumulation", MAX_ACCUMULATION)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
                raise PlanError(f"{name} must be a whole number from 1 to {top}; got {value!r}")
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) \
                or not 0 <= self.workers <= MAX_WORKERS:
            raise PlanError(f"workers must be a whole number from 0 to {MAX_WORKERS}; got {self.workers!r}")
        for name, allowed in CHOICES.items():
            if getattr(self, name) not in allowed:
                raise PlanError(f"{name} must be one of {', '.join(allowed)}; got {getattr(self, name)!r}")

    @classmethod
    def parse(cls, text) -> "Plan":
        """The plan a config line describes; PlanError saying what is wrong otherwise."""
        if not isinstance(text, str):
            raise PlanError(f"a plan is a line of text such as \"{example()}\"; got a "
                            f"{type(text).__name__}")
        if len(text) > MAX_TEXT:
            raise PlanError(f"a plan is at most {MAX_TEXT} characters; this one is {len(text)}")
        words = text.replace(",", " ").split()
        if not words:
            raise PlanError(f"the plan is empty: write it as \"{example()}\"")
        found: dict[str, str] = {}
        names = [f.name for f in fields(cls)]
        for word in words:
            match = _PAIR.fullmatch(word)
            if match is None:
                raise PlanError(f"{word[:40]!r} is not a key=value pair (write e.g. micro_batch=4)")
            key, value = match.groups()
            if key not in names:
                raise PlanError(f"{key!r} is not a knob of the plan; the knobs are {', '.join(names)}")
            if key in found:
                raise PlanError(f"{key} is given twice")
            found[key] = value
        for required in ("micro_batch", "accumulation"):
            if required not in found:
                raise PlanError(f"the plan needs {required}=...; missing")
        values: dict[str, object] = {}
        for key, value in found.items():
            if key in CHOICES:
                values[key] = value
            elif value.isdigit() and len(value) <= 4:
                values[key] = int(value)
            else:
                raise PlanError(f"{key} must be a whole number; got {value[:20]!r}")
        return cls(**values)

    def text(self) -> str:
        """The plan as its config line, every knob written out, in a fixed order."""
        return " ".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step, on one device: micro_batch x accumulation (chapter 05)."""
        return self.micro_batch * self.accumulation

    @property
    def dtype_name(self) -> str:
        return "bfloat16" if self.precision == "bf16" else "float32"


def example() -> str:
    return "micro_batch=4 accumulation=4 workers=2"


def naive(budget) -> Plan:
    """The naive run: the whole global batch at once, fp32, AdamW foreach, no workers."""
    return Plan(micro_batch=budget.batch, accumulation=1)


# ------------------------------------------------------------------------------------------
# What the course predicts for a plan


def predicted_peak_bytes(plan: Plan, budget) -> int:
    """The course's prediction of the plan's steady-state peak (chapter 02's
    ``arith.predict_training_memory``; with accumulation, the gradients stay alive through the
    later micro-batches: chapter 05)."""
    from gpulab import arith
    return arith.predict_training_memory(
        budget.config(), plan.micro_batch, budget.seq, plan.dtype_name, plan.optimizer,
        checkpointing=plan.checkpointing == "every", accumulating=plan.accumulation > 1)["peak"]


def recompute_factor(plan: Plan, budget) -> float:
    """Training FLOPs per token with the plan's checkpointing over those without (chapter 05's
    ``gpt_step_flops_per_token``: PyTorch's early stop skips each block's last matmul)."""
    if plan.checkpointing == "off":
        return 1.0
    from gpulab import arith
    config = budget.config()
    return (arith.gpt_step_flops_per_token(config, budget.seq, True)
            / arith.gpt_step_flops_per_token(config, budget.seq))


def step_seconds(plan: Plan, budget, naive_compute: float) -> float:
    """The chapter's step-time model (section 6), from the naive step's compute time.

    Compute is taken as proportional to FLOPs: a global batch computes in ``naive_compute``
    seconds, times the recompute factor with checkpointing, however it is split into
    micro-batches. Loading a global batch takes ``load_share`` x ``naive_compute``. Without
    workers the two add; with W workers loading runs beside compute and the slower stage sets
    the pace (chapter 07's ``pipeline.step_seconds``, applied per micro-batch, which sums to the
    same per step): max(load / W, compute). The model knows nothing of precision: a bf16 plan
    is predicted at fp32's speed, and the measurement says what bf16 changed.
    """
    if not naive_compute > 0 or not math.isfinite(naive_compute):
        raise ValueError(f"naive_compute must be a positive number of seconds; got {naive_compute!r}")
    compute = naive_compute * recompute_factor(plan, budget)
    load = budget.load_share * naive_compute
    if plan.workers == 0:
        return load + compute
    return max(load / plan.workers, compute)


def workers_needed(plan: Plan, budget) -> int:
    """The fewest workers for which loading no longer sets the pace: ceil(load / compute)."""
    return max(1, math.ceil(budget.load_share / recompute_factor(plan, budget) - 1e-12))


def off_target(plan: Plan, budget) -> str | None:
    """What is wrong with the plan's global batch, or None when it is the budget's target."""
    if plan.global_batch == budget.batch:
        return None
    return (f"its global batch is micro_batch x accumulation = {plan.micro_batch} x "
            f"{plan.accumulation} = {plan.global_batch} sequences; the target is {budget.batch}")


def training_script(plan: Plan) -> str:
    """The plan as the lines of a plain PyTorch training script (chapter 12, "In your training
    script"): the DataLoader, the model, the optimizer, the accumulation loop."""
    dtype = ", dtype=torch.bfloat16" if plan.precision == "bf16" else ""
    checkpointing = ", checkpointing=True" if plan.checkpointing == "every" else ""
    optimizer = "fused=True" if plan.optimizer == "adamw_fused" else "foreach=True"
    k = plan.accumulation
    lines = [
        f"# {plan.text()}",
        f"loader = DataLoader(dataset, batch_size={plan.micro_batch}, num_workers={plan.workers})",
        f"model = GPT(config{dtype}{checkpointing}).to(device)",
        f"optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, {optimizer})",
        "batches = iter(loader)",
        "for step in range(steps):",
        f"    for _ in range({k}):                      # {k} micro-batches of {plan.micro_batch}: "
        f"global batch {plan.global_batch}",
        "        x, y = next(batches)",
        f"        loss = model(x.to(device), y.to(device))[1] / {k}",
        "        loss.backward()                     # gradients add up in .grad",
        "    optimizer.step()",
        "    optimizer.zero_grad(set_to_none=True)",
    ]
    return "\n".join(lines)
