"""The tests' fake NVML, answering from a recording (scripts/record_nvml.py's format).

``NvmlReplay(path)`` stands in for pynvml: each ``nvml*`` call is looked up by its name
and arguments (a GPU handle by the UUID NVML gave it) and answers what the recording
says: the result, or the recorded NVML error raised as ``pynvml.NVMLError``. A call
recorded several times answers each recorded result in turn, then repeats the last
(an energy counter that advanced). A call the recording does not have is noted in
``unrecorded`` and raises, so a test can insist the app made only recorded calls.
Constants and ctypes types come from the real pynvml module.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pynvml

DATA = Path(__file__).resolve().parents[1] / "data" / "nvml"


@dataclass(frozen=True)
class Handle:
    """An NVML device handle in a replay, known by the UUID NVML gave it."""

    uuid: str


def _key(fn: str, encoded_args: list) -> str:
    return json.dumps([fn, encoded_args], sort_keys=True)


def _encode(value):
    if isinstance(value, Handle):
        return {"handle": value.uuid}
    if isinstance(value, pynvml.c_nvmlGpmSample_t):
        return {"gpm_sample": True}
    if isinstance(value, pynvml.c_nvmlGpmMetricsGet_t):
        return {"metrics": [_metric_name(value.metrics[i].metricId)
                            for i in range(value.numMetrics)]}
    return value


def _metric_name(metric_id: int) -> str:
    return next((n for n in dir(pynvml) if n.startswith("NVML_GPM_METRIC_")
                 and getattr(pynvml, n) == metric_id), str(metric_id))


def _decode(value):
    if isinstance(value, dict):
        if set(value) == {"handle"}:
            return Handle(value["handle"])
        if set(value) == {"gpm_sample"}:
            return pynvml.c_nvmlGpmSample_t()
        return SimpleNamespace(**{k: _decode(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


class NvmlReplay:
    def __init__(self, path: str | Path):
        self.recording = json.loads(Path(path).read_text())
        self.source = self.recording["source"]
        self._answers: dict[str, list[dict]] = {}
        for call in self.recording["calls"]:
            self._answers.setdefault(_key(call["fn"], call["args"]), []).append(call)
        self._served: dict[str, int] = {}
        self.unrecorded: list[str] = []
        self.made: list[str] = []

    def __getattr__(self, name):
        if not name.startswith("nvml"):
            return getattr(pynvml, name)  # constants, ctypes types, NVMLError

        def call(*args):
            key = _key(name, [_encode(a) for a in args])
            self.made.append(name)
            answers = self._answers.get(key)
            if not answers:
                self.unrecorded.append(key)
                raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            n = self._served.get(key, 0)
            self._served[key] = n + 1
            answer = answers[min(n, len(answers) - 1)]
            if "error" in answer:
                raise pynvml.NVMLError(getattr(pynvml, answer["error"]))
            if name == "nvmlGpmMetricsGet":
                return self._fill_metrics(args[0], answer["result"])
            return _decode(answer["result"])

        return call

    @staticmethod
    def _fill_metrics(request, recorded: dict):
        for i in range(request.numMetrics):
            m = request.metrics[i]
            got = recorded.get(_metric_name(m.metricId))
            if isinstance(got, int | float):
                m.value, m.nvmlReturn = float(got), pynvml.NVML_SUCCESS
            else:
                m.nvmlReturn = getattr(pynvml, (got or {}).get("error",
                                                               "NVML_ERROR_NOT_SUPPORTED"))
        return request


def install(monkeypatch, name: str | Path) -> NvmlReplay:
    """Replay ``tests/data/nvml/<name>.json`` (or the recording at a path) as NVML for
    engine.measure.nvml and engine.measure.gpm, and give torch the CUDA devices the recording saw
    (properties only: nothing runs)."""
    import torch

    from engine.measure import gpm, nvml

    replay = NvmlReplay(name if isinstance(name, Path) else DATA / f"{name}.json")
    monkeypatch.setattr(nvml, "_state", {"tried": True, "ok": True, "error": None,
                                         "lib": replay})
    monkeypatch.setattr(gpm, "_lib", lambda: replay)
    devices = replay.recording.get("torch_devices", [])
    if devices:
        props = [SimpleNamespace(**d) for d in devices]
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: len(props))
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props[i])
    return replay
