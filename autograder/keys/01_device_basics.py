"""Answer key for chapter 01, device basics. Instructor side: never copied into a release.

Every expected value is computed by gpulab's tested functions from the numbers the questions
state; nothing is typed in. Each mistake is the value a typical slip produces, with the words
the learner sees when they give it.
"""
from gpulab import arith, hardware
from gpulab.arith import GB, MiB
from gpulab.checks import Item, Mistake
from gpulab.device import physical_gpu

# The numbers stated in the questions (solutions/01_device_basics, "Quiz" sections).
BATCH_SHAPE = (64, 3, 224, 224)          # images: batch, channels, height, width; float32
WEIGHT_SHAPE = (11008, 4096)             # one MLP projection of a 7B Llama layer; bfloat16
PCIE4_QUOTED = 64 * GB                   # datasheet "PCIe Gen4: 64 GB/s": both directions
PCIE4_EFFECTIVE = 25 * GB                # a pinned host-to-device copy in practice
STAGING_MEMCPY, STAGING_DMA = 20 * GB, 25 * GB
VISIBLE, SERVER_GPUS = "2,3", 8
H100 = hardware.GPUS["H100-SXM5-80GB"]
H200 = hardware.GPUS["H200-SXM-141GB"]
DECODE_PARAMS = 8e9                      # an 8B-parameter model in bfloat16
QUEUED_MATMULS = 2                       # Quiz 12: the naive call still queued + the timed one

batch_bytes = arith.tensor_bytes(BATCH_SHAPE, "float32")
batch_elements = batch_bytes // 4
weight_bytes = arith.tensor_bytes(WEIGHT_SHAPE, "bfloat16")
h2d_seconds = arith.transfer_seconds(batch_bytes, PCIE4_EFFECTIVE)
staged_seconds_per_byte = 1 / STAGING_MEMCPY + 1 / STAGING_DMA
read_bytes = DECODE_PARAMS * arith.bytes_per_element("bfloat16")

ITEMS = [
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
        Mistake(1, "torch renumbers the visible GPUs from 0 in the order CUDA_VISIBLE_DEVICES lists "
                   "them, so cuda:1 is the second GPU listed, not physical GPU 1."),
        Mistake(2, "that is cuda:0, the first GPU listed. cuda:1 is the second one."),
    )),
    # Quiz 8 (reasoning): CUDA read CUDA_VISIBLE_DEVICES (unset: all 8) when the first tensor was
    # created on the GPU; hiding every GPU afterwards changes nothing.
    Item("01-late-visible-count", SERVER_GPUS, "GPUs", mistakes=(
        Mistake(0, "that is what \"\" does when it is set before CUDA starts. Here the tensor on "
                   "the GPU had already started CUDA, which read the variable then (unset: all 8 "
                   "GPUs) and never reads it again."),
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
    Item("01-resident-warps", arith.resident_warps(H100.sm_count, H100.max_threads_per_sm,
                                                   H100.warp_size), "warps", mistakes=(
        Mistake(H100.sm_count * H100.max_threads_per_sm,
                "32x too large: that counts threads. A warp is 32 threads."),
        Mistake(H100.max_threads_per_sm // H100.warp_size,
                "that is the warps of one SM; the H100 SXM has 132 SMs."),
    )),
    Item("01-h200-read-ms", arith.transfer_seconds(read_bytes, H200.memory_bandwidth) * 1e3, "ms",
         rel_tol=0.01, mistakes=(
        Mistake(arith.transfer_seconds(DECODE_PARAMS * 4, H200.memory_bandwidth) * 1e3,
                "2x too slow: the weights are bfloat16, 2 bytes each, not 4."),
        Mistake(arith.transfer_seconds(DECODE_PARAMS, H200.memory_bandwidth) * 1e3,
                "2x too fast: each bfloat16 parameter is 2 bytes; you read 1 byte per parameter."),
    )),
]
