"""The Numerics tab: what each format can hold, and what this model's numbers need.

Shows the dict of ``engine.numerics.lab.run_lab`` (run here in a worker thread, or read
from a report's ``numerics``): the formats table, the live demos, the gradient
histogram against the range of fp16, bf16 and the fp8 formats, the op trace and the
advice. Every figure is the lab's; this view only lays them out.
"""

from __future__ import annotations

import html

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QElapsedTimer, Qt, QTimer, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QProgressBar,
    QPushButton,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from engine.core.config import PRECISIONS
from gui import plot_style  # noqa: F401 (sets pyqtgraph's colours before any plot)
from gui.plain_text import as_html, plain_label

FORMAT_HEADERS = ("Format", "Bits", "s/e/m", "Max", "Min normal", "Min > 0", "eps", "Digits",
                  "Note")
DEMO_HEADERS = ("Expression", "dtype", "Result", "Exact", "Verdict", "Explanation")
TRACE_HEADERS = ("Phase", "Op", "Count", "Inputs", "Outputs", "FLOPs", "Share", "Sensitive")
BAD_VERDICTS = ("swallowed", "stalled", "inf", "nan", "drift", "overflow", "underflow")
EMPTY_TEXT = ("No numerics yet. Pick a precision and press \"Run numerics lab\": it uses the "
              "model, device, batch and sequence length of the Run tab and shows what each "
              "number format can hold, live demonstrations, this model's gradient histogram "
              "and the advice. A report opened with numerics shows them here too.")
BAND_COLORS = {"fp16": "#E69F00", "bf16": "#009E73", "fp8_e4m3": "#777777",
               "fp8_e5m2": "#AAAAAA"}


def lab_inputs(values: dict) -> str:
    """"gpt2, batch 4 × 128 tokens, on cpu" from the Run form's values."""
    return (f"{values.get('model')}, batch {values.get('batch_size'):,} × "
            f"{values.get('seq_len'):,} tokens, on {values.get('device')}")


def _num(value, fmt: str = ".4g") -> str:
    if value is None:
        return "n/a"
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return f"{value:,}"
    return format(value, fmt)


def _dtypes(names: list[str]) -> str:
    return ", ".join(n.removeprefix("torch.") for n in names)


def _table(headers: tuple[str, ...]) -> QTableWidget:
    table = QTableWidget(0, len(headers))
    table.setHorizontalHeaderLabels(headers)
    table.verticalHeader().hide()
    table.verticalHeader().setDefaultSectionSize(22)
    table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
    table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    table.horizontalHeader().setStretchLastSection(True)
    return table


def _fill(table: QTableWidget, rows: list[list[str]], tooltips: list[str] | None = None) -> None:
    table.setRowCount(len(rows))
    for r, row in enumerate(rows):
        for c, text in enumerate(row):
            item = QTableWidgetItem(text)
            if tooltips and tooltips[r]:
                item.setToolTip(as_html(tooltips[r]))
            table.setItem(r, c, item)


class NumericsView(QWidget):
    run_requested = Signal(str)  # precision
    stop_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.numerics: dict | None = None
        self.precision = QComboBox()
        self.precision.addItems(PRECISIONS)
        self.run_button = QPushButton("Run numerics lab")
        self.run_button.setToolTip("Formats, live demos, one step's gradients and the op trace, "
                                   "with the model, device, batch and sequence of the Run tab")
        self.run_button.clicked.connect(
            lambda: self.run_requested.emit(self.precision.currentText()))
        self.status = plain_label(EMPTY_TEXT)
        # what the lab will take from the Run tab, said before it is pressed
        self.uses = plain_label()
        self.uses.setObjectName("lab_uses")
        # while it runs: a busy bar with the seconds so far (the lab's process reports only
        # its end) and Stop, which ends that process
        self.progress = QProgressBar()
        self.progress.setRange(0, 0)
        self.progress.setMaximumWidth(160)
        self.progress.hide()
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip("End the numerics lab's process now")
        self.stop_button.clicked.connect(self.stop_requested)
        self.stop_button.hide()
        self._started = QElapsedTimer()
        self._ticker = QTimer(self)
        self._ticker.setInterval(500)
        self._ticker.timeout.connect(self._tick)
        self._running_text = ""

        self.formats = _table(FORMAT_HEADERS)
        self.demos = _table(DEMO_HEADERS)
        # long expressions are elided (full text in the tooltip) so the verdict stays in view
        self.demos.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Interactive)
        self.demos.setColumnWidth(0, 230)
        self.trace = _table(TRACE_HEADERS)
        self.trace_note = plain_label()
        self.advice = QTextBrowser()
        self.charts = pg.GraphicsLayoutWidget()
        self.histogram = self.charts.addPlot(row=0, col=0)
        self.histogram.setTitle("Gradients of one step (unscaled)", size="10pt")
        self.histogram.setLabel("left", "count")
        self.histogram.showGrid(x=True, y=True, alpha=0.25)
        self.bands = self.charts.addPlot(row=1, col=0)
        self.bands.setTitle("Representable range (dark: normal, light: subnormal)", size="10pt")
        self.bands.setLabel("bottom", "log2 |value|")
        self.bands.setXLink(self.histogram)
        self.bands.setMouseEnabled(y=False)
        self.charts.ci.layout.setRowStretchFactor(0, 3)
        self.charts.ci.layout.setRowStretchFactor(1, 2)

        top = QHBoxLayout()
        top.addWidget(QLabel("Precision"))
        top.addWidget(self.precision)
        top.addWidget(self.run_button)
        top.addWidget(self.stop_button)
        top.addWidget(self.progress)
        top.addWidget(self.status, 1)
        left = QSplitter(Qt.Orientation.Vertical)
        left.addWidget(self.formats)
        left.addWidget(self.demos)
        left.setSizes([230, 550])
        trace_box = QWidget()
        trace_layout = QVBoxLayout(trace_box)
        trace_layout.setContentsMargins(0, 0, 0, 0)
        trace_layout.addWidget(self.trace)
        trace_layout.addWidget(self.trace_note)
        right = QSplitter(Qt.Orientation.Vertical)
        right.addWidget(self.charts)
        right.addWidget(trace_box)
        right.addWidget(self.advice)
        right.setSizes([380, 220, 160])
        body = QSplitter()
        body.addWidget(left)
        body.addWidget(right)
        body.setSizes([700, 700])
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.uses)
        layout.addWidget(body, 1)

    def set_busy(self, busy: bool, message: str = "") -> None:
        self.run_button.setEnabled(not busy)
        if message:
            self.status.setText(message)

    def show_inputs(self, values: dict) -> None:
        """Say which model, batch, sequence and device the lab will use (the Run tab's)."""
        self.uses.setText(f"Uses the Run tab's settings: {lab_inputs(values)}. Change them "
                          "there.")

    def lab_started(self, text: str) -> None:
        self._running_text = text
        self._started.start()
        self.progress.show()
        self.stop_button.show()
        self.stop_button.setEnabled(True)
        self._tick()
        self._ticker.start()

    def lab_ended(self, message: str = "") -> None:
        self._ticker.stop()
        self.progress.hide()
        self.stop_button.hide()
        if message:
            self.status.setText(message)

    def _tick(self) -> None:
        self.status.setText(f"{self._running_text} {self._started.elapsed() // 1000} s so far")

    def clear(self, message: str) -> None:
        self.numerics = None
        for table in (self.formats, self.demos, self.trace):
            table.setRowCount(0)
        self.histogram.clear()
        self.bands.clear()
        self.trace_note.setText("")
        self.advice.clear()
        self.status.setText(message)

    def show_numerics(self, numerics: dict) -> None:
        self.numerics = numerics
        self.status.setText(
            f"{numerics.get('model')} at {numerics.get('precision')} on {numerics.get('device')}"
            f" (batch {numerics.get('batch_size')}, sequence {numerics.get('seq_len')})")
        self._show_formats(numerics.get("formats", []))
        self._show_demos(numerics.get("demos", []))
        self._show_gradients(numerics.get("gradients") or {})
        self._show_trace(numerics.get("op_trace") or {}, numerics.get("mfu_dtype_mix") or {})
        self._show_advice(numerics.get("advice") or {})

    def _show_formats(self, formats: list[dict]) -> None:
        rows = []
        for f in formats:
            sem = ("/".join(str(f[k]) for k in ("sign_bits", "exponent_bits", "mantissa_bits"))
                   if f.get("sign_bits") is not None else "table")
            rows.append([f["name"], str(f["bits"]), sem, _num(f["max"]), _num(f["min_normal"]),
                         _num(f["min_subnormal"]), _num(f["eps"]),
                         _num(f["decimal_digits"], ".2f"), f.get("note", "")])
        _fill(self.formats, rows, [f.get("note", "") for f in formats])

    def _show_demos(self, demos: list[dict]) -> None:
        rows = [[d["expression"], d["dtype"], _num(d["result"], ".10g"),
                 _num(d["expected_exact"], ".10g"), d["verdict"], d["explanation"]]
                for d in demos]
        _fill(self.demos, rows, [f"{d['expression']} in {d['dtype']}: {d['explanation']}"
                                 for d in demos])
        for r, d in enumerate(demos):
            if d["verdict"] in BAD_VERDICTS:
                self.demos.item(r, 4).setForeground(QColor("#C00000"))

    def _show_gradients(self, grads: dict) -> None:
        self.histogram.clear()
        self.bands.clear()
        overall = grads.get("overall") or {}
        hist = overall.get("histogram") or {}
        edges, counts = hist.get("log2_edges") or [], hist.get("counts") or []
        if len(edges) == len(counts) + 1 and counts:
            self.histogram.plot(np.asarray(edges, float), np.asarray(counts, float),
                                stepMode="center", fillLevel=0, brush="#0072B255",
                                pen=pg.mkPen("#0072B2", width=1.5))
        ranges = grads.get("format_ranges") or []
        ticks = []
        for i, r in enumerate(ranges):
            color = QColor(BAND_COLORS.get(r["name"], "#555555"))
            light = QColor(color)
            light.setAlpha(90)
            for start, stop, brush in ((r["log2_min_subnormal"], r["log2_min_normal"], light),
                                       (r["log2_min_normal"], r["log2_max"], color)):
                self.bands.addItem(pg.BarGraphItem(x0=[start], x1=[stop], y=[i], height=0.6,
                                                   brush=brush, pen=None))
            ticks.append((i, r["name"]))
            if r["name"] == "fp16":
                # fp16's underflow edge on the histogram: values left of it flush to zero
                self.histogram.addItem(pg.InfiniteLine(
                    pos=r["log2_min_subnormal"], angle=90,
                    pen=pg.mkPen(color, width=1.5, style=Qt.PenStyle.DashLine),
                    label="fp16 smallest", labelOpts={"position": 0.9, "color": color}))
        self.bands.getAxis("left").setTicks([ticks])
        self.bands.setYRange(-0.6, len(ranges) - 0.4, padding=0)
        if edges:
            self.histogram.setXRange(min(edges) - 4, max(max(edges), 16.5) + 1, padding=0)
        scale = grads.get("loss_scale")
        self.histogram.setTitle(
            f"Gradients of one step (unscaled; loss scale {_num(scale)}): "
            f"{_num(overall.get('nonzero'))} nonzero, max |g| {_num(overall.get('max_abs'))}",
            size="10pt")

    def _show_trace(self, trace: dict, mix: dict) -> None:
        ops = trace.get("ops", [])
        rows = [[op["phase"], op["op"], str(op["count"]), _dtypes(op["input_dtypes"]),
                 _dtypes(op["output_dtypes"]), _num(op["flops"]) if op["flops"] else "",
                 f"{100 * op['flops_share']:.1f}%" if op["flops"] else "",
                 "yes" if op["precision_sensitive"] else ""] for op in ops]
        _fill(self.trace, rows)
        notes = [f"{_num(trace.get('total_flops'))} FLOPs counted"]
        notes += [f"GEMM {g['op']} ({g['phase']}) M={g['m']} N={g['n']} K={g['k']} "
                  f"{g['dtype']}: {g['reason']}" for g in trace.get("flagged_gemms", [])]
        if trace.get("uncounted_ops"):
            notes.append("no FLOP formula for: " + ", ".join(trace["uncounted_ops"]))
        if mix.get("reason"):
            notes.append(f"MFU by dtype mix: {mix['reason']}")
        self.trace_note.setText("; ".join(notes))

    def _show_advice(self, advice: dict) -> None:
        def reason(r: dict) -> str:
            figure = r.get("figure") or "not measured"
            return (f"{html.escape(r['text'])}: <b>{html.escape(figure)}</b> "
                    f"<i>({html.escape(r['source'])})</i>")

        def items(texts: list[str]) -> str:
            return "<ul>" + "".join(f"<li>{t}</li>" for t in texts) + "</ul>"

        parts = [f"<h3>Recommended: {html.escape(advice.get('recommended', 'n/a'))}</h3>"]
        if advice.get("init_scale") is not None:
            parts.append(f"<p>GradScaler initial scale: {_num(advice['init_scale'])}</p>")
        parts.append(items([reason(r) for r in advice.get("reasons", [])]))
        if advice.get("also_try"):
            parts.append("<p>Also try:</p>" + items(
                [f"<b>{html.escape(a['precision'])}</b>: {reason(a['reason'])}"
                 for a in advice["also_try"]]))
        if advice.get("warnings"):
            parts.append('<p style="color:#C00000">Warnings:</p>'
                         + items([reason(w) for w in advice["warnings"]]))
        self.advice.setHtml("".join(parts))
