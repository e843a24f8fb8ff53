"""The course GPT dressed for the tools, and what a rank measures at each optimizer step
(chapter 09, the experiments). Framework-free: ``gpulab.frameworks.runs`` drives the tools.

- ``TINY_GPT``: the course GPT (gpulab.models) small enough for three tools x two CPU ranks in
  seconds: 134,912 parameters (``GPT.count_params``).
- ``TokenDataset``: random token sequences, items ``{"input_ids", "labels"}`` (the next tokens),
  the dict shape the HF Trainer's default collator stacks and every tool's DataLoader passes on.
- ``CourseGPT``: ``forward(input_ids, labels)`` returning ``{"loss", "logits"}``, what the HF
  Trainer calls, and a count of the tokens it trained on, which is how the chapter measures
  tokens per optimizer step in every tool alike.
- ``StepLog``: called right at each optimizer step, it records the tokens all ranks learned from
  since the last step (an all-reduce of the counts), the weight the tool gave that step's mean
  gradient, and this rank's bytes of weights, gradients and optimizer state, read from the live
  tensors.

The gradient weight is read from autograd: a hook on the loss the model returns sees the factor
the tool multiplied it by before ``backward`` (1/k in Accelerate and Lightning, 1/(micro-batches
in this step) in the HF Trainer). Summed over one optimizer step's micro-batches it is 1.0 when
the step's gradient is the mean of its micro-batches' gradients, and r/k when a tool divides a
last, shorter group of r micro-batches by k.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset

from gpulab.models import GPT, GPTConfig

TINY_GPT = GPTConfig(vocab_size=256, block_size=32, n_layer=2, n_head=2, n_embd=64)


class TokenDataset(Dataset):
    """``size`` sequences of ``seq_len`` random tokens, each with its next tokens as labels."""

    def __init__(self, size: int, seq_len: int = TINY_GPT.block_size, vocab: int = TINY_GPT.vocab_size,
                 seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(0, vocab, (size, seq_len + 1), generator=generator)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.tokens[i, :-1], "labels": self.tokens[i, 1:]}


class CourseGPT(nn.Module):
    """The course GPT with the HF-style call ``model(input_ids=..., labels=...)``."""

    def __init__(self, config: GPTConfig = TINY_GPT, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)              # the same weights on every rank and in every tool
        self.gpt = GPT(config)
        self.tokens_seen = 0
        self.loss_weight = 0.0               # sum of d(what backward ran on)/d(loss) since the last step
        self.compute_dtypes: set[str] = set()
        self.gpt.lm_head.register_forward_hook(self._record_dtype)

    def _record_dtype(self, module, inputs, output) -> None:
        if self.training:                    # what a matmul really ran in: autocast shows here
            self.compute_dtypes.add(str(output.dtype).removeprefix("torch."))

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> dict:
        # No **kwargs: the HF Trainer would then pass num_items_in_batch and leave the loss
        # unscaled by the accumulation steps, expecting the model to divide by the token count.
        if self.training:
            self.tokens_seen += input_ids.numel()
        logits, loss = self.gpt(input_ids, labels)
        if self.training and loss is not None and loss.requires_grad:
            loss.register_hook(self._record_weight)
        return {"loss": loss, "logits": logits}

    def _record_weight(self, grad: torch.Tensor) -> None:
        # The gradient arriving at the model's mean loss is the factor the tool scaled it by
        # (loss / k before backward gives 1/k). Read only, never changed (the hook returns None).
        self.loss_weight += float(grad)


class TokenMeanGPT(CourseGPT):
    """The course GPT with the HF Trainer's token-normalised accumulation (chapter 09, "In your
    training script"): a forward that accepts ``num_items_in_batch`` gets, in each micro-batch, the
    number of label tokens in the whole optimizer step (all micro-batches; all ranks when
    ``average_tokens_across_devices``, the default) and returns its summed loss divided by it. The
    Trainer then divides by nothing itself, so every token of the step weighs the same however
    the micro-batches are cut. ``items_seen`` records (tokens here, tokens in the step)."""

    accepts_loss_kwargs = True               # what the Trainer checks (else: a **kwargs in forward)

    def __init__(self, config: GPTConfig = TINY_GPT, seed: int = 0):
        super().__init__(config, seed)
        self.items_seen: list[tuple[int, int]] = []

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                num_items_in_batch: torch.Tensor | int | None = None) -> dict:
        if num_items_in_batch is None:
            return super().forward(input_ids, labels)
        if self.training:
            self.tokens_seen += input_ids.numel()
            self.items_seen.append((int(labels.ne(-100).sum()), int(num_items_in_batch)))
        logits, _ = self.gpt(input_ids)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100,
                                           reduction="sum") / num_items_in_batch
        if self.training and loss.requires_grad:
            loss.register_hook(self._record_weight)
        return {"loss": loss, "logits": logits}


def state_bytes(model: nn.Module, optimizer) -> dict[str, int]:
    """This rank's bytes of weights, gradients and optimizer state (Adam's moments and its step
    counters), summed over the live tensors."""
    params = list(model.parameters())
    optimizer_bytes = sum(t.numel() * t.element_size() for state in optimizer.state.values()
                          for t in state.values() if torch.is_tensor(t))
    return {"params": sum(p.numel() * p.element_size() for p in params),
            "grads": sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None),
            "optimizer": optimizer_bytes}


class StepLog:
    """What one rank saw at each optimizer step; ``optimizer_stepped`` is called by every rank."""

    def __init__(self):
        self.tokens_per_step: list[int] = []
        self.gradient_weights: list[float] = []
        self.state: dict[str, int] = {"params": 0, "grads": 0, "optimizer": 0}
        self._counted = 0

    def optimizer_stepped(self, model: CourseGPT, optimizer) -> None:
        new = torch.tensor(model.tokens_seen - self._counted)
        self._counted = model.tokens_seen
        if dist.is_initialized():
            dist.all_reduce(new)             # tokens of every rank's micro-batches since the last step
        self.tokens_per_step.append(int(new))
        self.gradient_weights.append(round(model.loss_weight, 6))   # this rank's; every rank's alike
        model.loss_weight = 0.0
        now = state_bytes(model, optimizer)
        if sum(now.values()) >= sum(self.state.values()):   # the fullest moment: all state exists
            self.state = now

    def report(self, model: CourseGPT) -> dict:
        first = next(model.parameters())
        return {"optimizer_steps": len(self.tokens_per_step), "tokens_per_step": self.tokens_per_step,
                "gradient_weights": self.gradient_weights, "state_bytes": self.state, "weights_dtype": str(first.dtype).removeprefix("torch."),
                "compute_dtypes": sorted(model.compute_dtypes)}
