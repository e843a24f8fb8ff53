"""Answer key for chapter 09, the same knobs in the tools you use. Instructor side: never released.

Every expected value is computed by gpulab's tested functions (gpulab.frameworks.knobs and
zero_memory, gpulab.arith) from the numbers the questions state; each mistake is the value a
typical slip produces, with the words the learner sees. No framework is imported here.
"""
from gpulab.arith import global_batch
from gpulab.course.checks import Item, Mistake
from gpulab.course.variants import Param, canonical
from gpulab.frameworks import knobs, zero_memory

GB, GiB = 1e9, 2**30
SUMMARY_PRECISION = "bf16-true"                 # Quiz 6
LIGHTNING_DEVICES, LIGHTNING_MICRO, LIGHTNING_ACCUM = 4, 8, 4     # Quiz 3


def model(n: int, name: str) -> dict:
    """Quiz 6: a published model and its parameter count (Hugging Face's num_parameters())."""
    return {"n": n, "name": name}


def count(n: float, text: str) -> dict:
    return {"n": n, "text": text}


PARAMS = {
    "micro": Param(8, (4, 8, 16)),                                        # Quizzes 1-2
    "accum": Param(4, (2, 4, 8)),
    "gpus": Param(8, (8, 16, 32)),
    "seq": Param(2048, (1024, 2048, 4096)),                               # Quiz 2
    "dataset": Param(10_000, (7_000, 10_000, 25_000, 30_000)),            # Quiz 3: never divisible
    "ds_batch": Param(1024, (512, 1024, 2048)),                           # Quiz 4: powers of two
    "ds_micro": Param(4, (2, 4, 8)),
    "ds_gpus": Param(32, (16, 32, 64)),
    "gpt2": Param(model(124_439_808, "GPT-2 (124M)"), (                   # Quiz 6
        model(124_439_808, "GPT-2 (124M)"), model(354_823_168, "GPT-2 medium (355M)"),
        model(774_030_080, "GPT-2 large (774M)"), model(1_557_611_200, "GPT-2 XL (1.5B)"))),
    "zero_model": Param(count(7e9, "7 × 10⁹"), (count(7e9, "7 × 10⁹"), count(13e9, "13 × 10⁹"),  # 8-9
                                                count(34e9, "34 × 10⁹"), count(70e9, "70 × 10⁹"))),
    "zero_gpus": Param(8, (8, 16, 32, 64)),
    "workers": Param(6, (4, 6, 12)),                                      # Quiz 10
    "worker_gpus": Param(8, (4, 8)),
}
QUESTIONS = {
    "ch09-md-q-total": "### Quiz 1: the Trainer's total train batch size\n\nA script launched with "
                       "`torchrun --nproc_per_node {gpus} train.py` builds\n`TrainingArguments("
                       "per_device_train_batch_size={micro}, gradient_accumulation_steps={accum})`. What "
                       "number does the\nTrainer log as \"Total train batch size (w. parallel, distributed "
                       "& accumulation)\"?",
    "ch09-md-q-tokens": "### Quiz 2: tokens per optimizer step\n\nThe same run trains on sequences of "
                        "{seq} tokens. How many **tokens** does one optimizer step learn\nfrom?",
    "ch09-md-q-steps": "### Quiz 3: Lightning's global_step after one epoch\n\nA dataset of {dataset:,} "
                       "sequences, `DataLoader(batch_size=8)`, `Trainer(devices=4,\nstrategy=\"ddp\", "
                       "accumulate_grad_batches=4, max_epochs=1)`. What is `trainer.global_step` (the\n"
                       "number of optimizer steps) when the epoch ends?",
    "ch09-md-q-ds": "### Quiz 4: the accumulation DeepSpeed derives\n\nA DeepSpeed config says "
                    "`\"train_batch_size\": {ds_batch}` and `\"train_micro_batch_size_per_gpu\": {ds_micro}`"
                    ",\nand nothing about accumulation. The job runs on {ds_gpus} GPUs. What "
                    "`gradient_accumulation_steps` does\nDeepSpeed set?",
    "ch09-md-q-summary": "### Quiz 6: what Lightning's summary prints\n\n{gpt2[name]} has {gpt2[n]:,} "
                         "parameters. Trained with `Trainer(precision=\"bf16-true\")`, what does\n"
                         "Lightning's model summary print as \"Total estimated model params size (MB)\"?",
    "ch09-md-q-paper": "### Quiz 8: ZeRO-2 by the paper\n\nA model of Ψ = {zero_model[text]} parameters "
                       "trains with mixed-precision Adam under ZeRO stage 2 (`\"stage\": 2` in\n`zero_optimization`) on "
                       "{zero_gpus} GPUs. By the ZeRO paper's formula, how many **GB** (10⁹ bytes) of model "
                       "state does each\nGPU hold?",
    "ch09-md-q-estimator": "### Quiz 9: what DeepSpeed's estimator prints\n\nFor the same model and "
                           "GPUs, what number does DeepSpeed's\n`estimate_zero2_model_states_mem_needs_all_cold` "
                           "print in its \"per GPU\" column for `offload_optimizer=none`\n(its formula and its "
                           "unit are above)?",
    "ch09-md-q-workers": "### Quiz 10: DataLoader workers on the machine\n\n`torchrun --nproc_per_node "
                         "{worker_gpus} train.py` with `TrainingArguments(dataloader_num_workers={workers})`."
                         "\nHow many DataLoader **worker processes** run on the machine while it trains?",
}
FIXED = {
    "09-more-gpus": "a choice of four outcomes of one fixed pair of configs, a fact about the tools",
    "09-mixed-weights": "a choice of four dtypes, a fact about mixed precision; Experiment 2 measures it",
    "09-wrong-line": "a code-reading choice of four lines in one fixed loop",
}


def distinct(item: Item) -> Item:
    """``item`` without the slips that give the right value or repeat an earlier slip's value
    (e.g. accumulation and GPUs both 8): each remaining one has its own diagnosis."""
    kept, seen = [], {item.value}
    for mistake in item.mistakes:
        if mistake.value not in seen:
            kept.append(mistake)
            seen.add(mistake.value)
    return Item(item.id, item.value, item.unit, item.rel_tol, item.abs_tol, tuple(kept), item.choices)


def items(p: dict) -> list[Item]:
    """The key for the numbers ``p`` (canonical: the chapter's own)."""
    micro, accum, gpus, seq = p["micro"], p["accum"], p["gpus"], p["seq"]
    total = global_batch(micro, accum, gpus)
    N = p["dataset"]
    steps = knobs.optimizer_steps_per_epoch(N, LIGHTNING_MICRO, LIGHTNING_ACCUM, LIGHTNING_DEVICES)
    batches = knobs.batches_per_rank(N, LIGHTNING_MICRO, LIGHTNING_DEVICES)
    per_step = LIGHTNING_DEVICES * LIGHTNING_MICRO * LIGHTNING_ACCUM
    ds_batch, ds_micro, ds_gpus = p["ds_batch"], p["ds_micro"], p["ds_gpus"]
    ds_accum = knobs.deepspeed_batch(ds_gpus, ds_batch, ds_micro)["gradient_accumulation_steps"]
    n_gpt2 = p["gpt2"]["n"]
    summary = knobs.lightning_summary_mb(n_gpt2, SUMMARY_PRECISION)
    psi, zero_gpus = p["zero_model"]["n"], p["zero_gpus"]
    paper = zero_memory.paper_gpu_bytes(psi, zero_gpus, 2)
    deepspeed = zero_memory.deepspeed_gpu_bytes(int(psi), zero_gpus, 2)
    workers, worker_gpus = p["workers"], p["worker_gpus"]

    step_slips = [Mistake(v, says) for v, says in (
        (N // per_step, "rounded down: the last, incomplete group of micro-batches still ends in an "
                        "optimizer step (Lightning steps at the end of the epoch)."),
        (N / per_step, "steps are whole numbers: each rank rounds its batches up, then the "
                       "accumulation groups up."),
        (batches, "that is the micro-batches per rank (trainer.num_training_batches); the optimizer "
                  f"steps once every {LIGHTNING_ACCUM} of them."),
        (knobs.optimizer_steps_per_epoch(N, LIGHTNING_MICRO, LIGHTNING_ACCUM), "each of the 4 devices "
         "gets a quarter of the dataset (DistributedSampler): divide by the devices too."),
    )]
    return [distinct(item) for item in [
        Item("09-total-train-batch", total, "sequences", mistakes=(
            Mistake(micro * accum, f"that is one GPU's share; {gpus} processes each run their own "
                                   "micro-batches: multiply by the world size too."),
            Mistake(micro * gpus, f"multiply by the {accum} accumulation steps too: each optimizer step "
                                  f"sums {accum} micro-batches per GPU."),
            Mistake(micro, "that is the instantaneous batch per device; the total counts every GPU and "
                           "every accumulated micro-batch."),
        )),
        Item("09-tokens-per-step", knobs.tokens_per_step(micro, accum, gpus, seq), "tokens", mistakes=(
            Mistake(total, f"that is sequences; each has {seq} tokens."),
            Mistake(micro * accum * seq, f"that is one GPU's tokens; all {gpus} GPUs' gradients are "
                                         "averaged into each step."),
            Mistake(micro * gpus * seq, f"that is one micro-batch per GPU; a step accumulates {accum}."),
        )),
        Item("09-lightning-steps", steps, "steps", mistakes=tuple(step_slips)),
        Item("09-ds-accumulation", ds_accum, "steps", mistakes=(
            Mistake(ds_batch // ds_micro, f"DeepSpeed divides by the {ds_gpus} GPUs too: "
                    "train_batch_size = micro-batch x accumulation x world size."),
            Mistake(ds_batch // ds_gpus, "that is the samples per GPU per step; divide by the "
                                         "micro-batch as well."),
            Mistake(ds_batch, "train_batch_size is the global batch; accumulation is how many "
                              "micro-batches make it on each GPU."),
        )),
        Item("09-more-gpus", "trainer_doubles", "",
             choices=("both_double", "trainer_doubles", "deepspeed_doubles", "neither"), mistakes=(
            Mistake("both_double", "DeepSpeed keeps train_batch_size = 256 as written and derives the "
                    "accumulation again: 256 // 8 // 16 = 2."),
            Mistake("deepspeed_doubles", "the other way round: the Trainer multiplies its per-device "
                    "batch and accumulation by the world size, DeepSpeed divides its fixed "
                    "train_batch_size by it."),
            Mistake("neither", "the Trainer's total is per_device x accumulation x world size: 16 "
                    "GPUs make it 512."),
        )),
        Item("09-summary-mb", summary, "MB", rel_tol=0.005, mistakes=(
            Mistake(knobs.lightning_summary_mb(n_gpt2, "32-true"), "that counts 4 bytes per parameter; "
                    "with \"bf16-true\" the weights are bf16, 2 bytes, and the summary counts 16 bits."),
            Mistake(summary * 1e6 / 2**20, "Lightning's MB are decimal (10⁶ bytes), not MiB."),
            Mistake(n_gpt2 * 8 / 1e6, "the summary counts the weights only, not gradients and "
                                      "Adam's moments (8 bytes per parameter in bf16)."),
            Mistake(n_gpt2 * 16 / 8, "bits to bytes: 16 bits are 2 bytes; then 10⁶ bytes per MB."),
        )),
        Item("09-mixed-weights", "float32", "", choices=("float32", "bfloat16", "float16", "int8"),
             mistakes=(
            Mistake("bfloat16", "that is \"bf16-true\". \"-mixed\" keeps the weights (and so the "
                    "optimizer's update) in fp32 and runs the matmuls in bf16 under autocast."),
            Mistake("float16", "nothing here is fp16; \"-mixed\" keeps the weights in fp32."),
            Mistake("int8", "int8 is a quantisation format, not a training precision here."),
        )),
        Item("09-paper-zero2-gb", paper / GB, "GB", rel_tol=0.005, mistakes=(
            Mistake(zero_memory.paper_gpu_bytes(psi, zero_gpus, 1) / GB, "that is stage 1 (only Adam's "
                    "12 bytes sharded); stage 2 shards the 2-byte gradients too: 2Ψ + 14Ψ/N."),
            Mistake(zero_memory.paper_gpu_bytes(psi, zero_gpus, 3) / GB, "that is stage 3; stage 2 "
                    "keeps every 16-bit weight on every GPU: 2Ψ + 14Ψ/N."),
            Mistake(16 * psi / GB, "that is plain data parallelism, 16 bytes per parameter on every GPU; "
                                   "stage 2 shards gradients and optimizer state."),
            Mistake(paper / GiB, "that is GiB; the question asks for decimal GB."),
        )),
        Item("09-ds-estimate-gib", deepspeed / GiB, "GiB", rel_tol=0.005, mistakes=(
            Mistake(deepspeed / GB, "DeepSpeed divides by 2³⁰ and prints \"GB\": its GB are GiB."),
            Mistake(paper / GiB, "that is the paper's 2Ψ + 14Ψ/N; DeepSpeed's estimator shards 18 bytes "
                                 "per parameter (it counts an fp32 copy of the gradients too)."),
            Mistake(18 * psi / zero_gpus / GiB, "the estimator adds the 2Ψ of 16-bit weights every GPU "
                                                "keeps in stage 2."),
        )),
        Item("09-loader-workers", workers * worker_gpus, "processes", mistakes=(
            Mistake(workers, f"each of the {worker_gpus} training processes starts its own "
                             f"{workers} workers."),
            Mistake(workers * worker_gpus + worker_gpus, "that counts the training processes "
                    "themselves too; the question asks for the DataLoader workers."),
            Mistake(workers + worker_gpus, "workers are per training process: multiply."),
        )),
        Item("09-wrong-line", "c", "", choices=("a", "b", "c", "d"), mistakes=(
            Mistake("a", "line A is how Accelerate is told about accumulation and bf16; it is right."),
            Mistake("b", "prepare is needed: it wraps the model in DDP, shards the loader and makes "
                         "optimizer.step() skip the accumulating micro-batches."),
            Mistake("d", "accelerator.backward(loss) is the right call (it scales for fp16 and "
                         "divides by the accumulation steps). Look at what the line above does to "
                         "the loss first."),
        )),
    ]]


ITEMS = items(canonical(PARAMS))
