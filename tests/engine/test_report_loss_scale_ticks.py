"""The HTML report's GradScaler loss-scale axis reads "2^16", never matplotlib's mathtext
source ("$\\mathdefault{2^{16}}$", which an SVG keeping its text as text shows raw). The
real main.py writes the report of the H200 sweep, whose fp16-amp trial scaled its loss."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

from tests.engine.test_h200_reports import unpack

ROOT = Path(__file__).resolve().parents[2]


def test_the_loss_scale_axis_of_the_html_report_is_plain_text(tmp_path):
    source = unpack("01-gpt2-fp32_tf32_fp16-amp_bf16-amp_fp16_bf16.json", tmp_path)
    out = tmp_path / "report.html"
    done = subprocess.run([sys.executable, "main.py", "report", str(source), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    page = out.read_text(encoding="utf-8")
    assert "mathdefault" not in page and "$\\" not in page
    # the loss-scale chart's own SVG: its tick labels are the powers of two the scale took
    start = page.index("GradScaler loss scale")
    svg = page[page.index("<svg", start):page.index("</svg>", start)]
    ticks = set(re.findall(r">\s*(2\^\d+)\s*<", svg))
    import json

    trials = json.loads(source.read_text())["trials"]
    scales = [s["loss_scale"] for t in trials if t["precision"] == "fp16-amp"
              for s in t["steps"] if s.get("loss_scale")]
    assert scales
    # every power of two between the smallest and largest scale is a tick on a log2 axis
    low, high = math.ceil(math.log2(min(scales))), math.floor(math.log2(max(scales)))
    assert {f"2^{k}" for k in range(low, high + 1)} <= ticks, (ticks, low, high)
