"""Chapter 02's training-memory calculator: a pure estimate, and a widget that draws it.

``estimate_memory`` gives the bytes one GPU holds while training a GPT-style transformer:
weights, gradients and optimizer state (``arith.model_state_bytes``), sharded by ZeRO, plus the
activations saved for backward (``arith.activation_bytes_per_layer``). ``memory_calculator``
wraps it in sliders and a stacked bar against common card sizes::

    from gpulab.course import widgets
    widgets.estimate_memory(n_params=6.74e9, n_layer=32, hidden=4096, heads=32,
                            seq_len=4096, micro_batch=1, checkpointing="selective")
    widgets.memory_calculator()          # in a notebook cell

Units: bytes. The widget prints GB (10^9) and GiB (2^30) side by side. Chapter 02, "VRAM
arithmetic".
"""

from __future__ import annotations

import html
import io
from dataclasses import dataclass

import ipywidgets as w
from matplotlib.figure import Figure

from gpulab import arith
from gpulab.arith import ZERO_STAGES, check_positive_integers, gpt_param_count, zero_sharded
from gpulab.course import plots

CHECKPOINTING = ("none", "selective", "full")  # -> arith.activation_bytes_per_layer(recompute=...)


# ------------------------------------------------------------------------------------------
# The estimate

def estimate_memory(*, n_layer: int, hidden: int, heads: int, seq_len: int, micro_batch: int,
                    n_params: float | None = None, vocab: int | None = None,
                    recipe: str = "mixed_adam", checkpointing: str = "none", n_gpus: int = 1,
                    zero_stage: int = 0, dropout: bool = True) -> dict[str, float]:
    """Bytes per GPU of training state: {'params', 'grads', 'optimizer', 'activations', 'total'}.

    The model size comes from exactly one of
      - ``n_params``: a parameter count (e.g. the published one), or
      - ``vocab``: n_params = ``gpt_param_count(n_layer, hidden, vocab)`` ≈ 12·L·h² + V·h.
    The architecture (``n_layer``, ``hidden``, ``heads``) is always needed, because activations
    depend on it, not on the parameter count.

    - model state: ``arith.model_state_bytes(n_params, recipe)``, then ``zero_sharded`` over
      ``n_gpus`` for ``zero_stage`` 0-3.
    - activations: n_layer × ``arith.activation_bytes_per_layer(seq_len, micro_batch, hidden,
      heads, bytes_per_value=<the recipe's weight bytes>, recompute=checkpointing,
      dropout=dropout)`` (Korthikanti et al. 2022), for this GPU's own micro-batch; ZeRO does
      not shard them. No tensor parallelism (t = 1). Not included: the embedding, final
      LayerNorm, LM head and loss activations (the logits alone are s·b·V values), temporary
      buffers, the CUDA context and allocator fragmentation; so this is a lower bound.

    Raises ValueError naming the field for impossible inputs (sizes that are not positive
    integers, heads that do not divide hidden, an unknown recipe or checkpointing mode,
    zero_stage outside 0-3, n_gpus < 1). Chapter 02, "VRAM arithmetic".
    """
    check_positive_integers(n_layer=n_layer, hidden=hidden, heads=heads, seq_len=seq_len,
              micro_batch=micro_batch, n_gpus=n_gpus)
    if hidden % heads:
        raise ValueError(f"heads={heads} must divide hidden={hidden} (each head gets hidden/heads)")
    if (n_params is None) == (vocab is None):
        raise ValueError("give exactly one of n_params (a count) or vocab (for 12·L·h² + V·h); "
                         f"got n_params={n_params!r}, vocab={vocab!r}")
    if n_params is None:
        n_params = gpt_param_count(n_layer, hidden, vocab)
    elif isinstance(n_params, bool) or not isinstance(n_params, (int, float)) or not n_params > 0:
        raise ValueError(f"n_params must be a positive number, got {n_params!r}")
    if recipe not in arith.RECIPES:
        raise ValueError(f"recipe must be one of {', '.join(arith.RECIPES)}; got {recipe!r}")
    if checkpointing not in CHECKPOINTING:
        raise ValueError(f"checkpointing must be one of {', '.join(CHECKPOINTING)}; "
                         f"got {checkpointing!r}")
    state = zero_sharded(arith.model_state_bytes(n_params, recipe), n_gpus, zero_stage)
    per_layer = arith.activation_bytes_per_layer(
        seq_len, micro_batch, hidden, heads, bytes_per_value=arith.RECIPES[recipe][0],
        recompute=checkpointing, dropout=dropout)
    out = {"params": state["params"], "grads": state["grads"], "optimizer": state["optimizer"],
           "activations": n_layer * per_layer}
    out["total"] = sum(out.values())
    return out


# ------------------------------------------------------------------------------------------
# Presets: published architectures. n_params is the exact count of the released weights
# (it differs from 12·L·h² + V·h: GPT-2 adds position embeddings and biases; Llama unties the
# embedding and uses a SwiGLU MLP of width 11008 / 13824). Llama has no dropout.

@dataclass(frozen=True)
class Preset:
    n_layer: int
    hidden: int
    heads: int
    vocab: int
    n_params: int
    seq_len: int  # the training context length
    dropout: bool
    source: str


PRESETS: dict[str, Preset] = {
    # 12·(7,087,872 per layer) + 50257·768 + 1024·768 + 1536 (final LayerNorm)
    "GPT-2 124M": Preset(12, 768, 12, 50257, 124_439_808, 1024, True,
                         "Radford et al. 2019; Hugging Face 'gpt2' config"),
    # 32·(4·4096² + 3·4096·11008 + 2·4096) + 2·32000·4096 + 4096
    "Llama-2-7B": Preset(32, 4096, 32, 32000, 6_738_415_616, 4096, False,
                         "Touvron et al. 2023, Table 1; 'Llama-2-7b-hf' config"),
    # 40·(4·5120² + 3·5120·13824 + 2·5120) + 2·32000·5120 + 5120
    "Llama-2-13B": Preset(40, 5120, 40, 32000, 13_015_864_320, 4096, False,
                          "Touvron et al. 2023, Table 1; 'Llama-2-13b-hf' config"),
}
CUSTOM = "custom (12·L·h² + V·h)"


class MemoryCalculator(w.VBox):
    """The widget ``memory_calculator()`` returns. ``controls`` maps each input's name to its
    widget; ``summary`` is the text (HTML); ``plot`` is the image of the stacked bar;
    ``breakdown`` is the last good estimate (None after an error)."""

    def __init__(self, preset: str = "GPT-2 124M"):
        p = PRESETS[preset]
        c = self.controls = {
            "preset": w.Dropdown(options=[*PRESETS, CUSTOM], value=preset, description="model"),
            "n_layer": w.IntText(p.n_layer, description="layers L"),
            "hidden": w.IntText(p.hidden, description="hidden h"),
            "heads": w.IntText(p.heads, description="heads a"),
            "vocab": w.IntText(p.vocab, description="vocab V"),
            "seq_len": w.SelectionSlider(options=[2**k for k in range(7, 16)], value=p.seq_len,
                                         description="seq_len s"),
            "micro_batch": w.IntSlider(1, min=1, max=64, description="micro-batch b"),
            "recipe": w.Dropdown(options=list(arith.RECIPES), value="mixed_adam",
                                 description="recipe"),
            "checkpointing": w.ToggleButtons(options=CHECKPOINTING, description="recompute"),
            "dropout": w.Checkbox(p.dropout, description="dropout (masks saved)"),
            "n_gpus": w.SelectionSlider(options=[2**k for k in range(11)], value=1,
                                        description="GPUs N_d"),
            "zero_stage": w.ToggleButtons(options=ZERO_STAGES, description="ZeRO stage"),
        }
        self.summary = w.HTML()
        # The PNG's own size (_png: 5.4 x 3.6 in at 90 dpi), so the browser does not stretch it.
        self.plot = w.Image(format="png", layout=w.Layout(width=f"{PLOT_PX[0]}px",
                                                          height=f"{PLOT_PX[1]}px"))
        self.breakdown: dict[str, float] | None = None
        self._applying_preset = False
        c["preset"].observe(self._on_preset, names="value")
        for name in ("n_layer", "hidden", "heads", "vocab"):
            c[name].observe(self._on_architecture, names="value")
        for name, control in c.items():
            if name != "preset":
                control.observe(lambda _change: self.update(), names="value")
        for control in c.values():  # room for the longer labels in the browser
            control.style.description_width = "110px"
        for name in ("seq_len", "micro_batch", "n_gpus"):
            # A track about 280 px long: micro-batch moves about 4 px per step, not 1 to 29 in
            # one small drag as on ipywidgets' default 94 px track.
            c[name].layout.width = "440px"
            c[name].continuous_update = False   # redraw once when the handle is let go
        # The controls keep their width (a narrow output would squeeze the sliders back to a few
        # pixels); where both do not fit side by side, the plot wraps below them.
        left = w.VBox(list(c.values()), layout=w.Layout(min_width="460px"))
        # Top-aligned: stretched to the controls' height, the image would be distorted.
        super().__init__([w.HBox([left, self.plot],
                                 layout=w.Layout(align_items="flex-start", flex_flow="row wrap")),
                          self.summary])
        self.update()

    def _on_preset(self, change) -> None:
        if change["new"] == CUSTOM:
            self.update()
            return
        p = PRESETS[change["new"]]
        self._applying_preset = True
        try:  # set every field first, then draw once
            for name in ("n_layer", "hidden", "heads", "vocab", "seq_len", "dropout"):
                self.controls[name].value = getattr(p, name)
        finally:
            self._applying_preset = False
        self.update()

    def _on_architecture(self, _change) -> None:
        # A hand edit means the model is no longer the preset; the edited control's own
        # observer then redraws, so switching the dropdown must not draw as well.
        if self._applying_preset or self.controls["preset"].value == CUSTOM:
            return
        self._applying_preset = True
        try:
            self.controls["preset"].value = CUSTOM
        finally:
            self._applying_preset = False

    def inputs(self) -> dict:
        """The keyword arguments for ``estimate_memory`` that the controls now hold."""
        v = {name: control.value for name, control in self.controls.items()}
        preset = PRESETS.get(v.pop("preset"))
        if preset is None:
            v["n_params"] = None
        else:
            v["n_params"], v["vocab"] = preset.n_params, None
        return v

    def update(self) -> None:
        if self._applying_preset:
            return
        kwargs = self.inputs()
        try:
            self.breakdown = estimate_memory(**kwargs)
        except ValueError as err:
            self.breakdown = None
            self.summary.value = (f"<b style='color:#b00'>Cannot compute:</b> "
                                  f"{html.escape(str(err))}")
            self.plot.layout.visibility = "hidden"
            return
        k = kwargs
        n_params = k["n_params"] or gpt_param_count(k["n_layer"], k["hidden"], k["vocab"])
        self.summary.value = _summary_html(self.breakdown, n_params)
        self.plot.value = _png(self.breakdown, f"{n_params / 1e9:.3g}B params, s={k['seq_len']}, "
                                               f"b={k['micro_batch']}, ZeRO-{k['zero_stage']} "
                                               f"on {k['n_gpus']} GPU(s)")
        self.plot.layout.visibility = "visible"


def memory_calculator(preset: str = "GPT-2 124M") -> MemoryCalculator:
    """An ipywidgets panel: pick a model and a training setup, see the memory per GPU.

    Redraws a stacked bar (params, grads, optimizer, activations) against 24/40/80/141 GB card
    lines on every change, and prints the totals in GB and GiB. Impossible inputs show the
    ValueError's message instead of a plot. Works without a browser (tests drive it by setting
    ``calc.controls[name].value``). Chapter 02, "VRAM arithmetic".
    """
    return MemoryCalculator(preset)


def _summary_html(breakdown: dict[str, float], n_params: float) -> str:
    rows = "".join(f"<tr><td>{k}</td><td>{v / arith.GB:,.2f} GB</td>"
                   f"<td>{v / arith.GiB:,.2f} GiB</td></tr>" for k, v in breakdown.items())
    total = breakdown["total"]
    fits = [label for label, gb in plots.CARDS_GB.items() if total <= gb * arith.GB]
    verdict = ("fits (on paper) on: " + "; ".join(fits)) if fits else "fits on none of these cards"
    return (f"<p>{n_params:,.0f} parameters. Per GPU:</p><table>{rows}</table>"
            f"<p><b>Total per GPU: {total / arith.GB:,.2f} GB ({total / arith.GiB:,.2f} GiB)</b>"
            f" &mdash; {html.escape(verdict)}. Not counted: embedding/head/loss activations, "
            "CUDA context (0.5-1 GiB), temporary buffers, fragmentation.</p>")


PLOT_INCHES, PLOT_DPI = (5.4, 3.6), 90
PLOT_PX = (round(PLOT_INCHES[0] * PLOT_DPI), round(PLOT_INCHES[1] * PLOT_DPI))   # 486 x 324


def _png(breakdown: dict[str, float], title: str) -> bytes:
    fig = Figure(figsize=PLOT_INCHES)  # not pyplot: nothing is left open or shown twice
    plots.stacked_memory_bar(breakdown, title=title, ax=fig.subplots())
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=PLOT_DPI)
    return buf.getvalue()
