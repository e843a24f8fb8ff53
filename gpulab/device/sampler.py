"""The background-sampler lifecycle that the course's monitors share: call ``sample()`` every
``interval`` seconds in a daemon thread while a block of work runs.

    class MySampler(BackgroundSampler):
        thread_name = "my-sampler"
        def _open(self) -> bool: ...     # open the source; False: nothing to sample, no thread
        def sample(self) -> None: ...    # one reading; must never raise into the work
        def _close(self) -> None: ...    # after the thread has stopped (a last sample, shutdown)

    with MySampler(interval=0.1) as sampler:
        ...                              # the work being watched

Used by ``gpulab.device.footprint.FootprintSampler`` (a learner's GPU memory, ``make gpu-check``),
``gpulab.pipeline.utilisation.UtilisationSampler`` (chapter 07) and ``gpulab.monitoring.monitor.Monitor``
(chapter 08). A thread is enough: NVML and psutil calls spend their time outside Python's lock.
"""

from __future__ import annotations

import threading


class BackgroundSampler:
    thread_name = "gpulab-sampler"

    def __init__(self, interval: float):
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _open(self) -> bool:
        """Prepare to sample; return False when there is nothing to sample (no thread starts)."""
        return True

    def _close(self) -> None:
        """Called by ``stop`` once the thread has ended (only if it was started)."""

    def sample(self) -> None:
        raise NotImplementedError

    def start(self):
        if self._open():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self._close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()
