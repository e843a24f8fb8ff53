"""The capstone's budgets (chapter 12, section 1): what each learner must fit and how fast.

A budget names a course GPT (``gpulab.models.GPT``: vocabulary 1,000, 4 heads, ``n_layer``
blocks of width ``n_embd``), the batch the optimizer must see (``batch`` sequences of ``seq``
tokens per optimizer step: the *target global batch*), a memory budget and a time budget.

- Memory: the peak of one steady-state training step, in MiB (2^20 bytes), counted as the CUDA
  caching allocator counts it (``gpulab.measure.training_step_peak``: the storage tracker on a
  CPU, ``max_memory_allocated`` on a GPU). The naive run (the whole batch at once, fp32, AdamW)
  is over it; several plans fit it.
- Time: the data arrive slowly. Loading one global batch takes ``load_share`` times the naive
  step's compute on the device the run measures (one wait per batch, as from network storage:
  chapter 07's ``TokenDataset``). The plan's step must be ``speedup`` times as fast as the
  naive run's, on the same device; ``fast`` is the bonus tier. Both are ratios, so a slow
  laptop and a fast GPU are judged alike.

Each budget's memory is sized against the course's prediction (``arith.predict_training_memory``)
so that every "largest micro-batch" answer has at least 3% of headroom on both sides: more than
the prediction's error (0.1% on a CPU, about 1% on a GPU). tests/test_capstone.py checks it for
every budget. The canonical budget, ``CANONICAL``, is the one the chapter states; a graded
release with a course seed draws one of ``BUDGETS`` for each student (gpulab.course.variants).
The workshop's board uses the canonical one: a room compares plans for the same budget.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

VOCAB, HEADS = 1000, 4
# The quiz's reference device: it runs the course GPT at this many FLOP/s (a CPU core with
# vector units does tens of GFLOP/s; chapter 03). Only the quizzes use it; runs measure.
REFERENCE_FLOPS = 20e9


@dataclass(frozen=True)
class Budget:
    name: str
    n_layer: int
    n_embd: int
    seq: int            # tokens per sequence (the model's block_size)
    batch: int          # the target global batch, in sequences per optimizer step
    memory_mib: int     # the peak a step may reach, MiB
    load_share: float   # loading a global batch takes this times the naive step's compute
    speedup: float      # the time budget: the plan at least this many times as fast as naive
    fast: float         # the bonus tier

    def config(self):
        """The budget's model as a ``GPTConfig`` (imports torch)."""
        from gpulab.models import GPTConfig
        return GPTConfig(vocab_size=VOCAB, block_size=self.seq, n_layer=self.n_layer,
                         n_head=HEADS, n_embd=self.n_embd)

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * 2**20

    @property
    def tokens_per_step(self) -> int:
        return self.batch * self.seq

    @property
    def model(self) -> str:
        return f"{self.n_layer} blocks of width {self.n_embd}"

    def record(self) -> dict:
        """The budget as the plain dict a quiz template reads (``{budget[batch]}``)."""
        return {**asdict(self), "model": self.model}


def _tiers(load_share: float) -> tuple[float, float]:
    """The time budget and the bonus tier for a load share: 0.4 and 0.5 of the most any plan
    can gain by hiding the loading, 1 + load_share (loading all hidden, compute unchanged),
    rounded up to a multiple of 0.05; the time budget at least 1.2, so that it takes workers.
    The rest is headroom: small micro-batches compute less efficiently than their FLOPs say,
    checkpointing recomputes, and a busy machine slows a run down (measured on a 2-core machine
    at a load of 10: the same plan from 1.6x to 3.5x)."""
    ceiling = 1 + load_share
    time_budget, bonus = (math.ceil(share * ceiling * 20 - 1e-9) / 20 for share in (0.4, 0.5))
    return max(1.2, time_budget), bonus


def _budget(name, n_layer, n_embd, seq, batch, memory_mib, load_share) -> Budget:
    return Budget(name, n_layer, n_embd, seq, batch, memory_mib, load_share, *_tiers(load_share))


# Chosen so that (tests/test_capstone.py checks each) every quiz's answer varies across students
# (a classmate's answer is right for about a quarter of a class), every budget's tokens per
# step differ, every "largest micro-batch" has 3% of headroom both ways and is at least 3 (a CPU
# computes smaller ones far below their FLOPs), and a plan without accumulation (checkpointing,
# bf16 or both) fits each budget: on a GPU this small a model is bound by kernel launches,
# which accumulation multiplies.
BUDGETS = (
    _budget("A", n_layer=2, n_embd=128, seq=64, batch=24, memory_mib=23, load_share=2.5),
    _budget("B", n_layer=2, n_embd=128, seq=40, batch=32, memory_mib=17, load_share=1.5),
    _budget("C", n_layer=3, n_embd=96, seq=56, batch=24, memory_mib=28, load_share=3.5),
    _budget("D", n_layer=2, n_embd=112, seq=56, batch=20, memory_mib=15, load_share=2.5),
    _budget("E", n_layer=3, n_embd=112, seq=64, batch=12, memory_mib=19, load_share=4.5),
    _budget("F", n_layer=2, n_embd=96, seq=48, batch=24, memory_mib=13, load_share=1.5),
    _budget("G", n_layer=3, n_embd=128, seq=40, batch=20, memory_mib=25, load_share=3.5),
)
CANONICAL = BUDGETS[0]


def budget_named(name: str) -> Budget:
    """The budget called ``name``; KeyError for any other name (a forged file's, say)."""
    for budget in BUDGETS:
        if budget.name == name:
            return budget
    raise KeyError(f"no budget named {name!r}")


CHAPTER = "12_capstone"


def mine(folder: str = ".") -> Budget:
    """Your budget. In a graded release with per-student numbers (``variants.json`` beside the
    notebook), the one drawn for your student id, as the quizzes' numbers are
    (gpulab.course.variants); anywhere else, or when no id is known, the chapter's own. In
    ``make autograde`` the id is the name of the submission's folder, as grading draws it
    (the kernel runs in autograded/<student>/<chapter>/), so that code computing answers from
    ``budget`` computes them for the student's own budget there too."""
    import json
    import os
    from pathlib import Path

    from gpulab.course import variants

    path = Path(folder) / variants.VARIANTS_FILE
    try:
        data = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        data = {}
    values = data.get("params", {}).get("budget") if isinstance(data, dict) else None
    if data.get("chapter") != CHAPTER or not isinstance(values, list) or not values:
        return CANONICAL
    if os.environ.get("NBGRADER_EXECUTION") == "autograde":
        student = Path(folder).resolve().parent.name
    else:
        student = variants.student_id()
    if student is None:
        print(f"No student id known: using the chapter's own budget {CANONICAL.name}.")
        return CANONICAL
    params = {"budget": variants.Param(values[0], tuple(values))}
    drawn = variants.draw(params, str(data.get("seed", "")), student, CHAPTER)["budget"]
    return budget_named(drawn["name"])
