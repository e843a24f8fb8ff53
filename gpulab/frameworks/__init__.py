"""Chapter 09, "The same knobs in the tools you use": the course's numbers under the names that
Hugging Face Accelerate, the HF Trainer, PyTorch Lightning and DeepSpeed give them.

- ``gpulab.frameworks.knobs``      the knobs side by side (precision, micro-batch and accumulation,
                                   checkpointing, data parallel / ZeRO / FSDP, DataLoader workers,
                                   compile) and the bookkeeping every tool does with them: global
                                   batch, tokens and optimizer steps per epoch, Lightning's model
                                   size, DeepSpeed's batch triple. Imports no framework.
- ``gpulab.frameworks.zero_memory`` per-GPU model state under a ZeRO stage: the paper's formula and
                                   DeepSpeed's own estimator convention, and a DeepSpeed JSON read
                                   by DeepSpeed itself (imports deepspeed only when asked to).
- ``gpulab.frameworks.tiny_run``   the course GPT as each tool wants it (a LightningModule, an
                                   HF-style ``forward``), a token dataset, and what a rank measures
                                   at each optimizer step (tokens, bytes of model state).
- ``gpulab.frameworks.runs``       the same short run through Accelerate, Lightning and the HF
                                   Trainer on CPU ranks (gloo), launched the way each tool's users
                                   launch from a notebook, with each tool's own report.
"""
