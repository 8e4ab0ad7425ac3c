"""Which run is on show, in one line: the device it ran on, its model and shape, and the
versions it ran with; and whether it came from another machine than this one (a report a
GPU server wrote, opened here), so the Run form can say it is not that run's."""

from __future__ import annotations

from engine.record.run_record import RunRecord

VERSIONS = ("torch", "transformers")  # the libraries that decide what a trial measures


def run_device(record: RunRecord) -> str | None:
    """The name of the device the run ran on ("NVIDIA H200", "CPU: AMD EPYC 7B13"), or None
    where its environment does not say (older and hand-made reports)."""
    environment = record.environment if isinstance(record.environment, dict) else {}
    device = environment.get("device")
    if not isinstance(device, dict) or not device.get("name"):
        return None
    name = str(device["name"])
    return name if device.get("kind") != "cpu" else f"CPU: {name}"


def run_summary(record: RunRecord, with_precisions: bool = True) -> str:
    """"NVIDIA H200 (CUDA 13.0): gpt2, batch 2 × 128 tokens, fp32; torch 2.11.0,
    transformers 5.17.0"; a part the record does not hold is n/a."""
    config = record.config or {}
    environment = record.environment if isinstance(record.environment, dict) else {}
    device = environment.get("device") if isinstance(environment.get("device"), dict) else {}
    cuda = device.get("cuda_version")
    where = run_device(record) or "n/a (the report does not name its device)"
    if cuda and device.get("kind") == "cuda":
        where += f" (CUDA {cuda})"
    libraries = environment.get("libraries") if isinstance(environment.get("libraries"),
                                                            dict) else {}
    versions = ", ".join(f"{name} {libraries.get(name) or 'n/a'}" for name in VERSIONS)
    shape = (f"batch {config.get('batch_size', 'n/a')} × {config.get('seq_len', 'n/a')} tokens")
    precisions = ", ".join(t.precision for t in record.trials) or ", ".join(
        config.get("precisions", [])) or "no trials"
    what = [config.get("model", "n/a"), shape, *([precisions] if with_precisions else [])]
    return f"{where}: {', '.join(map(str, what))}; {versions}"


def from_elsewhere(record: RunRecord, here: str | None) -> bool:
    """Whether ``record`` ran on another device than ``here`` (this machine's device name as
    ``run_device`` writes it; None while the probe has not answered) or on another host."""
    device = run_device(record)
    if device is None:
        return False
    if here is not None and device != here:
        return True
    import socket

    host = record.environment.get("host") if isinstance(record.environment, dict) else None
    return bool(host) and host != socket.gethostname()


def local_device(info) -> str | None:
    """This machine's chosen device as ``run_device`` names a run's (a ``DeviceInfo``)."""
    if info is None:
        return None
    return info.name if info.kind != "cpu" else f"CPU: {info.name}"
