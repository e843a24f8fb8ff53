"""gpulab.precision: every format's limits against torch.finfo and the published figures,
rounding and stalled sums worked out by hand, the loss-scale rule against a real GradScaler,
and what autocast and loss scaling do to a tiny GPT (fast: one layer of width 32 on a CPU)."""
import ast
import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from gpulab import precision as P
from gpulab.models import GPT, GPTConfig

TINY = GPTConfig(vocab_size=256, block_size=32, n_layer=1, n_head=2, n_embd=32)


def with_dtype(name):
    """A format name as a parameter, skipped (visibly) where this torch lacks its dtype."""
    return pytest.param(name, marks=pytest.mark.skipif(
        P.FORMATS[name].dtype is None, reason=f"this torch has no {P.FORMATS[name].dtype_name}"))


TORCH_FORMATS = [with_dtype(name) for name, f in P.FORMATS.items() if f.dtype_name]


@pytest.fixture(scope="module")
def corpus():
    return P.text_corpus(20_000)


# ------------------------------------------------------------------------------------------
# Formats

@pytest.mark.parametrize("name", TORCH_FORMATS)
def test_format_limits_match_torch_finfo(name):
    """eps, smallest normal, largest finite and bit count are torch.finfo's, exactly; the
    smallest subnormal (finfo has none) is smallest_normal × eps."""
    f = P.number_format(name)
    info = torch.finfo(f.dtype)
    assert (f.eps, f.smallest_normal, f.max, f.bits) == (
        info.eps, info.smallest_normal, info.max, info.bits)
    assert f.smallest_subnormal == info.smallest_normal * info.eps


@pytest.mark.parametrize("name", TORCH_FORMATS)
def test_limits_survive_rounding_and_their_halves_do_not(name):
    """The limits are numbers of the format (they round to themselves), and the gaps are as
    claimed: half the smallest subnormal and 1 + eps/2 are ties that round to the even
    neighbour (0 and 1), three quarters of the smallest subnormal rounds up to it."""
    f = P.number_format(name)
    for value in (f.smallest_subnormal, f.smallest_normal, f.max, 1 + f.eps):
        assert P.round_to(value, name) == value
    assert P.round_to(f.smallest_subnormal / 2, name) == 0.0
    assert P.round_to(f.smallest_subnormal * 0.75, name) == f.smallest_subnormal
    assert P.round_to(1 + f.eps / 2, name) == 1.0


def test_tf32_is_fp32_range_with_fp16_precision():
    """TF32 has no torch dtype: fp32's 8-bit exponent (same smallest normal) and fp16's 10-bit
    mantissa (eps 2^-10), 19 bits in all."""
    tf32 = P.FORMATS["tf32"]
    assert tf32.dtype is None
    assert tf32.eps == 2.0 ** -10 == P.FORMATS["fp16"].eps
    assert tf32.smallest_normal == torch.finfo(torch.float32).smallest_normal
    assert tf32.bits == 19


def test_bit_counts():
    assert [f.bits for f in P.FORMATS.values()] == [32, 19, 16, 16, 8, 8]
    assert list(P.FORMATS) == ["fp32", "tf32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"]


def test_published_values():
    """Independent of torch: IEEE 754 half precision, bfloat16, and the OCP FP8 spec
    (Micikevicius et al. 2022, Table 1: E4M3 max 448, min normal 2^-6, min subnormal 2^-9;
    E5M2 max 57344, min normal 2^-14, min subnormal 2^-16)."""
    fp16, bf16, e4m3, e5m2 = (P.FORMATS[n] for n in ("fp16", "bf16", "fp8_e4m3", "fp8_e5m2"))
    assert fp16.max == 65504
    assert fp16.smallest_normal == 6.103515625e-05
    assert fp16.smallest_subnormal == 2.0 ** -24 == pytest.approx(5.96e-8, rel=1e-3)
    assert bf16.eps == 0.0078125
    assert bf16.max == pytest.approx(3.3895e38, rel=1e-4)
    assert (e4m3.max, e4m3.smallest_normal, e4m3.smallest_subnormal) == (448, 2**-6, 2**-9)
    assert (e5m2.max, e5m2.smallest_normal, e5m2.smallest_subnormal) == (57344, 2**-14, 2**-16)


@pytest.mark.parametrize("alias, name", [
    ("bf16", "bf16"), ("bfloat16", "bf16"), (torch.bfloat16, "bf16"),
    ("fp16", "fp16"), ("float16", "fp16"), (torch.float16, "fp16"),
    (torch.float32, "fp32"),   # fp32, never tf32 (which shares no dtype)
    ("tf32", "tf32"),
])
def test_number_format_accepts_names_and_dtypes(alias, name):
    assert P.number_format(alias) is P.FORMATS[name]


@pytest.mark.parametrize("bad", ["fp64", "bf 16", torch.int8, torch.float64])
def test_unknown_format_names_the_known_ones(bad):
    with pytest.raises(ValueError, match="known: fp32, tf32, fp16, bf16, fp8_e4m3, fp8_e5m2"):
        P.number_format(bad)


def test_round_to_agrees_with_torch_on_fp32_values():
    """For values exact in fp32 (where torch's conversion rounds once), round_to is torch's
    rounding, overflow included: inf for IEEE formats, saturation at ±448 for e4m3."""
    rng = torch.Generator().manual_seed(0)
    values = (torch.rand(3000, generator=rng) * 2 - 1) * 2.0 ** (torch.rand(3000, generator=rng) * 280 - 150)
    values = torch.cat([values.float(), torch.tensor([float("inf"), -float("inf"), 65519.0, 65520.0])])
    for name in ("fp16", "bf16", "fp8_e4m3", "fp8_e5m2"):
        dtype = P.number_format(name).dtype
        if dtype is None:
            continue
        expected = values.to(dtype).double().tolist()
        assert [P.round_to(v, name) for v in values.double().tolist()] == expected, name


@pytest.mark.parametrize("x, fmt, expected", [
    (1 + 2 ** -11 + 2 ** -40, "fp16", 1 + 2 ** -10),   # just above a tie: up (torch's float64
    (1 + 2 ** -8 + 2 ** -40, "bf16", 1 + 2 ** -7),     # conversion rounds to fp32 first and
    (1 + 2 ** -4 + 2 ** -40, "fp8_e4m3", 1.125),       # would give 1.0: a double rounding)
    (2.0 ** -134 * (1 + 2 ** -20), "bf16", 2.0 ** -133),
    (1 + 2 ** -11, "tf32", 1.0),                       # tf32 has fp16's 10 mantissa bits
    (1 + 3 * 2 ** -11, "tf32", 1 + 2 ** -9),
    (3e38, "tf32", round(3e38 / 2.0 ** 117) * 2.0 ** 117),  # and fp32's range: gap 2^(127 - 10)
])
def test_round_to_rounds_once(x, fmt, expected):
    assert P.round_to(x, fmt) == expected


@pytest.mark.parametrize("x, fmt, expected", [
    (2049, "fp16", 2048),        # gap 2 above 2048: a tie, to the even mantissa
    (2051, "fp16", 2052),        # also a tie; 2052 is the even one
    (2050, "fp16", 2050),
    (1 + 2 ** -8, "bf16", 1.0),  # half of bf16's eps at 1: a tie, to 1
    (1 + 2 ** -7, "bf16", 1 + 2 ** -7),
    (257, "bf16", 256),          # bf16 holds 8 significant bits: 256 + 1 is lost
    (0.1, "fp32", 0.10000000149011612),
])
def test_round_to(x, fmt, expected):
    assert P.round_to(x, fmt) == expected


# ------------------------------------------------------------------------------------------
# Running sums: a sum kept in the format stops once step < half the gap at the sum

def test_fp16_sum_of_2_to_minus_10_stops_at_exactly_2():
    """Below 2 the fp16 gap is 2^-10, the step itself: every addition is exact. At 2 the gap is
    2^-9, so 2 + 2^-10 is a tie and rounds back to 2 (even mantissa): 2048 additions reach 2
    and the other 952 are lost. In fp32 all 3000 are exact."""
    sums = P.running_sum(2.0 ** -10, 3000, "fp16")
    assert len(sums) == 3000
    assert sums[:2048] == [k * 2.0 ** -10 for k in range(1, 2049)]
    assert sums[2047:] == [2.0] * (3000 - 2047)
    assert P.running_sum(2.0 ** -10, 3000, "fp32") == [k * 2.0 ** -10 for k in range(1, 3001)]


@pytest.mark.parametrize("fmt, stall", [
    # step 1e-4 ≈ 2^-13.3: the sum stalls at the first power of two 2^k whose half gap
    # 2^(k - m - 1) exceeds it (m mantissa bits), and it gets there: just below 2^k the gap
    # is 2^(k - m - 1) itself, and 1e-4 lies between half of it and all of it, so each
    # addition moves the sum up by exactly one gap, onto 2^k.
    ("fp16", 2.0 ** -2),   # m = 10: 2^(k-11) > 1e-4  <=>  k >= -2: 0.25
    ("bf16", 2.0 ** -5),   # m = 7:  2^(k-8)  > 1e-4  <=>  k >= -5: 0.03125, 8x lower
])
def test_sum_of_1e_minus_4_stalls_at_a_power_of_two(fmt, stall):
    sums = P.running_sum(1e-4, 10_000, fmt)
    assert max(sums) == sums[-1] == stall
    assert sums.index(stall) < 5000          # reached well before the end, then stuck
    assert P.running_sum(1e-4, 10_000, "fp32")[-1] == pytest.approx(1.0, rel=1e-3)


def test_bf16_weight_never_takes_a_small_update():
    """The master-weights argument: a bf16 weight of 1 has gap 2^-7 above it, so an update of
    1e-3 (< 2^-8) is rounded away every time; an fp32 weight takes all 1000 of them."""
    assert P.running_sum(1e-3, 1000, "bf16", start=1.0) == [1.0] * 1000
    assert P.running_sum(1e-3, 1000, "fp32", start=1.0)[-1] == pytest.approx(2.0, rel=1e-4)


# ------------------------------------------------------------------------------------------
# Loss scaling: the rule against torch.amp.GradScaler

@pytest.mark.parametrize("seed, growth_factor, backoff_factor", [
    (0, 2.0, 0.5), (1, 2.0, 0.5), (2, 4.0, 0.25), (3, 2.0, 0.125),
])
def test_loss_scale_after_reproduces_grad_scaler(seed, growth_factor, backoff_factor):
    """A real GradScaler("cpu") on one parameter whose gradient is finite or inf per a random
    pattern (growth_interval 3, so growth happens often): after every step its scale and the
    number of steps whose optimizer step was skipped (parameter unchanged) are the rule's."""
    rule = dict(init_scale=2.0 ** 10, growth_factor=growth_factor,
                backoff_factor=backoff_factor, growth_interval=3)
    param = torch.nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.SGD([param], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", **rule)
    rng = random.Random(seed)
    pattern = [rng.random() < 0.3 for _ in range(40)]
    assert any(pattern) and not all(pattern)
    skipped, grew = 0, False
    for i, overflow in enumerate(pattern):
        optimizer.zero_grad()
        grad = torch.full((3,), float("inf") if overflow else 1.0)
        scaler.scale((param * grad).sum()).backward()
        before, scale_before = param.detach().clone(), scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        skipped += torch.equal(before, param.detach())
        grew |= scaler.get_scale() > scale_before
        assert (scaler.get_scale(), skipped) == P.loss_scale_after(pattern[:i + 1], **rule), i
    assert skipped == sum(pattern) and grew


def test_loss_scale_worked_example():
    """Defaults (2^16, x2 every 2000 clean steps, x0.5 per overflow): three overflows take the
    scale to 2^13, then 5000 clean steps double it twice: 2^15, three steps skipped."""
    assert P.loss_scale_after([True] * 3 + [False] * 5000) == (2.0 ** 15, 3)
    assert P.loss_scale_after([]) == (2.0 ** 16, 0)


# ------------------------------------------------------------------------------------------
# Autocast and saved tensors

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_output_dtypes_on_cpu(dtype):
    """On CPU, matmuls autocast to the low dtype whatever their input; cross_entropy is on the
    CPU float32 list (so float32 even from low-precision logits); softmax and friends run in
    their input's dtype. Every op of FLOAT32_OPS["cuda"] is measured."""
    low = str(dtype).removeprefix("torch.")
    result = P.autocast_output_dtypes("cpu", dtype)
    assert set(P.FLOAT32_OPS["cuda"]) <= set(result)
    assert result["linear"] == result["matmul"] == (low, low)
    assert result["cross_entropy"] == ("float32", "float32")
    assert result["softmax"] == result["layer_norm"] == ("float32", low)
    assert result["add fp32"] == ("float32", "float32")    # type promotion to the wider input


def test_saved_tensor_bytes_of_a_linear_layer():
    """nn.Linear(256, 1024) on (8, 128, 256) saves its input and its weight (for the weight's
    and the input's gradient; the bias needs nothing): exactly, by dtype. Under bf16 autocast
    it saves the bf16 copies instead, half the bytes."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(256, 1024)
    x = torch.randn(8, 128, 256, requires_grad=True)
    fp32 = P.saved_tensor_bytes(lambda: layer(x))
    assert fp32 == {"float32": 4 * (8 * 128 * 256) + 4 * (256 * 1024)}

    def autocast_forward():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return layer(x)
    bf16 = P.saved_tensor_bytes(autocast_forward)
    assert bf16 == {"bfloat16": 2 * (8 * 128 * 256) + 2 * (256 * 1024)}


def test_a_storage_saved_twice_counts_once():
    """x * x saves x twice; two views of one tensor save one storage: each counted once, at the
    storage's full size."""
    x = torch.randn(8, 128, requires_grad=True)
    assert P.saved_tensor_bytes(lambda: x * x) == {"float32": 4 * 8 * 128}
    assert P.saved_tensor_bytes(lambda: x[:4] * x[4:]) == {"float32": 4 * 8 * 128}
    assert P.saved_tensor_bytes(lambda: x + x) == {}      # addition saves nothing


# ------------------------------------------------------------------------------------------
# Data

def test_text_corpus_is_deterministic_bytes():
    data = P.text_corpus(10_000)
    assert data.shape == (10_000,) and data.dtype == torch.long
    assert 0 <= data.min() and data.max() < 256
    assert torch.equal(data, P.text_corpus(10_000))
    assert torch.equal(P.text_corpus(1_000), data[:1_000])   # a prefix of the same bytes


def test_sample_batch_targets_are_the_next_tokens():
    """On data = 0, 1, 2, ... every window is consecutive and its targets are the inputs + 1,
    i.e. the inputs shifted by one; the same generator seed gives the same batch."""
    data = torch.arange(100)
    idx, targets = P.sample_batch(data, 64, 8, torch.Generator().manual_seed(0), "cpu")
    assert idx.shape == targets.shape == (64, 8)
    assert torch.equal(targets, idx + 1)
    assert torch.equal(idx, idx[:, :1] + torch.arange(8))
    assert targets.max() < len(data)
    # every start is possible, the last one included (its last target is the last token)
    assert P.sample_batch(torch.arange(9), 1, 8, torch.Generator(), "cpu")[1].max() == 8
    again = P.sample_batch(data, 64, 8, torch.Generator().manual_seed(0), "cpu")
    assert torch.equal(again[0], idx) and torch.equal(again[1], targets)
    text = P.text_corpus(1_000)
    idx, targets = P.sample_batch(text, 4, 16, torch.Generator().manual_seed(1), "cpu")
    assert torch.equal(idx[:, 1:], targets[:, :-1])


# ------------------------------------------------------------------------------------------
# Training in each precision

def test_fp32_training_is_reproducible_and_learns(corpus):
    """Same seed, same losses, bit for bit; the loss falls (from ln 256 ≈ 5.5) over 30 steps;
    fp32 has no loss scale."""
    first = P.train(TINY, "fp32", 30, 8, 32, "cpu", data=corpus)
    second = P.train(TINY, "fp32", 30, 8, 32, "cpu", data=corpus)
    assert first.losses == second.losses and len(first.losses) == 30
    assert sum(first.losses[-5:]) / 5 < sum(first.losses[:5]) / 5 - 0.5
    assert first.scales == [] and first.skipped == 0
    assert P.train(TINY, "fp32", 30, 8, 32, "cpu", data=corpus, seed=1).losses != first.losses


@pytest.mark.parametrize("precision", P.PRECISIONS)
def test_every_precision_trains(precision, corpus):
    """Finite losses, one per step, near ln 256 at the start; only "fp16" has a scaler."""
    run = P.train(TINY, precision, 3, 4, 16, "cpu", data=corpus)
    assert run.precision == precision and len(run.losses) == 3
    assert all(abs(loss - 5.55) < 0.3 for loss in run.losses)
    assert len(run.scales) == (3 if precision == "fp16" else 0)


def test_fp16_loss_scale_backs_off_and_grows(corpus):
    """An initial scale of 2^24 overflows fp16 gradients at once: the scaler halves it (skipping
    the step) until the gradients fit, then, with growth_interval 2, doubles it after two clean
    steps. The recorded scales follow loss_scale_after on the overflows they imply."""
    run = P.train(TINY, "fp16", 20, 4, 16, "cpu", data=corpus, init_scale=2.0 ** 24,
                  growth_interval=2)
    assert run.scales[0] == 2.0 ** 23 and run.skipped > 1
    assert min(run.scales) < 2.0 ** 24
    assert any(b > a for a, b in zip(run.scales, run.scales[1:]))       # growth
    overflows = [b < a for a, b in zip([2.0 ** 24] + run.scales, run.scales)]
    assert (P.loss_scale_after(overflows, 2.0 ** 24, growth_interval=2)
            == (run.scales[-1], run.skipped))


def test_unknown_precision_is_refused(corpus):
    with pytest.raises(ValueError, match="precision must be one of"):
        P.train(TINY, "fp8", 1, 2, 8, "cpu", data=corpus)


# ------------------------------------------------------------------------------------------
# Gradient underflow at the logits, and loss scaling

def test_loss_scaling_rescues_underflowing_logit_gradients(corpus):
    """The logits' gradient is (softmax − one-hot)/N with N = 16·32 tokens. A head scaled ×20
    makes the softmax peaked, so many entries fall below 2^-25, half fp16's smallest subnormal:
    in fp16 they become exact zeros (every entry below 2^-26 is zero, and no entry above 2^-24
    is), while fp32 keeps them. Scaled by 2^16 they all fit: no zero at all, and the fp16
    gradient / 2^16 equals the fp32 one to within fp16 rounding (2^-11 relative, or half a
    subnormal gap) plus the forward pass's difference: logits off by δ move each p by at most
    about 2δ·p."""
    torch.manual_seed(0)
    model = GPT(TINY)
    with torch.no_grad():
        model.lm_head.weight.mul_(20)
    idx, targets = P.sample_batch(corpus, 16, 32, torch.Generator().manual_seed(0), "cpu")
    n = idx.numel()

    g16, g32 = P.logit_gradients(model, idx, targets)
    assert g16.dtype == torch.float16 and g32.dtype == torch.float32
    assert g16.shape == g32.shape == (16, 32, 256)
    tiny = (g32 != 0) & (g32.abs() < 2.0 ** -25)
    assert tiny.sum() > 1000                                   # the precondition
    assert (g16 == 0).sum() > (g32 == 0).sum()
    assert (g16[g32.abs() < 2.0 ** -26] == 0).all()
    assert (g16[g32.abs() > 2.0 ** -24] != 0).all()

    scale = 2.0 ** 16
    s16, s32 = P.logit_gradients(model, idx, targets, scale=scale)
    assert (s16 == 0).sum() == 0 and torch.isfinite(s16).all()
    torch.testing.assert_close(s32 / scale, g32, rtol=1e-6, atol=0)
    with torch.no_grad():
        logits32, _ = model(idx)
        with torch.autocast("cpu", dtype=torch.float16):
            logits16, _ = model(idx)
    delta = (logits16.float() - logits32).abs().max().item()
    assert delta < 0.02
    p_over_n = g32 + torch.nn.functional.one_hot(targets, 256) / n     # softmax / N ≥ 0
    bound = 2.0 ** -11 * g32.abs() + 2.5 * delta * p_over_n + 2.0 ** -25 / scale
    assert ((s16.float() / scale - g32).abs() <= bound).all()


def test_initial_logit_gradient_is_exact_with_uniform_probabilities(corpus):
    """With the head zeroed every logit is 0, so p = 1/V exactly and each wrong entry's gradient
    of the mean loss over b·s tokens is 1/(V·b·s): the formula, to fp32 rounding."""
    torch.manual_seed(0)
    model = GPT(TINY)
    with torch.no_grad():
        model.lm_head.weight.zero_()
    idx, targets = P.sample_batch(corpus, 4, 16, torch.Generator().manual_seed(0), "cpu")
    _, g32 = P.logit_gradients(model, idx, targets)
    wrong = g32[torch.nn.functional.one_hot(targets, 256) == 0]
    torch.testing.assert_close(wrong, torch.full_like(wrong, P.initial_logit_gradient(256, 4, 16)))


# ------------------------------------------------------------------------------------------
# Rules against what they predict

@pytest.mark.parametrize("step, fmt", [(2.0 ** -10, "fp16"), (1e-4, "fp16"), (1e-4, "bf16"),
                                       (3e-3, "bf16"), (7e-4, "fp16"), (2.0 ** -5, "bf16")])
def test_stall_point_is_where_the_running_sum_stops(step, fmt):
    sums = P.running_sum(step, 3 * int(P.stall_point(step, fmt) / step) + 10, fmt)
    assert max(sums) == sums[-1] == P.stall_point(step, fmt)


@pytest.mark.parametrize("seed", range(3))
def test_grad_scaler_scale_is_what_loss_scale_after_predicts(seed):
    rng = random.Random(seed)
    pattern = [rng.random() < 0.3 for _ in range(30)]
    rule = dict(init_scale=2.0 ** 10, growth_interval=3)
    assert P.grad_scaler_scale(pattern, **rule) == P.loss_scale_after(pattern, **rule)[0]


def test_grad_scaler_scale_plays_quiz_9_with_the_defaults():
    """Quiz 9's 5003 steps on torch.amp.GradScaler itself, once (about a second): 3 overflows,
    then two growths of 2000 clean steps; the key's answer is that scale."""
    from gpulab.course.checks import load_key_module
    key = load_key_module(Path(__file__).resolve().parent.parent / "autograder" / "keys" / "04_mixed_precision.py")
    assert P.grad_scaler_scale([True] * 3 + [False] * 5000) == 2.0 ** 15 == key["04-scale-after"].value


# ------------------------------------------------------------------------------------------
# Autocast per device: the op lists, the activations each keeps, the state per parameter

def _float32_list_ops(class_name: str) -> set[str]:
    """Op names on torch's own autocast float32 test lists for this release (read from the
    source: importing the module needs expecttest): ``AutocastTestLists`` is CUDA's,
    ``AutocastCPUTestLists`` the CPU's."""
    path = Path(torch.__file__).parent / "testing" / "_internal" / "autocast_test_lists.py"
    tree = ast.parse(path.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    names = set()
    for node in ast.walk(cls):
        if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Attribute)
                and node.targets[0].attr in ("torch_fp32", "nn_fp32")):
            for entry in node.value.elts:
                names.add(entry.elts[0].value)
    return names


def test_float32_lists_are_torchs_own():
    """What the predictions assume about each device is what torch's autocast test lists say:
    softmax, log_softmax, layer_norm, exp and sum are on CUDA's float32 list and not on the
    CPU's; cross_entropy is on both (torch lists its parts: nll_loss on both, log_softmax on
    CUDA's; the CPU casts cross_entropy as a whole, measured in the test above)."""
    cuda, cpu = _float32_list_ops("AutocastTestLists"), _float32_list_ops("AutocastCPUTestLists")
    assert {"softmax", "layer_norm", "nll_loss"} <= cuda and "nll_loss" in cpu
    for op in P.FLOAT32_OPS["cuda"]:
        if op == "cross_entropy":
            continue
        assert op in cuda, op
        assert (op in cpu) == (op in P.FLOAT32_OPS["cpu"]), op
    assert P.autocast_bytes_per_score("cuda") == 6 and P.autocast_bytes_per_score("cpu") == 2


class CudaFloat32List(TorchFunctionMode):
    """On the CPU, run softmax as CUDA autocast does: its 16-bit input cast up to fp32 (the
    only op of CUDA's float32 list that the course GPT meets with a 16-bit input; layer_norm
    and cross_entropy already run in fp32 on both devices)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (F.softmax, torch.softmax, torch.Tensor.softmax):
            args = (args[0].float(), *args[1:])
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("config, batch, seq_len", [
    (GPTConfig(vocab_size=256, block_size=128, n_layer=2, n_head=4, n_embd=128), 4, 64),
    (GPTConfig(vocab_size=300, block_size=32, n_layer=1, n_head=2, n_embd=64), 1, 32),
    (GPTConfig(vocab_size=100, block_size=64, n_layer=3, n_head=8, n_embd=64), 3, 17),
])
@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
def test_autocast_saved_bytes_match_what_autograd_saves(config, batch, seq_len, device_type):
    """Every dtype exactly: measured on the CPU, and for CUDA on the CPU with softmax following
    CUDA's float32 list, which is where the devices differ (6 bytes per score against 2)."""
    torch.manual_seed(0)
    model = GPT(config)
    idx = torch.randint(0, config.vocab_size, (batch, seq_len))
    targets = torch.randint(0, config.vocab_size, (batch, seq_len))

    def forward():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if device_type == "cuda":
                with CudaFloat32List():
                    return model(idx, targets)[1]
            return model(idx, targets)[1]

    measured = P.saved_tensor_bytes(forward, exclude=model.parameters())
    assert measured == P.autocast_saved_bytes(config, batch, seq_len, device_type)


def test_cuda_keeps_4_more_bytes_per_score_in_fp32():
    config = GPTConfig(vocab_size=256, block_size=128, n_layer=2, n_head=4, n_embd=128)
    cpu, cuda = (P.autocast_saved_bytes(config, 4, 64, d) for d in ("cpu", "cuda"))
    assert cuda["float32"] - cpu["float32"] == 4 * 2 * 4 * 4 * 64 * 64
    assert {k: v for k, v in cuda.items() if k != "float32"} == {k: v for k, v in cpu.items() if k != "float32"}


def test_parameter_copy_bytes_finds_the_saved_weight_copy():
    """Under autocast a linear layer saves a bf16 copy of its weight (not of its bias); without
    autocast it saves the fp32 parameter itself, which is no copy."""
    layer = torch.nn.Linear(64, 96)
    x = torch.randn(8, 64, requires_grad=True)

    def forward(enabled):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
            return layer(x)
    assert P.parameter_copy_bytes(lambda: forward(True), layer.parameters()) == 2 * 64 * 96
    assert P.parameter_copy_bytes(lambda: forward(False), layer.parameters()) == 0


def test_autocast_state_bytes_counted_on_a_real_step(corpus):
    """One autocast step with AdamW, the linear weights' tensors counted: fp32 weight, fp32
    gradient, fp32 exp_avg and exp_avg_sq, and the bf16 copy saved in the forward: 18 bytes per
    parameter, as autocast_state_bytes says; 16 of them outlive the step (the 16-bit recipe's
    total too, but in other tensors: arith.RECIPES["mixed_adam"])."""
    torch.manual_seed(0)
    model = GPT(TINY)
    optimizer = torch.optim.AdamW(model.parameters())
    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    idx, targets = P.sample_batch(corpus, 4, 16, torch.Generator().manual_seed(0), "cpu")

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(idx, targets)[1]
        loss.backward()
    copies = P.parameter_copy_bytes(step, weights)
    optimizer.step()
    n = sum(w.numel() for w in weights)
    state = P.autocast_state_bytes(n)
    assert state["params"] == sum(w.numel() * w.element_size() for w in weights)
    assert state["grads"] == sum(w.grad.numel() * w.grad.element_size() for w in weights)
    assert state["optimizer"] == sum(optimizer.state[w][k].numel() * optimizer.state[w][k].element_size()
                                     for w in weights for k in ("exp_avg", "exp_avg_sq"))
    assert state["copies"] == copies
    assert state["total"] == 18 * n
    assert P.autocast_state_bytes(10, copied_params=0)["total"] == 160


# ------------------------------------------------------------------------------------------
# Timing and the predict-then-measure line

@pytest.mark.parametrize("precision", P.PRECISIONS)
def test_step_seconds_reads_nothing_back_from_the_device(precision, corpus, monkeypatch):
    """The timed steps must not wait for a GPU: no ``.item()`` anywhere (no loss read, and a
    fused AdamW so GradScaler needs none); checked on the CPU, where the same code runs. The
    warm-up steps run first (Adam's state exists when the clock starts)."""
    calls = []
    item = torch.Tensor.item
    monkeypatch.setattr(torch.Tensor, "item", lambda t: calls.append(1) or item(t))
    seconds = P.step_seconds(TINY, precision, 4, 16, "cpu", corpus, steps=2, warmup=1)
    assert seconds > 0 and calls == []


# --------------------------------------------------------------------------------------------
# Section 8, in your training script: the AMP step's lines in order, and what each wrong order
# breaks (gpulab.precision.script), measured on one step of a small MLP under fp16 autocast

@pytest.fixture(scope="module")
def orders():
    from gpulab.precision import ORDERS, measure_order
    return {order: (measure_order(order), measure_order(order, init_scale=2.0 ** 40)) for order in ORDERS}


def test_the_right_order_clips_the_true_gradient_and_skips_an_overflow(orders):
    from gpulab.precision.script import MAX_NORM
    run, overflow = orders["right"]
    assert run.clip_saw == pytest.approx(run.true_norm, rel=1e-3) and run.true_norm > MAX_NORM
    assert run.applied == pytest.approx(MAX_NORM, rel=1e-3) and run.error is None
    assert overflow.applied == 0 and overflow.finite and overflow.scale == 2.0 ** 38   # 2 skips


def test_each_wrong_order_breaks_what_the_chapter_says(orders):
    from gpulab.precision.script import MAX_NORM
    S = 2.0 ** 16
    clip_first, _ = orders["clip before unscale_"]
    assert clip_first.clip_saw == pytest.approx(clip_first.true_norm * S, rel=1e-2)
    assert clip_first.applied == pytest.approx(MAX_NORM / S, rel=1e-2)
    unscaled_step, overflow = orders["optimizer.step() for scaler.step()"]
    assert unscaled_step.clip_saw == pytest.approx(unscaled_step.true_norm * S, rel=1e-2)
    assert not overflow.finite                               # an inf applied: NaN weights
    assert "scaler.scale" in orders["loss.backward() unscaled"][0].error
    no_update, _ = orders["no scaler.update()"]
    assert no_update.applied == pytest.approx(MAX_NORM, rel=1e-3)
    assert no_update.error.startswith("step 2:")             # only the second step refuses,
    assert "unscale_() is being called after step()" in no_update.error   # at its unscale_()
