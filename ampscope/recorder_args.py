"""What the Recorder is given, checked before anything starts, and what it writes, checked
against its own reader.

An argument the Recorder cannot use is refused at once, in one line: an optimizer or scaler
of the wrong kind would otherwise fail every step (or the run's end) with a warning that
blames something else, and a monitor rate of inf or 1e-300 would flood the journal or kill
the monitor's thread. A step value the journal's reader would refuse (``tokens=10**30``
makes ``tokens_per_s`` 1e31) is dropped from that step with one warning, so every run the
Recorder writes opens in ``report`` and the window.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import torch

from engine.record.validate import number_problem

MONITOR_HZ = (0.1, 100.0)  # host/GPU samples a second: one per 10 s up to NVML's useful rate
# fields computed from another: dropped with it (a throughput of a dropped token count)
DERIVED = {"tokens": ("tokens_per_s", "tflops", "mfu", "hfu"),
           "step_ms": ("tokens_per_s", "tflops", "mfu", "hfu")}


def check_monitor_hz(monitor_hz) -> None:
    low, high = MONITOR_HZ
    if isinstance(monitor_hz, bool) or not isinstance(monitor_hz, numbers.Real) \
            or not (math.isfinite(monitor_hz) and low <= monitor_hz <= high):
        raise ValueError(f"monitor_hz must be a number from {low:g} to {high:g} samples a second "
                         f"(got {monitor_hz!r:.40}); leave it out for 5")


def base_optimizer(optimizer):
    """The torch optimizer itself under wrappers (accelerate's AcceleratedOptimizer)."""
    while optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        optimizer = getattr(optimizer, "optimizer", None)
    inner = getattr(optimizer, "optimizer", None)
    return inner if isinstance(inner, torch.optim.Optimizer) else optimizer


def check_arguments(optimizer, base_optimizer, scaler, monitor_hz) -> None:
    """Raise one ValueError for an argument the Recorder cannot use. ``base_optimizer``: the
    torch optimizer under ``optimizer``'s wrappers (accelerate's), or what was found."""
    if optimizer is not None and not isinstance(base_optimizer, torch.optim.Optimizer):
        raise ValueError(f"optimizer must be a torch.optim.Optimizer (or a wrapper of one), got "
                         f"{type(optimizer).__name__}: pass the optimizer whose step() you "
                         "call, or None")
    if scaler is not None and not isinstance(scaler, torch.amp.GradScaler):
        raise ValueError(f"scaler must be a torch.amp.GradScaler, got {type(scaler).__name__}: "
                         "pass the scaler you call scaler.step() on, or None")
    check_monitor_hz(monitor_hz)


def readable_step(sample, warn) -> object:
    """``sample`` (a StepSample) with every number its reader would refuse set to None, and
    the figures computed from it; ``warn(key, message)`` says which, once."""
    dropped = {}
    for field in dataclasses.fields(sample):
        value = getattr(sample, field.name)
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            continue
        problem = number_problem(field.name, value)
        if problem is not None:
            dropped[field.name] = problem
    if not dropped:
        return sample
    cleared = set(dropped).union(*(DERIVED.get(name, ()) for name in dropped))
    said = "; ".join(f"{name} {problem}" for name, problem in dropped.items())
    warn("implausible", f"step {sample.step} holds values no run can have ({said[:300]}): "
                        f"{', '.join(sorted(cleared))} left out of that step (and of any other "
                        "step like it), the run goes on; check what you pass to rec.step()")
    return dataclasses.replace(sample, **dict.fromkeys(cleared, None))
