"""Refuse a run that will not fit in the memory the machine has free, before it starts.

Each trial's peak is predicted by engine.models.memory_model from the model built on the
meta device (no memory, a second or less: engine.run.plan.meta_shape) and compared with
what the device has free now: ``psutil``'s available memory on the CPU, NVML's or AMD SMI's
free memory on a GPU (a GPU neither sees: torch's, read in a short-lived child process).
Trials run one at a time, so the largest prediction is the one that must fit. A prediction
that cannot be made (a hub model not in the cache, a distributed strategy whose memory is
per rank), or free memory that cannot be read, is said, not guessed, and the run is not
refused for it.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

from engine.core.config import AUTO, RunConfig, base_precision

GIB = 2**30
CHILD_TIMEOUT_S = 120  # a child importing torch and starting CUDA: seconds, on a slow disk more
# the CUDA context mem_get_info needs ends with the child, not held by the CLI for the run
_CHILD = "import sys, torch; print(torch.cuda.mem_get_info(int(sys.argv[1]))[0])"


@dataclass(frozen=True)
class FitCheck:
    """The largest predicted trial peak against the device's free memory, both in bytes."""

    precision: str | None  # the trial with the largest prediction
    predicted_bytes: int | None
    free_bytes: int | None
    device: str  # "cpu" or "cuda:N"
    note: str | None = None  # why a figure is missing

    @property
    def fits(self) -> bool:
        return (self.predicted_bytes is None or self.free_bytes is None
                or self.predicted_bytes <= self.free_bytes)

    def refusal(self) -> str:
        """One line with the figures and what to do."""
        return (f"the {self.precision} trial is predicted to need "
                f"{self.predicted_bytes / GIB:,.2f} GiB at its peak (engine.models.memory_model, "
                f"batch and sequence as set) but {self.device} has {self.free_bytes / GIB:,.2f} "
                "GiB free now: lower --batch-size or --seq-len, turn on "
                "--grad-checkpointing, or free memory, then run again")


def free_bytes(device: str) -> tuple[int | None, str, str | None]:
    """(bytes free on ``device`` now or None, the device's name as said in the refusal, why
    it is None)."""
    if device.startswith("cuda"):
        import torch

        from engine.measure import amd_smi, nvml
        from engine.measure.device import probe

        index = torch.device(device).index or 0
        name = f"cuda:{index}"
        # never torch.cuda.mem_get_info here: it would create a CUDA context in this process,
        # holding memory the trials' processes then lack
        lib, handle = probe(name).telemetry()
        if lib is amd_smi:
            free = amd_smi.free_bytes(handle)
        else:
            memory = nvml.query("nvmlDeviceGetMemoryInfo", handle) if handle is not None else None
            free = memory.free if memory is not None else None
        if free is not None:
            return int(free), name, None
        free, note = _free_in_child(index)
        return free, name, note
    import psutil

    return int(psutil.virtual_memory().available), "this machine's memory", None


def _free_in_child(index: int) -> tuple[int | None, str | None]:
    """torch's free memory of ``cuda:index``, read in a child process; None with the reason
    when it cannot tell (the run is then not checked)."""
    try:
        done = subprocess.run([sys.executable, "-c", _CHILD, str(index)], capture_output=True,
                              text=True, timeout=CHILD_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:  # no interpreter, a timeout
        said = f"{type(exc).__name__}: {exc}"
    else:
        try:
            return int(done.stdout.split()[-1]), None
        except (ValueError, IndexError):  # it raised: its last line says why
            said = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return None, (f"free memory not checked: neither NVML nor AMD SMI sees cuda:{index}, and a "
                  f"child process's torch.cuda.mem_get_info failed ({said})")


def check(config: RunConfig) -> FitCheck:
    """Predict each trial's peak and compare the largest with the free memory."""
    from engine.core.recipes import recipe
    from engine.measure.device import resolve_device
    from engine.models.memory_model import predict_memory
    from engine.run.plan import PlanConfig, meta_shape, trial_optimizer

    device = str(resolve_device(config.device))
    if config.strategy != "none":
        return FitCheck(None, None, None, device, "a distributed run's memory is per rank: "
                        "`plan --strategy` predicts it")
    # an ':auto' recipe converts some of fp8's layers, chosen per card (the plan refuses it):
    # its bound is its recipe's with every layer converted
    asked = {p.replace(f":{AUTO}", "", 1): p for p in config.precisions}
    plan = PlanConfig(model=config.model, precisions=tuple(asked), batch_size=1,
                      seq_len=config.seq_len, grad_checkpointing=config.grad_checkpointing,
                      optimizer=config.optimizer, history=False, max_batch=0)
    largest: tuple[int, str] | None = None
    try:
        for precision in plan.precisions:
            shape = meta_shape(plan, precision)
            predicted = predict_memory(
                recipe(base_precision(precision)), trial_optimizer(plan, precision), shape,
                config.batch_size, config.seq_len, config.grad_checkpointing,
                "cuda" if device.startswith("cuda") else "cpu").total_bytes
            if largest is None or predicted > largest[0]:
                largest = (predicted, asked.get(precision, precision))
    except Exception as exc:  # noqa: BLE001 (the run itself reports what is wrong, better)
        return FitCheck(None, None, None, device, f"memory not predicted: {exc}")
    free, name, note = free_bytes(device)
    return FitCheck(largest[1], largest[0], free, name, note)


def refuse_if_too_big(config: RunConfig) -> FitCheck:
    """``check``, raising ``ValueError`` with the figures when the run will not fit."""
    result = check(config)
    if not result.fits:
        raise ValueError(result.refusal())
    return result
