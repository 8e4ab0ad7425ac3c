"""The CLI's free-memory check on a GPU (engine.run.fits.free_bytes) never creates a CUDA
context in the CLI's process: torch.cuda.mem_get_info would hold a few hundred MB of the GPU
for the whole run, memory the trials' processes then lack. NVML answers on NVIDIA, AMD SMI
on ROCm; a GPU neither sees is asked by a short-lived child process, else not checked, with
the reason."""

from __future__ import annotations

import subprocess

import pytest
import torch

import engine.measure.device
from engine.measure import amd_smi, nvml
from engine.run import fits

GIB = 2**30


class _Gpu:
    """A DeviceInfo's telemetry: (the guarded library, its handle or None)."""

    def __init__(self, lib, handle):
        self.lib, self.handle = lib, handle

    def telemetry(self):
        return self.lib, self.handle

    def nvml_handle(self):
        return self.handle if self.lib is nvml else None


@pytest.fixture
def no_context(monkeypatch):
    def refused(*args, **kwargs):
        raise AssertionError("torch.cuda.mem_get_info in the CLI's process: a CUDA context")

    monkeypatch.setattr(torch.cuda, "mem_get_info", refused)


def _gpu(monkeypatch, lib, handle):
    monkeypatch.setattr(engine.measure.device, "probe", lambda device: _Gpu(lib, handle))


def test_rocm_free_memory_comes_from_amd_smi(monkeypatch, no_context):
    _gpu(monkeypatch, amd_smi, "mi300x")
    vram = {"vram_total": 192 * 1024, "vram_used": 40 * 1024}  # MiB, as amdsmi says

    def query(fn, h, *args):
        assert fn == "amdsmi_get_gpu_vram_usage" and h == "mi300x"
        return vram

    monkeypatch.setattr(amd_smi, "query", query)
    free, name, note = fits.free_bytes("cuda:0")
    assert (free, name, note) == (152 * GIB, "cuda:0", None)


def test_a_gpu_no_library_sees_is_asked_by_a_child_process(monkeypatch, no_context):
    _gpu(monkeypatch, amd_smi, None)
    ran = []

    def child(cmd, **kwargs):
        ran.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout=f"{7 * GIB}\n", stderr="")

    monkeypatch.setattr(fits.subprocess, "run", child)
    assert fits.free_bytes("cuda:1") == (7 * GIB, "cuda:1", None)
    (cmd,) = ran
    assert "mem_get_info" in cmd[2] and cmd[3] == "1"


def test_a_child_that_cannot_tell_leaves_the_run_unchecked_with_the_reason(
        monkeypatch, no_context):
    """Here the child is real: this machine's torch has no GPU, so it fails."""
    _gpu(monkeypatch, nvml, None)
    free, name, note = fits.free_bytes("cuda:0")
    assert free is None and name == "cuda:0"
    assert "neither NVML nor AMD SMI sees cuda:0" in note and "not checked" in note
    check = fits.FitCheck("bf16-amp", 10 * GIB, free, name, note)
    assert check.fits
