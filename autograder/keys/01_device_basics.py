"""Answer key for chapter 01, device basics. Instructor side: never copied into a release.

Every expected value is computed by gpulab's tested functions from the numbers the questions
state; nothing is typed in. Each mistake is the value a typical slip produces, with the words
the learner sees when they give it.
"""
from gpulab import arith
from gpulab.arith import GB, MiB
from gpulab.course.checks import Item, Mistake
from gpulab.course.variants import Param, canonical
from gpulab.device import hardware
from gpulab.device import physical_gpu

# The numbers stated in the questions (solutions/01_device_basics, "Quiz" sections). Those in
# PARAMS are canonical values: a graded release with a course seed draws others for each student
# (gpulab.course.variants). The rest are the same for everyone (FIXED says why).
BATCH_SHAPE = (64, 3, 224, 224)          # images: batch, channels, height, width; float32
PCIE4_QUOTED = 64 * GB                   # datasheet "PCIe Gen4: 64 GB/s": both directions
PCIE4_EFFECTIVE = 25 * GB                # a pinned host-to-device copy in practice
SERVER_GPUS = 8
H200 = hardware.GPUS["H200-SXM-141GB"]
QUEUED_MATMULS = 2                       # Quiz 12: the naive call still queued + the timed one


def gpu(key: str, short: str, name: str) -> dict:
    """A GPU of gpulab.device.hardware (its cited SM count and resident threads), as Quiz 1 names it."""
    spec = hardware.GPUS[key]
    return {"short": short, "name": name, "sms": spec.sm_count, "threads": spec.max_threads_per_sm,
            "warp": spec.warp_size}


def model(n: float, text: str) -> dict:
    return {"n": n, "text": text}


def weight(name: str, rows: int, cols: int) -> dict:
    return {"name": name, "rows": rows, "cols": cols}


PARAMS = {
    "gpu": Param(gpu("H100-SXM5-80GB", "an H100", "An H100 SXM"), (
        gpu("H100-SXM5-80GB", "an H100", "An H100 SXM"), gpu("A100-SXM4-80GB", "an A100", "An A100 SXM"),
        gpu("H100-PCIe-80GB", "an H100 PCIe", "An H100 PCIe"))),
    "decode_model": Param(model(8e9, "An 8-billion-parameter"), (
        model(1e9, "A 1-billion-parameter"), model(3e9, "A 3-billion-parameter"),
        model(7e9, "A 7-billion-parameter"), model(8e9, "An 8-billion-parameter"),
        model(13e9, "A 13-billion-parameter"), model(34e9, "A 34-billion-parameter"),
        model(70e9, "A 70-billion-parameter"))),
    # One MLP projection of published models, [intermediate, hidden] (their config.json).
    "weight": Param(weight("Llama-2-7B", 11008, 4096), (
        weight("Llama-2-7B", 11008, 4096), weight("Llama-2-13B", 13824, 5120),
        weight("Llama-3-8B", 14336, 4096), weight("Llama-2-70B", 28672, 8192),
        weight("Llama-3.2-1B", 8192, 2048), weight("Llama-3.2-3B", 8192, 3072))),
    # GPUs of the 8-GPU server, two to seven of them; GPU 1 is never listed (a named slip's value).
    "visible": Param("2,3", ("2,3", "5,7", "6,0", "3,6,7", "2,4,5", "7,5,0", "0,2,3,4", "4,6,7,2",
                             "4,5,6,7,0", "3,0,6,7,2", "2,3,4,5,6,7", "5,6,7,0,2,3", "0,2,3,4,5,6,7")),
    "memcpy_gbps": Param(20, (10, 15, 20, 30, 40)),
    "dma_gbps": Param(25, (25, 50)),
}
QUESTIONS = {
    "ch01-md-09": "### Quiz 1: how many warps can {gpu[short]} keep in flight?\n\n{gpu[name]} has {gpu[sms]} "
                  "SMs; each SM holds at most {gpu[threads]} resident threads; a warp is {gpu[warp]} "
                  "threads.\nHow many warps can the whole GPU keep resident at once?",
    "ch01-md-10": "### Quiz 2: reading every weight once\n\nGenerating one *token* (a word or a piece of a word) "
                  "with a large language model reads every\nweight from HBM once. At small\nbatch sizes that read takes most of the "
                  "step's time. {decode_model[text]} model is stored in\n*bfloat16*, a 16-bit number "
                  "format (2 bytes per parameter; section 3). The H200's HBM3e delivers\n4.8 TB/s "
                  "(datasheet). How many **milliseconds** does one full read of the weights take, at\n"
                  "best?",
    "ch01-md-15": "### Quiz 5: one weight matrix\n\nOne MLP projection of a {weight[name]} layer is a weight "
                  "matrix of shape `({weight[rows]}, {weight[cols]})` in\n`bfloat16`. How many **bytes**?",
    "ch01-md-22": "### Quiz 6: which physical GPU is `cuda:1`?\n\nA job runs with `CUDA_VISIBLE_DEVICES="
                  "\"{visible}\"` on an 8-GPU server. Which **GPU index**\n(in CUDA's numbering, before any "
                  "renumbering) does `cuda:1` refer to?",
    "ch01-md-23": "### Quiz 7: what does `device_count()` say?\n\nThe same job (8-GPU server, "
                  "`CUDA_VISIBLE_DEVICES=\"{visible}\"`) calls `torch.cuda.device_count()`.\nWhat does it "
                  "return?",
    "ch01-md-29": "### Quiz 11: the cost of pageable memory\n\nSuppose a pageable copy runs its two stages one "
                  "after the other: first a CPU memory copy into the\nstaging buffer at {memcpy_gbps} GB/s, "
                  "then the DMA across PCIe at {dma_gbps} GB/s. What is the effective bandwidth\nof the "
                  "whole copy, in **GB/s**? (Hint: work out the time per byte.)",
}
# The image batch of Quizzes 3, 4, 9 and 10 is the one the chapter's experiments allocate and
# copy (their predictions); Quizzes 8 and 12 are reasoning whose answer no number changes.
FIXED = {
    "01-batch-bytes": "the batch an experiment allocates (the prediction it measures)",
    "01-batch-mib": "the same batch, in MiB",
    "01-h2d-ms": "the batch and link an experiment copies (the prediction it measures)",
    "01-batches-per-s": "the batch and link an experiment copies (the prediction it measures)",
    "01-late-visible-count": "reasoning about when CUDA reads the variable; an experiment checks it",
    "01-queued-sync-ratio": "reasoning about the queue (2T); an experiment measures it",
}


def items(p: dict) -> list[Item]:
    """The key for the numbers ``p`` (canonical: the chapter's own)."""
    GPU, VISIBLE = p["gpu"], p["visible"]
    WEIGHT_SHAPE = (p["weight"]["rows"], p["weight"]["cols"])    # bfloat16
    STAGING_MEMCPY, STAGING_DMA = p["memcpy_gbps"] * GB, p["dma_gbps"] * GB
    DECODE_PARAMS = p["decode_model"]["n"]                       # in bfloat16

    batch_bytes = arith.tensor_bytes(BATCH_SHAPE, "float32")
    batch_elements = batch_bytes // 4
    weight_bytes = arith.tensor_bytes(WEIGHT_SHAPE, "bfloat16")
    h2d_seconds = arith.transfer_seconds(batch_bytes, PCIE4_EFFECTIVE)
    staged_seconds_per_byte = 1 / STAGING_MEMCPY + 1 / STAGING_DMA
    read_bytes = DECODE_PARAMS * arith.bytes_per_element("bfloat16")
    first_listed = int(VISIBLE.split(",")[0])

    return [
        Item("01-batch-bytes", batch_bytes, "bytes", mistakes=(
            Mistake(batch_bytes * 8, "8x too large: you counted bits. A float32 value is 4 bytes = 32 bits."),
            Mistake(batch_elements, "4x too small: that is the number of elements. Multiply by the 4 bytes each float32 value takes."),
            Mistake(batch_elements * 2, "2x too small: float32 takes 4 bytes per value, not 2 (that is bfloat16/float16)."),
        )),
        Item("01-batch-mib", batch_bytes / MiB, "MiB", rel_tol=0.005, mistakes=(
            Mistake(batch_bytes / 1e6, "you divided by 10^6, which gives MB. A MiB is 2^20 = 1,048,576 bytes."),
            Mistake(batch_bytes / 2**30, "that is GiB; the question asks for MiB (2^20 bytes)."),
        )),
        Item("01-bf16-weight-bytes", weight_bytes, "bytes", mistakes=(
            Mistake(weight_bytes * 2, "2x too large: bfloat16 is 2 bytes per value; 4 is float32."),
            Mistake(weight_bytes / 2, "2x too small: that is the number of values. Multiply by 2 bytes per bfloat16 value."),
        )),
        Item("01-h2d-ms", h2d_seconds * 1e3, "ms", rel_tol=0.01, mistakes=(
            Mistake(arith.transfer_seconds(batch_bytes, PCIE4_QUOTED) * 1e3,
                    "too fast: 64 GB/s is the datasheet figure for both directions together and before "
                    "protocol overhead. Use the effective 25 GB/s."),
            Mistake(arith.transfer_seconds(batch_bytes, PCIE4_QUOTED / 2) * 1e3,
                    "too fast: 32 GB/s is the raw one-direction rate; a real copy reaches about 25 GB/s."),
            Mistake(h2d_seconds, "1000x too small: that is seconds; the question asks for milliseconds."),
        )),
        Item("01-batches-per-s", arith.batches_per_second(batch_bytes, PCIE4_EFFECTIVE), "batches/s",
             rel_tol=0.01, mistakes=(
            Mistake(arith.batches_per_second(batch_bytes, PCIE4_QUOTED),
                    "too many: 64 GB/s counts both directions before overhead; one direction delivers ~25 GB/s."),
            Mistake(1 / arith.batches_per_second(batch_bytes, PCIE4_EFFECTIVE),
                    "that is seconds per batch; the question asks for batches per second (its inverse)."),
        )),
        Item("01-pageable-gbps", 1 / staged_seconds_per_byte / GB, "GB/s", rel_tol=0.01, mistakes=(
            Mistake((STAGING_MEMCPY + STAGING_DMA) / 2 / GB,
                    "you averaged the two bandwidths. One after the other, their *times* add: "
                    "1/B = 1/B1 + 1/B2."),
            Mistake(min(STAGING_MEMCPY, STAGING_DMA) / GB,
                    "the slower stage alone sets the rate only when the stages overlap; here they run "
                    "one after the other, so their times add."),
            Mistake((STAGING_MEMCPY + STAGING_DMA) / GB,
                    "adding bandwidths is right for links working in parallel; these stages run in series."),
        )),
        Item("01-visible-physical", physical_gpu(VISIBLE, 1), "", mistakes=(
            Mistake(1, "the CUDA runtime renumbers the visible GPUs from 0 in the order CUDA_VISIBLE_DEVICES "
                       "lists them, so cuda:1 is the second GPU listed, not GPU 1 of the server."),
            Mistake(first_listed, "that is cuda:0, the first GPU listed. cuda:1 is the second one."),
        )),
        # Quiz 8 (reasoning): CUDA read CUDA_VISIBLE_DEVICES (unset: all 8) when the first tensor was
        # created on the GPU; hiding every GPU afterwards changes nothing. torch 2.13 then answers
        # device_count() from CUDA (torch/cuda/__init__.py); torch before pytorch/pytorch#175355
        # asked NVML on the first call after init and said 0, which is why the question names 2.13.
        Item("01-late-visible-count", SERVER_GPUS, "GPUs", mistakes=(
            Mistake(0, "that is what \"\" does when it is set before CUDA starts. Here the tensor on "
                       "the GPU had already started CUDA, which read the variable then (unset: all 8 "
                       "GPUs) and never reads it again; torch 2.13 asks CUDA for the count. (Torch "
                       "releases before pytorch/pytorch#175355 did say 0 here, from NVML, while CUDA "
                       "still used all 8 GPUs.)"),
            Mistake(1, "\"\" hides GPUs only if set before CUDA starts, and it would hide all of them, "
                       "not leave one. Here CUDA had already started with all 8 visible."),
        )),
        # Quiz 12 (reasoning): synchronize() waits for everything queued, the naive matmul included.
        Item("01-queued-sync-ratio", QUEUED_MATMULS, "x T", rel_tol=0.05, mistakes=(
            Mistake(1, "that is what a clock started from an empty queue reads. Here the naive "
                       "matmul was only queued when its timer stopped, so it may still run when the "
                       "second clock starts: synchronize() waits for it too, about 2T in all."),
            Mistake(0, "the second timing synchronises before stopping the clock, so it cannot be "
                       "near zero: it includes every matmul still in the queue."),
        )),
        Item("01-visible-count", len(VISIBLE.split(",")), "GPUs", mistakes=(
            Mistake(SERVER_GPUS, "CUDA_VISIBLE_DEVICES hides the unlisted GPUs from the process: "
                                 "device_count() counts only the listed ones."),
        )),
        Item("01-resident-warps", arith.resident_warps(GPU["sms"], GPU["threads"], GPU["warp"]), "warps",
             mistakes=(
            Mistake(GPU["sms"] * GPU["threads"],
                    "32x too large: that counts threads. A warp is 32 threads."),
            Mistake(GPU["threads"] // GPU["warp"],
                    f"that is the warps of one SM; the {GPU['name'][3:]} has {GPU['sms']} SMs."),
        )),
        # 5%: a bound "at best", accepted as a two-figure answer (3.3 for 3.33 ms, 1.2 for 1.25,
        # 14 for 14.2); the slips are factors of 2 away.
        Item("01-h200-read-ms", arith.transfer_seconds(read_bytes, H200.memory_bandwidth) * 1e3, "ms",
             rel_tol=0.05, mistakes=(
            Mistake(arith.transfer_seconds(DECODE_PARAMS * 4, H200.memory_bandwidth) * 1e3,
                    "2x too slow: the weights are bfloat16, 2 bytes each, not 4."),
            Mistake(arith.transfer_seconds(DECODE_PARAMS, H200.memory_bandwidth) * 1e3,
                    "2x too fast: each bfloat16 parameter is 2 bytes; you read 1 byte per parameter."),
        )),
    ]


ITEMS = items(canonical(PARAMS))
