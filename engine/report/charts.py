"""The report's charts, drawn with matplotlib into SVG text for inlining in HTML.

Only the object-oriented API (``Figure``) is used, never pyplot, so no GUI backend
is chosen and charts can be drawn from any thread. Each precision has its colour from
``engine.record.colors``. A chart whose data the run does not have is ``None`` with a note
saying why, never an empty or zero-filled plot.
"""

from __future__ import annotations

import functools
import io
import math
from dataclasses import dataclass

import matplotlib as mpl
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator, NullFormatter

from engine.record.colors import color_of
from engine.record.compare import baseline_reason, comparison_rows, format_cell, record_precisions
from engine.record.memory_timeline_series import (
    CATEGORY_STYLE,
    plan_series,
    shared_top,
    size_text,
    trial_series,
)
from engine.record.run_record import RunRecord

_STYLE = {
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.fontsize": 8,
    "legend.frameon": False,
    "svg.fonttype": "none",  # text stays text: smaller files, selectable labels
    # labels are plain text: a name with "$" (a precision, a model) is not a formula
    "text.parse_math": False,
}

# categories of the memory chart, with Paul Tol's "light" colours (not precision colours)
_MEMORY_CATEGORIES = (
    ("params_bytes", "parameters", "#77AADD"),
    ("grads_bytes", "gradients", "#EE8866"),
    ("optimizer_bytes", "optimizer state", "#EEDD88"),
    ("weight_copies_bytes", "weight copies", "#99DDFF"),
    ("activations_bytes", "activations", "#FFAABB"),
)
_OTHER_COLOR = "#DDDDDD"
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h")


@dataclass(frozen=True)
class Chart:
    title: str
    svg: str | None  # None: nothing to draw, ``note`` says why
    note: str = ""


def _color(precision: str) -> str:
    return color_of(precision)


def _styled(draw):
    """Draw under the report's style; rc settings apply when axes and text are created."""

    @functools.wraps(draw)
    def wrapper(record: RunRecord, *args) -> Chart:
        with mpl.rc_context(_STYLE):
            return draw(record, *args)

    return wrapper


def _figure(height: float = 3.0) -> Figure:
    return Figure(figsize=(7.5, height), layout="constrained")


def _svg(fig: Figure) -> str:
    buf = io.StringIO()
    # no metadata block: it carries a date (charts would differ run to run) and web links
    fig.savefig(buf, format="svg", metadata={"Creator": None, "Date": None, "Format": None,
                                             "Type": None})
    text = buf.getvalue()
    return text[text.index("<svg") :]  # drop the XML prolog: the SVG goes inline in HTML


def _value(x: float | None) -> float:
    return math.nan if x is None else x  # NaN leaves a gap in a matplotlib line


def _byte_unit(largest: float) -> tuple[float, str]:
    for scale, unit in ((1024**3, "GiB"), (1024**2, "MiB"), (1024, "KiB")):
        if largest >= scale:
            return scale, unit
    return 1, "bytes"


def _step_lines(record: RunRecord, field: str, ylabel: str, title: str) -> Chart:
    fig = _figure()
    ax = fig.add_subplot()
    drawn, non_finite = False, []
    for i, p in enumerate(record_precisions(record)):
        steps = [s for s in record.steps(p) if getattr(s, field) is not None]
        if not steps:
            continue
        xs = [s.step for s in steps]
        ys = [getattr(s, field) for s in steps]
        if not all(math.isfinite(y) for y in ys):
            non_finite.append(p)
        # precisions often agree closely: thinner lines and own markers on top keep all visible
        marker = _MARKERS[i % len(_MARKERS)]
        ax.plot(xs, ys, color=_color(p), marker=marker, markersize=4,
                linewidth=max(0.8, 2.6 - 0.4 * i), label=p)
        warm = [(s.step, getattr(s, field)) for s in steps if s.warmup]
        if warm:
            ax.plot(*zip(*warm), linestyle="none", marker=marker, markersize=6,
                    markerfacecolor="white", color=_color(p))
        drawn = True
    if not drawn:
        return Chart(title, None, f"no trial recorded a {field} value")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step (hollow markers: warm-up)")
    ax.set_ylabel(ylabel)
    ax.legend(loc="best")
    note = ""
    if non_finite:
        note = f"inf or NaN values (not drawn) in: {', '.join(non_finite)}"
    return Chart(title, _svg(fig), note)


@_styled
def loss_chart(record: RunRecord) -> Chart:
    return _step_lines(record, "loss", "loss", "Training loss per step")


@_styled
def step_time_chart(record: RunRecord) -> Chart:
    return _step_lines(record, "step_ms", "step time (ms)", "Step time")


@_styled
def loss_scale_chart(record: RunRecord) -> Chart:
    title = "GradScaler loss scale"
    fig = _figure()
    ax = fig.add_subplot()
    scaled = False
    for p in record_precisions(record):
        steps = [s for s in record.steps(p) if s.loss_scale is not None]
        if not steps:
            continue
        ax.plot([s.step for s in steps], [s.loss_scale for s in steps], color=_color(p),
                drawstyle="steps-post", label=p)
        skipped = [s for s in steps if s.skipped]
        if skipped:
            ax.scatter([s.step for s in skipped], [s.loss_scale for s in skipped],
                       marker="x", s=45, color=_color(p), zorder=3,
                       label=f"{p}: skipped step (inf/NaN gradients)")
        scaled = True
    if not scaled:
        return Chart(title, None, "no precision in this run uses a GradScaler (only fp16-amp does)")
    ax.set_yscale("log", base=2)
    # plain "2^17": matplotlib's log ticks are mathtext, which an SVG kept as text (svg.fonttype
    # "none") shows as its source, "$\\mathdefault{2^{17}}$"
    ax.yaxis.set_major_formatter(FuncFormatter(_power_of_two))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("loss scale (log2)")
    ax.legend(loc="best")
    return Chart(title, _svg(fig))


def _power_of_two(value: float, _position) -> str:
    """A log2 tick as plain text: "2^17" for a power of two, else the number itself."""
    if value <= 0:
        return ""
    power = math.log2(value)
    return f"2^{round(power)}" if abs(power - round(power)) < 1e-9 else f"{value:g}"


def _bars(ax, labels: list[str], values: list[float | None], texts: list[str]) -> None:
    """Bars for known values; "n/a" written in place of a missing one, never a zero bar."""
    known = [v for v in values if v is not None]
    top = max(known) if known else 1.0
    for i, (label, value, text) in enumerate(zip(labels, values, texts)):
        if value is None:
            ax.text(i, top * 0.04, "n/a", ha="center", va="bottom", color="#555555")
        else:
            ax.bar(i, value, color=_color(label), width=0.6)
            ax.text(i, value, text, ha="center", va="bottom")
    ax.set_xticks(range(len(labels)), labels)
    ax.set_ylim(0, top * 1.15)
    ax.grid(axis="x", visible=False)


@_styled
def throughput_chart(record: RunRecord) -> Chart:
    title = "Throughput and speed-up vs fp32"
    rows = comparison_rows(record)
    if not any(r.tokens_per_s is not None for r in rows):
        return Chart(title, None, "no trial measured its throughput")
    fig = _figure()
    ax = fig.add_subplot()
    texts = [
        "" if r.speedup_vs_fp32 is None else format_cell("speedup_vs_fp32", r.speedup_vs_fp32)
        for r in rows
    ]
    _bars(ax, [r.precision for r in rows], [r.tokens_per_s for r in rows], texts)
    cis = [(i, r.tokens_per_s, r.tokens_per_s_ci) for i, r in enumerate(rows)
           if r.tokens_per_s is not None and r.tokens_per_s_ci is not None]
    for i, value, (low, high) in cis:  # whiskers: the bootstrap CI of the throughput
        ax.errorbar(i, value, yerr=[[max(0.0, value - low)], [max(0.0, high - value)]],
                    fmt="none", ecolor="#222222", capsize=4, linewidth=1)
    if cis:
        ax.set_ylim(0, max(ax.get_ylim()[1], 1.1 * max(ci[1] for _, _, ci in cis)))
    ax.set_ylabel("tokens / s")
    reason = baseline_reason(record)
    notes = ["whiskers: 95% bootstrap CI over the measured steps"] if cis else []
    if reason:
        notes.append(f"speed-up n/a: {reason}")
    return Chart(title, _svg(fig), "; ".join(notes))


# MFU denominator -> (summary fields of the share and its reason, title, axis label)
_MFU_KINDS = {
    "common": (("mfu_common", "mfu_common_reason"),
               "Model FLOPs utilisation vs common 16-bit Tensor Core peak (one denominator "
               "for every recipe)", "MFU (% of the device's bf16 dense peak)"),
    "datasheet": (("mfu", "mfu_reason"), "Model FLOPs utilisation vs datasheet peak",
                  "MFU (% of datasheet peak)"),
    "measured": (("mfu_measured", "mfu_measured_reason"),
                 "Model FLOPs utilisation vs measured matmul peak",
                 "MFU (% of measured matmul peak)"),
}


@_styled
def mfu_chart(record: RunRecord, denominator: str = "datasheet") -> Chart:
    (field, reason_field), title, ylabel = _MFU_KINDS[denominator]
    trials = [t for t in record.trials if t.summary is not None]
    by_reason: dict[str, list[str]] = {}  # one line per reason, not one per precision
    for t in trials:
        if getattr(t.summary, field) is None:
            reason = getattr(t.summary, reason_field) or "not measured"
            by_reason.setdefault(reason, []).append(t.precision)
    missing = "; ".join(f"{', '.join(ps)}: {reason}" for reason, ps in by_reason.items())
    values = [None if getattr(t.summary, field) is None else getattr(t.summary, field) * 100
              for t in trials]
    if all(v is None for v in values):
        return Chart(title, None, missing or "no trial finished")
    note = f"MFU n/a for {missing}" if missing else ""
    fig = _figure()
    ax = fig.add_subplot()
    _bars(ax, [t.precision for t in trials], values,
          ["" if v is None else f"{v:.1f}%" for v in values])
    ax.set_ylabel(ylabel)
    return Chart(title, _svg(fig), note)


def mfu_charts(record: RunRecord) -> list[Chart]:
    """MFU against each denominator a trial has; the datasheet's n/a is said once where no
    trial has a measured one either (a CPU run charts the measured peak alone). Recipes are
    compared against the common 16-bit peak where the device has one: each recipe's own
    datasheet peak ranks an fp32 trial above a faster bf16 one."""
    measured = mfu_chart(record, "measured")
    common = mfu_chart(record, "common")
    datasheet = common if common.svg is not None else mfu_chart(record, "datasheet")
    if measured.svg is None:
        return [datasheet]
    return [datasheet, measured] if datasheet.svg is not None else [measured]


@_styled
def memory_chart(record: RunRecord) -> Chart:
    title = "Memory by category (measured) and predicted total"
    trials = [t for t in record.trials if t.memory is not None]
    if not trials:
        return Chart(title, None, "no trial measured its memory")
    tops = [
        max(t.memory.total_bytes or 0,
            sum(getattr(t.memory, key) or 0 for key, _, _ in _MEMORY_CATEGORIES),
            t.predicted_memory.total_bytes if t.predicted_memory else 0)
        for t in trials
    ]
    scale, unit = _byte_unit(max(tops))
    fig = _figure(3.4)
    ax = fig.add_subplot()
    notes, labelled, no_peak = [], set(), []
    for i, t in enumerate(trials):
        m, bottom = t.memory, 0.0
        for key, name, color in _MEMORY_CATEGORIES:
            value = getattr(m, key)
            if value is None and key == "weight_copies_bytes":  # a report from before them
                continue
            if value is None:
                why = m.activations_method or "not measured"
                notes.append(f"{t.precision}: {name} n/a ({why})")
                continue
            ax.bar(i, value / scale, bottom=bottom, color=color, width=0.55,
                   label=None if name in labelled else name, edgecolor="white", linewidth=0.5)
            labelled.add(name)
            bottom += value / scale
        if not m.total_bytes:
            no_peak.append(t.precision)
        elif m.activations_bytes is not None:  # else "other" would hide the activations
            other = m.total_bytes / scale - bottom
            if other >= 0:
                ax.bar(i, other, bottom=bottom, color=_OTHER_COLOR, width=0.55,
                       label=None if "other" in labelled
                       else "other at the peak (temporaries, buffers, batch)",
                       edgecolor="white", linewidth=0.5)
                labelled.add("other")
            else:
                notes.append(f"{t.precision}: categories exceed the measured peak by "
                             f"{-other:.2f} {unit}")
        if t.predicted_memory is not None:
            ax.scatter(i + 0.36, t.predicted_memory.total_bytes / scale, marker="D", s=30,
                       color="black", zorder=3,
                       label=None if "predicted" in labelled else "predicted total")
            labelled.add("predicted")
    ax.set_xticks(range(len(trials)), [t.precision for t in trials])
    for tick, t in zip(ax.get_xticklabels(), trials):
        tick.set_color(_color(t.precision))
    ax.set_ylabel(f"memory ({unit})")
    ax.grid(axis="x", visible=False)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    if no_peak:
        notes.append(f"'other' n/a for {', '.join(no_peak)}: no peak was measured")
    return Chart(title, _svg(fig), "; ".join(notes))


@dataclass(frozen=True)
class _Panel:
    series: tuple[tuple[str, str], ...]  # (MonitorSample field, legend label)
    ylabel: str
    in_bytes: bool = False


_MONITOR_PANELS: dict[str, tuple[_Panel, ...]] = {
    "nvml": (
        _Panel((("gpu_util_pct", "GPU util"), ("mem_util_pct", "memory util")), "utilisation (%)"),
        _Panel((("gpu_mem_used_bytes", "GPU memory used"),), "GPU memory", in_bytes=True),
        _Panel((("power_w", "power"),), "power (W)"),
    ),
    "host": (
        _Panel((("cpu_pct", "process CPU"),), "CPU (%)"),
        _Panel((("host_rss_bytes", "process RSS"),), "host memory", in_bytes=True),
    ),
}
_MONITOR_PANELS["amdsmi"] = _MONITOR_PANELS["nvml"]  # the same fields from AMD SMI


@_styled
def monitor_chart(record: RunRecord) -> Chart:
    title = "Device monitor"
    sources = {m.source for m in record.monitor_samples}
    source = next((s for s in ("nvml", "amdsmi", "host") if s in sources), None)
    if source is None:
        return Chart(title, None, "no monitor samples were recorded")
    samples = [m for m in record.monitor_samples if m.source == source]
    t0 = record.started_s or samples[0].time_s
    xs = [m.time_s - t0 for m in samples]
    panels = [
        panel for panel in _MONITOR_PANELS[source]
        if any(getattr(m, field) is not None for m in samples for field, _ in panel.series)
    ]
    if not panels:
        return Chart(title, None, f"the {source} monitor reported no values")
    fig = _figure(1.9 * len(panels) + 0.6)
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for ax, panel in zip(axes, panels):
        scale, ylabel = 1, panel.ylabel
        if panel.in_bytes:
            largest = max(getattr(m, f) or 0 for m in samples for f, _ in panel.series)
            scale, unit = _byte_unit(largest)
            ylabel = f"{ylabel} ({unit})"
        for (field, label), style in zip(panel.series, ("-", "--")):
            ys = [_value(getattr(m, field)) for m in samples]
            ax.plot(xs, [y / scale for y in ys], color="#333333", linestyle=style, label=label)
        for trial in record.trials:
            if trial.finished_s > trial.started_s > 0:
                ax.axvspan(trial.started_s - t0, trial.finished_s - t0,
                           color=_color(trial.precision), alpha=0.18, linewidth=0)
        ax.set_ylabel(ylabel)
        if len(panel.series) > 1:
            ax.legend(loc="upper left")
    for trial in record.trials:
        if trial.finished_s > trial.started_s > 0:
            axes[0].text((trial.started_s + trial.finished_s) / 2 - t0, 1.02, trial.precision,
                         transform=axes[0].get_xaxis_transform(), ha="center", va="bottom",
                         color=_color(trial.precision), fontsize=8)
    axes[-1].set_xlabel("time since the run started (s); shaded: each precision's trial")
    source_text = {"nvml": "NVML (GPU)", "amdsmi": "AMD SMI (ROCm GPU)"}.get(
        source, "psutil (host; no NVML on this machine)")
    device = record.environment.get("device")
    power = device.get("power_method") if source != "host" and isinstance(device, dict) else None
    return Chart(title, _svg(fig), f"source: {source_text}" + (f"; {power}" if power else ""))


def report_charts(record: RunRecord) -> list[Chart]:
    """Every chart of the report, in reading order."""
    return [
        throughput_chart(record),
        *mfu_charts(record),
        memory_chart(record),
        memory_timeline_chart(record),
        loss_chart(record),
        loss_scale_chart(record),
        step_time_chart(record),
        monitor_chart(record),
    ]


# --- memory across the step (engine/record/memory_timeline_series.py) ---------------------

_LEVEL_STYLE = {"usable": ("black", "-"), "allocated": ("#997700", "-."),
                "reserved": ("#994455", "--"),
                "nvml": ("#004488", ":")}


def _phase_marks(ax, s, x_of) -> None:
    """Shade each checkpointed layer's recompute, draw a line where a phase begins, and
    label the spans wide enough to hold a word."""
    width = max(x_of(s.ops) - x_of(0), 1)
    labelled = set()
    for first, last, phase in s.spans:
        left, right = x_of(first), x_of(last)
        if phase.startswith("recompute"):
            ax.axvspan(left, right, color="#BBBBBB", alpha=0.35, linewidth=0)
        else:
            ax.axvline(left, color="#555555", linewidth=0.6)
        short = "recompute" if phase.startswith("recompute") else phase
        if (right - left) / width >= 0.07 and (short, round(left)) not in labelled:
            ax.text((left + right) / 2, 1.0, short, transform=ax.get_xaxis_transform(),
                    ha="center", va="bottom", fontsize=7, color="#333333")
            labelled.add((short, round(left)))


def _draw_timeline(ax, s, scale: float, x_of) -> None:
    xs = [x_of(x) for x in s.x]
    ax.stackplot(xs, [[v / scale for v in vals] for vals in s.values],
                 colors=[CATEGORY_STYLE.get(n, (n, _OTHER_COLOR))[1] for n in s.categories],
                 labels=[CATEGORY_STYLE.get(n, (n, ""))[0] for n in s.categories],
                 step="post", linewidth=0, rasterized=True)  # hundreds of vertices each
    ax.plot([x_of(s.peak_x)], [s.peak_bytes / scale], marker="v", color="black",
            linestyle="none", label="peak")
    right = x_of(s.peak_x) > (x_of(0) + x_of(s.ops)) / 2  # the label stays inside the axes
    ax.annotate(f"peak {size_text(s.peak_bytes)}", (x_of(s.peak_x), s.peak_bytes / scale),
                xytext=(-4 if right else 4, 4), textcoords="offset points", fontsize=7,
                ha="right" if right else "left")
    if s.overlay_x:
        ax.plot([x_of(x) for x in s.overlay_x], [v / scale for v in s.overlay_bytes],
                color="black", linewidth=1.2, drawstyle="steps-post", label=s.overlay_label)
    for level in s.levels:
        color, style = _LEVEL_STYLE.get(level.key, ("black", "-"))
        ax.axhline(level.bytes / scale, color=color, linestyle=style, linewidth=1,
                   label=level.label)
    _phase_marks(ax, s, x_of)


def _timeline_figure(drawn: list, xlabel: str) -> str:
    """One row per series, one byte axis for all, one legend."""
    top = shared_top(drawn)
    scale, unit = _byte_unit(top)
    fig = Figure(figsize=(7.5, 1.9 * len(drawn) + 0.8), layout="constrained")
    axes = fig.subplots(len(drawn), 1, sharey=True, squeeze=False)[:, 0]
    handles, labels = [], []
    for ax, s in zip(axes, drawn, strict=True):
        _draw_timeline(ax, s, scale, float)
        precision = s.title.split(" ")[0]
        ax.set_ylabel(f"{s.title}\n({unit})", color=_color(precision))
        ax.set_xlim(0, s.ops)
        ax.set_ylim(0, top / scale * 1.08)
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    axes[-1].set_xlabel(xlabel)
    fig.legend(handles, labels, loc="outside right upper")
    return _svg(fig)


@_styled
def memory_timeline_chart(record: RunRecord) -> Chart:
    """One stacked area per precision, on one shared byte axis."""
    title = "Memory across one training step, by category (the memory step)"
    drawn = [s for t in record.trials
             if (s := trial_series(t, record.environment)) is not None]
    if not drawn:
        return Chart(title, None, "no trial recorded a memory timeline (reports before it, "
                                  "user runs, stopped trials)")
    svg = _timeline_figure(drawn, "aten ops into the step")
    notes = sorted({s.note for s in drawn if s.note})
    return Chart(title, svg, "; ".join(notes + [
        "each point is a real moment of the step (a few hundred kept of every allocation "
        "change, the peak exact); shaded: a checkpointed layer's forward rerunning"]))


def plan_timeline_html(result) -> str:
    """The plan's traced steps across time, each with its cards' usable memory; where a
    measured trial of the same recipe recorded a timeline, its total on the same axes."""
    import html

    drawn = [s for t in result.trials if (s := plan_series(t)) is not None]
    if not drawn:
        return ""
    with mpl.rc_context(_STYLE):
        svg = _timeline_figure(drawn, "aten ops into the traced step (a measured step "
                                      "scaled to the same length)")
    measured = ", and measured where a real trial exists" if any(
        s.overlay_x for s in drawn) else ""
    note = html.escape("Stacked: the traced step's bytes by category at each allocation "
                       "change (a few hundred kept, the peak exact); lines: each card's usable "
                       "memory; a black line: the measured trial's total over its own step.")
    return f"<h2>Memory across one training step (traced{measured})</h2>{svg}<p>{note}</p>"
