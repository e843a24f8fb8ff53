"""Throughput arithmetic (chapter 03): FLOPs, MFU, the roofline, days of training.

Part of ``gpulab.arith`` (see its docstring for the conventions); import it as
``from gpulab import arith`` and call ``arith.<name>``, as the notebooks do.
"""

from __future__ import annotations

from .training_memory import _positive, check_positive_integers


# Conventions: a multiply-add is 2 FLOPs; "FLOPs" counts operations, "FLOP/s" a rate; bytes
# and bytes/s are decimal SI units (GB/s = 10^9 bytes/s), as the datasheets quote them.


def matmul_flops(m: int, k: int, n: int) -> int:
    """FLOPs of one matrix product [m, k] x [k, n]: 2·m·k·n.

    Each of the m·n outputs is a dot product of length k: k multiplies and k adds (counting the
    first add into zero), so 2·k FLOPs. Source: formulas.md, "Compute"; How to Scale Your Model,
    "All the Transformer Math" (matrix-matrix: 2NPM). Chapter 03, "Counting FLOPs".
    """
    check_positive_integers(m=m, k=k, n=n)
    return 2 * m * k * n


def matmul_bytes(m: int, k: int, n: int, bytes_per_value: int = 2) -> int:
    """Bytes a matrix product [m, k] x [k, n] must move at least: p·(m·k + k·n + m·n).

    Both inputs read once from memory and the output written once, p bytes per value (2 for
    bf16/fp16, 4 for fp32). A lower bound: a kernel whose tiles do not fit on chip re-reads
    inputs. Source: formulas.md, "Roofline" (2·(B·D + D·F + B·F) for 2-byte values); How to
    Scale Your Model, "All the Transformer Math".
    Chapter 03, "Arithmetic intensity and the roofline".
    """
    check_positive_integers(m=m, k=k, n=n, bytes_per_value=bytes_per_value)
    return bytes_per_value * (m * k + k * n + m * n)


def training_flops(n_params: float, n_tokens: float, *, n_layer: int | None = None,
                   hidden: int | None = None, seq_len: int | None = None,
                   recompute: bool = False) -> float:
    """FLOPs to train ``n_params`` parameters on ``n_tokens`` tokens: C ≈ 6·N·D.

    The forward pass costs 2 FLOPs per parameter per token (one multiply-add per weight); the
    backward pass twice that, 4·N·D, since each weight matmul needs a gradient for its input and
    one for its weight. Source: Kaplan et al. 2020, "Scaling Laws for Neural Language Models",
    §2.1 (C ≈ 6·N per token, N without embeddings).

    Attention: given ``n_layer`` (L), ``hidden`` (h) and ``seq_len`` (s), adds the FLOPs of the
    attention scores and their weighted sum, which have no parameters: 12·L·h·s per token
    (forward 4·L·h·s: q·kᵀ and scores·v, 2·s·h each per token per layer; backward twice that).
    Source: Chowdhery et al. 2022, "PaLM", appendix B: 6N + 12·L·H·Q·T per token, with H heads
    of size Q, so h here is the attention width H·Q. It equals d_model in GPT-style models;
    PaLM 540B has 48 heads of 256 = 12288 against a d_model of 18432. Like PaLM, this counts the
    full s×s square: a causal kernel that skips the masked half does less work.

    ``recompute=True``: full activation recomputation runs every forward twice, 8·N·D (plus
    16·L·h·s per token for attention): "hardware FLOPs" rather than "model FLOPs". MFU uses the
    model FLOPs; hardware FLOPs utilisation (HFU) the recomputed ones. Source: Korthikanti et al.
    2022, "Reducing Activation Recomputation in Large Transformer Models", §6 (MFU vs HFU);
    formulas.md, "Compute". Chapter 03, "Counting FLOPs".

    >>> training_flops(1e9, 1e9)
    6e+18
    """
    _positive(n_params=n_params, n_tokens=n_tokens)
    shape = {"n_layer": n_layer, "hidden": hidden, "seq_len": seq_len}
    given = {k: v for k, v in shape.items() if v is not None}
    if given and len(given) < 3:
        missing = ", ".join(k for k in shape if k not in given)
        raise ValueError(f"the attention term needs n_layer, hidden and seq_len together; "
                         f"missing {missing}")
    passes = 4 if recompute else 3                 # forward, backward (= 2 forwards), recompute
    per_token = 2 * passes * n_params
    if given:
        check_positive_integers(**given)
        per_token += 4 * passes * n_layer * hidden * seq_len
    return per_token * n_tokens


def mfu(tokens_per_second: float, flops_per_token: float, peak_flops_per_second: float) -> float:
    """Model FLOPs utilisation: the model FLOPs a run achieves per second over the hardware's peak.

        MFU = tokens_per_second · flops_per_token / peak_flops_per_second

    with flops_per_token the model's own (``training_flops(N, 1, ...)``), never counting
    recomputation, so MFU compares runs that recompute differently. ``peak_flops_per_second`` is
    the peak of all chips together. Source: Chowdhery et al. 2022, "PaLM", §4.1 and appendix B:
    238.3K tokens/s on 6144 TPU v4 chips of 275 TFLOP/s: 45.7% from 6N alone, 46.2% with the
    attention term. Chapter 03, "Model FLOPs, hardware FLOPs, and MFU".
    """
    _positive(tokens_per_second=tokens_per_second, flops_per_token=flops_per_token,
              peak_flops_per_second=peak_flops_per_second)
    return tokens_per_second * flops_per_token / peak_flops_per_second


def arithmetic_intensity(flops: float, bytes_moved: float) -> float:
    """FLOPs per byte moved to or from memory: flops / bytes_moved.

    For a bf16 [m, k] x [k, n] matmul it is 2·m·k·n / (2·(m·k + k·n + m·n)), about m when
    m ≪ k, n. Source: Williams, Waterman, Patterson 2009, "Roofline" (operational intensity);
    formulas.md, "Roofline". Chapter 03, "Arithmetic intensity and the roofline".
    """
    _positive(flops=flops, bytes_moved=bytes_moved)
    return flops / bytes_moved


def attention_bytes(batch: int, heads: int, seq_len: int, head_dim: int,
                    bytes_per_value: int = 2, fused: bool = False) -> int:
    """Bytes causal attention's forward moves to and from memory, at least.

    Both read q, k, v and write the output: 4·b·a·s·d·p. The naive chain
    (``gpulab.measure.naive_attention``) also passes over the (b, a, s, s) scores 8 times:
    q·kᵀ writes them (1), the scale and the mask each read and write them (4), softmax reads
    and writes them (2), the product with v reads them (1); the s×s boolean mask itself is
    left out. A fused kernel keeps the scores in on-chip memory and moves only q, k, v and the
    output (FlashAttention re-reads k and v about s·d/M times for on-chip memory M, so this is
    its lower bound). Sources: Dao et al. 2022, "FlashAttention", §3.2 (standard attention
    Θ(s·d + s²) HBM accesses, FlashAttention Θ(s²·d²/M)); Williams et al. 2009 (roofline).
    Chapter 03, "Why a fused kernel wins".

    >>> attention_bytes(1, 1, 1024, 64, 2, fused=False) - attention_bytes(1, 1, 1024, 64, 2, fused=True)
    16777216
    """
    check_positive_integers(batch=batch, heads=heads, seq_len=seq_len, head_dim=head_dim,
                            bytes_per_value=bytes_per_value)
    qkvo = 4 * batch * heads * seq_len * head_dim * bytes_per_value
    return qkvo if fused else qkvo + 8 * batch * heads * seq_len**2 * bytes_per_value


def critical_intensity(peak_flops_per_second: float, bandwidth: float) -> float:
    """The roofline's ridge point: peak FLOP/s / memory bandwidth, in FLOPs per byte.

    Below it a kernel is memory-bound, above it compute-bound. H100 SXM, bf16 dense:
    989e12 / 3.35e12 ≈ 295 FLOPs/byte. Source: Williams, Waterman, Patterson 2009, "Roofline";
    formulas.md, "Roofline". Chapter 03, "Arithmetic intensity and the roofline".
    """
    _positive(peak_flops_per_second=peak_flops_per_second, bandwidth=bandwidth)
    return peak_flops_per_second / bandwidth


def roofline_seconds(flops: float, bytes_moved: float, peak_flops_per_second: float,
                     bandwidth: float) -> float:
    """Shortest time a kernel can take: max(flops / peak, bytes_moved / bandwidth).

    The roofline model assumes compute and memory traffic overlap perfectly, so the slower of
    the two sets the time; real kernels take longer (launch overhead, imperfect overlap). Source:
    Williams, Waterman, Patterson 2009, "Roofline: An Insightful Visual Performance Model for
    Multicore Architectures", CACM 52(4); formulas.md, "Roofline".
    Chapter 03, "Arithmetic intensity and the roofline".
    """
    _positive(flops=flops, bytes_moved=bytes_moved,
              peak_flops_per_second=peak_flops_per_second, bandwidth=bandwidth)
    return max(flops / peak_flops_per_second, bytes_moved / bandwidth)


def bound(flops: float, bytes_moved: float, peak_flops_per_second: float,
          bandwidth: float) -> str:
    """"compute" or "memory": which term of ``roofline_seconds`` is the larger.

    Equivalently, whether the arithmetic intensity is above or below the critical intensity
    (a tie counts as "compute": the kernel would just reach the peak). Source: Williams,
    Waterman, Patterson 2009, "Roofline". Chapter 03, "Arithmetic intensity and the roofline".
    """
    _positive(flops=flops, bytes_moved=bytes_moved,
              peak_flops_per_second=peak_flops_per_second, bandwidth=bandwidth)
    compute_s, memory_s = flops / peak_flops_per_second, bytes_moved / bandwidth
    return "compute" if compute_s >= memory_s else "memory"


SECONDS_PER_DAY = 86_400


def training_days(n_params: float, n_tokens: float, n_gpus: int,
                  peak_flops_per_second: float, mfu: float) -> float:
    """Days to train: 6·N·D / (n_gpus · peak · MFU) / 86400.

    ``peak_flops_per_second`` is one GPU's dense peak (``gpulab.device.hardware.peak_flops``) and
    ``mfu`` the fraction of it the run sustains (0 < mfu <= 1; 0.3-0.5 is typical of large
    runs). Attention is left out, as in 6·N·D. Worked example (LLaMA, Touvron et al. 2023, §2.4):
    65.2B parameters on 1.4T tokens on 2048 A100-80GB at 380 tokens/s/GPU, "approximately
    21 days": MFU = 6·65.2e9·380 / 312e12 = 47.6%, and this gives 20.8 days. Source: Kaplan
    et al. 2020 (C ≈ 6·N·D); formulas.md, "Compute".
    Chapter 03, "Model FLOPs, hardware FLOPs, and MFU".
    """
    _positive(n_params=n_params, n_tokens=n_tokens, peak_flops_per_second=peak_flops_per_second,
              mfu=mfu)
    check_positive_integers(n_gpus=n_gpus)
    if mfu > 1:
        raise ValueError(f"mfu must be a fraction of the peak (0 < mfu <= 1), got {mfu!r}")
    return training_flops(n_params, n_tokens) / (n_gpus * peak_flops_per_second * mfu) \
        / SECONDS_PER_DAY
