"""Chapter 10, "Batch size and learning": what the batch size does to learning, not to memory
or throughput. Past a point a bigger batch buys no fewer steps, costs more examples, and needs
another learning rate and a warm-up.

One module per idea, in the order the chapter meets them:

- ``gpulab.batch_size.noise_scale``  sections 1-2: the gradient noise scale B_simple = tr Σ/|G|²,
                                     the best step at batch B, the unbiased two-batch estimator
                                     (McCandlish et al. 2018) and a meter for a real loop
- ``gpulab.batch_size.tradeoff``     section 1 and 3: steps against examples,
                                     (S/S_min − 1)(E/E_min − 1) = 1, B_crit = E_min/S_min, the
                                     fit of measured steps, the best of a learning-rate sweep
- ``gpulab.batch_size.language``     sections 2-3: a synthetic language with a known entropy floor
                                     and a bigram table whose noise scale has a closed form
- ``gpulab.batch_size.runs``         experiments 1-2: many SGD runs of the table at once, steps to
                                     a target, the noise scale measured along a run
- ``gpulab.batch_size.lr_scaling``   section 4: the linear (Goyal et al. 2017) and square-root
                                     (Malladi et al. 2022) rules, warm-up, the schedules big runs
                                     published
- ``gpulab.batch_size.gpt_runs``     experiment 3: the course GPT at 4× the batch under each rule,
                                     with and without warm-up
- ``gpulab.batch_size.planning``     section 5: micro-batch × accumulation × ranks × sequence, and
                                     when more GPUs stop buying time to the target

Import the module you need (``from gpulab.batch_size import noise_scale``).
"""
