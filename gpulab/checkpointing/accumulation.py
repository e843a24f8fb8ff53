"""Gradient accumulation: a big batch's gradient from several small ones (chapter 05).

The gradient of a mean is the mean of the gradients. Split a batch of B samples into k equal
micro-batches, run forward and backward on each with its loss divided by k, let autograd sum
the gradients in ``.grad``, and step once: the result is the full batch's gradient, up to float
rounding, with the activations of B/k samples alive at a time (``gpulab.arith.global_batch``,
``accumulation_steps``, ``largest_micro_batch``).

"Up to rounding" holds only when every micro-batch's loss is a mean over the same number of
items. Two common cases break it:

- Token losses with padding (``ignore_index=-100``): each micro-batch's loss is a mean over its
  own valid tokens, so a micro-batch of 8 tokens weighs as much as one of 64. The fix:
  sum the token losses and divide by the valid tokens of the whole batch
  (``token_weighted_gradients``). With data parallelism, that count is over all ranks too.
- BatchNorm: its statistics are computed per micro-batch, so the function itself changes
  (``batchnorm_example``). LayerNorm, which normalises each sample on its own, does not.

Each function returns gradients as {parameter name: tensor}, cloned, and leaves the model's
``.grad`` cleared (None), so calls can be compared side by side.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpulab.arith import check_positive_integers
from gpulab.models import GPT, GPTConfig

IGNORE_INDEX = -100   # F.cross_entropy's default: targets equal to it are padding, not counted


def gpt_loss(model: GPT, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The course GPT's own loss: mean cross-entropy over the valid (not -100) targets."""
    return model(idx, targets)[1]


def summed_token_loss(model: GPT, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The same cross-entropy, summed over the valid targets instead of averaged."""
    logits = model(idx)[0]                                              # (B, T, V)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX,
                           reduction="sum")


def _split(tensor: torch.Tensor, micro_batches: int) -> tuple[torch.Tensor, ...]:
    check_positive_integers(micro_batches=micro_batches)
    if len(tensor) % micro_batches:
        raise ValueError(f"a batch of {len(tensor)} does not split into {micro_batches} equal "
                         f"micro-batches")
    return tensor.split(len(tensor) // micro_batches)


def _take_gradients(model: nn.Module) -> dict[str, torch.Tensor]:
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


def accumulated_gradients(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
                          micro_batches: int, loss_fn=None,
                          loss_factor: float | None = None) -> dict[str, torch.Tensor]:
    """Gradients accumulated over ``micro_batches`` equal parts of the batch, each part's loss
    multiplied by ``loss_factor`` (by default 1/``micro_batches``): the usual accumulation loop,
    without the optimizer step.

    ``loss_fn(model, inputs, targets)`` returns a micro-batch's mean loss; by default
    ``gpt_loss``. Gradients already in the model are cleared first.
    """
    loss_fn = loss_fn if loss_fn is not None else gpt_loss
    loss_factor = 1 / micro_batches if loss_factor is None else loss_factor
    model.zero_grad(set_to_none=True)
    for x, y in zip(_split(inputs, micro_batches), _split(targets, micro_batches)):
        (loss_fn(model, x, y) * loss_factor).backward()      # .grad += this part's gradient
    return _take_gradients(model)


def train_step(model, optimizer, micro_batches, max_norm: float = 1.0) -> torch.Tensor:
    """One optimizer step of plain gradient accumulation on one GPU, as chapter 05's "In your
    training script" prints it (tests/test_checkpointing.py keeps the two the same): each
    micro-batch's mean loss over k, gradients summed in ``.grad``, then clipping, the step and
    the reset once, at the boundary. ``micro_batches``: [(inputs, targets), ...] of equal size.
    Returns the gradient norm before clipping, that of the whole global batch's gradient."""
    k = len(micro_batches)
    for x, y in micro_batches:
        loss = model(x, y)[1]                    # this micro-batch's mean loss
        (loss / k).backward()                    # .grad += its share of the gradient
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)   # once, on the sum
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norm


def full_batch_gradients(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
                         loss_fn=None) -> dict[str, torch.Tensor]:
    """The reference: one forward and backward over the whole batch."""
    return accumulated_gradients(model, inputs, targets, 1, loss_fn)


def token_weighted_gradients(model: GPT, idx: torch.Tensor, targets: torch.Tensor,
                             micro_batches: int) -> dict[str, torch.Tensor]:
    """The fix for uneven token counts: each micro-batch's summed token loss divided by the
    number of valid tokens in the whole batch, so every token weighs the same, as in the
    full batch's mean. (Count the tokens before the loop; with data parallelism, all-reduce
    the count across ranks.)"""
    n_valid = (targets != IGNORE_INDEX).sum()
    model.zero_grad(set_to_none=True)
    for x, y in zip(_split(idx, micro_batches), _split(targets, micro_batches)):
        (summed_token_loss(model, x, y) / n_valid).backward()
    return _take_gradients(model)


def max_abs_difference(grads: dict[str, torch.Tensor],
                       reference: dict[str, torch.Tensor]) -> float:
    """Largest |difference| between two sets of gradients, over every parameter."""
    if grads.keys() != reference.keys():
        raise ValueError("the two sets of gradients cover different parameters")
    return max((grads[name] - reference[name]).abs().max().item() for name in reference)


# ------------------------------------------------------------------------------------------
# When accumulation is not the full batch

SMALL_GPT = GPTConfig(vocab_size=256, block_size=64, n_layer=2, n_head=4, n_embd=64)


def padded_batch(config: GPTConfig, valid_tokens: list[int], seq_len: int,
                 seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of ``len(valid_tokens)`` random sequences whose targets are padding (-100)
    after the first ``valid_tokens[row]`` positions (right padding)."""
    generator = torch.Generator().manual_seed(seed)
    shape = (len(valid_tokens), seq_len)
    idx = torch.randint(config.vocab_size, shape, generator=generator)
    targets = torch.randint(config.vocab_size, shape, generator=generator)
    positions = torch.arange(seq_len)                                   # (T,)
    padding = positions >= torch.tensor(valid_tokens).unsqueeze(1)      # (B, T)
    return idx, targets.masked_fill(padding, IGNORE_INDEX)


def loss_factor_example(config: GPTConfig = SMALL_GPT, seq_len: int = 32,
                        micro_batches: int = 4, loss_factor: float | None = None,
                        seed: int = 0) -> dict:
    """Which factor on each micro-batch's mean loss gives the full batch's gradient? Measured.

    Accumulates the course GPT's gradients over ``micro_batches`` equal micro-batches (2 rows
    each) with no factor, and finds the one number c that best turns that sum into the full
    batch's gradient g: c = <sum, g> / <sum, sum> (least squares over every parameter). It is
    1/``micro_batches`` up to float rounding, since the sum of k means is k times the mean.
    Then accumulates with ``loss_factor`` (default 1/k) and compares. Returns a dict:
    ``measured factor``, ``max |difference|`` (with ``loss_factor``), ``largest gradient``.
    """
    check_positive_integers(micro_batches=micro_batches, seq_len=seq_len)
    torch.manual_seed(seed)
    model = GPT(config)
    idx, targets = padded_batch(config, [seq_len] * (2 * micro_batches), seq_len, seed)
    reference = full_batch_gradients(model, idx, targets)
    summed = accumulated_gradients(model, idx, targets, micro_batches, loss_factor=1.0)
    dot = sum((summed[n] * reference[n]).sum().item() for n in reference)
    norm = sum((summed[n] ** 2).sum().item() for n in reference)
    scaled = accumulated_gradients(model, idx, targets, micro_batches, loss_factor=loss_factor)
    return {"measured factor": dot / norm,
            "max |difference|": max_abs_difference(scaled, reference),
            "largest gradient": max(g.abs().max().item() for g in reference.values())}


def uneven_token_counts_example(config: GPTConfig = SMALL_GPT, seq_len: int = 32,
                                micro_batches: int = 2, seed: int = 0) -> dict:
    """Accumulated vs full-batch gradients of the course GPT (float32), three ways.

    The batch has 2·``micro_batches`` sequences. Equal: every target valid. Uneven: the first
    micro-batch's sequences fully valid, the others' only 4 tokens each. Returns a dict:
    ``equal`` (mean-of-means loop, equal counts: float rounding), ``uneven, mean of means``
    (the same loop: clearly off), ``uneven, token-weighted`` (the fix: rounding again), each the
    max |difference| to the full batch's gradients; ``largest gradient`` for scale;
    ``valid tokens per micro-batch``; ``loss, mean of means`` and ``loss, all tokens``.
    """
    check_positive_integers(micro_batches=micro_batches, seq_len=seq_len)
    if micro_batches < 2:
        raise ValueError("the example needs at least 2 micro-batches")
    torch.manual_seed(seed)
    model = GPT(config)
    rows = 2 * micro_batches
    idx, full = padded_batch(config, [seq_len] * rows, seq_len, seed)
    _, uneven = padded_batch(config, [seq_len] * 2 + [4] * (rows - 2), seq_len, seed)
    out = {}
    reference = full_batch_gradients(model, idx, full)
    out["equal"] = max_abs_difference(accumulated_gradients(model, idx, full, micro_batches),
                                      reference)
    reference = full_batch_gradients(model, idx, uneven)
    naive = accumulated_gradients(model, idx, uneven, micro_batches)
    fixed = token_weighted_gradients(model, idx, uneven, micro_batches)
    out["uneven, mean of means"] = max_abs_difference(naive, reference)
    out["uneven, token-weighted"] = max_abs_difference(fixed, reference)
    out["largest gradient"] = max(g.abs().max().item() for g in reference.values())
    parts = list(zip(_split(idx, micro_batches), _split(uneven, micro_batches)))
    out["valid tokens per micro-batch"] = [int((y != IGNORE_INDEX).sum()) for _, y in parts]
    with torch.no_grad():
        losses = [gpt_loss(model, x, y).item() for x, y in parts]
        out["loss, mean of means"] = sum(losses) / len(losses)
        out["loss, all tokens"] = gpt_loss(model, idx, uneven).item()
    return out


def batchnorm_example(micro_batches: int = 2, norm: str = "batch", batch: int = 32,
                      seed: int = 0) -> dict:
    """Accumulated vs full-batch gradients of a tiny MLP with a normalisation layer.

    ``norm="batch"``: nn.BatchNorm1d normalises with each micro-batch's own mean and variance,
    so the micro-batches compute a different function from the full batch (and update the
    running statistics ``micro_batches`` times). ``norm="layer"``: nn.LayerNorm normalises each
    sample on its own, and accumulation matches again. Returns ``max |difference|`` and
    ``largest gradient``.
    """
    if norm not in ("batch", "layer"):
        raise ValueError(f"norm must be 'batch' or 'layer'; got {norm!r}")
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16),
                          nn.BatchNorm1d(16) if norm == "batch" else nn.LayerNorm(16),
                          nn.ReLU(), nn.Linear(16, 1))
    x, y = torch.randn(batch, 8), torch.randn(batch, 1)

    def mse(model, x, y):
        return F.mse_loss(model(x), y)

    reference = full_batch_gradients(model, x, y, mse)
    accumulated = accumulated_gradients(model, x, y, micro_batches, mse)
    return {"max |difference|": max_abs_difference(accumulated, reference),
            "largest gradient": max(g.abs().max().item() for g in reference.values())}


def clipping_at_the_boundary_example(config: GPTConfig = SMALL_GPT, seq_len: int = 32,
                                     micro_batches: int = 4, seed: int = 0) -> dict:
    """``train_step`` against one step on the whole batch (the same model, SGD): the gradient
    norm that ``clip_grad_norm_`` sees, and the largest difference between the two models'
    weights after the step. Both agree up to float rounding: clipping at the boundary clips the
    global batch's gradient. Returns ``norm, accumulated``, ``norm, whole batch`` and
    ``max |weight difference|``."""
    check_positive_integers(micro_batches=micro_batches, seq_len=seq_len)
    idx, targets = padded_batch(config, [seq_len] * (2 * micro_batches), seq_len, seed)
    models, norms = [], []
    for parts in (micro_batches, 1):
        torch.manual_seed(seed)
        model = GPT(config)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        norms.append(train_step(model, optimizer, list(zip(_split(idx, parts), _split(targets, parts))),
                                max_norm=0.1).item())
        models.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    return {"norm, accumulated": norms[0], "norm, whole batch": norms[1],
            "max |weight difference|": (models[0] - models[1]).abs().max().item()}
