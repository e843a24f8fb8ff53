"""Count what a rank hands to collectives and sends point to point, in elements (chapter 11).

    with CollectiveCounter() as counted:
        loss = model(x).sum(); loss.backward()
    counted.totals()      # {"all_reduce": (calls, elements), ...}

How it sees them: every collective and send of ``torch.distributed`` reaches PyTorch's dispatcher
as an operator (``c10d::allreduce_`` for ``dist.all_reduce``, ``c10d::send`` for a send,
``_c10d_functional::all_reduce`` for the collectives DTensor and ``parallelize_module`` issue),
and a ``TorchDispatchMode`` sees every operator that runs while it is active, backward included
(autograd runs backward's operators through the same dispatcher). Read from torch 2.13's
operator schemas (``torch.ops.c10d.*``, ``torch.ops._c10d_functional.*``); ``TorchDispatchMode``
is a private API (chapter 02's memory tracker uses it too).

Sizes follow chapter 06 (nccl-tests' convention): an all-reduce counts its buffer, an all-gather
its gathered result, a reduce-scatter its full input, a send or a receive its tensor. So a
tensor-parallel all-reduce of the b·s·h activations counts b·s·h, whatever the ranks.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


def _numel(tensors) -> int:
    return sum(t.numel() for t in tree_leaves(tensors) if isinstance(t, torch.Tensor))


# operator name -> (the collective it is, the elements it counts, from its arguments)
SIZES = {
    "c10d.allreduce_": ("all_reduce", lambda args: _numel(args[0])),
    "_c10d_functional.all_reduce": ("all_reduce", lambda args: _numel(args[0])),
    "_c10d_functional.all_reduce_": ("all_reduce", lambda args: _numel(args[0])),
    "c10d._allgather_base_": ("all_gather", lambda args: _numel(args[0])),           # the output
    "c10d.allgather_": ("all_gather", lambda args: _numel(args[0])),                 # the outputs
    "_c10d_functional.all_gather_into_tensor": ("all_gather", lambda args: _numel(args[0]) * args[1]),
    "c10d._reduce_scatter_base_": ("reduce_scatter", lambda args: _numel(args[1])),  # the input
    "_c10d_functional.reduce_scatter_tensor": ("reduce_scatter", lambda args: _numel(args[0])),
    "c10d.send": ("send", lambda args: _numel(args[0])),
    "c10d.recv_": ("recv", lambda args: _numel(args[0])),
}


class CollectiveCounter(TorchDispatchMode):
    """Inside ``with``: every collective and point-to-point transfer this rank runs, as
    (collective, elements) in ``records``, in the order they ran (see the module docstring)."""

    def __init__(self):
        super().__init__()
        self.records: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if name in SIZES:
            kind, size = SIZES[name]
            self.records.append((kind, size(args)))
        return func(*args, **(kwargs or {}))

    def totals(self) -> dict[str, tuple[int, int]]:
        """{collective: (calls, elements)}, for those that ran."""
        calls, elements = Counter(), Counter()
        for kind, n in self.records:
            calls[kind] += 1
            elements[kind] += n
        return {kind: (calls[kind], elements[kind]) for kind in calls}

    def elements(self, kind: str) -> int:
        """Elements of all the ``kind`` collectives together (0 if none ran)."""
        return sum(n for k, n in self.records if k == kind)
