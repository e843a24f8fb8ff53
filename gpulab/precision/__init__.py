"""Number formats and mixed precision (chapter 04): what each format can hold, what autocast runs
in low precision, and how loss scaling keeps fp16 gradients from vanishing.

One module per idea, in the order the chapter meets them:

- ``gpulab.precision.formats``       sections 1-2: each format's bit counts and what follows from
                                     them (``Format``, ``FORMATS``, ``number_format``), rounding
                                     (``round_to``) and running sums that stop (``running_sum``,
                                     ``stall_point``)
- ``gpulab.precision.loss_scaling``  section 3: gradients that underflow
                                     (``initial_logit_gradient``, ``logit_gradients``) and the
                                     dynamic loss scale (``loss_scale_after``,
                                     ``grad_scaler_scale``)
- ``gpulab.precision.autocast``      sections 4-5: what autocast runs in low precision
                                     (``FLOAT32_OPS``, ``autocast_output_dtypes``) and what it
                                     keeps (``saved_tensor_bytes``, ``parameter_copy_bytes``,
                                     ``autocast_state_bytes``, ``autocast_bytes_per_score``,
                                     ``autocast_saved_bytes``)
- ``gpulab.precision.training``      section 7 (and the data of section 3): a GPT trained in each
                                     precision (``PRECISIONS``, ``text_corpus``, ``sample_batch``,
                                     ``TrainingRun``, ``train``) and its step timed
                                     (``step_seconds``)
- ``gpulab.precision.script``        section 8, in your training script: the AMP loop's lines in
                                     their order and the wrong orders (``ORDERS``), each measured
                                     on one step (``OrderResult``, ``measure_order``)

Every name is offered here too, so a notebook writes ``precision.round_to`` whichever module
holds it. To replace a function in a test, patch it in the module that holds it: a module calls
its neighbours' functions through its own imports, not through ``gpulab.precision``.
"""

from gpulab.precision.formats import (FORMATS, Format, number_format, round_to, running_sum,
                                      stall_point)
from gpulab.precision.loss_scaling import (grad_scaler_scale, initial_logit_gradient,
                                           logit_gradients, loss_scale_after)
from gpulab.precision.autocast import (FLOAT32_OPS, autocast_bytes_per_score,
                                       autocast_output_dtypes, autocast_saved_bytes,
                                       autocast_state_bytes, parameter_copy_bytes,
                                       saved_tensor_bytes)
from gpulab.precision.training import (PRECISIONS, TrainingRun, sample_batch, step_seconds,
                                       text_corpus, train)
from gpulab.precision import script
from gpulab.precision.script import ORDERS, OrderResult, measure_order

__all__ = [
    # formats and rounding (sections 1-2)
    "Format", "FORMATS", "number_format", "round_to", "running_sum", "stall_point",
    # gradients that underflow, loss scaling (section 3)
    "initial_logit_gradient", "logit_gradients", "loss_scale_after", "grad_scaler_scale",
    # autocast: dtypes and saved bytes (sections 4-5)
    "FLOAT32_OPS", "autocast_output_dtypes", "saved_tensor_bytes", "parameter_copy_bytes",
    "autocast_state_bytes", "autocast_bytes_per_score", "autocast_saved_bytes",
    # training in each precision (section 7)
    "PRECISIONS", "text_corpus", "sample_batch", "TrainingRun", "train", "step_seconds",
    # the training script's lines and their wrong orders (section 8)
    "script", "ORDERS", "OrderResult", "measure_order",
]
