"""Peak memory of a training step, measured the same way on a CPU and on a GPU (chapter 02).

On CUDA the caching allocator keeps count: ``torch.cuda.max_memory_allocated()``. A CPU has no
such counter (and ``torch.cuda.max_memory_allocated()`` quietly returns 0 on a CPU-only build), so
``StorageTracker`` keeps one itself. It sits under autograd as a ``TorchDispatchMode`` and sees
every operation with its outputs:

- each output with a storage it has not seen before is a new allocation: add its bytes, rounded
  up to a multiple of 512 as the CUDA caching allocator does (PyTorch docs, "CUDA semantics");
- outputs that share a storage with an input (views, in-place ops) are not new: counting them
  would count a matmul's forward + backward two or three times over;
- a weakref finaliser on each storage subtracts its bytes when the storage is freed;
- the highest total seen is the peak.

Storages are also sorted into categories, so that the peak comes with a breakdown: tensors the
caller names up front (``resident``: parameters, buffers, optimizer state, the batch), tensors
autograd saves for backward (a ``saved_tensors_hooks`` pack hook: the activations), parameters'
gradients (a post-accumulate-grad hook), and everything else (temporaries). With activation
checkpointing, what a block saves when it is recomputed during backward shows as temporaries.

The same tracker runs under ``FakeTensorMode``, where tensors have shapes and dtypes but no
data: a 7B-parameter step is sized in seconds without allocating it. Blind spot: scratch memory
a kernel allocates internally (convolutions, fused attention) is not a tensor and is not seen.
``TorchDispatchMode`` and ``FakeTensorMode`` are private PyTorch APIs (tested with torch 2.13).
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from gpulab.arith import allocator_bytes
from gpulab.device import best_device
from gpulab.models import GPT, GPTConfig

CATEGORIES = ("params", "buffers", "grads", "optimizer", "inputs", "activations", "temporaries")


@dataclass(frozen=True)
class MemoryPeak:
    """Peak memory of one call, in bytes.

    ``peak``: bytes alive at the highest point, resident tensors included. On CUDA it comes from
    the allocator (``max_memory_allocated`` above a warm baseline, plus the resident tensors); on
    a CPU from the storage tracker. ``breakdown``: the tracker's bytes per category at its peak.
    ``highest``: the most each category held at any time (for ``activations``: all that forward
    saved, before backward frees any). ``end``: bytes alive when the call returned (tracker).
    ``tracked_peak``: the tracker's own peak (equal to ``peak`` on a CPU; on CUDA the two should
    agree within about 1%). ``requested_peak``: CUDA only, the same peak from the allocator's
    ``requested_bytes`` (sizes as asked for: no rounding, no cached block reused whole).
    ``timeline``: (op name, bytes alive) after each op, if recorded.
    """

    peak: int
    breakdown: dict[str, int]
    highest: dict[str, int]
    end: int
    device: str
    method: str
    tracked_peak: int
    requested_peak: int | None = None
    timeline: list[tuple[str, int]] = field(default_factory=list, repr=False)

    def __str__(self) -> str:
        parts = ", ".join(f"{k} {v / 2**20:.2f}" for k, v in self.breakdown.items() if v)
        return f"peak {self.peak / 2**20:.2f} MiB on {self.device} ({self.method}): {parts} MiB"


# The CUDA caching allocator's size rules, default settings (PyTorch,
# c10/cuda/CUDACachingAllocator.cpp: kSmallSize, kLargeBuffer, kMinLargeAlloc, kRoundLarge;
# PyTorch docs, "CUDA semantics: memory management"). Chapter 01, Experiment 1.
SMALL_REQUEST = 2**20          # up to 1 MiB: the small pool (2 MiB segments)
MID_SEGMENT = 20 * 2**20       # 1-10 MiB: a 20 MiB segment
LARGE_REQUEST = 10 * 2**20     # above 10 MiB: a segment of the request rounded up to 2 MiB
LARGE_ROUNDING = 2 * 2**20


def cuda_block_bytes(nbytes: int) -> int:
    """Bytes ``torch.cuda.memory_allocated()`` counts for one tensor of ``nbytes`` when the
    allocator takes a fresh segment for it (nothing cached fits, as for a first tensor of its size).

    The request is rounded up to 512 bytes (``arith.allocator_bytes``). The allocator cuts the
    tensor's block out of its segment only when enough is left over to be worth keeping: 512 bytes
    in the small pool, but MORE THAN 1 MiB in the large pool. Otherwise the tensor gets the whole
    segment, and the whole segment counts as allocated: a 73.5 MiB tensor in a 74 MiB segment
    counts 74 MiB. (A tensor that reuses a larger cached block is split as long as more than 1 MiB
    remains, so the figure also depends on what was freed before.)
    """
    block = allocator_bytes(nbytes)
    if block <= SMALL_REQUEST:
        return block
    if block < LARGE_REQUEST:
        segment = MID_SEGMENT
    else:
        segment = -(-block // LARGE_ROUNDING) * LARGE_ROUNDING
    return block if segment - block > SMALL_REQUEST else segment


@dataclass(frozen=True)
class Allocation:
    """What one tensor costs the allocator, in bytes: ``requested`` (the size asked for) and
    ``allocated`` (the size of the block it got, as ``memory_allocated()`` counts it)."""

    requested: int
    allocated: int
    device: str


def _cuda_stat(device, name: str) -> int:
    """One counter of the CUDA allocator; 0 before its first allocation (the dict is empty then)."""
    return torch.cuda.memory_stats(device).get(name, 0)


def allocation(make_tensor, device) -> Allocation:
    """Allocate ``make_tensor()`` on ``device`` and read what the allocator counts for it.

    CUDA: the changes in ``requested_bytes.all.current`` (sizes as asked for) and
    ``allocated_bytes.all.current`` (= ``memory_allocated()``: whole blocks, see
    ``cuda_block_bytes``). CPU: PyTorch keeps no allocation counter, so both are the size of the
    tensor's storage, which is the formula shape x bytes per element by construction, not an
    independent measurement. Chapter 01, Experiment 1.
    """
    device = torch.device(device)
    if device.type != "cuda":
        nbytes = make_tensor().untyped_storage().nbytes()
        return Allocation(nbytes, nbytes, str(device))
    requested = _cuda_stat(device, "requested_bytes.all.current")
    allocated = _cuda_stat(device, "allocated_bytes.all.current")
    tensor = make_tensor()
    result = Allocation(_cuda_stat(device, "requested_bytes.all.current") - requested,
                        _cuda_stat(device, "allocated_bytes.all.current") - allocated, str(device))
    del tensor
    return result


class StorageTracker(TorchDispatchMode):
    """Bytes of live storages on one device type, by category, and their peak (see the module
    docstring)."""

    def __init__(self, resident: dict[str, list[torch.Tensor]] | None = None,
                 record: bool = False, device: torch.device | str = "cpu"):
        super().__init__()
        self.device_type = torch.device(device).type
        self.live: dict[int, list] = {}   # id(storage) -> [bytes, category, its finaliser]
        self.totals = dict.fromkeys(CATEGORIES, 0)
        self.current = self.peak = 0
        self.peak_breakdown, self.highest = dict(self.totals), dict(self.totals)
        self.timeline: list[tuple[str, int]] | None = [] if record else None
        for category, tensors in (resident or {}).items():
            for t in tensors:
                self._add(t.untyped_storage(), category)

    def _add(self, storage, category: str) -> None:
        key = id(storage)
        if key in self.live:
            return
        nbytes = allocator_bytes(storage.nbytes())
        self.live[key] = [nbytes, category, weakref.finalize(storage, self._free, key)]
        self.totals[category] += nbytes
        self.highest[category] = max(self.highest[category], self.totals[category])
        self.current += nbytes
        if self.current > self.peak:
            self.peak, self.peak_breakdown = self.current, dict(self.totals)

    def _free(self, key: int) -> None:
        nbytes, category, _ = self.live.pop(key)
        self.totals[category] -= nbytes
        self.current -= nbytes

    def close(self) -> None:
        """Stop following the storages still alive (their finalisers would keep this alive)."""
        for _, _, finaliser in self.live.values():
            finaliser.detach()
        self.live.clear()

    def reclassify(self, tensor: torch.Tensor, category: str) -> None:
        """Move a temporary's storage into ``category`` (an activation, a gradient)."""
        entry = self.live.get(id(tensor.untyped_storage()))
        if entry is not None and entry[1] == "temporaries":
            self.totals["temporaries"] -= entry[0]
            self.totals[category] += entry[0]
            self.highest[category] = max(self.highest[category], self.totals[category])
            entry[1] = category

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {id(t.untyped_storage()) for t in tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type == self.device_type:
                storage = t.untyped_storage()
                if id(storage) not in inputs:        # a view or an in-place result is not new
                    self._add(storage, "temporaries")
        if self.timeline is not None:
            self.timeline.append((str(func.overloadpacket.__name__), self.current))
        return out


@contextlib.contextmanager
def _category_hooks(tracker: StorageTracker, model: torch.nn.Module | None):
    """Tell the tracker which storages autograd saves and which become gradients."""
    def pack(t):
        tracker.reclassify(t, "activations")
        return t

    handles = []
    if model is not None:
        for p in model.parameters():
            if p.requires_grad:
                handles.append(p.register_post_accumulate_grad_hook(
                    lambda p: tracker.reclassify(p.grad, "grads")))
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield
    finally:
        for h in handles:
            h.remove()


def _resident(model, optimizer, inputs, device) -> dict[str, list[torch.Tensor]]:
    """Tensors alive before the call, by category, on ``device`` only (on CUDA, AdamW foreach
    keeps its step counters on the CPU, where they cost no GPU memory)."""
    params = list(model.parameters()) if model is not None else []
    state = optimizer.state.values() if optimizer is not None else []
    found = {"params": params,
             "buffers": list(model.buffers()) if model is not None else [],
             "grads": [p.grad for p in params if p.grad is not None],
             "optimizer": [t for s in state for t in s.values() if isinstance(t, torch.Tensor)],
             "inputs": list(inputs)}
    return {k: [t for t in v if t.device.type == device.type] for k, v in found.items()}


def peak_memory(fn, device=None, *, model=None, optimizer=None, inputs=(),
                record: bool = False) -> MemoryPeak:
    """Run ``fn()`` once and measure its peak memory, counting ``model``'s parameters and
    buffers, their gradients, ``optimizer``'s state and the ``inputs`` tensors as alive
    throughout (they are named so the breakdown can sort them; pass none to measure only what
    ``fn`` allocates).

    CPU (or fake tensors): the storage tracker. CUDA: ``max_memory_allocated()`` above the
    allocated bytes before the call, plus the resident tensors; run a warm-up call first (it
    creates optimizer state and cuBLAS workspaces, which would otherwise count). The tracker runs
    alongside for the breakdown. The allocator counts whole blocks, so on CUDA ``peak`` can exceed
    the tracker's 512-byte-rounded count by up to 1 MiB per large tensor that was handed a block
    it could not split (``cuda_block_bytes``); ``requested_peak`` has no rounding at all. NOTE: the CUDA branch follows PyTorch's docs and this project's
    CPU findings but has not yet been run on a GPU.
    """
    if device is None:
        found = next(iter(model.parameters()), None) if model is not None else None
        device = found.device if found is not None else torch.device("cpu")
    device = torch.device(device)
    tracker = StorageTracker(_resident(model, optimizer, inputs, device), record, device)
    resident = tracker.current
    on_cuda = device.type == "cuda"
    requested = None
    if on_cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        baseline = torch.cuda.memory_allocated(device)
        requested_baseline = _cuda_stat(device, "requested_bytes.all.current")
    with _category_hooks(tracker, model), tracker:
        fn()
    if on_cuda:
        torch.cuda.synchronize(device)
        peak = resident + torch.cuda.max_memory_allocated(device) - baseline
        requested = (resident + _cuda_stat(device, "requested_bytes.all.peak")
                     - requested_baseline)
        method = "CUDA allocator, max_memory_allocated above a warm baseline"
    else:
        peak, method = tracker.peak, "storage tracker (TorchDispatchMode, 512-byte rounding)"
    result = MemoryPeak(peak, tracker.peak_breakdown, dict(tracker.highest), tracker.current,
                        str(device), method, tracker.peak, requested, tracker.timeline or [])
    tracker.close()
    return result


# ------------------------------------------------------------------------------------------
# One training step of gpulab.models.GPT

OPTIMIZERS = ("sgd", "adamw", "adamw_fused")


def make_optimizer(model: torch.nn.Module, name: str, lr: float = 1e-3):
    """The optimizers chapter 02 predicts, each with its implementation named explicitly so that
    a CPU and a GPU run the same code (the defaults differ: a per-parameter loop on CPU,
    ``foreach`` on CUDA, and the memory differs with them):

    - ``sgd``: plain SGD, no momentum: no state, updates in place.
    - ``adamw``: AdamW, ``foreach=True`` (CUDA's default): two moments per parameter, and during
      ``step()`` one temporary the size of all parameters (``exp_avg_sq_sqrt``).
    - ``adamw_fused``: AdamW, ``fused=True``: the same state, updated in place, no temporary.
    """
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr, foreach=True)
    if name == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=lr, foreach=True)
    if name == "adamw_fused":
        return torch.optim.AdamW(model.parameters(), lr=lr, fused=True)
    raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}; got {name!r}")


def train_step(model: GPT, optimizer, idx: torch.Tensor, targets: torch.Tensor,
               micro_batches: int = 1) -> None:
    """Forward, backward, update, clear the gradients. The logits are dropped at once: holding
    them (``logits, loss = model(...)``) would keep b·s·V more values alive through backward.

    ``micro_batches`` = k > 1: gradient accumulation (chapter 05). The batch is split into k
    equal parts, each forward + backward with its loss scaled by 1/k, gradients summing in
    ``.grad``; one optimizer step at the end. Activations shrink with the micro-batch, but the
    gradients, created by the first backward, stay alive through all the later ones.
    """
    if micro_batches == 1:
        model(idx, targets)[1].backward()
    else:
        if len(idx) % micro_batches:
            raise ValueError(f"a batch of {len(idx)} does not split into {micro_batches} "
                             f"equal micro-batches")
        size = len(idx) // micro_batches
        for x, y in zip(idx.split(size), targets.split(size)):
            (model(x, y)[1] / micro_batches).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _create_optimizer_state(model: torch.nn.Module, optimizer) -> None:
    """The optimizer's first update, on zero gradients: it creates the state a first training
    step would (AdamW's moments and step counters, sized like the parameters) without running
    that step's forward and backward."""
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def training_step_peak(config: GPTConfig, batch_size: int, seq_len: int,
                       dtype: torch.dtype = torch.float32, optimizer: str = "adamw",
                       checkpointing: bool | int = False, device=None, fake: bool = False,
                       record: bool = False, micro_batches: int = 1) -> MemoryPeak:
    """Measured peak of a steady-state training step of ``GPT(config)``: a first step creates the
    optimizer's state, the second is measured (on a CPU or fake tensors the first is only the
    optimizer's update on zero gradients: it leaves the same state, for half the work). Everything alive at the peak counts: parameters,
    buffers, optimizer state, the batch (``idx`` and ``targets``, int64), activations, gradients,
    temporaries. Returns a ``MemoryPeak``; ``.peak`` is the number in bytes. ``checkpointing``:
    False, True (every block) or k, segments of k blocks (``GPT``; chapter 05).
    ``micro_batches``: split the batch into that many micro-batches and accumulate their
    gradients (``train_step``; chapter 05); ``batch_size`` stays the whole batch.

    ``device``: where to run; by default ``gpulab.device.best_device()`` (the GPU path follows
    the project's notes on measuring memory but has not yet been run on a GPU). ``fake=True``
    builds and runs everything under ``FakeTensorMode`` on the CPU, without data, so a config
    too large for this machine is sized without being allocated (7B: a few seconds).
    """
    device = torch.device(device) if device is not None else best_device()
    fake_mode = contextlib.nullcontext()
    if fake:
        from torch._subclasses.fake_tensor import FakeTensorMode
        fake_mode, device = FakeTensorMode(), torch.device("cpu")
    with fake_mode:
        torch.manual_seed(0)
        model = GPT(config, dtype=dtype, device=device, checkpointing=checkpointing)
        opt = make_optimizer(model, optimizer)
        idx = torch.randint(config.vocab_size, (batch_size, seq_len), device=device)
        targets = torch.randint(config.vocab_size, (batch_size, seq_len), device=device)
        def step():
            train_step(model, opt, idx, targets, micro_batches)

        if device.type == "cuda":
            step()                 # warm-up: optimizer state, cuBLAS workspaces, cached blocks
        else:
            _create_optimizer_state(model, opt)   # all a warm-up leaves on a CPU or fake tensors
        return peak_memory(step, device, model=model, optimizer=opt, inputs=(idx, targets),
                           record=record)
