"""Pinned memory and a second stream (chapter 07, GPU only): a batch's host-to-device copy
overlapped with the compute, measured."""

from __future__ import annotations

import torch

from gpulab import measure
from gpulab.pipeline.loop import StandInCompute


# ------------------------------------------------------------------------------------------
# Pinned memory and a second stream (GPU only)


def copy_compute_overlap(n_bytes: int, compute_seconds: float, device: torch.device | str,
                         repeats: int = 5) -> dict | None:
    """On a GPU, measure a batch's copy and a compute step one after the other, and side by side.

    - ``serial``: a pageable copy (``non_blocking`` cannot help: the driver stages pageable memory
      through its own pinned buffer, and the call returns when the copy is done), then the step;
    - ``overlapped``: a pinned copy with ``non_blocking=True`` on a side stream while the step
      runs on the default stream; the side stream first waits for the default one (the target
      buffer must be free) and the default stream waits for the copy at the end (the next step
      reads the batch).

    The step is ``StandInCompute(compute_seconds)`` without its synchronize (a kernel of known
    length). Timing with ``measure.time_fn`` (warm-up outside the timed region, CUDA events on the
    default stream, whose last wait covers the side stream). Returns seconds: ``copy_pageable``,
    ``copy_pinned``, ``compute``, ``serial``, ``overlapped``, and the model's predictions
    ``serial_model`` = copy_pageable + compute and ``overlapped_model`` = max(copy_pinned,
    compute). Returns None on a CPU: there is no device memory and no copy engine to overlap.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return None
    pageable = torch.ones(n_bytes, dtype=torch.uint8)
    pinned = torch.ones(n_bytes, dtype=torch.uint8).pin_memory()
    target = torch.empty(n_bytes, dtype=torch.uint8, device=device)
    compute = StandInCompute(compute_seconds, device, synchronize=False)
    side = torch.cuda.Stream(device)
    main = torch.cuda.current_stream(device)

    def serial():
        target.copy_(pageable)
        compute()

    def overlapped():
        side.wait_stream(main)
        with torch.cuda.stream(side):
            target.copy_(pinned, non_blocking=True)
        compute()
        main.wait_stream(side)

    def timed(fn):
        return measure.time_fn(fn, device, warmup=2, repeats=repeats).median

    result = {"copy_pageable": timed(lambda: target.copy_(pageable)),
              "copy_pinned": timed(lambda: target.copy_(pinned, non_blocking=True)),
              "compute": timed(compute), "serial": timed(serial), "overlapped": timed(overlapped)}
    result["serial_model"] = result["copy_pageable"] + result["compute"]
    result["overlapped_model"] = max(result["copy_pinned"], result["compute"])
    return result
