"""Chapter 09 (gpulab.frameworks): the bookkeeping against the tools themselves, the knobs table
against the installed versions, DeepSpeed's estimator restated against DeepSpeed, and the key
against figures worked by hand."""
import dataclasses
import json
import inspect
import math
from pathlib import Path

import pytest
import torch
from torch.utils.data import DistributedSampler

from gpulab.course.checks import load_key_module
from gpulab.frameworks import knobs, zero_memory

ROOT = Path(__file__).resolve().parent.parent


BOOKKEEPING_CASES = [(40, 2, 4, 2), (42, 2, 4, 2), (50, 2, 4, 2), (10_000, 4, 8, 4), (7, 3, 2, 5), (64, 1, 8, 8),
                     (13, 4, 3, 2)]


def _steps_of(batch_sizes: list[int], k: int) -> list[int]:
    """Samples per optimizer step of a loop that steps every k micro-batches and at the end."""
    return [sum(batch_sizes[i:i + k]) for i in range(0, len(batch_sizes), k)]


@pytest.mark.parametrize("n, ranks, micro, k", BOOKKEEPING_CASES)
def test_bookkeeping_behind_a_distributed_sampler_is_torchs(n, ranks, micro, k):
    """Lightning's (and plain PyTorch's) rounding, against torch's DistributedSampler and a loop that
    steps every k micro-batches and at the end of the epoch; ceil(N / (b k R)) steps."""
    per_rank = [list(DistributedSampler(range(n), num_replicas=ranks, rank=r, shuffle=False)) for r in range(ranks)]
    assert {len(s) for s in per_rank} == {knobs.samples_per_rank(n, ranks)}
    batches = [len(chunk) for chunk in torch.arange(len(per_rank[0])).split(micro)]
    steps = [ranks * s for s in _steps_of(batches, k)]
    assert knobs.samples_per_step(n, micro, k, ranks) == steps
    assert knobs.batches_per_rank(n, micro, ranks) == len(batches) == math.ceil(n / (micro * ranks))
    assert knobs.optimizer_steps_per_epoch(n, micro, k, ranks) == len(steps) == math.ceil(n / (micro * k * ranks))


@pytest.mark.parametrize("n, ranks, micro, k", BOOKKEEPING_CASES)
def test_even_batches_are_accelerates_batch_sampler_shard(n, ranks, micro, k):
    """Accelerate's (and the HF Trainer's) rounding, against accelerate's BatchSamplerShard itself
    (even_batches=True, its default): whole batches dealt round the ranks, the last filled from
    the start of the epoch, so every micro-batch is full on more than one rank."""
    from accelerate.data_loader import BatchSamplerShard
    from torch.utils.data import BatchSampler, SequentialSampler

    sampler = BatchSampler(SequentialSampler(range(n)), micro, drop_last=False)
    shards = [[len(b) for b in BatchSamplerShard(sampler, num_processes=ranks, process_index=r)]
              for r in range(ranks)] if ranks > 1 else [[len(b) for b in sampler]]
    assert all(shard == shards[0] for shard in shards)
    assert knobs.samples_per_step(n, micro, k, ranks, even_batches=True) == [ranks * s for s in _steps_of(shards[0], k)]
    assert len(shards[0]) == knobs.batches_per_rank(n, micro, ranks)


def test_gradient_weights_of_the_last_shorter_group():
    # 50 samples, b 4, R 2: 7 micro-batches per rank, k 2: the fourth step has one micro-batch.
    assert knobs.gradient_weights(50, 4, 2, 2) == [1.0, 1.0, 1.0, 0.5]
    assert knobs.gradient_weights(50, 4, 2, 2, divide_by_window=True) == [1.0] * 4
    assert knobs.gradient_weights(48, 4, 3, 2) == [1.0, 1.0]          # 6 micro-batches, k 3: no short group


def test_deepspeed_batch_triple_is_deepspeeds():
    """Our restatement against DeepSpeedConfig itself (one process: world size 1)."""
    from deepspeed.runtime.config import DeepSpeedConfig

    for given in ({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4},
                  {"train_batch_size": 64, "gradient_accumulation_steps": 8},
                  {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}):
        config = DeepSpeedConfig(dict(given))
        ours = knobs.deepspeed_batch(1, given.get("train_batch_size"), given.get("train_micro_batch_size_per_gpu"),
                                     given.get("gradient_accumulation_steps"))
        assert ours == {"train_batch_size": config.train_batch_size,
                        "train_micro_batch_size_per_gpu": config.train_micro_batch_size_per_gpu,
                        "gradient_accumulation_steps": config.gradient_accumulation_steps}
    assert knobs.deepspeed_batch(32, 1024, 4)["gradient_accumulation_steps"] == 8
    with pytest.raises(ValueError, match="refuses"):
        knobs.deepspeed_batch(3, 1024, 4, 8)


@pytest.mark.parametrize("stage, psi, gpus", [(2, 7_000_000_000, 8), (2, 134_912, 2), (3, 13_000_000_000, 64),
                                              (3, 45_000_000, 8)])
def test_deepspeed_estimate_restated_is_deepspeeds(stage, psi, gpus):
    largest = 131_072_000 if stage == 3 else 0
    assert zero_memory.deepspeed_gpu_bytes(psi, gpus, stage, largest) == \
        zero_memory.deepspeed_estimate(stage, psi, gpus, largest)


def test_largest_layer_is_deepspeeds_count():
    from deepspeed.runtime.zero.stage3 import model_to_params

    from gpulab.models import GPT
    from gpulab.frameworks.tiny_run import TINY_GPT
    model = GPT(TINY_GPT)
    assert model_to_params(model) == (model.num_params(), zero_memory.largest_layer_params(model))


def test_paper_formula_is_the_zero_papers_figure_1():
    # Rajbhandari et al. 2020, Figure 1: Ψ = 7.5B, N = 64: 31.4 GB (stage 1), 16.6 (2), 1.9 (3).
    assert [round(zero_memory.paper_gpu_bytes(7.5e9, 64, s) / 1e9, 1) for s in (1, 2, 3)] == [31.4, 16.6, 1.9]


def test_every_knob_named_is_an_argument_of_the_installed_tools():
    import accelerate
    import pytorch_lightning as pl
    from accelerate.utils import DeepSpeedPlugin, FullyShardedDataParallelPlugin
    from deepspeed.runtime import constants
    from deepspeed.runtime.engine import DeepSpeedEngine
    from pytorch_lightning.strategies import FSDPStrategy, StrategyRegistry
    from transformers import TrainingArguments

    trainer_args = {f.name for f in dataclasses.fields(TrainingArguments)}
    assert {"per_device_train_batch_size", "gradient_accumulation_steps", "bf16", "fp16",
            "gradient_checkpointing", "fsdp", "deepspeed", "dataloader_num_workers", "dataloader_pin_memory",
            "dataloader_prefetch_factor", "dataloader_drop_last", "torch_compile", "torch_compile_backend",
            "torch_compile_mode", "max_grad_norm", "use_cpu", "ddp_backend", "lr_scheduler_type"} <= trainer_args
    assert {"precision", "accumulate_grad_batches", "strategy", "devices", "gradient_clip_val"} <= \
        set(inspect.signature(pl.Trainer).parameters)
    assert {"mixed_precision", "gradient_accumulation_steps", "cpu", "fsdp_plugin", "deepspeed_plugin",
            "dynamo_backend"} <= set(inspect.signature(accelerate.Accelerator).parameters)
    assert {"fsdp_version", "reshard_after_forward", "activation_checkpointing", "cpu_offload"} <= \
        {f.name for f in dataclasses.fields(FullyShardedDataParallelPlugin)}
    assert "zero_stage" in {f.name for f in dataclasses.fields(DeepSpeedPlugin)}
    assert {"sharding_strategy", "activation_checkpointing_policy", "cpu_offload"} <= \
        set(inspect.signature(FSDPStrategy).parameters)
    assert {"ddp", "ddp_notebook", "fsdp", "deepspeed_stage_1", "deepspeed_stage_2", "deepspeed_stage_3"} <= \
        set(StrategyRegistry.available_strategies())
    assert {constants.TRAIN_BATCH_SIZE, constants.TRAIN_MICRO_BATCH_SIZE_PER_GPU,
            constants.GRADIENT_ACCUMULATION_STEPS, constants.GRADIENT_CLIPPING} == \
        {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping"}
    assert (constants.TORCH_AUTOCAST, constants.TORCH_AUTOCAST_DTYPE) == ("torch_autocast", "dtype")
    assert callable(DeepSpeedEngine.compile)
    assert len(knobs.KNOBS) >= 10 and knobs.knobs_markdown().count("\n") == len(knobs.KNOBS) + 1


@pytest.fixture(scope="module")
def one_rank_reports():
    from gpulab.frameworks import runs
    settings = {"Lightning": "bf16-true", "Accelerate": "bf16-mixed", "HF Trainer": "bf16-mixed"}
    return {tool: runs.run(tool, runs.Settings(dataset_size=10, micro_batch=2, accumulation=2, ranks=1,
                                               precision=precision))
            for tool, precision in settings.items()}


def test_each_tool_reports_what_the_bookkeeping_predicts(one_rank_reports):
    """One rank in this process (two ranks run in the chapter): 5 micro-batches of 2, 3 steps,
    the last on one micro-batch; 16 bytes per parameter mixed, 8 bf16-true."""
    from gpulab.frameworks.tiny_run import TINY_GPT
    from gpulab.models import GPT
    n = GPT.count_params(TINY_GPT)
    for tool, report in one_rank_reports.items():
        assert report.optimizer_steps == knobs.optimizer_steps_per_epoch(10, 2, 2) == 3, tool
        assert report.tokens_per_step == [128, 128, 64], tool
        # Accelerate and Lightning divide the last, lone micro-batch's loss by k = 2; the Trainer by 1
        assert report.gradient_weights == knobs.gradient_weights(10, 2, 2, divide_by_window=tool == "HF Trainer"), tool
        assert report.gradient_weights[-1] == (1.0 if tool == "HF Trainer" else 0.5), tool
        assert report.global_batch == 4, tool
        per_param = sum(report.state_bytes.values()) / n
        assert per_param == pytest.approx(8 if tool == "Lightning" else 16, rel=0.001), tool
        assert report.compute_dtypes == ["bfloat16"], tool
    lightning = one_rank_reports["Lightning"].reported
    assert lightning["summary: Total estimated model params size (MB)"] == \
        pytest.approx(knobs.lightning_summary_mb(n, "bf16-true"), abs=0.001)
    assert "Total train batch size (w. parallel, distributed & accumulation) = 4" in \
        "\n".join(one_rank_reports["HF Trainer"].reported["log"])


def test_key_against_worked_figures():
    value = {i: item.value for i, item in load_key_module(ROOT / "autograder" / "keys" / "09_frameworks.py").items()}
    assert value["09-total-train-batch"] == 8 * 4 * 8 == 256
    assert value["09-tokens-per-step"] == 256 * 2048
    assert value["09-lightning-steps"] == 79                 # 2,500 per device, 313 batches, ceil(313 / 4)
    assert value["09-ds-accumulation"] == 8                  # 1024 // 4 // 32
    assert value["09-summary-mb"] == pytest.approx(248.88, abs=0.01)      # 124,439,808 x 2 B / 1e6
    assert value["09-paper-zero2-gb"] == pytest.approx(26.25)            # 14 + 98 / 8 GB
    assert value["09-ds-estimate-gib"] == pytest.approx(29.75e9 / 2**30)  # (14 + 126 / 8) GB in GiB
    assert value["09-loader-workers"] == 48
    assert (value["09-more-gpus"], value["09-mixed-weights"], value["09-wrong-line"]) == \
        ("trainer_doubles", "float32", "c")


def test_the_trainer_passes_a_token_normalised_model_the_tokens_of_the_whole_step():
    """Chapter 09's "In your training script": a model whose forward takes ``num_items_in_batch``
    gets, in every micro-batch, the label tokens of the whole optimizer step (7 samples of 32
    tokens, micro-batch 2, k 2: micro-batches of 2, 2 | 2, 1 samples), and the Trainer then does not
    divide its loss by k."""
    from transformers import Trainer, TrainingArguments

    from gpulab.frameworks import runs
    from gpulab.frameworks.tiny_run import TokenDataset, TokenMeanGPT

    model = TokenMeanGPT()
    runs._forget_accelerate_state()
    try:
        with runs._workspace() as out, runs._captured():
            args = TrainingArguments(output_dir=out, per_device_train_batch_size=2, gradient_accumulation_steps=2,
                                     num_train_epochs=1, use_cpu=True, report_to="none", save_strategy="no",
                                     logging_strategy="no", disable_tqdm=True)
            Trainer(model=model, args=args, train_dataset=TokenDataset(7)).train()
    finally:
        runs._forget_accelerate_state()
    assert model.items_seen == [(64, 128), (64, 128), (64, 96), (32, 96)]    # (this micro-batch, the step)
    assert model.loss_weight == pytest.approx(4.0)                           # 1 per micro-batch: no 1/k


def test_accelerate_backward_divides_by_the_accumulation_steps():
    """Quiz 11's premise, read from Accelerate itself."""
    from accelerate import Accelerator
    source = inspect.getsource(Accelerator.backward)
    assert "loss = loss / self.gradient_accumulation_steps" in source
    assert torch.__version__   # (torch imported for the sampler above)


def test_the_trainer_fills_deepspeed_auto_values_and_refuses_a_mismatch():
    """Chapter 09's "In your training script": "auto" in a DeepSpeed config takes the value from
    TrainingArguments (no DeepSpeed engine starts), and a number that disagrees stops the Trainer."""
    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    config = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
              "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "bf16": {"enabled": "auto"},
              "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                        "weight_decay": "auto"}},
              "zero_optimization": {"stage": 2}}
    args = TrainingArguments(output_dir="unused", per_device_train_batch_size=8, gradient_accumulation_steps=4,
                             learning_rate=3e-4, weight_decay=0.1, bf16=True, max_grad_norm=1.0, use_cpu=True,
                             report_to="none")
    filled = HfTrainerDeepSpeedConfig(json.loads(json.dumps(config)))
    filled.trainer_config_process(args)
    assert (filled.config["train_batch_size"], filled.config["train_micro_batch_size_per_gpu"],
            filled.config["gradient_accumulation_steps"]) == (32, 8, 4)            # 8 x 4 x world size 1
    assert filled.config["optimizer"]["params"]["lr"] == 3e-4 and filled.config["bf16"]["enabled"] is True
    mismatch = HfTrainerDeepSpeedConfig(dict(json.loads(json.dumps(config)), gradient_accumulation_steps=8))
    mismatch.trainer_config_process(args)
    with pytest.raises(ValueError, match="mismatch TrainingArguments"):
        mismatch.trainer_config_finalize(args, None, 100)
