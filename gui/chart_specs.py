"""The charts the window draws, by key: titles and axes, without pyqtgraph.

The File > Export chart menu is built from these at start-up, before the chart views
(which load pyqtgraph) exist.
"""

# live chart key -> (title, left-axis label, units pyqtgraph may prefix: only for s and W)
LIVE_CHARTS: dict[str, tuple[str, str, str | None]] = {
    "loss": ("Loss", "loss", None),
    "loss_scale": ("Loss scale (○ = skipped step)", "log2(scale)", None),
    "step_time": ("Step time", "step time", "s"),
    "throughput": ("Throughput", "tokens/s", None),
    "mfu": ("MFU (model FLOPs, no recompute)", "MFU (%)", None),
    "memory": ("Allocated (solid) / reserved (dashed)", "memory (MiB)", None),
    "monitor_util": ("GPU utilisation", "utilisation (%)", None),
    "monitor_memory": ("GPU memory", "memory (MiB)", None),
    "monitor_power": ("GPU power", "power", "W"),
    "monitor_gpm": ("Tensor pipe / SM activity (GPM)", "activity (%)", None),
    # a user's own loop (ampscope.Recorder, the Trainer callback): what the loop itself used
    "learning_rate": ("Learning rate (the optimizer step's)", "lr", None),
    "grad_norm": ("Grad norm", "2-norm", None),
    "step_breakdown": ("Where each step's time went (stacked)", "time", "s"),
    "scalars": ("Logged scalars (rec.log)", "value", None),
}
# trial-start lines on the monitor charts carry their precision's name up to this many
# trials; more names overprinted each other on a 1366 px screen
NAMED_TRIALS = 4
# shown for a user's own run only: a profile trial has no scheduler, phases or rec.log
USER_RUN_CHARTS = ("learning_rate", "grad_norm", "step_breakdown", "scalars")

# the MFU charts' titles once a run says which peak MFU divides by (both: solid and dashed)
MFU_TITLES = {
    "common": "MFU (model FLOPs) vs the device's common 16-bit Tensor Core peak "
              "(one denominator for every recipe)",
    "datasheet": "MFU (model FLOPs) vs datasheet peak",
    "measured": "MFU (model FLOPs) vs measured matmul peak",
    "both": "MFU (model FLOPs): solid vs datasheet peak, dashed vs measured matmul peak",
}

# Compare tab chart key -> (title, left-axis label, units)
COMPARE_CHARTS: dict[str, tuple[str, str, str | None]] = {
    "memory": ("Memory by category (left: measured, right: predicted)", "MiB", None),
    "throughput": ("Throughput (whiskers: 95% CI; label: speed-up vs fp32)", "tokens/s", None),
    "mfu": ("MFU (model FLOPs, no recompute; peak blended by dtype)", "MFU", "%"),
    "peak_memory": ("Peak memory", "MiB", None),
}


def device_kind(environment) -> str | None:
    """A run's device kind ("cpu", "cuda"), or None where its environment does not say
    (older and hand-made reports hold other shapes)."""
    device = environment.get("device") if isinstance(environment, dict) else None
    return device.get("kind") if isinstance(device, dict) else None
