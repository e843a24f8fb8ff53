"""The capstone (chapter 12): a budget of your own, a plan that fits it, a run that measures it.

One module per idea, in the order the chapter meets them:

- ``gpulab.capstone.budget``   the budgets: a model, a target global batch and sequence
                               length, a memory budget and a time budget (``Budget``,
                               ``BUDGETS``, ``CANONICAL``)
- ``gpulab.capstone.plan``     a plan as a one-line config (``Plan.parse``, ``Plan.text``),
                               what it reaches and what the course's formulas predict for it
- ``gpulab.capstone.run``      the run that measures a plan beside the naive run on the same
                               device, in a fresh process (``measure``)
- ``gpulab.capstone.results``  the file of a learner's runs, read back with limits (the
                               chapter's history, the workshop's board)
- ``gpulab.capstone.grading``  what grading trusts: the plan's text, judged by a measurement
                               the grader makes itself

``budget``, ``plan`` and ``results`` import no torch, so the workshop's board can read plans
without it. Submodules are imported explicitly (``from gpulab.capstone import plan``).
"""
