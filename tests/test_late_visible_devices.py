"""Chapter 01, Experiment 2: when CUDA_VISIBLE_DEVICES is set too late, what device_count() says
(gpulab.device.choosing.count_gpus_in_this_process), on a made-up 8-GPU machine that behaves as
the CUDA driver and torch 2.13 do (issue 29)."""
import os

import pytest

from gpulab.device import choosing, count_gpus_in_this_process, visible_gpu_counts


class Driver:
    """The CUDA driver reads CUDA_VISIBLE_DEVICES once, at its first call (cuInit, reached by
    torch.cuda.is_available()'s cudaGetDeviceCount); torch answers device_count() from NVML with
    the variable as it is now until torch has started CUDA (init), and from the driver after."""

    GPUS = 8

    def __init__(self):
        self.driver_count = None        # what the driver read when it started
        self.torch_started = False

    def _nvml_count(self) -> int:
        value = os.environ.get("CUDA_VISIBLE_DEVICES")
        return self.GPUS if value is None else len(
            [e for e in value.split(",") if e.strip().isdigit()][:self.GPUS])

    def _start_driver(self) -> int:
        if self.driver_count is None:
            self.driver_count = self._nvml_count()
        return self.driver_count

    def is_available(self) -> bool:
        return self._start_driver() > 0

    def init(self) -> None:
        self._start_driver()
        self.torch_started = True

    def device_count(self) -> int:
        return self.driver_count if self.torch_started else self._nvml_count()


@pytest.fixture
def eight_gpus(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")      # so that monkeypatch restores ours after
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(choosing.torch, "cuda", Driver())


@pytest.mark.parametrize("value, when, expected", [
    (None, False, 8), ("", False, 0), ("0", False, 1),     # set in time
    ("", True, 8), ("0", True, 8),                           # after torch started CUDA: ignored
    ("", "is_available", 0), ("0", "is_available", 1),       # after best_device(): the count moves
    ("", "is_available, then init", 8),                      # ...but CUDA kept what it read
])
def test_a_late_variable_moves_the_count_until_torch_starts_cuda(eight_gpus, value, when, expected):
    assert count_gpus_in_this_process(value, set_after_init=when) == expected


def test_an_unknown_moment_is_refused():
    with pytest.raises(ValueError, match="set_after_init"):
        count_gpus_in_this_process("", set_after_init="later")
    with pytest.raises(ValueError, match="'x'"):
        visible_gpu_counts({"x": ("", "never")})


@pytest.mark.parametrize("at_start, value, when, expected", [
    ("0", "", True, 1),             # CUDA started under "0" in the probe, before the late ""
    (None, "", "is_available", 0),  # the driver read "unset" (8); the count re-reads ""
    ("", None, False, 8),           # set in time: the start value is replaced before CUDA starts
])
def test_a_forked_probe_starts_under_its_own_setting(eight_gpus, at_start, value, when, expected):
    assert choosing._count_gpus_in_a_fresh_fork(at_start, value, when) == expected
