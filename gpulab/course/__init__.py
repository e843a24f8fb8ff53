"""The course's own machinery, apart from what the course teaches: how a quiz asks, checks,
varies per student and shows a result. Every chapter uses all of it.

- ``gpulab.course.checks``    a quiz's test cell: ``check(item_id, answer)``, the answer keys'
                              ``Item`` and ``Mistake``, the self-check file
- ``gpulab.course.diagnosis`` the words a wrong number gets: the slip it points to, named only
                              where the item's unit lets that slip happen
- ``gpulab.course.variants``  per-student numbers in graded releases (``Param``, ``question``)
- ``gpulab.course.predict``   the "your prediction | formula | measured" line an experiment ends with
- ``gpulab.course.plots``     predicted-vs-measured, by-size, stacked and timeline plots
- ``gpulab.course.widgets``   chapter 02's memory calculator (ipywidgets), backed by a plain function

Import the module you need (``from gpulab.course import plots, predict``): this package imports
nothing itself, so a test cell that needs only ``checks`` stays cheap.
"""
