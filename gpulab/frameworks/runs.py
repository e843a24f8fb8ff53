"""One short training run of the course GPT through Hugging Face Accelerate, PyTorch Lightning
and the HF Trainer, on CPU ranks that talk over gloo (chapter 09, Experiments 1 and 2).

Each tool is launched the way its users launch it from a notebook: Accelerate's
``notebook_launcher`` and Lightning's ``strategy="ddp_notebook"`` fork the ranks from the kernel
(so nothing is imported twice), and the HF Trainer, which runs on Accelerate, goes through
``notebook_launcher`` too. With ``ranks=1`` each runs in this process. The ranks are always CPU
processes: two of them fit on any machine, one GPU or none, and the bookkeeping measured here
(global batch, optimizer steps, tokens per step, bytes of model state) is the same on a GPU.

Every run returns a ``Report``: what the tool itself says (its own attribute names and log
lines, in ``reported``), and what rank 0 measured at each optimizer step (tokens from all ranks,
the weight of the step's mean gradient, bytes of weights, gradients and optimizer state;
``gpulab.frameworks.tiny_run.StepLog``). The code each rank runs is ``accelerate_rank``,
``LitCourseGPT`` with ``run_lightning``, and ``trainer_rank``: the chapter prints it.

Two harmless logs are switched off where they start, with each library's own switch: DeepSpeed's
"Setting accelerator to CPU" warning (``DS_ACCELERATOR=cpu``, set only where DeepSpeed would
fall back to the CPU anyway) and Lightning's "Initializing distributed: GLOBAL_RANK ..." banner
(the ``lightning_fabric`` logger, at WARNING during a run).
"""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import logging
import os
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")            # nothing here downloads
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import torch                                             # noqa: E402

# DeepSpeed picks CUDA when torch sees a GPU and otherwise warns, on import, that it falls back
# to the CPU (deepspeed/accelerator/real_accelerator.py). Naming the CPU, only in that case,
# is its documented override: the same choice, without the warning.
if not (torch.cuda.device_count() > 0 and torch.cuda.is_available()):
    os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed  # noqa: E402,F401  the HF Trainer imports it when installed: once here, not in each forked rank
import pytorch_lightning as pl                           # noqa: E402
from accelerate import Accelerator, notebook_launcher    # noqa: E402
from accelerate.state import AcceleratorState           # noqa: E402
from pytorch_lightning.utilities.model_summary import ModelSummary  # noqa: E402
from torch.utils.data import DataLoader                  # noqa: E402
from transformers import Trainer, TrainerCallback, TrainingArguments  # noqa: E402

from gpulab.frameworks.tiny_run import CourseGPT, StepLog, TokenDataset  # noqa: E402
from gpulab.parallel.dist import free_port               # noqa: E402

TOOLS = ("Accelerate", "Lightning", "HF Trainer")
# One precision, three spellings (chapter 09, section 3).
ACCELERATE_PRECISION = {"32": "no", "bf16-mixed": "bf16"}
LIGHTNING_PRECISION = {"32": "32-true", "bf16-mixed": "bf16-mixed", "bf16-true": "bf16-true"}


@dataclass(frozen=True)
class Settings:
    """The knobs of a run, named once; each tool gets them under its own names."""

    dataset_size: int = 40
    micro_batch: int = 4
    accumulation: int = 2
    ranks: int = 2
    precision: str = "bf16-mixed"        # "32", "bf16-mixed" or (Lightning only) "bf16-true"
    num_workers: int = 0                 # DataLoader worker processes per rank
    lr: float = 1e-3


@dataclass
class Report:
    tool: str
    settings: Settings
    reported: dict                       # the tool's own figures, under the tool's own names
    global_batch: int                    # as the tool states it, or computes from its attributes
    optimizer_steps: int
    tokens_per_step: list[int]           # measured: tokens of all ranks between optimizer steps
    gradient_weights: list[float]        # measured: the weight of each step's mean gradient (1.0 = the mean)
    state_bytes: dict[str, int]          # measured on rank 0: params, grads, optimizer
    weights_dtype: str
    compute_dtypes: list[str]
    output: str = field(default="", repr=False)     # what the run printed


def code_markdown() -> str:
    """The code each tool's ranks run in the chapter's experiments, as Markdown (a fenced code
    block per function, under a line saying what it is): the chapter prints it before it runs."""
    shown = [("Accelerate: your loop", accelerate_rank),
             ("Lightning: a LightningModule, and the Trainer that runs it", LitCourseGPT),
             ("", run_lightning),
             ("HF Trainer: TrainingArguments and a Trainer", trainer_rank)]
    return "\n\n".join((f"**{title}** (`runs.{code.__name__}`)\n\n" if title else "")
                       + f"```python\n{inspect.getsource(code)}```" for title, code in shown)


def run(tool: str, settings: Settings = Settings()) -> Report:
    """``settings`` through one tool; its report."""
    runner = {"Accelerate": run_accelerate, "Lightning": run_lightning, "HF Trainer": run_hf_trainer}
    return runner[tool](settings)


# ---------------------------------------------------------------------------------------------
# Accelerate: your loop, its Accelerator


def accelerate_rank(settings: Settings, out: str) -> None:
    accelerator = Accelerator(cpu=True, mixed_precision=ACCELERATE_PRECISION[settings.precision],
                              gradient_accumulation_steps=settings.accumulation)
    model = CourseGPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr)
    loader = DataLoader(TokenDataset(settings.dataset_size), batch_size=settings.micro_batch,
                        shuffle=True, num_workers=settings.num_workers)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    inner, log = accelerator.unwrap_model(model), StepLog()
    for batch in loader:
        with accelerator.accumulate(model):        # no_sync and the step only every k batches
            loss = model(**batch)["loss"]
            accelerator.backward(loss)             # divides the loss by gradient_accumulation_steps
            optimizer.step()                       # a no-op until the k-th micro-batch
            if accelerator.sync_gradients:
                log.optimizer_stepped(inner, optimizer)
            optimizer.zero_grad()
    if accelerator.is_main_process:
        reported = {"accelerator.num_processes": accelerator.num_processes,
                    "accelerator.distributed_type": str(accelerator.distributed_type),
                    "accelerator.mixed_precision": accelerator.mixed_precision,
                    "accelerator.gradient_accumulation_steps": accelerator.gradient_accumulation_steps,
                    "loader.total_batch_size": loader.total_batch_size, "len(loader)": len(loader)}
        _save(out, reported, loader.total_batch_size * accelerator.gradient_accumulation_steps,
              log.report(inner))


def run_accelerate(settings: Settings = Settings()) -> Report:
    with _workspace() as out, _captured() as printed:
        _forget_accelerate_state()                 # the launcher refuses a kernel that made one
        notebook_launcher(accelerate_rank, args=(settings, out), num_processes=settings.ranks,
                          use_port=str(free_port()))
        _forget_accelerate_state()
        return _load("Accelerate", settings, out, printed)


# ---------------------------------------------------------------------------------------------
# Lightning: a LightningModule, its Trainer


class LitCourseGPT(pl.LightningModule):
    """The course GPT as a LightningModule; rank 0 writes the report when training ends."""

    def __init__(self, settings: Settings, out: str):
        super().__init__()
        self.model, self.settings, self.out, self.log_ = CourseGPT(), settings, out, StepLog()

    def train_dataloader(self):
        return DataLoader(TokenDataset(self.settings.dataset_size), batch_size=self.settings.micro_batch,
                          shuffle=True, num_workers=self.settings.num_workers)

    def training_step(self, batch, batch_idx):
        return self.model(**batch)["loss"]         # Lightning divides it by accumulate_grad_batches

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.settings.lr)

    def on_before_optimizer_step(self, optimizer):
        self.log_.optimizer_stepped(self.model, optimizer)

    def on_train_end(self):
        trainer = self.trainer
        if trainer.is_global_zero:
            reported = {"trainer.world_size": trainer.world_size, "trainer.global_step": trainer.global_step,
                        "trainer.num_training_batches": trainer.num_training_batches,
                        "trainer.accumulate_grad_batches": trainer.accumulate_grad_batches,
                        "trainer.precision": trainer.precision,
                        "summary: Total estimated model params size (MB)": round(ModelSummary(self).model_size, 3)}
            batch = trainer.world_size * trainer.accumulate_grad_batches * self.settings.micro_batch
            _save(self.out, reported, batch, self.log_.report(self.model))


def run_lightning(settings: Settings = Settings()) -> Report:
    with _workspace() as out, _captured() as printed:
        trainer = pl.Trainer(accelerator="cpu", devices=settings.ranks,
                             strategy="ddp_notebook" if settings.ranks > 1 else "auto",
                             precision=LIGHTNING_PRECISION[settings.precision],
                             accumulate_grad_batches=settings.accumulation, max_epochs=1,
                             logger=False, enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, default_root_dir=out)
        trainer.fit(LitCourseGPT(settings, out))
        return _load("Lightning", settings, out, printed)


# ---------------------------------------------------------------------------------------------
# The HF Trainer: TrainingArguments, a model whose forward returns the loss


class _LogSteps(TrainerCallback):
    def __init__(self):
        self.log = StepLog()

    def on_optimizer_step(self, args, state, control, model=None, optimizer=None, **kwargs):
        self.log.optimizer_stepped(model, optimizer)   # after optimizer.step(), before zero_grad


def trainer_rank(settings: Settings, out: str) -> None:
    lines, logger = _LogLines(), logging.getLogger("transformers.trainer")
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    logger.propagate = False                   # to our handler only, not transformers' console
    args = TrainingArguments(
        output_dir=out, per_device_train_batch_size=settings.micro_batch,
        gradient_accumulation_steps=settings.accumulation, num_train_epochs=1,
        bf16=settings.precision == "bf16-mixed", learning_rate=settings.lr,
        dataloader_num_workers=settings.num_workers, use_cpu=True,
        ddp_backend="gloo" if settings.ranks > 1 else None, ddp_find_unused_parameters=False,
        report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True)
    callback, model = _LogSteps(), CourseGPT()
    trainer = Trainer(model=model, args=args, train_dataset=TokenDataset(settings.dataset_size),
                      callbacks=[callback])
    result = trainer.train()
    if trainer.is_world_process_zero():
        reported = {"args.world_size": args.world_size, "TrainOutput.global_step": result.global_step,
                    "log": [line for line in lines.lines if line.startswith("  ")]}
        _save(out, reported, trainer.get_total_train_batch_size(args), callback.log.report(model))


def run_hf_trainer(settings: Settings = Settings()) -> Report:
    with _workspace() as out, _captured() as printed:
        _forget_accelerate_state()
        notebook_launcher(trainer_rank, args=(settings, out), num_processes=settings.ranks,
                          use_port=str(free_port()))
        _forget_accelerate_state()
        return _load("HF Trainer", settings, out, printed)


class _LogLines(logging.Handler):
    """The lines the Trainer logs at the start of training ("Total train batch size ...")."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


# ---------------------------------------------------------------------------------------------
# Plumbing: where rank 0 leaves its report, what the run printed


def _save(out: str, reported: dict, global_batch: int, measured: dict) -> None:
    Path(out, "report.json").write_text(json.dumps({"reported": reported, "global_batch": global_batch,
                                                    **measured}))


def _load(tool: str, settings: Settings, out: str, printed: io.StringIO) -> Report:
    data = json.loads(Path(out, "report.json").read_text())
    return Report(tool=tool, settings=settings, output=printed.getvalue(), **data)


@contextlib.contextmanager
def _workspace():
    with tempfile.TemporaryDirectory(prefix="gpulab-ch09-") as out:
        yield out


@contextlib.contextmanager
def _captured():
    """The run's chatter (banners, summaries, tips) into ``Report.output``, not the notebook."""
    printed = io.StringIO()
    # "GPU available: False" and tips (pytorch_lightning); each rank's "Initializing distributed:
    # GLOBAL_RANK: 0, MEMBER: 1/2" (lightning_fabric, whose own handler writes to stderr). The
    # forked ranks inherit these levels.
    loggers = [logging.getLogger(name) for name in ("pytorch_lightning", "lightning_fabric")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield printed
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _forget_accelerate_state() -> None:
    """Accelerate keeps one state per process; a run in this process (ranks=1) leaves it set,
    and notebook_launcher then refuses to fork. Accelerate's own tests reset it the same way."""
    AcceleratorState._reset_state(reset_partial_state=True)
