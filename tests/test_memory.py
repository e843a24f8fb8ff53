"""Chapter 02's promise, checked: predict a training step's memory from the config alone
(``gpulab.arith.predict_training_memory``) and measure it (``gpulab.measure``), within 2%.

The prediction never calls the tracker: it is arithmetic on the config. The tracker is checked
on its own first, on cases small enough to count by hand. Configurations have n_embd >= 128:
below that the CUDA allocator's 512-byte rounding of tiny tensors (biases, LayerNorm weights),
which the tracker mimics and the prediction leaves out, reaches a few percent.
"""

import pytest
import torch

from gpulab.arith import MiB, activation_bytes_per_layer, predict_training_memory
from gpulab.measure import peak_memory, training_step_peak
from gpulab.measure.memory import make_optimizer, train_step
from gpulab.models import GPT, GPTConfig
from memory_cases import TOLERANCE, case_id, config, relative_error

ROUNDING_SLACK = 8 * 512  # a component may be off by a few 512-byte roundings of tiny tensors


def close(predicted: float, measured: float) -> bool:
    """Within 2%, or (for components of a few KiB) within a few allocator roundings."""
    return (relative_error(predicted, measured) <= TOLERANCE
            or abs(predicted - measured) <= ROUNDING_SLACK)


# ------------------------------------------------------------------------------------------
# Parameter count

@pytest.mark.parametrize("cfg", [GPTConfig(), config(n_layer=3, n_embd=384, n_head=6),
                                 config(vocab_size=50257, block_size=1024, n_layer=1)])
def test_parameter_formula_matches_the_model(cfg):
    model = GPT(cfg, device="meta")                      # meta: shapes only, nothing allocated
    counted = sum(p.numel() for p in model.parameters())
    assert GPT.count_params(cfg) == model.num_params() == counted
    for dtype in (torch.float32, torch.bfloat16):
        predicted = predict_training_memory(cfg, 1, 8, dtype, "sgd")["params"]
        assert predicted == counted * dtype.itemsize


def test_reference_model_has_3_70_m_parameters_and_a_7b_config_6_71_b():
    # measuring-memory.md: vocab 1000, hidden 256, 4 layers -> 3.70 M parameters, 14.13 MiB fp32
    assert GPT(GPTConfig(), device="meta").num_params() == 3_704_320
    # 32 x (12 x 4096^2 + 13 x 4096) + 2 x 32000 x 4096 + 2048 x 4096 + 2 x 4096, by hand
    big = GPTConfig(vocab_size=32000, block_size=2048, n_layer=32, n_head=32, n_embd=4096)
    assert GPT(big, device="meta").num_params() == 6_714_695_680


# ------------------------------------------------------------------------------------------
# The tracker on cases counted by hand

def test_matmul_forward_and_backward_counts_each_storage_once():
    x = torch.randn(1024, 1024, requires_grad=True)      # 4 MiB each
    w = torch.randn(1024, 1024, requires_grad=True)

    def step():
        y = x @ w                                        # + 4 MiB
        y.backward(torch.ones_like(y))                   # + 4 MiB seed, + 4 + 4 MiB grads

    result = peak_memory(step, inputs=(x, w))
    assert result.peak == 24 * MiB                       # x, w, y, seed, x.grad, w.grad
    assert result.end == 16 * MiB                        # y and the seed are gone again
    assert result.breakdown["inputs"] == 8 * MiB
    assert result.breakdown["activations"] == 0          # mm saved x and w, already counted


def test_views_and_in_place_ops_are_not_new_memory():
    def views():
        y = torch.zeros(256, 1024)                       # 1 MiB
        y.view(-1).add_(1)                               # a view, then in place
        y.t().mul_(2)[3:].clamp_(max=5)
        torch.relu_(y)
        return y.transpose(0, 1)

    assert peak_memory(views).peak == 1 * MiB

    earlier = torch.zeros(1024, 1024)                    # made before, not named as an input
    assert peak_memory(lambda: earlier.view(-1)[::2].add_(1)).peak == 0


def test_freed_tensors_are_subtracted_and_sizes_rounded_to_512_bytes():
    def churn():
        for _ in range(5):
            buffer = torch.empty(1 * MiB, dtype=torch.uint8)
            del buffer
        keep = [torch.empty(1) for _ in range(3)]        # 4 bytes each -> 512 each
        return len(keep)

    result = peak_memory(churn)
    assert result.peak == 1 * MiB
    assert result.end == 0
    assert peak_memory(lambda: torch.empty(3, 100)).peak == 1536   # 1200 bytes -> 1536


def test_breakdown_sorts_params_grads_state_and_activations():
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 512))
    opt = torch.optim.AdamW(model.parameters(), foreach=True)
    x = torch.randn(256, 512)

    def step():
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()                                               # creates Adam's state
    result = peak_memory(step, model=model, optimizer=opt, inputs=(x,))
    n_params = sum(p.numel() for p in model.parameters())
    assert result.breakdown["params"] == 4 * n_params == pytest.approx(4 * 1_050_112)
    assert result.highest["grads"] == 4 * n_params
    # m and v, plus one 4-byte step counter per tensor rounded to 512
    assert result.breakdown["optimizer"] == 8 * n_params + 4 * 512
    # saved: the ReLU's output (256 x 1024 fp32 = 1 MiB; ReLU saves its result, which fc2 also
    # saves as its input: counted once) and fc2's output for square (0.5 MiB); x is an input
    assert result.highest["activations"] == 1.5 * MiB
    assert result.end == result.breakdown["params"] + result.breakdown["optimizer"] + 512 * 1024


# ------------------------------------------------------------------------------------------
# Prediction vs measurement: one steady-state step of GPT, on this CPU

CASES = [  # (config, batch, seq_len, dtype, optimizer, checkpointing), by where the peak sits
    # start of backward: the logits' gradients on top of every activation
    (GPTConfig(), 8, 128, torch.float32, "adamw", False),
    (config(vocab_size=2048), 8, 64, torch.float32, "sgd", False),
    (config(vocab_size=2048), 8, 64, torch.bfloat16, "adamw", False),
    # optimizer step: small batches, AdamW foreach's temporary
    (config(), 1, 16, torch.float32, "adamw", False),
    (config(), 1, 16, torch.bfloat16, "adamw", True),
    (config(n_layer=4), 4, 64, torch.float32, "adamw", True),
    # end of backward: all gradients
    (config(), 1, 32, torch.float32, "sgd", False),
    (config(), 2, 32, torch.float32, "adamw_fused", False),
    # attention core of the top block (long sequences), or the bottom one with checkpointing
    (config(vocab_size=256, n_head=8), 2, 128, torch.float32, "sgd", False),
    (config(vocab_size=256, n_head=8, n_layer=3), 2, 128, torch.bfloat16, "adamw", False),
    (config(vocab_size=256, n_head=8, n_layer=3), 2, 128, torch.float32, "sgd", True),
    (config(vocab_size=256, n_head=8), 2, 128, torch.bfloat16, "adamw_fused", True),
    # QKV projection of the bottom block; MLP down-projection of the top block
    (config(vocab_size=256, n_embd=256, n_layer=3), 4, 32, torch.float32, "sgd", False),
    (config(vocab_size=256, n_embd=256, n_layer=3), 4, 32, torch.float32, "sgd", True),
    (config(vocab_size=256, n_embd=256, n_head=2), 8, 32, torch.bfloat16, "adamw_fused", False),
]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_prediction_matches_measured_step_within_2_percent(case):
    cfg, batch, seq_len, dtype, opt, ckpt = case
    predicted = predict_training_memory(cfg, batch, seq_len, dtype, opt, ckpt)
    measured = training_step_peak(cfg, batch, seq_len, dtype, opt, ckpt)
    where = max(predicted["phases"], key=predicted["phases"].get)
    msg = (f"predicted {predicted['peak'] / MiB:.3f} MiB (at {where}), "
           f"measured {measured.peak / MiB:.3f} MiB: {measured}")
    assert relative_error(predicted["peak"], measured.peak) <= TOLERANCE, msg
    # the components, each measured on its own
    assert close(predicted["params"], measured.breakdown["params"])
    assert close(predicted["grads"], measured.highest["grads"])
    assert close(predicted["activations"], measured.highest["activations"])
    if opt == "sgd":
        assert predicted["optimizer"] == measured.breakdown["optimizer"] == 0
    else:
        assert close(predicted["optimizer"], measured.breakdown["optimizer"])
    # after zero_grad only the model state and the batch are left
    state = sum(predicted[k] for k in ("params", "optimizer", "buffers", "inputs"))
    assert close(state, measured.end)


def test_first_adam_step_peaks_lower_than_later_ones():
    # Adam's m and v are created inside the first step(), after backward, so the first step's
    # backward runs without them (measuring-memory.md: 100.00 vs 128.26 MiB).
    cfg = config(vocab_size=2048)
    torch.manual_seed(0)
    model = GPT(cfg)
    opt = make_optimizer(model, "adamw")
    idx, targets = torch.randint(2048, (8, 64)), torch.randint(2048, (8, 64))
    first = peak_memory(lambda: train_step(model, opt, idx, targets), model=model,
                        optimizer=opt, inputs=(idx, targets))
    later = training_step_peak(cfg, 8, 64, torch.float32, "adamw")
    sgd = predict_training_memory(cfg, 8, 64, torch.float32, "sgd")["peak"]
    assert first.peak < later.peak
    assert relative_error(sgd, first.peak) <= TOLERANCE    # the first step peaks like SGD's


def test_checkpointing_keeps_only_block_inputs():
    cfg = config(n_layer=3)
    plain = training_step_peak(cfg, 4, 64, torch.float32, "sgd")
    ckpt = training_step_peak(cfg, 4, 64, torch.float32, "sgd", checkpointing=True)
    b, s, h, a = 4, 64, cfg.n_embd, cfg.n_head
    ln_stats = 4 * b * s * 4                                             # 2 LayerNorms x 2
    per_block = activation_bytes_per_layer(s, b, h, a, 4, dropout=False) + ln_stats
    kept = activation_bytes_per_layer(s, b, h, a, 4, "full")                             # the input
    saved = plain.highest["activations"] - ckpt.highest["activations"]
    assert saved == cfg.n_layer * (per_block - kept)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_saved_activations_per_block_follow_korthikanti_with_1_byte_dropout_masks(dtype):
    # One block more adds exactly activation_bytes_per_layer(...) + 2 LayerNorms' mean and 1/std.
    b, s, p = 4, 128, dtype.itemsize
    for dropout in (0.0, 0.1):
        saved = [training_step_peak(config(n_layer=n, dropout=dropout), b, s, dtype, "sgd")
                 .highest["activations"] for n in (1, 2)]
        expected = activation_bytes_per_layer(s, b, 128, 4, p, dropout=dropout > 0)
        assert saved[1] - saved[0] == expected + 4 * b * s * p


def test_one_block_saves_the_tensors_chapter_02_lists():
    """Chapter 02, "The course GPT's layer, counted" (issue 35): one fp32 block without dropout
    saves 8 tensors of s·b·h values and 2 of 4·s·b·h (16 in all, not 17: att @ v's output is
    not saved, its side-by-side copy is the output projection's input), the softmax's a·s²·b,
    and each LayerNorm's mean and 1/std (4 of b·s)."""
    b, s, h, a = 2, 16, 128, 4                       # sbh, 4sbh, as²b and bs all differ
    block = GPT(config(n_embd=h, n_head=a)).blocks[0]
    weights = {p.untyped_storage().data_ptr() for p in [*block.parameters(), *block.buffers()]}
    saved = {}
    def pack(t):
        if t.untyped_storage().data_ptr() not in weights:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes() // 4
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(torch.randn(b, s, h, requires_grad=True))
    sizes = sorted(saved.values())
    assert sizes == sorted([s * b * h] * 8 + [4 * s * b * h] * 2 + [a * s * s * b] + [b * s] * 4)
    assert 4 * sum(sizes) == 64 * s * b * h + 4 * a * s * s * b + 16 * b * s


def test_prediction_refuses_what_it_does_not_model():
    with pytest.raises(ValueError, match="dropout"):
        predict_training_memory(config(dropout=0.1), 1, 16, torch.float32, "sgd")
    with pytest.raises(ValueError, match="optimizer"):
        predict_training_memory(config(), 1, 16, torch.float32, "adam")


# ------------------------------------------------------------------------------------------
# Fake tensors: the same measurement without the memory

def test_fake_tensor_run_gives_the_real_run_bytes():
    cfg = config(vocab_size=256, n_head=8)
    for opt, ckpt in (("adamw", False), ("adamw_fused", True)):
        real = training_step_peak(cfg, 2, 128, torch.bfloat16, opt, ckpt)
        fake = training_step_peak(cfg, 2, 128, torch.bfloat16, opt, ckpt, fake=True)
        assert fake.peak == real.peak
        assert fake.breakdown == real.breakdown and fake.highest == real.highest


def test_fake_gpt2_small_step_matches_prediction():
    # GPT-2 small's shape (124 M parameters tied; 163 M here, untied), batch 4 x 512: about
    # 2.7 GiB in fp32, sized in a second or two without allocating it.
    gpt2 = GPTConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768)
    measured = training_step_peak(gpt2, 4, 512, torch.float32, "adamw", fake=True)
    predicted = predict_training_memory(gpt2, 4, 512, torch.float32, "adamw")
    assert relative_error(predicted["peak"], measured.peak) <= TOLERANCE


# ------------------------------------------------------------------------------------------
# On a GPU (skipped here): the allocator's count against the tracker's and the prediction

@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", CASES[:3] + CASES[8:12], ids=case_id)
def test_cuda_allocator_agrees_with_tracker_and_prediction(case):
    cfg, batch, seq_len, dtype, opt, ckpt = case
    measured = training_step_peak(cfg, batch, seq_len, dtype, opt, ckpt, device="cuda")
    predicted = predict_training_memory(cfg, batch, seq_len, dtype, opt, ckpt)
    assert relative_error(measured.tracked_peak, measured.peak) <= 0.01, measured
    assert relative_error(predicted["peak"], measured.peak) <= TOLERANCE, measured


# ------------------------------------------------------------------------------------------
# The CUDA allocator's block sizes (chapter 01, Experiment 1; issue 13, finding 6)

from gpulab.measure import memory  # noqa: E402
from gpulab.measure.memory import Allocation, allocation, cuda_block_bytes  # noqa: E402

BATCH = 64 * 3 * 224 * 224   # chapter 01's image batch, in elements


@pytest.mark.parametrize("bytes_per_element, block", [
    (8, 74 * MiB),              # 73.5 MiB in a 74 MiB segment: 0.5 MiB left, not split off
    (4, BATCH * 4),             # 36.75 MiB in a 38 MiB segment: 1.25 MiB left, split off
    (2, BATCH * 2),             # 18.375 MiB in a 20 MiB segment: 1.625 MiB left, split off
    (1, BATCH),                 # 9.19 MiB: a 20 MiB segment, split
])
def test_block_of_chapter_01s_batch_in_a_fresh_segment(bytes_per_element, block):
    assert cuda_block_bytes(BATCH * bytes_per_element) == block


def test_small_blocks_round_to_512_bytes_and_large_ones_keep_an_unsplittable_rest():
    assert cuda_block_bytes(4000) == 4096
    assert cuda_block_bytes(MiB) == MiB                        # small pool, exact
    assert cuda_block_bytes(9 * MiB + 1) == 9 * MiB + 512      # 20 MiB segment, split
    assert cuda_block_bytes(11 * MiB) == 12 * MiB              # 1 MiB left: not MORE than 1 MiB
    assert cuda_block_bytes(11 * MiB - 512) == 11 * MiB - 512  # 1 MiB + 512 left: split off


def test_on_a_cpu_the_allocation_is_the_storage_size_by_construction():
    a = allocation(lambda: torch.empty(1000, dtype=torch.float64), "cpu")
    assert a == Allocation(8000, 8000, "cpu")


class FakeCudaAllocator:
    """The two counters allocation() reads, for a tensor that gets a whole 74 MiB segment."""

    def __init__(self):
        self.stats = {}   # empty before the first allocation, as torch.cuda.memory_stats is

    def memory_stats(self, device):
        return dict(self.stats)

    def allocate(self, requested, block):
        self.stats = {"requested_bytes.all.current": requested,
                      "allocated_bytes.all.current": block}
        return object()


def test_on_cuda_requested_and_allocated_bytes_are_read_separately(monkeypatch):
    fake = FakeCudaAllocator()
    monkeypatch.setattr(memory.torch, "cuda", fake)
    got = allocation(lambda: fake.allocate(BATCH * 8, 74 * MiB), "cuda")
    assert (got.requested, got.allocated) == (BATCH * 8, 74 * MiB)


# ------------------------------------------------------------------------------------------
# Chapter 02 frees the model it measured (issue 13, finding 7)

def test_chapter_02_first_step_cell_frees_its_model():
    """`del model, optimizer` alone freed nothing while `resident` and `step` still held them:
    on a GPU that memory then showed in every later `memory_allocated()`."""
    import gc
    import weakref
    from pathlib import Path

    import nbformat

    from gpulab import measure
    from gpulab.course import predict

    path = Path(__file__).resolve().parents[1] / "solutions/02_vram_arithmetic/02_vram_arithmetic.ipynb"
    cell = next(c.source for c in nbformat.read(path, as_version=4).cells if c.id == "ch02-code-23")
    built = []

    class RecordedGPT(GPT):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(weakref.ref(self))

    namespace = dict(torch=torch, measure=measure, predict=predict, GPT=RecordedGPT, MiB=MiB,
                     config=config(n_layer=1), batch=2, seq=16, device=torch.device("cpu"),
                     first_step_gap_mib=...)
    exec(cell, namespace)
    gc.collect()
    assert len(built) == 1 and built[0]() is None, "the measured model is still alive"
