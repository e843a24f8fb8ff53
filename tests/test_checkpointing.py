"""Chapter 05, checked: checkpointing in segments of k blocks and gradient accumulation trade
compute for memory as ``gpulab.arith`` predicts, and accumulation gives the full batch's
gradient exactly when (and only when) every micro-batch's loss averages over as many items.

What is monotone and what is not. Without checkpointing the peak sits at the start of backward
(every activation saved). With segments of k blocks, forward keeps ⌈L/k⌉ segment inputs and
backward holds one segment's k blocks, recomputed: about (L/k)·S + k·A, with S a block's input
and A its activations (16-34 times S). So the peak is NOT monotone in k: k = L recomputes
everything and then holds it all (only the loss and head peaks go), and the best k is
√(L·S/A), which is 1 for the course GPT (the peak rises k = 1 < 2 < ... < L < none) and 2 only
for a deep, narrow model (64 blocks of width 32 below). Chen et al.'s √L assumes A ≈ S.
"""

import dataclasses

import pytest
import torch

from gpulab.checkpointing import accumulation as acc
from gpulab.arith import (MiB, accumulation_steps, best_segment_size, global_batch,
                          gpt_step_flops_per_token, largest_micro_batch, predict_training_memory,
                          recompute_flops_per_token, segment_size, sqrt_segment_size,
                          training_flops, training_flops_with_checkpointing)
from gpulab.measure import step_seconds, training_step_peak
from gpulab.models import GPT, GPTConfig
from memory_cases import TOLERANCE, case_id, config, relative_error


_measured = {}


def measured(cfg, batch, seq_len, dtype, opt, ckpt, micro_batches=1, fake=False):
    """training_step_peak, each configuration measured once per test session."""
    key = (dataclasses.astuple(cfg), batch, seq_len, dtype, opt, ckpt, micro_batches, fake)
    if key not in _measured:
        _measured[key] = training_step_peak(cfg, batch, seq_len, dtype, opt, ckpt, fake=fake,
                                            micro_batches=micro_batches)
    return _measured[key]


# ------------------------------------------------------------------------------------------
# Checkpointing in segments of k blocks: predicted vs measured

COURSE = (GPTConfig(), 8, 128, torch.float32, "adamw")     # 4 layers, n_embd 256

CASES = [  # (config, batch, seq_len, dtype, optimizer, checkpointing)
    *[(*COURSE, k) for k in (False, 1, 2, 3, 4)],           # none, every block, √L, one segment
    (config(n_layer=4), 4, 64, torch.bfloat16, "adamw", 2),
    (config(n_layer=4), 4, 64, torch.bfloat16, "sgd", 4),
    (config(n_layer=5), 2, 128, torch.float32, "adamw", 2),  # a top segment of 1 block
    (config(n_layer=8, vocab_size=256), 4, 64, torch.float32, "adamw_fused", 3),  # 3, 3, 2
    (config(n_layer=9, vocab_size=256, n_head=8), 2, 128, torch.float32, "sgd", 3),  # √9
    (config(n_layer=16), 1, 128, torch.float32, "sgd", 4),   # √16
    (config(n_layer=5, vocab_size=256, n_head=8), 2, 128, torch.float32, "sgd", 5),
]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_every_k_prediction_matches_measured_step_within_2_percent(case):
    predicted = predict_training_memory(*case)
    result = measured(*case)
    where = max(predicted["phases"], key=predicted["phases"].get)
    assert relative_error(predicted["peak"], result.peak) <= TOLERANCE, (
        f"predicted {predicted['peak'] / MiB:.3f} MiB (at {where}), "
        f"measured {result.peak / MiB:.3f} MiB: {result}")
    # forward keeps ⌈L/k⌉ segment inputs (plus the head's activations)
    assert relative_error(predicted["activations"], result.highest["activations"]) <= TOLERANCE


def test_checkpointing_true_is_segments_of_one_block():
    assert predict_training_memory(*COURSE, True) == predict_training_memory(*COURSE, 1)
    every, one = measured(*COURSE, True), measured(*COURSE, 1)
    assert every.peak == one.peak and every.breakdown == one.breakdown


def test_sqrt_segment_size():
    assert [sqrt_segment_size(L) for L in (1, 2, 4, 9, 12, 16, 32)] == [1, 1, 2, 3, 3, 4, 6]
    with pytest.raises(ValueError):
        sqrt_segment_size(0)


def test_segment_size_is_checked():
    assert segment_size(False, 4) is None and segment_size(True, 4) == 1
    assert segment_size(3, 4) == 3
    for bad in (0, -1, 5, 1.5, "every"):
        with pytest.raises(ValueError, match="checkpointing"):
            GPT(config(n_layer=4), device="meta", checkpointing=bad)


def test_peak_falls_from_no_checkpointing_to_one_segment_to_every_block():
    # The course GPT: every measured peak in order, as predicted; k = √L = 2 is not the best.
    order = [False, 4, 3, 2, 1]
    peaks = [measured(*COURSE, k).peak for k in order]
    assert peaks == sorted(peaks, reverse=True), [f"{p / MiB:.2f}" for p in peaks]
    predicted = [predict_training_memory(*COURSE, k)["peak"] for k in order]
    assert predicted == sorted(predicted, reverse=True)
    assert best_segment_size(*COURSE) == 1


def test_a_deep_narrow_model_is_smallest_with_segments_of_two():
    # 64 blocks of width 32: a kept input costs so little against a block's activations that
    # keeping half as many pays for holding two blocks. (n_embd 32 is below the 2% regime:
    # the 512-byte rounding of its many tiny tensors adds about 1%.)
    deep = GPTConfig(vocab_size=32, block_size=64, n_layer=64, n_head=1, n_embd=32)
    shape = (deep, 64, 16, torch.float32, "sgd")
    assert best_segment_size(*shape) == 2
    one, two = training_step_peak(*shape, 1).peak, training_step_peak(*shape, 2).peak
    assert two < 0.9 * one


def test_checkpointing_does_not_change_the_gradients():
    torch.manual_seed(0)
    idx, targets = torch.randint(256, (4, 32)), torch.randint(256, (4, 32))
    grads = {}
    for k in (False, 1, 2):
        torch.manual_seed(0)
        model = GPT(dataclasses.replace(acc.SMALL_GPT, n_layer=4), checkpointing=k)
        grads[k] = acc.full_batch_gradients(model, idx, targets)
    torch.testing.assert_close(grads[1], grads[False])
    torch.testing.assert_close(grads[2], grads[False])


def test_recomputation_flops():
    assert training_flops_with_checkpointing(1e9, 0, 1e6) == 8e15
    ratio = training_flops_with_checkpointing(3e9, 1e9, 1.0) / training_flops(4e9, 1.0)
    assert ratio == pytest.approx((24 + 6) / 24)


def counted_flops_per_token(model, idx, targets, blocks=None):
    """FlopCounterMode's count of one forward and backward, per token. ``blocks(model, x)``
    replaces the model's own run through its blocks (the chapter's training-script lines)."""
    from torch.utils.flop_counter import FlopCounterMode

    def loss():
        if blocks is None:
            return model(idx, targets)[1]
        x = model.wte(idx) + model.wpe(torch.arange(idx.shape[1]))
        logits = model.lm_head(model.ln_f(blocks(model, x)))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())

    with FlopCounterMode(display=False) as counter:
        loss().backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops() / idx.numel()


TINY = GPTConfig(vocab_size=64, block_size=16, n_layer=3, n_head=2, n_embd=32)


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_recomputation_flops_are_what_pytorch_runs(dropout):
    """Issue 29: PyTorch's non-reentrant checkpoint stops recomputing once backward has what it
    needs, so each segment's last matmul (the MLP's output projection) never runs again, and
    every block checkpointed costs (6 + 2·2/3)N, not 8N. FlopCounterMode counts it, for every
    segment size, and with early stop off or dropout on (its mask is saved last) the whole
    segment runs again."""
    from torch.utils.checkpoint import set_checkpoint_early_stop

    cfg = dataclasses.replace(TINY, dropout=dropout)
    torch.manual_seed(0)
    idx, targets = torch.randint(64, (2, 16)), torch.randint(64, (2, 16))
    for k in (False, True, 2, 3):
        model = GPT(cfg, checkpointing=k)
        assert counted_flops_per_token(model, idx, targets) == gpt_step_flops_per_token(cfg, 16, k)
    with set_checkpoint_early_stop(False):
        counted = counted_flops_per_token(GPT(cfg, checkpointing=True), idx, targets)
    assert counted == gpt_step_flops_per_token(cfg, 16, True, early_stop=False)
    full = gpt_step_flops_per_token(cfg, 16) + 3 * 2 * (24 * 32 * 32 + 4 * 16 * 32) / 2
    assert gpt_step_flops_per_token(cfg, 16, True, early_stop=False) == full  # a forward again


def test_the_course_gpts_recomputation_ratio():
    """The chapter's numbers: 21.98 M FLOPs per token, 26.70 M with every block checkpointed
    (1.215x; the textbook 8N/6N would be 1.33, and 28.8 M with the attention recomputed whole)."""
    course = GPTConfig()
    plain, every = (gpt_step_flops_per_token(course, 128, k) for k in (False, True))
    assert (plain, every) == (21_983_232, 26_701_824)
    assert every / plain == pytest.approx(1.2147, abs=1e-4)
    assert gpt_step_flops_per_token(course, 128, True, early_stop=False) == 28_798_976


def test_the_training_script_lines_recompute_what_the_formula_says():
    """checkpoint_sequential leaves its last segment unchecked; a policy that saves the Linear
    layers' outputs recomputes only the attention's two matmuls (chapter 05, section 4)."""
    from functools import partial

    from torch.utils.checkpoint import (CheckpointPolicy, checkpoint_sequential,
                                        create_selective_checkpoint_contexts)
    from torch.utils.checkpoint import checkpoint as torch_checkpoint

    def save_matmuls(ctx, op, *args, **kwargs):
        if op in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    def sequential(model, x):
        return checkpoint_sequential(model.blocks, 2, x, use_reentrant=False)

    def selective(model, x):
        context = partial(create_selective_checkpoint_contexts, save_matmuls)
        for block in model.blocks:
            x = torch_checkpoint(block, x, use_reentrant=False, context_fn=context)
        return x

    cfg = dataclasses.replace(TINY, n_layer=4)
    torch.manual_seed(0)
    model = GPT(cfg)
    idx, targets = torch.randint(64, (2, 16)), torch.randint(64, (2, 16))
    plain = gpt_step_flops_per_token(cfg, 16)
    assert counted_flops_per_token(model, idx, targets, sequential) == (
        plain + recompute_flops_per_token(cfg, 16, [2]))
    assert counted_flops_per_token(model, idx, targets, selective) == (
        plain + recompute_flops_per_token(cfg, 16, [1] * 4, attention_core_only=True))
    with pytest.raises(ValueError, match="n_layer"):
        recompute_flops_per_token(cfg, 16, [2, 3])


def test_step_seconds_runs():
    tiny = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)
    assert 0 < step_seconds(tiny, 2, 16, checkpointing=1, steps=1, device="cpu") < 10


# ------------------------------------------------------------------------------------------
# Gradient accumulation

def test_global_batch_and_accumulation_steps():
    assert global_batch(4, 8) == 32 and global_batch(4, 8, dp_ranks=2) == 64
    assert accumulation_steps(512, 8, dp_ranks=4) == 16 and accumulation_steps(32, 32) == 1
    assert global_batch(8, accumulation_steps(96, 8, 3), 3) == 96
    with pytest.raises(ValueError, match="not divisible"):
        accumulation_steps(100, 8)
    with pytest.raises(ValueError, match="not divisible"):
        accumulation_steps(64, 8, dp_ranks=3)
    with pytest.raises(ValueError, match="positive integer"):
        global_batch(0, 4)


@pytest.mark.parametrize("micro_batches", [2, 4, 8])
def test_accumulated_gradients_equal_the_full_batch(micro_batches):
    torch.manual_seed(0)
    model = GPT(acc.SMALL_GPT)
    idx, targets = torch.randint(256, (8, 32)), torch.randint(256, (8, 32))
    full = acc.full_batch_gradients(model, idx, targets)
    accumulated = acc.accumulated_gradients(model, idx, targets, micro_batches)
    assert all(p.grad is None for p in model.parameters())
    assert accumulated.keys() == dict(model.named_parameters()).keys()
    torch.testing.assert_close(accumulated, full)            # float32 tolerances
    with pytest.raises(ValueError, match="equal"):
        acc.accumulated_gradients(model, idx, targets, 3)


@pytest.mark.parametrize("micro_batches", [2, 4])
def test_the_measured_loss_factor_is_one_over_k(micro_batches):
    """Experiment 2 of chapter 05 reads the learner's factor: 1/k reproduces the full batch;
    no scaling (1) gives k times its gradient; the least-squares factor is 1/k."""
    right = acc.loss_factor_example(micro_batches=micro_batches)
    assert right["measured factor"] == pytest.approx(1 / micro_batches, rel=1e-5)
    assert right["max |difference|"] < 1e-6
    unscaled = acc.loss_factor_example(micro_batches=micro_batches, loss_factor=1.0)
    assert unscaled["max |difference|"] == pytest.approx(
        (micro_batches - 1) * unscaled["largest gradient"], rel=1e-3)


def test_uneven_token_counts_need_the_token_weighted_loss():
    out = acc.uneven_token_counts_example()
    assert out["valid tokens per micro-batch"] == [64, 8]
    assert out["equal"] < 1e-6
    assert out["uneven, mean of means"] > 0.1 * out["largest gradient"]
    assert out["uneven, token-weighted"] < 1e-6
    assert out["loss, mean of means"] != pytest.approx(out["loss, all tokens"], abs=1e-3)
    # the fix, checked with float32 tolerances against the full batch
    torch.manual_seed(0)
    model = GPT(acc.SMALL_GPT)
    idx, targets = acc.padded_batch(acc.SMALL_GPT, [32, 20, 7, 1], 32, seed=1)
    torch.testing.assert_close(acc.token_weighted_gradients(model, idx, targets, 4),
                               acc.full_batch_gradients(model, idx, targets))


def test_batchnorm_breaks_accumulation_and_layernorm_does_not():
    batch = acc.batchnorm_example(norm="batch")
    layer = acc.batchnorm_example(norm="layer")
    assert batch["max |difference|"] > 0.01 * batch["largest gradient"]
    assert layer["max |difference|"] < 1e-5


ACCUMULATION = [  # (config, micro-batch, seq_len, dtype, optimizer, checkpointing, micro_batches)
    (GPTConfig(), 4, 128, torch.float32, "adamw", False, 2),
    (config(n_layer=4), 2, 64, torch.float32, "sgd", 2, 4),
    (config(vocab_size=256, n_head=8), 2, 128, torch.bfloat16, "adamw", True, 2),
]


@pytest.mark.parametrize("case", ACCUMULATION, ids=lambda c: f"L{c[0].n_layer}-m{c[-1]}-k{c[5]}")
def test_accumulation_prediction_matches_measured_step(case):
    cfg, micro, s, dtype, opt, ckpt, m = case
    predicted = predict_training_memory(cfg, micro, s, dtype, opt, ckpt, accumulating=True)
    result = measured(cfg, micro * m, s, dtype, opt, ckpt, micro_batches=m)
    assert relative_error(predicted["peak"], result.peak) <= TOLERANCE, result
    # the gradients stay alive between micro-batches: more than a plain step of the micro-batch
    plain = predict_training_memory(cfg, micro, s, dtype, opt, ckpt)["peak"]
    assert predicted["peak"] > plain


@pytest.mark.parametrize("ckpt, accumulating", [(False, False), (2, False), (1, True)])
def test_largest_micro_batch_fits_and_one_more_does_not(ckpt, accumulating):
    cfg, s, dtype, opt = config(n_layer=4), 64, torch.float32, "adamw"

    def peak(b):
        return predict_training_memory(cfg, b, s, dtype, opt, ckpt, accumulating)["peak"]

    budget = (peak(6) + peak(7)) / 2
    assert largest_micro_batch(budget, cfg, s, dtype, opt, ckpt, accumulating) == 6
    m = 2 if accumulating else 1                             # measure two micro-batches
    fits = measured(cfg, 6 * m, s, dtype, opt, ckpt, micro_batches=m)
    too_big = measured(cfg, 7 * m, s, dtype, opt, ckpt, micro_batches=m)
    assert fits.peak <= budget < too_big.peak
    assert largest_micro_batch(peak(1) - 1, cfg, s, dtype, opt, ckpt, accumulating) == 0
    assert largest_micro_batch(peak(1), cfg, s, dtype, opt, ckpt, accumulating) == 1


def test_the_chapters_loop_is_the_code_that_runs_and_quiz_11_differs_in_line_8():
    """Chapter 05, section 4 (issue 27): the loop the chapter prints is, line for line, the body
    of ddp_accumulation.accumulate that its experiment and chapter 06's torchrun script run; and
    the code-reading quiz's loop differs from it in line 8 only, the line its key names."""
    import inspect
    import json
    import re
    from pathlib import Path

    from gpulab.checkpointing import ddp_accumulation

    path = Path(__file__).resolve().parent.parent / "solutions" / "05_checkpointing_accumulation"
    cells = {c["id"]: "".join(c["source"])
             for c in json.loads((path / "05_checkpointing_accumulation.ipynb").read_text())["cells"]}

    def block(cell_id):
        return re.search(r"```python\n(.*?)```", cells[cell_id], re.S).group(1).splitlines()

    right, quiz = block("ch05-md-script-accum"), block("ch05-md-quiz-loop")
    body = [line.strip() for line in inspect.getsource(ddp_accumulation.accumulate).splitlines()
            if not line.endswith("# for the log")]         # what chapter 06's script logs
    assert [line.strip() for line in right[:-2]] == body[body.index(right[0].strip()):][:len(right) - 2]
    assert right[-2:] == ["optimizer.step()", "optimizer.zero_grad(set_to_none=True)"]
    code = [re.sub(r"^ ?\d+ {2}", "", line) for line in quiz]        # drop the line numbers
    differ = [n for n, (a, b) in enumerate(zip(code, right), 1)
              if a.split("#")[0].rstrip() != b.split("#")[0].rstrip()]
    assert len(code) == len(right) and differ == [8]


def test_the_plain_loop_the_chapter_prints_runs_and_clips_the_global_batchs_gradient():
    """Chapter 05, section 4 (issue 35): the one-GPU loop the chapter prints (the loss over k,
    clip_grad_norm_ once at the boundary) is, line for line, accumulation.train_step; run on 4
    micro-batches it clips the same norm as one step on the whole batch and leaves the same
    weights, which clipping each micro-batch would not."""
    import inspect
    import json
    import re
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "solutions" / "05_checkpointing_accumulation"
    cells = {c["id"]: "".join(c["source"])
             for c in json.loads((path / "05_checkpointing_accumulation.ipynb").read_text())["cells"]}
    printed = re.search(r"```python\n(k = len.*?)```", cells["ch05-md-script-read"], re.S).group(1)
    body = inspect.getsource(acc.train_step).splitlines()
    start = next(i for i, line in enumerate(body) if line.strip().startswith("k = len"))
    assert [line.strip() for line in printed.splitlines()] == [
        line.strip() for line in body[start:start + len(printed.splitlines())]]
    out = acc.clipping_at_the_boundary_example(micro_batches=4)
    assert out["norm, accumulated"] == pytest.approx(out["norm, whole batch"], rel=1e-5)
    assert out["norm, whole batch"] > 0.1             # above max_norm: clipping did act
    assert out["max |weight difference|"] < 1e-6
