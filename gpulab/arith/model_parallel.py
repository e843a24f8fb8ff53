"""Model parallelism (chapter 11): tensor, sequence and pipeline parallelism, and layouts.

Import it as ``from gpulab.arith import model_parallel as mp`` (the chapter does). Symbols, as in
the chapter and in Narayanan et al. 2021: b the micro-batch (sequences per forward), s the
sequence length, h the hidden size, a the attention heads, L the layers, t the tensor-parallel
degree, p the pipeline stages, m the micro-batches per step, v the virtual stages per GPU, d the
data-parallel degree. An *element* is one value of a tensor, whatever its dtype; bytes are
elements times the bytes per value (2 in bf16). A collective's size is its full tensor, as
nccl-tests counts it and chapter 06 does (``arith.communication``): the buffer of an all-reduce,
the gathered result of an all-gather, the input of a reduce-scatter.

The ring costs come from chapter 06 (``allreduce_seconds``); the activation count per layer from
chapter 02 (``activation_bytes_per_layer``, Korthikanti et al. 2022); the bubble
(p − 1)/(m + p − 1) from chapter 06 (``pipeline_bubble_fraction``). This module adds what
splitting the model changes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .communication import allreduce_seconds, pipeline_bubble_fraction, zero_bytes_per_gpu, zero_comm_bytes
from .training_memory import _positive, activation_bytes_per_layer, check_positive_integers

# Collectives per transformer layer and micro-batch under Megatron's tensor parallelism: one
# all-reduce after attention's output projection and one after the MLP's second linear in
# forward (the g operators), and one before each sub-layer's first linear in backward (f).
ALLREDUCES_PER_LAYER = {"forward": 2, "backward": 2}


# --------------------------------------------------------------------------------------------
# Tensor parallelism (chapter 11, section 1-2)

def tp_allreduce_elements(batch: int, seq_len: int, hidden: int, n_layers: int = 1) -> int:
    """Elements each tensor-parallel rank hands to all-reduce in one training step of one
    micro-batch: 4·b·s·h per layer (Shoeybi et al. 2019, "Megatron-LM", §3, Figure 3: the
    operators f and g; Narayanan et al. 2021, §3.3).

    Each sub-layer (attention, MLP) splits its first linear by columns and its second by rows.
    The row-parallel linear leaves each rank a partial sum of the b·s·h output: g all-reduces it
    in forward. The column-parallel linear's input gradient is likewise a partial sum on each
    rank: f all-reduces it in backward. Two sub-layers, one all-reduce each way: 4·b·s·h. The
    count does not depend on t: every rank hands the whole b·s·h tensor each time. (With full
    recomputation the forward runs twice, adding 2·b·s·h.) Chapter 11, section 1.

    >>> tp_allreduce_elements(1, 2048, 12288)
    100663296
    """
    check_positive_integers(batch=batch, seq_len=seq_len, hidden=hidden, n_layers=n_layers)
    per_layer = sum(ALLREDUCES_PER_LAYER.values()) * batch * seq_len * hidden
    return per_layer * n_layers


def tp_comm_seconds(batch: int, seq_len: int, hidden: int, tp: int, bandwidth: float,
                    n_layers: int = 1, bytes_per_value: int = 2) -> float:
    """Time of the tensor-parallel all-reduces of one micro-batch's forward and backward on a
    ring of t ranks: 4·L all-reduces of b·s·h values, each 2(t−1)/t · b·s·h·bytes / B
    (``allreduce_seconds``, chapter 06). They sit on the critical path: the next operation
    needs their result, so nothing hides them. Chapter 11, section 1.

    Worked example: GPT-3 175B's layer (h = 12288, s = 2048, b = 1), 96 layers, t = 8 on
    NVLink 4 (450 GB/s per direction), bf16: 384 all-reduces of 50.3 MB, 75.2 ms.

    >>> round(tp_comm_seconds(1, 2048, 12288, 8, 450e9, n_layers=96) * 1e3, 1)
    75.2
    """
    check_positive_integers(tp=tp, bytes_per_value=bytes_per_value)
    count = tp_allreduce_elements(batch, seq_len, hidden, n_layers) // (batch * seq_len * hidden)
    one = allreduce_seconds(batch * seq_len * hidden * bytes_per_value, tp, bandwidth)
    return count * one


def layer_training_flops(batch: int, seq_len: int, hidden: int) -> int:
    """Matmul FLOPs of one transformer layer's forward and backward for one micro-batch:
    72·b·s·h² (the 12h² weights of a 4h-MLP layer, 2 FLOPs per multiply-add, forward once and
    backward twice: 3 × 2 × 12). Narayanan et al. 2021, §5.1, count 96·b·s·h²(1 + s/(6h)) per
    layer with activation recomputation (the forward twice); without it 72, and this leaves out
    their s/(6h), the attention scores (8% for s = 4096, h = 8192). Chapter 11, section 2.

    >>> layer_training_flops(1, 2048, 12288)
    22265110462464
    """
    check_positive_integers(batch=batch, seq_len=seq_len, hidden=hidden)
    return 72 * batch * seq_len * hidden**2


def tp_comm_to_compute(tp: int, hidden: int, bandwidth: float, flops_per_second: float,
                       bytes_per_value: int = 2) -> float:
    """Tensor parallelism's communication time over its compute time, per layer and
    micro-batch:

        comm    = 4 · 2(t−1)/t · b·s·h·q / B         (four ring all-reduces, q bytes per value)
        compute = 72·b·s·h² / (t·F)                   (``layer_training_flops``, split t ways)
        ratio   = (t − 1)·q·F / (9·h·B)

    b and s cancel: a bigger batch does not help. The ratio grows with t − 1 (each rank's
    compute shrinks as 1/t, its traffic does not) and shrinks with h. Nothing overlaps the two,
    so the step takes compute × (1 + ratio). Chapter 11, section 2.

    Worked example: h = 8192, t = 8, H100s at F = 400 TFLOP/s achieved, NVLink 4 (450 GB/s),
    bf16: 7·2·400e12 / (9·8192·450e9) = 0.169.

    >>> round(tp_comm_to_compute(8, 8192, 450e9, 400e12), 4)
    0.1688
    """
    check_positive_integers(tp=tp, hidden=hidden, bytes_per_value=bytes_per_value)
    _positive(bandwidth=bandwidth, flops_per_second=flops_per_second)
    return (tp - 1) * bytes_per_value * flops_per_second / (9 * hidden * bandwidth)


# --------------------------------------------------------------------------------------------
# Sequence parallelism and activation memory (chapter 11, section 3)

def activation_bytes_per_rank(seq_len: int, batch: int, hidden: int, heads: int, tp: int = 1,
                              sequence_parallel: bool = False, bytes_per_value: int = 2,
                              recompute: str = "none", dropout: bool = True) -> float:
    """Bytes one transformer layer saves for backward on each of t tensor-parallel ranks
    (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
    §4.2, Table 2), in 16 bits with dropout:

        tensor parallelism alone   s·b·h·(10 + 24/t + 5·a·s/(h·t))
        with sequence parallelism  s·b·h·(34/t + 5·a·s/(h·t))

    Tensor parallelism splits what lies between f and g (Q, K, V, the scores, the MLP's 4h
    tensors: the 24 and the 5as/h), but every rank keeps the whole inputs of the LayerNorms, of
    the two first linears, and the dropout masks (the 10). Sequence parallelism splits those 10
    along the sequence: each rank runs the LayerNorms and dropouts on s/t of the tokens, so
    everything is divided by t, and it keeps only its s/t slice of each first linear's input
    (gathering it again in backward). Both are ``activation_bytes_per_layer`` of chapter 02:
    with ``tp=t``, and with ``tp=1`` divided by t. Chapter 11, section 3.

    Worked example: GPT-3 175B's layer (s 2048, b 1, h 12288, a 96), t = 8: 578.8 MB alone
    (23 sbh: 10 + 3 + 10), 358.6 MB with sequence parallelism (34/8 + 10 = 14.25 sbh).

    >>> activation_bytes_per_rank(2048, 1, 12288, 96, 8) / 1e6
    578.813952
    >>> activation_bytes_per_rank(2048, 1, 12288, 96, 8, sequence_parallel=True) / 1e6
    358.612992
    """
    check_positive_integers(tp=tp)
    if sequence_parallel:
        if seq_len % tp:
            raise ValueError(f"sequence parallelism splits the sequence: tp={tp} must divide "
                             f"seq_len={seq_len}")
        whole = activation_bytes_per_layer(seq_len, batch, hidden, heads, bytes_per_value,
                                           recompute, tp=1, dropout=dropout)
        if heads % tp:
            raise ValueError(f"tp={tp} must divide heads={heads} (tensor parallelism splits heads)")
        return whole / tp
    return activation_bytes_per_layer(seq_len, batch, hidden, heads, bytes_per_value, recompute,
                                      tp=tp, dropout=dropout)


def course_block_activation_bytes(seq_len: int, batch: int, hidden: int, heads: int,
                                  tp: int = 1, sequence_parallel: bool = False,
                                  bytes_per_value: int = 4) -> float:
    """What one block of the course GPT (``gpulab.models.Block``: no dropout, fp32 by default)
    saves for backward on each tensor-parallel rank: Korthikanti's count without dropout
    (``activation_bytes_per_rank(..., dropout=False)``) plus the two LayerNorms' mean and 1/std,
    2·b·s values each, which chapter 02 adds (``predict_training_memory``). Under tensor
    parallelism alone every rank keeps them for all s tokens; with sequence parallelism for its
    s/t. Chapter 11, Experiment 3 measures it.

    >>> course_block_activation_bytes(256, 2, 64, 4) == 4 * (16 * 256 * 2 * 64 + 4 * 256**2 * 2 + 4 * 2 * 256)
    True
    """
    stats = 2 * (2 * batch * seq_len * bytes_per_value)       # two LayerNorms: mean, 1/std
    layer = activation_bytes_per_rank(seq_len, batch, hidden, heads, tp, sequence_parallel,
                                      bytes_per_value, dropout=False)
    return layer + (stats / tp if sequence_parallel else stats)


# --------------------------------------------------------------------------------------------
# Pipeline parallelism (chapter 11, section 4)

SCHEDULES = ("GPipe", "1F1B")


def interleaved_bubble_fraction(n_stages: int, n_microbatches: int, virtual_stages: int) -> float:
    """Idle fraction of an interleaved 1F1B step with v virtual stages per GPU (Narayanan et al.
    2021, §2.2.2): each GPU holds v chunks of L/(p·v) layers, a slot costs 1/v of a stage's
    time, and the fill and drain shrink to (p − 1)/v stage-times while the work stays m:

        (p − 1)/v / (m + (p − 1)/v) = (p − 1)/(v·m + p − 1).

    v = 1 is ``pipeline_bubble_fraction``. The paper's "bubble time fraction" (1/v)·(p − 1)/m
    measures the same idle time against m slots of work instead of the whole step. The price:
    v times as many point-to-point sends. Chapter 11, section 4.

    >>> interleaved_bubble_fraction(4, 8, 1) == pipeline_bubble_fraction(4, 8)
    True
    >>> round(interleaved_bubble_fraction(4, 8, 2), 4)
    0.1579
    """
    check_positive_integers(n_stages=n_stages, n_microbatches=n_microbatches,
                            virtual_stages=virtual_stages)
    return (n_stages - 1) / (virtual_stages * n_microbatches + n_stages - 1)


def microbatches_for_bubble(n_stages: int, bubble: float) -> int:
    """The fewest micro-batches m with (p − 1)/(m + p − 1) <= bubble:
    m >= (p − 1)(1 − bubble)/bubble, rounded up. Chapter 11, section 4.

    >>> microbatches_for_bubble(16, 0.1)
    135
    """
    check_positive_integers(n_stages=n_stages)
    if not 0 < bubble < 1:
        raise ValueError(f"bubble must be a fraction between 0 and 1, got {bubble!r}")
    # the tiny slack keeps a float like 135.00000000000003 from rounding up to 136
    return max(1, math.ceil((n_stages - 1) * (1 - bubble) / bubble - 1e-9))


def microbatches_in_flight(schedule: str, n_stages: int, n_microbatches: int, stage: int = 0) -> int:
    """Micro-batches whose activations a stage holds at its peak. GPipe runs every forward
    before any backward (Huang et al. 2019): all m. 1F1B (PipeDream-Flush, Narayanan et al. 2021,
    §2.2.1) starts a backward as soon as one can run, so stage i (0 = first) runs p − i
    forwards ahead and then alternates: min(m, p − i). Stage 0 holds the most, p; the last,
    one. Chapter 11, section 4.

    >>> [microbatches_in_flight("1F1B", 4, 8, i) for i in range(4)], microbatches_in_flight("GPipe", 4, 8)
    ([4, 3, 2, 1], 8)
    """
    check_positive_integers(n_stages=n_stages, n_microbatches=n_microbatches)
    if not 0 <= stage < n_stages:
        raise ValueError(f"stage must be 0 ... {n_stages - 1}, got {stage!r}")
    if schedule == "GPipe":
        return n_microbatches
    if schedule == "1F1B":
        return min(n_microbatches, n_stages - stage)
    raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}; got {schedule!r}")


def pipeline_send_elements(batch: int, seq_len: int, hidden: int, n_microbatches: int) -> int:
    """Elements one stage sends to the next per step: its output activations, b·s·h per
    micro-batch, and the next stage sends back as many gradients: 2·m·b·s·h crossing each stage
    boundary, point to point (``send``/``recv``), once per stage, not once per layer. A middle
    stage sends m·b·s·h each way. Chapter 11, section 4.

    >>> pipeline_send_elements(1, 2048, 12288, 8)
    402653184
    """
    check_positive_integers(batch=batch, seq_len=seq_len, hidden=hidden,
                            n_microbatches=n_microbatches)
    return 2 * n_microbatches * batch * seq_len * hidden


# --------------------------------------------------------------------------------------------
# Choosing a layout (chapter 11, section 5)

def stage_layers(n_layers: int, n_stages: int) -> int:
    """Layers on the fullest pipeline stage, ⌈L/p⌉: Llama 3 405B's 126 layers on 16 stages are
    8 per stage but 7 on the first and the last (Dubey et al. 2024, §3.3.2), so 8.

    >>> stage_layers(126, 16)
    8
    """
    check_positive_integers(n_layers=n_layers, n_stages=n_stages)
    return math.ceil(n_layers / n_stages)


@dataclass(frozen=True)
class Transformer:
    """A GPT-style model as the layout arithmetic sees it: Ψ parameters in L layers of hidden
    size h with a heads, trained on sequences of s tokens."""

    n_params: float
    n_layers: int
    hidden: int
    heads: int
    seq_len: int


@dataclass(frozen=True)
class Layout:
    """t-way tensor, p-way pipeline and d-way data parallelism (t·p·d GPUs), b sequences per
    micro-batch, m micro-batches per step (the global batch is b·m·d sequences), ZeRO stage
    ``zero_stage`` over the d data-parallel ranks (chapter 06), sequence parallelism on or off,
    and the activation recomputation of Korthikanti et al. ("none", "selective", "full")."""

    tp: int
    pp: int
    dp: int
    micro_batch: int
    microbatches: int
    zero_stage: int = 1
    sequence_parallel: bool = True
    recompute: str = "selective"

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp


@dataclass(frozen=True)
class Cluster:
    """GPUs grouped in nodes of ``gpus_per_node`` joined by NVLink (``nvlink`` bytes/s per GPU
    and direction); between nodes each GPU reaches ``network`` bytes/s per direction (its NIC,
    or its share of the node's NICs); ``memory`` bytes per GPU; ``flops`` the FLOP/s each GPU
    achieves."""

    gpus_per_node: int
    nvlink: float
    network: float
    memory: float
    flops: float


def layout_memory_bytes(model: Transformer, layout: Layout, recipe: str = "mixed_adam",
                        bytes_per_value: int = 2) -> dict[str, float]:
    """Bytes per GPU of a layout at its fullest, the first pipeline stage under 1F1B:

        model state   ZeRO's bytes (``zero_bytes_per_gpu``, chapter 06) of the Ψ/(t·p)
                      parameters each GPU holds, sharded over the d data-parallel ranks
        activations   ⌈L/p⌉ layers × ``activation_bytes_per_rank`` × micro-batches in flight;
                      under 1F1B the first stage holds min(m, p): about L layers' worth of one
                      micro-batch, whatever p (Korthikanti et al. 2022, §4.2.3)

    Assumes the parameters split evenly over t·p (the embedding and the head land on the first
    and last stages in truth) and leaves out the logits and the loss, temporaries and
    fragmentation. Chapter 11, section 5.

    Worked example: GPT-3 175B (Ψ 175e9, 96 layers, h 12288, 96 heads, s 2048) as Megatron-LM's
    example script lays it out (TP 8, PP 16, micro-batch 1), 128 micro-batches, no ZeRO, with
    selective recomputation and sequence parallelism: 21.9 GB of state, 10.3 GB of activations.

    >>> gpt3 = Transformer(175e9, 96, 12288, 96, 2048)
    >>> {k: round(v / 1e9, 1) for k, v in layout_memory_bytes(gpt3, Layout(8, 16, 12, 1, 128, zero_stage=0)).items()}
    {'model state': 21.9, 'activations': 10.3, 'total': 32.1}
    """
    t, p = layout.tp, layout.pp
    state = zero_bytes_per_gpu(model.n_params / (t * p), layout.dp, layout.zero_stage, recipe)
    per_layer = activation_bytes_per_rank(model.seq_len, layout.micro_batch, model.hidden,
                                          model.heads, t, layout.sequence_parallel,
                                          bytes_per_value, layout.recompute)
    in_flight = microbatches_in_flight("1F1B", p, layout.microbatches, 0)
    activations = stage_layers(model.n_layers, p) * per_layer * in_flight
    return {"model state": state, "activations": activations, "total": state + activations}


def layout_comm_bytes(model: Transformer, layout: Layout, bytes_per_value: int = 2) -> dict[str, float]:
    """Bytes each GPU sends per optimizer step, by kind of parallelism:

        tensor    ⌈L/p⌉·m layers' worth of all-reduces: 4 per layer and micro-batch, each sending
                  2(t−1)/t · b·s·h values (a ring; sequence parallelism sends the same)
        pipeline  m·b·s·h activations forward and as many gradients back (a middle stage),
                  divided by t when sequence parallelism leaves each tensor-parallel rank
                  only its s/t slice to send (Narayanan et al. 2021, §4.1, scatter/gather)
        data      ZeRO's traffic (``zero_comm_bytes``, chapter 06) for the Ψ/(t·p) parameters
                  each GPU holds, over d ranks, once per step

    Chapter 11, section 5.
    """
    t, p, d, m, b = layout.tp, layout.pp, layout.dp, layout.microbatches, layout.micro_batch
    sbh = b * model.seq_len * model.hidden
    tensor = stage_layers(model.n_layers, p) * m * 4 * 2 * (t - 1) / t * sbh * bytes_per_value
    pipeline = 0.0 if p == 1 else 2 * m * sbh * bytes_per_value / (t if layout.sequence_parallel else 1)
    data = 0.0 if d == 1 else zero_comm_bytes(model.n_params / (t * p), layout.zero_stage,
                                              bytes_per_value, n_gpus=d)
    return {"tensor": tensor, "pipeline": pipeline, "data": data}


def ring_bandwidth(gpus_in_group: int, cluster: Cluster) -> float:
    """The bandwidth a ring of ``gpus_in_group`` consecutive ranks gets: NVLink while the group
    fits in one node; across nodes, the network, over as many NICs at once as the group has GPUs
    in each node (chapter 06: NCCL runs one ring over each NIC at once), never more than NVLink:
    min(NVLink, k × network) for k GPUs of the group per node. Chapter 11, section 5.

    >>> h100 = Cluster(8, 450e9, 50e9, 80e9, 400e12)
    >>> ring_bandwidth(8, h100), ring_bandwidth(16, h100)
    (450000000000.0, 400000000000.0)
    """
    check_positive_integers(gpus_in_group=gpus_in_group)
    if gpus_in_group <= cluster.gpus_per_node:
        return cluster.nvlink
    per_node = cluster.gpus_per_node if gpus_in_group % cluster.gpus_per_node == 0 else 1
    return min(cluster.nvlink, per_node * cluster.network)


def layout_links(layout: Layout, cluster: Cluster) -> dict[str, float]:
    """The bandwidth each kind of traffic gets, ranks placed tensor-parallel first, then
    pipeline, then data parallel (Llama 3's order [TP, CP, PP, DP], Dubey et al. 2024, §3.3.2):

        tensor    a ring of t consecutive GPUs (``ring_bandwidth``)
        pipeline  GPU to GPU, t·p apart in rank: NVLink while t·p ≤ g, else one GPU's network
        data      a ring of d GPUs t·p apart: NVLink while t·p·d ≤ g; across nodes its members
                  are max(1, g/(t·p)) per node, each with its own NIC

    Chapter 11, section 5."""
    g, t, p = cluster.gpus_per_node, layout.tp, layout.pp
    data = (cluster.nvlink if layout.gpus <= g
            else min(cluster.nvlink, max(1, g // (t * p)) * cluster.network))
    return {"tensor": ring_bandwidth(t, cluster),
            "pipeline": cluster.nvlink if t * p <= g else cluster.network,
            "data": data}


def layout_report(model: Transformer, layout: Layout, cluster: Cluster) -> dict:
    """Memory per GPU, bytes sent per step, and the time each kind of traffic takes on its link
    (``layout_links``), next to the step's compute: 6·Ψ·tokens / (GPUs·F) (chapter 03), and the
    pipeline bubble (p − 1)/(m + p − 1). Tensor-parallel time adds to the compute (nothing hides
    it); pipeline sends are small and data-parallel traffic overlaps with backward (chapter 06).
    Chapter 11, section 5."""
    memory = layout_memory_bytes(model, layout)
    comm = layout_comm_bytes(model, layout)
    links = layout_links(layout, cluster)
    tokens = layout.micro_batch * layout.microbatches * layout.dp * model.seq_len
    compute = 6 * model.n_params * tokens / (layout.gpus * cluster.flops)
    return {"memory": memory, "fits": memory["total"] <= cluster.memory, "comm bytes": comm,
            "comm seconds": {kind: comm[kind] / links[kind] for kind in comm},
            "links": links, "compute seconds": compute,
            "bubble": pipeline_bubble_fraction(layout.pp, layout.microbatches)}
