"""A small GPT whose memory you can predict byte by byte (chapter 02, "VRAM arithmetic").

A decoder-only transformer in the style of nanoGPT (Karpathy, github.com/karpathy/nanoGPT,
model.py), read top to bottom: token + position embeddings, ``n_layer`` pre-LayerNorm blocks
(attention, then a 4h GELU MLP, each added to the residual stream), a final LayerNorm and a
linear head that turns each position into ``vocab_size`` logits.

It differs from nanoGPT on purpose, so that what it keeps in memory is what the course's formulas
(Korthikanti et al. 2022, ``gpulab.arith.activation_bytes_per_layer``) count, on a CPU and on a
GPU alike:

- Attention is written out: the (s x s) scores are materialised and softmaxed. PyTorch's
  ``scaled_dot_product_attention`` picks different kernels on CPU and GPU, and its flash kernel
  does not store the scores at all, so its memory depends on the machine.
- Dropout (off by default) uses ``torch.native_dropout``, which saves a 1-byte bool mask on CPU
  and CUDA alike; ``F.dropout`` on a CPU saves its mask in the activation dtype (4 bytes in fp32).
- Embeddings are NOT tied: the head has its own (vocab_size x n_embd) weight, as in Llama, so
  each parameter has exactly one gradient. (nanoGPT ties them, saving vocab_size x n_embd
  parameters; the parameter formula in ``GPT.count_params`` would drop its ``V·h`` head term.)
- The head has no bias.

Everything is built directly in the requested ``dtype`` on the requested ``device``: build in
bfloat16 rather than calling ``.to(torch.bfloat16)`` later, because ``module.to()`` fails inside
``FakeTensorMode`` (used to size models that do not fit; see ``gpulab.measure``), and on
``device="meta"`` nothing is allocated at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from gpulab.arith import segment_size


@dataclass
class GPTConfig:
    vocab_size: int = 1000
    block_size: int = 128   # longest sequence the position embedding (and causal mask) covers
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 256
    dropout: float = 0.0


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Dropout that saves a 1-byte bool mask on every device (see the module docstring)."""
    if p == 0.0 or not training:
        return x
    return torch.native_dropout(x, p, True)[0]


class CausalSelfAttention(nn.Module):

    def __init__(self, config: GPTConfig, future: torch.Tensor, **factory):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.n_head, self.dropout = config.n_head, config.dropout
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, **factory)  # q, k, v at once
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, **factory)
        # The causal mask, one tensor shared by all layers (see GPT.__init__).
        self.register_buffer("future", future, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)                  # 3 x (B, T, C)
        # Contiguous copies (S bytes each), saved by the matmuls below. Matmul would make the
        # same copies itself when B > 1 but not when B = 1, where it saves views that keep the
        # whole q|k|v tensor alive longer: explicit copies make the memory the same for any B.
        q = q.view(B, T, self.n_head, hs).transpose(1, 2).contiguous()  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2).contiguous()  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2).contiguous()  # (B, nh, T, hs)
        # The scores are materialised: b·a·s² values, the 5as/h term of Korthikanti et al.
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))   # (B, nh, T, T)
        att = att.masked_fill(self.future[:T, :T], float("-inf"))
        att = F.softmax(att, dim=-1)                              # saved for backward
        att = dropout(att, self.dropout, self.training)
        y = att @ v                                               # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)          # heads side by side again
        return dropout(self.c_proj(y), self.dropout, self.training)


class MLP(nn.Module):

    def __init__(self, config: GPTConfig, **factory):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, **factory)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, **factory)
        self.dropout = config.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.c_fc(x))                                  # (B, T, 4C)
        return dropout(self.c_proj(x), self.dropout, self.training)


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: GPTConfig, future: torch.Tensor, **factory):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, **factory)
        self.attn = CausalSelfAttention(config, future, **factory)
        self.ln_2 = nn.LayerNorm(config.n_embd, **factory)
        self.mlp = MLP(config, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def run_blocks(x: torch.Tensor, blocks: nn.ModuleList) -> torch.Tensor:
    """Run ``blocks`` one after the other: one checkpoint segment (or the whole stack)."""
    for block in blocks:
        x = block(x)
    return x


class GPT(nn.Module):
    """``GPT(config, dtype=torch.bfloat16, device="meta")`` builds it in place; ``model(idx)``
    with idx (B, T) int64 returns (logits (B, T, V), None), ``model(idx, targets)`` returns
    (logits, mean cross-entropy loss over the targets that are not -100, F.cross_entropy's
    ``ignore_index``). In training, drop the logits before ``backward()``. ``checkpointing``:
    False, True (every block) or k, segments of k blocks (chapter 05)."""

    def __init__(self, config: GPTConfig, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None, checkpointing: bool | int = False):
        super().__init__()
        self.config = config
        # Activation checkpointing (Chen et al. 2016; chapter 05): False keeps every activation;
        # an int k cuts the blocks into segments of k (the top one shorter if k does not divide
        # n_layer); forward keeps only each segment's input and backward recomputes the
        # segment's k blocks, whose activations are then alive together. True is k = 1 (every
        # block); k = n_layer is one segment. Checked here, read again on every forward.
        segment_size(checkpointing, config.n_layer)
        self.checkpointing = checkpointing
        factory = {"dtype": dtype, "device": device}
        self.wte = nn.Embedding(config.vocab_size, config.n_embd, **factory)
        self.wpe = nn.Embedding(config.block_size, config.n_embd, **factory)
        # Causal mask: True above the diagonal = a future position, hidden from the query. A
        # buffer, not a parameter: never trained; one bool tensor of block_size² bytes shared by
        # every layer (a copy per layer would cost L·block_size² bytes: 128 MiB for a 7B config).
        future = torch.ones(config.block_size, config.block_size, dtype=torch.bool,
                            device=device).triu(diagonal=1)
        self.blocks = nn.ModuleList(Block(config, future, **factory)
                                    for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, **factory)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False, **factory)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        # GPT-2's initialisation (as in nanoGPT); works on meta and fake tensors too.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_params(self) -> int:
        """Parameters actually in the model: sum of ``p.numel()`` (buffers not included)."""
        return sum(p.numel() for p in self.parameters())

    @staticmethod
    def count_params(config: GPTConfig) -> int:
        """The same number from the config alone, term by term (V vocab_size, T block_size,
        h n_embd, L n_layer; chapter 02, "Counting parameters"):

            per block  12h² + 13h   attention 4h² + 4h (c_attn 3h² + 3h, c_proj h² + h),
                                    MLP 8h² + 5h (c_fc 4h² + 4h, c_proj 4h² + h), 2 LayerNorms 4h
            embeddings V·h + T·h, final LayerNorm 2h, head V·h (untied, no bias)
        """
        V, T, h, L = config.vocab_size, config.block_size, config.n_embd, config.n_layer
        return L * (12 * h * h + 13 * h) + V * h + T * h + 2 * h + V * h

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        B, T = idx.shape
        assert T <= self.config.block_size, f"sequence of {T} > block_size {self.config.block_size}"
        pos = torch.arange(T, dtype=torch.long, device=idx.device)         # (T,)
        x = self.wte(idx) + self.wpe(pos)                                   # (B, T, C)
        x = dropout(x, self.config.dropout, self.training)
        k = segment_size(self.checkpointing, self.config.n_layer)
        if k is None or not torch.is_grad_enabled():
            x = run_blocks(x, self.blocks)
        else:
            for start in range(0, self.config.n_layer, k):
                # saves only x, the segment's input; backward recomputes its blocks
                x = checkpoint(run_blocks, x, self.blocks[start:start + k], use_reentrant=False)
        logits = self.lm_head(self.ln_f(x))                                 # (B, T, V)
        loss = None
        if targets is not None:
            # log-softmax of B·T·V values is saved for backward: often the largest single tensor.
            loss = F.cross_entropy(logits.view(B * T, -1), targets.view(B * T))
        return logits, loss
