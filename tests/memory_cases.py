"""Shared by the memory tests (test_memory.py, test_checkpointing.py): the accuracy bar, the
small GPT the configurations start from, and readable ids for the parametrised cases."""
from gpulab.models import GPTConfig

TOLERANCE = 0.02  # |predicted - measured| / measured, the chapters' accuracy bar on CPU


def relative_error(predicted: float, measured: float) -> float:
    return abs(predicted - measured) / measured


def config(**changes) -> GPTConfig:
    base = dict(vocab_size=512, block_size=128, n_layer=2, n_head=4, n_embd=128)
    return GPTConfig(**{**base, **changes})


def case_id(case) -> str:
    """(config, batch, seq_len, dtype, optimizer, checkpointing) -> e.g. V512-L2-h128-a4-b8-s64-float32-sgd-k2"""
    cfg, b, s, dtype, opt, ckpt = case
    return (f"V{cfg.vocab_size}-L{cfg.n_layer}-h{cfg.n_embd}-a{cfg.n_head}-b{b}-s{s}-"
            f"{str(dtype).removeprefix('torch.')}-{opt}-k{ckpt}")
