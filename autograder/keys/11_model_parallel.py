"""Answer key for chapter 11, model parallelism. Instructor side: never released.

Every expected value is computed by gpulab's tested functions (``gpulab.arith.model_parallel``,
chapter 06's ring costs and ZeRO, chapter 02's activation count) from the numbers the questions
state; each mistake is the value a typical slip produces, with the words the learner sees.

The published models' sizes: GPT-3 175B (Brown et al. 2020, Table 2.1: 96 layers, h 12288, 96
heads, context 2048), Llama-2-70B (Touvron et al. 2023, Table 1 and §2.2: 80 layers, h 8192, 64
heads, context 4096; its grouped-query attention and SwiGLU are not the GPT-style layer the
formulas count, hence "sized"), MT-NLG 530B (Smith et al. 2022: 105 layers, h 20480, 128 heads,
sequence 2048), Llama 3 405B (Dubey et al. 2024, Table 3 and §3.3: 126 layers, h 16384, 128
heads, sequence 8192; its layout TP 8 × PP 16 × DP 128 on 16,384 GPUs, Table 4).

Each item is preceded by "# Quiz N", the number of its "### Quiz N" heading in the notebook
(tests/test_keys.py checks that they agree).
"""
import math

from gpulab.arith import GB, GiB
from gpulab.arith import model_parallel as mp
from gpulab.arith.communication import zero_bytes_per_gpu
from gpulab.course.checks import Item, Mistake
from gpulab.course.variants import Param, canonical

NVLINK = 450e9                      # quizzes 2-4: H100 NVLink 4, bytes/s per direction
ACROSS = 50e9                       # quiz 4: one 400 Gb/s NIC per server between them
GPUS_PER_SERVER = 8
BF16 = 2


def model(name: str, layers: int, hidden: int, heads: int, seq: int, params: float) -> dict:
    return {"name": name, "L": layers, "h": hidden, "a": heads, "s": seq, "psi": params,
            "h_text": f"{hidden:,}", "s_text": f"{seq:,}"}


GPT3 = model("GPT-3 175B", 96, 12288, 96, 2048, 175e9)
LLAMA2_70B = model("Llama-2-70B-sized", 80, 8192, 64, 4096, 70e9)
MTNLG = model("MT-NLG 530B", 105, 20480, 128, 2048, 530e9)
LLAMA3_405B = model("Llama 3 405B", 126, 16384, 128, 8192, 405e9)
MODELS = (GPT3, LLAMA2_70B, MTNLG, LLAMA3_405B)


def layout(name: str, params: float, tp: int, pp: int, dp: int) -> dict:
    return {"name": name, "psi": params, "psi_text": f"{params / 1e9:g} × 10⁹", "t": tp, "p": pp,
            "d": dp, "gpus": f"{tp * pp * dp:,}"}


def stages(layers: int, pp: int) -> dict:
    return {"L": layers, "p": pp}


PARAMS = {
    "layer": Param(GPT3, MODELS),                                  # quizzes 1, 2, 6, 7
    "micro_batch": Param(1, (1, 2, 4)),                            # quiz 1
    "tp": Param(8, (4, 8)),                                        # quizzes 1, 2, 6, 7
    "ratio_layer": Param(LLAMA2_70B, MODELS),                      # quizzes 3, 4
    "flops_t": Param(400, (300, 400, 500)),                        # F in 10¹² FLOP/s
    "bubble_stages": Param(16, (4, 8, 16)),                        # quiz 9
    "bubble_percent": Param(10, (5, 10, 20)),
    "interleave": Param({"p": 4, "m": 8, "v": 2},
                        tuple({"p": p, "m": m, "v": v} for p in (4, 8) for m in (8, 16, 32) for v in (2, 4))),
    "in_flight": Param({"p": 8, "m": 32, "A": 3},
                       tuple({"p": p, "m": m, "A": A} for p in (4, 8) for m in (16, 32) for A in (2, 3, 5))),
    "state_layout": Param(layout("Llama 3 405B", 405e9, 8, 16, 128),
                          (layout("Llama 3 405B", 405e9, 8, 16, 128), layout("GPT-3 175B", 175e9, 8, 16, 8),
                           layout("Llama-2-70B-sized", 70e9, 8, 4, 32), layout("MT-NLG 530B", 530e9, 8, 16, 16))),
    "traffic_stages": Param(stages(96, 16), (stages(96, 16), stages(96, 8), stages(80, 8),
                                             stages(80, 4), stages(128, 16))),
}
QUESTIONS = {
    "ch11-md-quiz-tp-elements": (
        "### Quiz 1: what tensor parallelism hands to all-reduce\n\n"
        "One layer of {layer[name]} ($h$ = {layer[h_text]}) runs a micro-batch of $b = {micro_batch}$ "
        "sequences of\n$s$ = {layer[s_text]} tokens, split over $t = {tp}$ GPUs in Megatron's layout. "
        "How many **elements** does each\nGPU hand to all-reduce in one forward and backward of this "
        "micro-batch?"),
    "ch11-md-quiz-tp-ms": (
        "### Quiz 2: the whole model's all-reduces\n\n"
        "All $L = {layer[L]}$ layers of {layer[name]} ($h$ = {layer[h_text]}, $s$ = {layer[s_text]}, "
        "$b = 1$) split over $t = {tp}$ H100s of\none server, joined by NVLink 4 at 450 GB/s per "
        "direction, with bf16 activations. How many **ms** do\nthe tensor-parallel all-reduces of one "
        "micro-batch's forward and backward take on chapter 06's\nring (no latency)?"),
    "ch11-md-quiz-tp-ratio": (
        "### Quiz 3: communication over compute, inside a server\n\n"
        "A {ratio_layer[name]} layer ($h$ = {ratio_layer[h_text]}) split over the 8 H100s of one "
        "server: NVLink 4 at\n$B = 450$ GB/s per direction, each GPU achieving $F = {flops_t}$ "
        "TFLOP/s (10¹² FLOP/s), bf16 activations.\nWhat is the ratio of the tensor-parallel "
        "communication time to the compute time (a plain number)?"),
    "ch11-md-quiz-tp-nodes": (
        "### Quiz 4: the same layer across two servers\n\n"
        "The same layer, split over $t = 16$ GPUs: the 8 of this server and the 8 of a second one. "
        "The\nservers are joined by one 400 Gb/s NIC each, so the ring's hops between them run at "
        "50 GB/s.\nWhat is the ratio now?"),
    "ch11-md-quiz-sp-tp-gib": (
        "### Quiz 6: a layer's activations per GPU, tensor parallelism alone\n\n"
        "One layer of {layer[name]} ($h$ = {layer[h_text]}, $a = {layer[a]}$ heads, "
        "$s$ = {layer[s_text]}, $b = 1$) split over\n$t = {tp}$ GPUs. How many **GiB** does each GPU "
        "keep for backward (16-bit values with dropout, the\nscores stored: Korthikanti et al.'s "
        "count)?"),
    "ch11-md-quiz-sp-gib": (
        "### Quiz 7: the same layer with sequence parallelism\n\n"
        "The same layer on the same $t = {tp}$ GPUs, now with sequence parallelism. How many "
        "**GiB** per GPU?"),
    "ch11-md-quiz-bubble-m": (
        "### Quiz 9: enough micro-batches\n\n"
        "A model split into $p = {bubble_stages}$ pipeline stages. What is the fewest number of "
        "micro-batches $m$ per step\nthat keeps the bubble at or below {bubble_percent}% of the step?"),
    "ch11-md-quiz-interleaved": (
        "### Quiz 10: interleaving\n\n"
        "$p = {interleave[p]}$ GPUs, $m = {interleave[m]}$ micro-batches per step, and each GPU "
        "holds $v = {interleave[v]}$ virtual stages. What fraction\nof the step does each GPU idle?"),
    "ch11-md-quiz-in-flight": (
        "### Quiz 11: activations in flight\n\n"
        "A pipeline of $p = {in_flight[p]}$ stages runs $m = {in_flight[m]}$ micro-batches per "
        "step. One micro-batch's activations\ntake {in_flight[A]} GB on each stage. How many **GB** "
        "of activations does the first stage hold at its\npeak under 1F1B?"),
    "ch11-md-quiz-state": (
        "### Quiz 13: model state per GPU in a layout\n\n"
        "{state_layout[name]} ($\\Psi$ = {state_layout[psi_text]} parameters) trained with "
        "mixed-precision Adam (16\nbytes per parameter: 2 + 2 + 12, chapter 06) on "
        "{state_layout[gpus]} GPUs as TP {state_layout[t]} × PP {state_layout[p]} × DP "
        "{state_layout[d]}, with ZeRO\nstage 1 over the data-parallel GPUs. How many **GB** of model "
        "state does each GPU hold?"),
    "ch11-md-quiz-traffic": (
        "### Quiz 14: tensor against pipeline traffic\n\n"
        "A model of $L = {traffic_stages[L]}$ layers in $p = {traffic_stages[p]}$ stages of equal "
        "size, with tensor parallelism inside each\nstage. For one micro-batch, how many times "
        "more elements does a GPU of a middle stage hand to\ntensor-parallel all-reduces than it "
        "sends to the next stage and receives back from it?"),
}
FIXED = {
    "11-missing-f": "a reading of the code the question prints; Experiment 1's ranks measure it",
    "11-sp-traffic": "a choice whose answer no number changes",
    "11-too-few-microbatches": "a reading of torch's Schedule1F1B, which the question prints",
    "11-fastest-link": "a choice whose answer no number changes",
}


def items(p: dict) -> list[Item]:
    """The key for the numbers ``p`` (canonical: the chapter's own)."""
    one, b, t = p["layer"], p["micro_batch"], p["tp"]
    sbh = b * one["s"] * one["h"]
    elements = mp.tp_allreduce_elements(b, one["s"], one["h"])
    comm_ms = mp.tp_comm_seconds(1, one["s"], one["h"], t, NVLINK, one["L"]) * 1e3
    h_ratio, F = p["ratio_layer"]["h"], p["flops_t"] * 1e12
    ratio = mp.tp_comm_to_compute(GPUS_PER_SERVER, h_ratio, NVLINK, F)
    across = mp.tp_comm_to_compute(2 * GPUS_PER_SERVER, h_ratio, ACROSS, F)

    def act(tp, sequence_parallel=False):
        return mp.activation_bytes_per_rank(one["s"], 1, one["h"], one["a"], tp, sequence_parallel)

    sbh_one = one["s"] * one["h"]                    # b = 1 in quizzes 6 and 7
    scores = 5 * one["a"] * one["s"] ** 2            # 5as²b bytes: the scores' share, b = 1
    P, X = p["bubble_stages"], p["bubble_percent"] / 100
    il = p["interleave"]
    ip, im, iv = il["p"], il["m"], il["v"]
    fl = p["in_flight"]
    lay = p["state_layout"]
    psi_gpu = lay["psi"] / (lay["t"] * lay["p"])
    traffic = p["traffic_stages"]
    per_stage = traffic["L"] / traffic["p"]

    return [
        # Quiz 1
        Item("11-tp-elements", elements, "elements", mistakes=(
            Mistake(elements / 2, "that is forward only: backward all-reduces as many, the input "
                                  "gradients of the two column-parallel linears (Megatron's f)."),
            Mistake(BF16 * elements, "that counts bytes (2 per bf16 value): the question asks for "
                                     "elements."),
            Mistake(elements / t, "each all-reduce hands over the whole b·s·h tensor on every GPU: "
                                  "tensor parallelism splits the weights, not the tensors it "
                                  "all-reduces."),
        )),
        # Quiz 2
        Item("11-tp-ms", comm_ms, "ms", rel_tol=0.01, mistakes=(
            Mistake(comm_ms / 2, "half: either forward only (backward all-reduces as many), or "
                                 "900 GB/s, NVLink's two directions added, or 1 byte per value "
                                 "(bf16 is 2)."),
            Mistake(comm_ms * t / (t - 1), "a ring all-reduce sends 2(t−1)/t of the buffer per "
                                           "GPU, not 2 times all of it (chapter 06)."),
            Mistake(comm_ms / one["L"], f"that is one layer; the model has L = {one['L']}."),
        )),
        # Quiz 3
        Item("11-tp-ratio", ratio, "", rel_tol=0.01, mistakes=(
            Mistake(ratio * GPUS_PER_SERVER / (GPUS_PER_SERVER - 1),
                    "the ring's factor makes it t − 1, not t: each GPU sends 2(t−1)/t of each "
                    "tensor, and t·2(t−1)/t = 2(t − 1)."),
            Mistake(ratio / 2, "that uses 900 GB/s, NVLink's two directions added; a ring sends "
                               "each chunk one way, at 450 GB/s."),
            Mistake(ratio / GPUS_PER_SERVER, "each GPU computes only 1/t of the layer: compute = "
                                             "72·b·s·h²/(t·F)."),
        )),
        # Quiz 4
        Item("11-tp-nodes", across, "", rel_tol=0.01, mistakes=(
            Mistake(mp.tp_comm_to_compute(2 * GPUS_PER_SERVER, h_ratio, NVLINK, F),
                    "that is NVLink's bandwidth: a ring is as fast as its slowest hop, here the "
                    "50 GB/s between the servers."),
            Mistake(mp.tp_comm_to_compute(2 * GPUS_PER_SERVER, h_ratio, 400e9, F),
                    "400 Gb/s is bits per second: 50 GB/s."),
            Mistake(mp.tp_comm_to_compute(GPUS_PER_SERVER, h_ratio, ACROSS, F),
                    "t is 16 now: each GPU's compute halves again, its traffic does not."),
        )),
        # Quiz 5: code reading, the column-parallel linear without f.
        Item("11-missing-f", "d", "", choices=("a", "b", "c", "d"), mistakes=(
            Mistake("a", "each GPU's input gradient is only its own columns' share: without f's "
                         "all-reduce, what flows to the layers below is a partial sum."),
            Mistake("b", "forward does not change: f is the identity in forward. Experiment 1's "
                         "outputs still agree."),
            Mistake("c", "this MLP's own weight gradients come from its input, which is whole, and "
                         "from the gradient of its output, which is right: they are right. What is "
                         "wrong is the input gradient it passes down."),
        )),
        # Quiz 6
        Item("11-sp-tp-gib", act(t) / GiB, "GiB", rel_tol=0.01, mistakes=(
            Mistake(act(1) / GiB, "that is the unsplit layer, s·b·h(34 + 5as/h): t splits the 24 "
                                  "and the scores."),
            Mistake(act(t, True) / GiB, "that divides everything by t, which is sequence "
                                        "parallelism. With tensor parallelism alone the 10·s·b·h "
                                        "of LayerNorm inputs, first-linear inputs and dropout "
                                        "masks stay whole on every GPU."),
            Mistake(act(t) / GB, "that is GB (10⁹ bytes); a GiB is 2³⁰."),
        )),
        # Quiz 7
        Item("11-sp-gib", act(t, True) / GiB, "GiB", rel_tol=0.01, mistakes=(
            Mistake(act(t) / GiB, "that is tensor parallelism alone: sequence parallelism also "
                                  "splits the 10·s·b·h along the sequence."),
            Mistake((34 * sbh_one / t + scores) / GiB,
                    "the scores are split too, by heads: 5as²b/t."),
            Mistake(act(t, True) / GB, "that is GB (10⁹ bytes); a GiB is 2³⁰."),
        )),
        # Quiz 8: reasoning.
        Item("11-sp-traffic", "b", "", choices=("a", "b", "c", "d"), mistakes=(
            Mistake("a", "an all-reduce is a reduce-scatter followed by an all-gather (chapter "
                         "06): each of the two sends (t−1)/t of the tensor, together 2(t−1)/t, "
                         "the all-reduce's volume."),
            Mistake("c", "each half sends (t−1)/t of the tensor; together they send what the "
                         "all-reduce did."),
            Mistake("d", "each GPU's result is 1/t of the sequence, but it still receives the "
                         "other GPUs' (t−1)/t: the volume is the all-reduce's."),
        )),
        # Quiz 9
        Item("11-bubble-m", mp.microbatches_for_bubble(P, X), "micro-batches", mistakes=(
            Mistake(math.ceil((P - 1) / X - 1e-9), "that keeps (p−1)/m below the target: "
                                                   "Narayanan et al.'s bubble time fraction, idle "
                                                   "over useful time. The step's share is "
                                                   "(p−1)/(m+p−1)."),
            Mistake(math.ceil(P * (1 - X) / X - 1e-9), "the fill and the drain take p − 1 slots, "
                                                       "not p: (p−1)/(m+p−1)."),
        )),
        # Quiz 10
        Item("11-interleaved", mp.interleaved_bubble_fraction(ip, im, iv), "", rel_tol=0.01, mistakes=(
            Mistake(mp.interleaved_bubble_fraction(ip, im, 1), "that is without interleaving: v "
                                                               "virtual stages shrink the fill "
                                                               "and drain v times."),
            Mistake(mp.interleaved_bubble_fraction(ip, im, 1) / iv,
                    "dividing the whole step's share by v: the fill and drain shrink to "
                    "(p−1)/v slots, but the work stays m: (p−1)/(v·m + p − 1)."),
            Mistake((ip - 1) / (iv * im), "that is idle over useful time (Narayanan et al.'s "
                                          "(1/v)·(p−1)/m); the question asks for the share of "
                                          "the step."),
        )),
        # Quiz 11
        Item("11-in-flight-gb", mp.microbatches_in_flight("1F1B", fl["p"], fl["m"], 0) * fl["A"], "GB",
             rel_tol=0.01, mistakes=(
            Mistake(fl["m"] * fl["A"], "that is GPipe, all m forwards before any backward; 1F1B's "
                                       "first stage starts backward after p forwards."),
            Mistake(fl["A"], "that is the last stage, which runs each backward right after its "
                             "forward; the first stage runs p forwards ahead."),
            Mistake((fl["p"] - 1) * fl["A"], "the first stage holds p micro-batches: its p "
                                             "warm-up forwards, before the first backward "
                                             "reaches it."),
        )),
        # Quiz 12: code reading, Schedule1F1B with fewer micro-batches than stages.
        Item("11-too-few-microbatches", "b", "", choices=("a", "b", "c", "d"), mistakes=(
            Mistake("a", "torch's Schedule1F1B checks m against the stages when it is built: "
                         "\"Number of microbatches (2) must be greater than or equal to the number "
                         "of stages (4)\"."),
            Mistake("c", "nothing gets as far as a send: the constructor raises first."),
            Mistake("d", "torch does not switch schedules for you: ScheduleGPipe accepts m < p, "
                         "Schedule1F1B refuses it."),
        )),
        # Quiz 13
        Item("11-state-gb", zero_bytes_per_gpu(psi_gpu, lay["d"], 1) / GB, "GB", rel_tol=0.01, mistakes=(
            Mistake(16 * psi_gpu / GB, "that is without ZeRO: stage 1 shards the 12 bytes of "
                                       "optimizer state over the d data-parallel GPUs."),
            Mistake(16 * psi_gpu / lay["d"] / GB, "that shards all 16 bytes over the data-parallel "
                                                  "GPUs, which is ZeRO-3; stage 1 shards only the "
                                                  "optimizer state."),
            Mistake(zero_bytes_per_gpu(lay["psi"] / lay["t"], lay["d"], 1) / GB,
                    "each GPU holds 1/(t·p) of the parameters: the pipeline stages split the "
                    "layers too."),
        )),
        # Quiz 14
        Item("11-traffic-ratio", 4 * per_stage / 2, "", rel_tol=0.01, mistakes=(
            Mistake(4 * per_stage, "the next stage also sends the gradients back: 2·b·s·h per "
                                   "micro-batch crosses the boundary."),
            Mistake(4 * per_stage / 4, "backward all-reduces as much as forward: 4·b·s·h per "
                                       "layer."),
            Mistake(4 * traffic["L"] / 2, "a stage holds L/p layers, not L."),
        )),
        # Quiz 15: reasoning.
        Item("11-fastest-link", "b", "", choices=("a", "b", "c", "d"), mistakes=(
            Mistake("a", "data parallelism's traffic comes once per step and hides behind "
                         "backward (chapter 06); tensor parallelism's comes in every layer and "
                         "waits for nothing to hide it."),
            Mistake("c", "a stage sends b·s·h per micro-batch, once per stage; tensor parallelism "
                         "hands 4·b·s·h per layer (Quiz 14)."),
            Mistake("d", "they differ by orders of magnitude: compare Quiz 14's ratio, and when "
                         "each can overlap with compute."),
        )),
    ]


ITEMS = items(canonical(PARAMS))
