"""What ``python3 main.py plan`` can finish, estimated before it traces anything.

The trace builds the whole model on fake tensors and runs a step through every layer, so
its host memory and time grow with the number of layers; under FSDP2 rank 0's shard of
each parameter is its rows divided among ``--nproc-per-node`` ranks. Before tracing, the
model's skeleton is built here on the meta device with 2 and 4 layers, and what one more
layer costs (host bytes by ``tracemalloc``, seconds) is scaled to the config's layer
count: a lower bound of the trace's cost (the trace builds the same modules and then runs
them). A plan whose bound does not fit this machine's available memory, or would take
longer than ``MAX_TRACE_S``, is refused in one line that says what to do; so is a world
size with more ranks than the model's largest parameter has rows. A model whose layers
repeat is traced cut to a few repeats (engine.run.plan_scale): its bound is the cut's.
"""

from __future__ import annotations

import copy
import time
import tracemalloc

import psutil
import torch

MAX_TRACE_S = 600.0  # a plan is a prediction someone waits for: longer traces are refused


def _layers(config) -> int | None:
    layers = getattr(config, "num_hidden_layers", None)
    return layers if isinstance(layers, int) and not isinstance(layers, bool) else None


def _build(config, task: str, layers: int):
    from engine.models.hf import model_class

    sized = copy.deepcopy(config)
    sized.num_hidden_layers = layers
    with torch.device("meta"):
        return model_class(task).from_config(sized)


def _skeleton(config, task: str, layers: int) -> tuple[int, float, int]:
    """(host bytes, seconds, the largest parameter's rows) of the model with ``layers``
    layers, built on the meta device (no weights)."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        model = _build(config, task, layers)
        seconds = time.perf_counter() - start
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    rows = max((p.shape[0] for p in model.parameters() if p.dim() > 0), default=1)
    return held, seconds, rows


def check_plan_bounds(plan_config) -> None:
    """Raise ``ValueError`` (one line: the estimate and what to do) for a plan this machine
    cannot finish."""
    from engine.models.load import load_config, resolve_source

    config, task = load_config(resolve_source(plan_config.model))
    layers = _layers(config)
    try:
        # the first build imports the model's code, outside tracemalloc (under it importing
        # takes twice as long) and not counted
        _build(config, task, 1)
        small = _skeleton(config, task, 2)
        large = _skeleton(config, task, 4)
    except Exception:  # a config that cannot be resized: the trace itself will tell
        return
    rows = small[2]
    world = plan_config.nproc_per_node
    if plan_config.strategy == "fsdp2" and world > rows:
        raise ValueError(
            f"--nproc-per-node {world:,} is more ranks than the model's largest parameter "
            f"has rows ({rows:,}): FSDP2 shards rows, so the other ranks would hold only "
            f"padding; plan at most {rows:,} ranks (a node has as many as it has GPUs)")
    if not plan_config.full_trace and layers is not None \
            and resolve_source(plan_config.model).kind != "hub":
        from engine.run.plan_layers import find_pattern
        from engine.run.plan_scale import SAMPLES

        pattern, _ = find_pattern(config, SAMPLES[-1][-1])
        if pattern is not None:  # the model cut to its largest sample is what is traced
            layers = pattern.cut_layers(SAMPLES[-1][-1])
    if layers is None or layers <= 2:
        return
    per_layer_bytes = max(large[0] - small[0], 0) / 2
    per_layer_s = max(large[1] - small[1], 0.0) / 2
    need_bytes = small[0] + (layers - 2) * per_layer_bytes
    need_s = small[1] + (layers - 2) * per_layer_s
    free = psutil.virtual_memory().available
    if need_bytes <= free and need_s <= MAX_TRACE_S:
        return
    fits = (int((free - small[0]) / per_layer_bytes) + 2 if per_layer_bytes else layers,
            int((MAX_TRACE_S - small[1]) / per_layer_s) + 2 if per_layer_s else layers)
    raise ValueError(
        f"a model of {layers:,} layers cannot be planned here: tracing it needs at least "
        f"{need_bytes / 2**30:,.1f} GiB of host memory ({free / 2**30:,.1f} GiB available) "
        f"and {need_s:,.0f} s (at most {MAX_TRACE_S:.0f} s), from building 2 and 4 layers "
        f"on the meta device here ({per_layer_bytes / 2**10:,.0f} KiB and "
        f"{per_layer_s * 1e3:,.1f} ms per layer); plan the model with at most "
        f"{max(1, min(fits)):,} layers (num_hidden_layers in its config.json) and scale")
