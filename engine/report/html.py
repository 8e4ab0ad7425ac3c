"""The HTML report: one self-contained file (inline CSS and SVG, no scripts, no links).

It opens offline in any browser and can be mailed around. Every piece of text from
the record goes through ``html.escape``; the only raw markup is our own and the SVG
matplotlib drew. Missing values read "n/a" beside the reason the record gives.
"""

from __future__ import annotations

import datetime
import html
import os
from pathlib import Path
from string import Template

from engine.core.atomic import atomic_write
from engine.core.config import BF16_EMULATED
from engine.core.events import TrialResult
from engine.core.resources import RESOURCES
from engine.distributed.summary_text import wire_dtype
from engine.measure.kernel_workspace import workspace_line
from engine.measure.lost_updates_text import EXPLANATION as LOST_EXPLANATION
from engine.measure.lost_updates_text import HEADERS as LOST_HEADERS
from engine.measure.lost_updates_text import TITLE as LOST_TITLE
from engine.measure.lost_updates_text import lost_rows
from engine.measure.quant_error_text import HEADERS as QUANT_HEADERS
from engine.measure.quant_error_text import TITLE as QUANT_TITLE
from engine.measure.quant_error_text import layer_db, quant_rows
from engine.record import spread
from engine.record.colors import color_of
from engine.record.compare import (
    COLUMNS,
    NOISY_RULE,
    baseline_reason,
    comparison_rows,
    format_bytes,
    format_cell,
    speed_verdict,
    trained_text,
)
from engine.record.data_text import data_line
from engine.record.run_record import SCHEMA_VERSION, RunRecord
from engine.record.verdict import Verdict, figure_text, verdict
from engine.report.charts import Chart, report_charts

TEMPLATE_PATH = RESOURCES / "report_template.html"
NA = '<span class="na">n/a</span>'


def _e(value) -> str:
    return html.escape(str(value))


def _date(seconds: float | None) -> str:
    if not seconds:
        return "n/a"
    return datetime.datetime.fromtimestamp(seconds).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


def _bytes(value: int | None) -> str:
    return NA if value is None else f"{format_bytes(value)} <span class=na>({value:,} B)</span>"


def _number(value) -> str:
    if value is None:
        return NA
    if isinstance(value, bool):
        return _e(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return _e(f"{value:.6g}")
    return _e(value)


def _swatch(precision: str) -> str:
    color = color_of(precision)
    return f'<span class="swatch" style="background:{color}"></span>{_e(precision)}'


def _status(status: str) -> str:
    return f'<span class="status status-{_e(status)}">{_e(status)}</span>'


def _kv(rows: list[tuple[str, str]]) -> str:
    """A two-column table; values are already HTML."""
    body = "".join(f"<tr><th>{_e(k)}</th><td>{v}</td></tr>" for k, v in rows)
    return f'<table class="kv">{body}</table>'


def _table(headers: list[str], rows: list[list[str]], numeric: set[int] = frozenset()) -> str:
    """A table with escaped headers; cells are already HTML."""
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join(
        "<tr>"
        + "".join(f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>"
                  for i, c in enumerate(row))
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render_value(value) -> str:
    """Any JSON-like value as HTML: dicts as key/value tables, lists of dicts as tables.

    Used for sections whose content other parts of the engine define (numerics).
    """
    if value is None:
        return NA
    if isinstance(value, dict):
        return _kv([(str(k), render_value(v)) for k, v in value.items()]) if value else NA
    if isinstance(value, list | tuple):
        if value and all(isinstance(v, dict) for v in value):
            keys = list(dict.fromkeys(k for v in value for k in v))
            rows = [[render_value(v.get(k)) for k in keys] for v in value]
            return _table(keys, rows)
        return ", ".join(render_value(v) for v in value) if value else "[]"
    return _number(value)


def _flatten(data: dict, prefix: str = "") -> list[tuple[str, object]]:
    out = []
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.extend(_flatten(value, f"{name}."))
        else:
            out.append((name, value))
    return out


def _device(record: RunRecord) -> str:
    device = record.environment.get("device")
    if isinstance(device, dict):
        emulated = device.get("bf16_hardware") is False
        device = device.get("description") or device.get("name")
        if device and emulated:  # bf16 trials ran in emulation: their speeds are no guide
            device += f"; bf16: {BF16_EMULATED}"
    if not device:
        device = next((t.device for t in record.trials if t.device), None)
    return _e(device) if device else NA


# --- sections -------------------------------------------------------------------------


def _header(record: RunRecord) -> str:
    """The title and one line of facts; environment and configuration folded away."""
    model = record.config.get("model", "unknown model")
    duration = (
        f"{record.finished_s - record.started_s:.1f} s"
        if record.finished_s and record.started_s
        else "n/a"
    )
    facts = " &middot; ".join([
        _device(record), _e(_date(record.started_s)), f"run {_status(record.status)}",
        _e(duration), f"run id {_e(record.run_id) if record.run_id else NA}",
    ])
    data = data_line(record)
    return (
        f"<h1>AmpScope report: {_e(model)}</h1>"
        f'<p class="meta">{facts}. "n/a" marks a value this run could not measure; the '
        "reason is given next to it.</p>"
        + (f'<p class="meta">{_e(data[:1].upper() + data[1:])}.</p>' if data else "")
    )


def _run_details(record: RunRecord) -> str:
    """Environment, library versions, the probed device and the configuration: folded."""
    env = {k: v for k, v in record.environment.items() if not isinstance(v, dict) or k != "device"}
    env_html = _kv([(k, render_value(v)) for k, v in _flatten(env)]) if env else NA
    device = record.environment.get("device")
    device_html = render_value(device) if isinstance(device, dict) else NA
    config = _kv([(k, render_value(v)) for k, v in _flatten(record.config)])
    return (f"<details><summary>Environment and library versions</summary>{env_html}</details>"
            f"<details><summary>Device details</summary>{device_html}</details>"
            f"<details><summary>Run configuration</summary>{config}</details>")


def _verdict(v: Verdict) -> str:
    """The recommendation first: the headline, what to do, and why, folded."""
    cls = "verdict" if v.precision else "verdict none"
    advice = f'<p class="todo">To do: {_e(v.advice)}</p>' if v.advice else ""
    reasons = "".join(f"<li>{_e(r)}</li>" for r in v.reasons)
    figures = _table(["precision", "judgement", f"figures vs {v.reference} (95% CI)", "why"],
                     [[_swatch(f.precision), _e(f.judgement), _e(figure_text(f)), _e(f.note)]
                      for f in v.figures])
    return (f'<section class="{cls}"><p class="headline">{_e(v.headline)}</p>{advice}'
            f"<details><summary>Why: each precision, the reasons and the rules</summary>"
            f"{figures}<ul>{reasons}</ul><p class=\"note\">Rules: {_e(v.rules)}.</p>"
            "</details></section>")


def _speed_note(record: RunRecord, verdict) -> str:
    """The verdict on the speeds, how it was reached, and what the steps ran on."""
    style = ' style="color:#9b1c10;font-weight:600"' if verdict.noisy else ""
    suggestion = f" Suggestion: {_e(verdict.suggestion)}." if verdict.suggestion else ""
    batches = {t.summary.distinct_batches for t in record.trials
               if t.summary is not None and t.summary.distinct_batches}
    seed = record.config.get("seed", "n/a")
    text = record.data is not None and record.data.tokens is not None
    what = (f"batches of {_e(record.data.source)} (windows drawn by seed {_e(seed)})" if text
            else f"synthetic batches (random token ids, seed {_e(seed)})")
    pool = (f"Steps cycle through {', '.join(map(str, sorted(batches)))} distinct {what}, so "
            "a step's loss is on one of those batches, not on new data." if batches else
            "The number of distinct batches was not recorded by the AmpScope that ran this.")
    return (f"<p{style}>Speed: {_e(verdict.text)}.{suggestion}</p>"
            "<details><summary>How the spread and the ranking are computed</summary>"
            f'<p class="note">Spread: {_e(spread.METHOD)}. Rule: {_e(NOISY_RULE)}. {pool}</p>'
            "</details>")


# the columns that fit 1280 px; the rest are folded into a second table below
PRIMARY_COLUMNS = ("precision", "status", "median_step_ms", "speedup_vs_fp32", "speedup_ci",
                   "speed_verdict", "peak_memory_bytes", "memory_saving_vs_fp32",
                   "skipped_steps", "final_loss_diff_vs_fp32")
_TEXT_COLUMNS = ("precision", "status", "reason", "speed_verdict", "trained")


def _columns_table(rows, columns) -> str:
    keys = [key for key, _, _ in COLUMNS if key in columns]
    headers = [header for key, header, _ in COLUMNS if key in columns]
    numeric = {i for i, key in enumerate(keys) if key not in _TEXT_COLUMNS}
    cells = []
    for row in rows:
        line = []
        for key in keys:
            value = getattr(row, key)
            if key == "precision":
                line.append(_swatch(value))
            elif key == "status":
                line.append(_status(value))
            else:
                text = format_cell(key, value)
                line.append(NA if text == "n/a" else _e(text))
        cells.append(line)
    return _table(headers, cells, numeric)


def _comparison(record: RunRecord) -> str:
    verdict = speed_verdict(record.trials)
    rows = comparison_rows(record, verdict)
    if not rows:
        return '<p class="na">No trial finished.</p>'
    secondary = ("precision",) + tuple(key for key, _, _ in COLUMNS
                                       if key not in PRIMARY_COLUMNS)
    note = baseline_reason(record)
    baseline = (f'<p class="note">Baseline n/a: {_e(note)}</p>' if note else
                '<p class="note">Speed-up, memory saved and loss difference are against '
                "the fp32 trial.</p>")
    return (_columns_table(rows, PRIMARY_COLUMNS) + baseline + _speed_note(record, verdict)
            + "<details><summary>More columns: throughput, spread, MFU/HFU, energy, trained "
            f"parameters, reasons</summary>{_columns_table(rows, secondary)}</details>"
            + _quant_error(record, {r.precision: r.final_loss_diff_vs_fp32 for r in rows})
            + _lost_updates(record))


def _lost_updates(record: RunRecord) -> str:
    """Each trial's lost-update shares, with the master-weights explanation a click away."""
    rows = lost_rows(record.trials)
    if not rows:
        return ""
    body = [[_swatch(r[0]), *(_e(v) for v in r[1:])] if len(r) == len(LOST_HEADERS) else
            [_swatch(r[0]), f'<span class="na">{_e(r[1])}</span>', "", "", "", ""]
            for r in rows]
    return (f'<h3 id="lost-updates">Lost updates</h3><p class="note">{_e(LOST_TITLE)}.</p>'
            + _table(list(LOST_HEADERS), body, numeric={2, 3, 4})
            + f"<details><summary>Why updates get lost: master weights</summary>"
            f"<p>{_e(LOST_EXPLANATION)}</p></details>")


def _quant_error(record: RunRecord, loss_diffs: dict) -> str:
    """Each trial's SQNR (median / worst layer) beside its loss difference vs fp32."""
    rows = quant_rows(record.trials, loss_diffs)
    if not rows:
        return ""
    body = [[_swatch(r[0]), *(_e(v) for v in r[1:])] if len(r) == len(QUANT_HEADERS) else
            [_swatch(r[0]), f'<span class="na">{_e(r[1])}</span>', "", "", ""] for r in rows]
    return (f'<h3 id="quant-error">Quantisation error</h3><p class="note">{_e(QUANT_TITLE)}. '
            "Each trial's layers are listed in its section.</p>"
            + _table(list(QUANT_HEADERS), body, numeric={1, 2, 3, 4}))


def _layer_sqnr(trial: TrialResult) -> str:
    q = trial.quant_error

    rows = [[_e(r.name), _e(r.format), _e(layer_db(r, "weight")), _e(layer_db(r, "input"))]
            for r in q.layers]
    return (f"<details><summary>Quantisation error per layer (SQNR, dB)</summary>"
            f'<p class="note">{_e(q.method)}</p>'
            f"{_table(['layer', 'rounded as', 'weight dB', 'input dB'], rows, numeric={2, 3})}"
            "</details>")


def _chart(chart: Chart) -> str:
    body = chart.svg if chart.svg is not None else f'<p class="na">n/a: {_e(chart.note)}</p>'
    note = f'<p class="note">{_e(chart.note)}</p>' if chart.svg is not None and chart.note else ""
    return f"<figure><figcaption>{_e(chart.title)}</figcaption>{body}{note}</figure>"


def _error_pct(predicted, category: str | None) -> str:
    """The engine's error for a category: 100 * (predicted - measured) / measured."""
    value = predicted.error_pct.get(category) if predicted is not None and category else None
    return NA if value is None else _e(f"{value:+.1f}%")


def _memory(trial: TrialResult) -> str:
    m, p = trial.memory, trial.predicted_memory
    if m is None and p is None:
        return '<p class="na">n/a: no memory was measured for this trial</p>'
    # (label, measured field at the peak, predicted field, error category, phase whose start
    # the error compares with: saved activations when backward begins, all gradients when
    # the optimiser step begins)
    pairs = [
        ("parameters", "params_bytes", "params_bytes", "params", None),
        ("buffers", "buffers_bytes", "buffers_bytes", "buffers", None),
        ("quantisation state (absmax, SCB)", "quant_state_bytes", "quant_state_bytes",
         "quant_state", None),
        ("fp32 master weights", None, "master_bytes", None, None),
        ("gradients", "grads_bytes", "grads_bytes", "grads", "optimizer"),
        ("optimizer state", "optimizer_bytes", "optimizer_bytes", "optimizer", None),
        ("autocast / dequantised weight copies", "weight_copies_bytes", "weight_copies_bytes",
         "weight_copies", "backward"),
        ("activations", "activations_bytes", "activations_bytes", "activations", "backward"),
        ("temporaries", "temporaries_bytes", None, None, None),
        ("input batch", "inputs_bytes", None, None, None),
        ("peak (total)", "total_bytes", "total_bytes", "total", None),
    ]
    start = (m.at_phase_start_bytes or {}) if m is not None else {}
    names = {"grads": "grads", "weight_copies": "weight_copies", "activations": "activations"}
    rows = []
    for label, mkey, pkey, category, phase in pairs:
        measured = getattr(m, mkey) if m is not None and mkey else None
        predicted = getattr(p, pkey) if p is not None and pkey else None
        then = start.get(phase, {}).get(names.get(category)) if phase else None
        then_text = f"{_bytes(then)} at {phase} start" if then is not None else ""
        rows.append([_e(label), _bytes(measured), then_text, _bytes(predicted),
                     _error_pct(p, category)])
    out = _table(["category", "measured at the peak", "measured then", "predicted",
                  "error (predicted - measured) / measured"], rows, {1, 2, 3, 4})
    if m is not None:
        out += _kv([
            ("peak allocated", _bytes(m.peak_allocated_bytes)),
            ("peak reserved", _bytes(m.peak_reserved_bytes)),
            ("temporaries", _bytes(m.temporaries_bytes)),
            ("NVML process memory", f"{_bytes(m.nvml_process_bytes)} {_e(m.nvml_method)}"),
            ("CUDA context and other (NVML - reserved, read together)",
             _bytes(m.context_gap_bytes)),
            ("peak reached in", _e(m.peak_phase) or NA),
            ("activations measured by", _e(m.activations_method) or NA),
            ("total measured by", _e(m.total_method) or NA),
            ("notes", _e(m.notes) or NA),
        ])
    if p is not None:
        out += _kv([
            ("activations predicted by", _e(p.activations_method) or NA),
            ("prediction formula", _e(p.formula) or NA),
            ("bytes per parameter", render_value(p.bytes_per_param)),
        ])
    return out


def _flops(trial: TrialResult) -> str:
    f = trial.flops
    if f is None:
        return '<p class="na">n/a: FLOPs were not counted for this trial</p>'
    ratio = (
        _e(f"{f.counted_per_step / f.analytic_per_step:.3f}")
        if f.counted_per_step is not None and f.analytic_per_step
        else NA
    )
    by_dtype = ", ".join(f"{k} {v:,}" for k, v in f.by_peak_dtype.items()) or NA
    out = _kv([
        ("model FLOPs per step (MFU)",
         f"{_number(f.analytic_per_step)} ({_e(f.model_convention or 'analytic')}: "
         f"{_e(f.analytic_formula)})"),
        ("hardware FLOPs per step (HFU)",
         f"{_number(f.counted_per_step)} ({_e(f.hardware_convention or 'counted')}; "
         f"{_e(f.counted_method)})"),
        ("hardware / model", ratio),
        ("hardware FLOPs by dtype", _e(by_dtype) if f.by_peak_dtype else NA),
    ])
    if f.by_op:
        rows = [[_e(op), _number(n)] for op, n in sorted(f.by_op.items(), key=lambda kv: -kv[1])]
        out += f"<details><summary>FLOPs by operator</summary>{_table(['op', 'FLOPs'], rows, {1})}"
        out += "</details>"
    return out


def _host_load(trial: TrialResult) -> str:
    load = trial.host_load
    if load is None:
        return f"{NA}: not sampled (a report from an older AmpScope, or a user run)"

    def pair(mean, peak, fmt):
        return NA if mean is None else _e(f"{fmt(mean)} mean, {fmt(peak)} max")

    loads = pair(load.load_avg_1m_mean, load.load_avg_1m_max, lambda v: f"{v:.2f}")
    others = pair(load.other_cpu_pct_mean, load.other_cpu_pct_max, lambda v: f"{v:.0f}%")
    return (f"1-minute load average {loads} on {load.cpu_count} cores; other processes "
            f"{others} of the CPU ({load.samples} samples)")


def _mfu_cell(mfu, peak_flops, source, reason) -> str:
    """MFU of one denominator: the share, the peak and where the peak comes from."""
    if mfu is None:
        return f"{NA}: {_e(reason or 'no reason recorded')}"
    peak = NA if peak_flops is None else _e(f"{peak_flops / 1e12:.4g} TFLOP/s")
    return f"{_e(format_cell('mfu', mfu))} of {peak} ({_e(source or 'source not recorded')})"


def _summary(trial: TrialResult) -> str:
    s = trial.summary
    if s is None:
        return '<p class="na">n/a: the trial has no measured steps</p>'
    mfu = _mfu_cell(s.mfu, s.peak_flops, s.peak_flops_source, s.mfu_reason)
    mfu_common = _mfu_cell(s.mfu_common, s.common_peak_flops, s.common_peak_source,
                           s.mfu_common_reason)
    mfu_measured = _mfu_cell(s.mfu_measured, s.measured_peak_flops, s.measured_peak_source,
                             s.mfu_measured_reason)
    hfu = (_e(format_cell("hfu", s.hfu)) if s.hfu is not None
           else f"{NA}: {_e(s.mfu_reason or 'no reason recorded')}")
    return _kv([
        ("steps measured", _number(s.steps_measured)),
        ("median step time", _e(format_cell("median_step_ms", s.median_step_ms))),
        *_spread_rows(s),
        ("throughput", _e(format_cell("tokens_per_s", s.tokens_per_s))),
        ("achieved TFLOP/s, model FLOPs", _number(s.tflops)),
        ("achieved TFLOP/s, hardware FLOPs", _number(s.hardware_tflops)),
        ("MFU vs common 16-bit peak (one denominator for every recipe on the device)",
         mfu_common),
        ("MFU vs datasheet peak (model FLOPs, no recompute)", mfu),
        ("MFU vs measured matmul peak (the same FLOPs)", mfu_measured),
        ("HFU (hardware FLOPs, recompute included)", hfu),
        ("peak memory", f"{_bytes(s.peak_memory_bytes)} ({_e(s.peak_memory_method)})"),
        ("skipped steps", _number(s.skipped_steps)),
        ("final loss", _number(s.final_loss)),
        ("final loss scale", _number(s.final_loss_scale)),
        ("host load while it ran", _host_load(trial)),
        ("GPU energy per step / per token",
         f"{_number(s.energy_per_step_j)} J / {_number(s.energy_per_token_j)} J "
         f"({_e(s.energy_method) or NA})"),
    ])


def _pct_cell(share) -> str:
    return NA if share is None else _e(f"{100 * share:.1f}%")


def _gpm(trial: TrialResult) -> str:
    g = trial.gpm
    if g is None or g.reason:
        return f"{NA}: {_e(g.reason if g else 'not sampled')}"
    return _e(", ".join(
        f"{label} {'n/a' if v is None else f'{v:.1f}%'}" for label, v in (
            ("tensor pipes", g.tensor_any_util_pct), ("HMMA", g.tensor_hmma_util_pct),
            ("IMMA", g.tensor_imma_util_pct), ("SM active", g.sm_util_pct),
            ("DRAM bandwidth", g.dram_bw_util_pct))) + f" over {g.window}"
        + (f"; {g.na_reason}" if g.na_reason else ""))


def _kernel_time(trial: TrialResult) -> str:
    ps = trial.profiled_step
    if ps is None:
        return f'<p class="na">n/a: {_e(trial.profiled_step_reason or "not profiled")}</p>'
    idle = (_pct_cell(ps.idle_gap_share) if ps.idle_gap_share is not None
            else f"{NA}: {_e(ps.idle_gap_reason)}")
    tc = (_pct_cell(ps.tensor_core_share) if ps.tensor_core_share is not None
          else f"{NA}: {_e(ps.tensor_core_reason)}")
    out = _kv([
        ("profiled step", f"{_e(f'{ps.step_ms:.2f} ms')} ({_e(ps.time_basis)})"),
        ("matmul by dtype", ", ".join(f"{_pct_cell(v)} {_e(k)}"
                                      for k, v in ps.matmul_share_by_dtype.items()) or NA),
        *[(name, _pct_cell(share)) for name, share in ps.category_share.items()],
        ("idle gaps between kernels", idle),
        *([("profiled vs measured step", _e(ps.basis_note))] if ps.basis_note else []),
        ("matmul time on Tensor Cores", tc),
        ("peak memory", f"{_bytes(ps.peak_memory_bytes)} ({_e(ps.peak_memory_method)})"),
        *([("kernel workspace", _e(workspace_line(ps)))] if workspace_line(ps) else []),
        ("dtype of an op", _e(ps.dtype_method)),
        ("Tensor Core activity (NVML GPM)", _gpm(trial)),
    ])
    rows = [[_e(o.op), _e(o.dtype), _e(o.category), _number(o.calls),
             _e(f"{o.self_ms:.3f}"), _pct_cell(o.step_share)] for o in ps.ops]
    out += (f"<details><summary>ops by self time ({len(rows)})</summary>"
            f"{_table(['op', 'dtype', 'category', 'calls', 'ms', 'share'], rows, {3, 4, 5})}"
            "</details>")
    if ps.odd_gemms:
        rows = [[_e(g.op), _e(g.dtype), _e(f"{g.m}x{g.n}x{g.k}"), _number(g.calls),
                 _e(f"{g.ms:.3f}"),
                 NA if g.tensor_core is None else _e("yes" if g.tensor_core else "no"),
                 _e(g.reason)] for g in ps.odd_gemms]
        out += (f"<details><summary>GEMM shapes off the Tensor Core multiple ({len(rows)})"
                "</summary>"
                + _table(["op", "dtype", "MxNxK", "calls", "ms", "on Tensor Cores", "why"], rows,
                         {3, 4})
                + "</details>")
    if ps.kernels:
        rows = [[_e(k.name), _e(k.op), _e(k.dtype), _number(k.calls), _e(f"{k.ms:.3f}"),
                 NA if k.tensor_core is None else _e("yes" if k.tensor_core else "no")]
                for k in ps.kernels]
        out += (f"<details><summary>GPU kernels ({len(rows)})</summary>"
                f"{_table(['kernel', 'op', 'dtype', 'calls', 'ms', 'Tensor Core'], rows, {3, 4})}"
                "</details>")
    return out


def _spread_rows(s) -> list[tuple[str, str]]:
    sp = s.spread
    if sp is None:
        return [("step time spread", f"{NA}: not recorded (report from an older AmpScope, or "
                                     "no measured step)")]
    level = f"{sp.ci_level:.0%}"
    no_ci = f"{NA}: fewer than {spread.MIN_STEPS} measured steps"
    return [
        ("step time p10..p90", _e(format_cell("step_ms_p10_p90", (sp.p10_step_ms,
                                                                   sp.p90_step_ms)))),
        ("step time CV (std / mean)", _e(format_cell("step_ms_cv", sp.cv)) if sp.cv is not None
         else f"{NA}: one measured step"),
        (f"median step time {level} CI", _e(format_cell("step_ms_p10_p90",
                                                        sp.median_step_ms_ci))
         if sp.median_step_ms_ci else no_ci),
        (f"throughput {level} CI", _e(format_cell("tokens_per_s_ci", sp.tokens_per_s_ci))
         if sp.tokens_per_s_ci else no_ci),
        ("interleaved rounds", _number(sp.rounds)),
        ("distinct batches cycled", _number(s.distinct_batches)),
    ]


def _dtype_map(trial: TrialResult) -> str:
    rows = [
        [_e(p.name), _e("x".join(map(str, p.shape))), _e(p.dtype), _e(p.device),
         _number(p.bytes), _number(p.numel), _e(p.trainable), _e(p.module_type),
         _e(p.tied_to) if p.tied_to else ""]
        for p in trial.dtype_map
    ]
    headers = ["parameter", "shape", "dtype", "device", "bytes", "numel", "trainable",
               "module", "tied to"]
    return (f"<details><summary>dtype map ({len(rows)} parameters)</summary>"
            f"{_table(headers, rows, {4, 5})}</details>")


def _module_tree(trial: TrialResult) -> str:
    rows = [
        [f'<span style="padding-left:{m.depth * 1.2:.1f}em">{_e(m.name or "(model)")}</span>',
         _e(m.type), _number(m.params), _bytes(m.bytes), _e(m.quantized),
         _e(m.matmul_dtype) if m.matmul_dtype else NA]
        for m in trial.module_tree
    ]
    headers = ["module", "type", "params", "bytes", "quantized", "matmuls in"]
    return (f"<details><summary>module tree ({len(rows)} modules)</summary>"
            f"{_table(headers, rows, {2, 3})}"
            "</details>")


def _trial(trial: TrialResult) -> str:
    color = color_of(trial.precision)
    reason = f'<p class="note">{_e(trial.reason)}</p>' if trial.reason else ""
    parts = [
        f'<section class="trial" style="border-left-color:{color}">',
        f"<h3>{_swatch(trial.precision)} {_status(trial.status)}</h3>{reason}",
    ]
    if trial.status == "unsupported" and trial.summary is None and trial.memory is None:
        return "".join(parts) + "</section>"
    parts.append(_kv([
        ("recipe", _e(trial.recipe) or NA),
        ("device", _e(trial.device) or NA),
        # engine/measure/gating.py: an emulated trial's speed is not the format's own hardware's
        ("hardware support", f"{_e(trial.support)}: {_e(trial.support_reason)}"
         if trial.support else f"{NA}: not recorded (an older report or a user run)"),
        ("parameters", f"{_number(trial.param_count)} ({_number(trial.trainable_params)} "
                       "trainable)"),
        ("trains", _e(trained_text(trial) or NA)),
        ("LoRA configuration", render_value(trial.lora) if trial.lora else NA),
        ("load footprint", f"{_bytes(trial.load_footprint_bytes)} {_e(trial.footprint_note)}"),
        ("quantisation state beside it",
         _bytes(trial.memory.quant_state_bytes) if trial.memory else NA),
        *([("notes", "<br>".join(_e(n) for n in trial.notes))] if trial.notes else []),
    ]))
    parts.append(f"<h4>Summary and MFU</h4>{_summary(trial)}")
    parts.append(f"<details><summary>FLOPs per step and their formulas</summary>"
                 f"{_flops(trial)}</details>")
    parts.append(f"<details><summary>Memory: measured vs predicted</summary>{_memory(trial)}"
                 "</details>")
    parts.append(f"<details><summary>Time by dtype: one extra profiled step</summary>"
                 f"{_kernel_time(trial)}</details>")
    if trial.ranks:
        parts.append(_ranks(trial))
    if trial.dtype_map:
        parts.append(_dtype_map(trial))
    if trial.module_tree:
        parts.append(_module_tree(trial))
    if trial.quant_error is not None:
        parts.append(_layer_sqnr(trial))
    if trial.numerics is not None:
        parts.append(f"<h4>Numerics</h4>{render_value(trial.numerics)}")
    parts.append("</section>")
    return "".join(parts)


def _ranks(trial: TrialResult) -> str:
    """Distributed trials: memory by category per rank, and bytes per collective."""
    d = trial.distributed
    rows = []
    for r in trial.ranks:
        m, p = r.memory, r.predicted_memory
        cells = [_e(r.rank), _e(r.status)]
        cells += [_bytes(getattr(m, f, None)) if m else NA for f in (
            "sharded_params_bytes", "unsharded_params_bytes", "grads_bytes", "optimizer_bytes",
            "activations_bytes", "comm_buffers_bytes", "total_bytes")]
        err = r.memory_error_pct.get("total")
        cells += [_bytes(p.total_bytes) if p else NA, NA if err is None else f"{err:+.1f}%",
                  NA if r.median_step_ms is None else f"{r.median_step_ms:.1f}"]
        rows.append(cells)
    ranks = _table(["rank", "status", "params (shard)", "unsharded peak", "grads", "optimizer",
                    "activations", "buckets", "total", "predicted", "error", "median step ms"],
                   rows, numeric=set(range(2, 12)))
    comm = _table(["collective", "dtype", "measured per step", "expected", "calls per step"],
                  [[_e(c.collective), _e(wire_dtype(c.collective, c.dtype, d.collectives)),
                    _bytes(c.measured_bytes),
                    _bytes(c.expected_bytes), f"{c.calls_per_step:g}"] for c in d.comm],
                  numeric={2, 3, 4}) if d else ""
    spread = NA if d is None or d.step_spread_pct is None else f"{d.step_spread_pct:.1f}%"
    head = (f"<h4>Ranks ({_e(d.strategy)}, {d.world_size} ranks, {_e(d.backend)}; "
            f"slowest rank {_e(d.slowest_rank)}, step spread {spread})</h4>") if d else ""
    return f"{head}{ranks}<p class=\"note\">{_e(d.comm_method) if d else ''}</p>{comm}"


def _log(record: RunRecord) -> str:
    if not record.logs:
        return '<p class="na">No log messages.</p>'
    rows = [
        [_e(_date(x.time_s)), f'<span class="log-{_e(x.level)}">{_e(x.level)}</span>',
         _e(x.precision or ""), _e(x.message)]
        for x in record.logs
    ]
    return _table(["time", "level", "precision", "message"], rows)


def render_html(record: RunRecord) -> str:
    """The whole report as one HTML string."""
    template = Template(TEMPLATE_PATH.read_text(encoding="utf-8"))
    model = record.config.get("model", "unknown model")
    numerics = (
        f"<h2>Numerics</h2>{render_value(record.numerics)}" if record.numerics is not None else ""
    )
    return template.substitute(
        title=_e(f"AmpScope report: {model}, {_date(record.started_s)}"),
        header=_header(record),
        verdict=_verdict(verdict(record)),
        comparison=_comparison(record),
        details=_run_details(record),
        charts="\n".join(_chart(c) for c in report_charts(record)),
        trials="\n".join(_trial(t) for t in record.trials) or '<p class="na">No trials.</p>',
        numerics=numerics,
        log=_log(record),
        footer=_e(f"Written by AmpScope, report schema version {SCHEMA_VERSION}. "
                  "Open the JSON report of the same run in the AmpScope window to explore it."),
    )


def write_html(record: RunRecord, path: str | os.PathLike) -> Path:
    text = render_html(record)
    return atomic_write(path, lambda fh: fh.write(text))
