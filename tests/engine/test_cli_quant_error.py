"""The quantisation-error table of `profile` in the terminal (within 100 columns) and in the
HTML report: each trial's median and worst-layer SQNR, recomputed here from the JSON
report's per-layer figures, beside the final loss difference from the two final losses."""

from __future__ import annotations

import html
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

from engine.record.json_report import read_json
from engine.report.html import render_html
from tests.engine.float8_cpu import rowwise_runs_on_cpu

ROOT = Path(__file__).resolve().parents[2]
# the float8 recipe whose layers the table lists, with the format it names: rowwise where
# this torch's CPU _scaled_mm takes row scales (torch 2.11's does not: n/a there)
FP8, FP8_FORMAT = (("fp8-rowwise", "fp8 e4m3fn rowwise, power-of-2 scales")
                   if rowwise_runs_on_cpu() else ("fp8", "fp8 e4m3fn tensorwise"))


def _pair(values) -> str:
    finite = [v for v in values if v is not None]
    return f"{statistics.median(finite):.1f} / {min(finite):.1f}"


def test_profile_prints_and_reports_each_trials_sqnr_beside_its_loss_vs_fp32(tmp_path):
    out = tmp_path / "r.json"
    run = subprocess.run(
        [sys.executable, "main.py", "profile", "--model", "tiny", "--precision",
         f"fp32,bf16-amp,{FP8}", "--batch-size", "1", "--seq-len", "32", "--steps", "1",
         "--warmup", "0", "--device", "cpu", "--isolation", "inline", "--no-kernel-profile",
         "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, check=False,
        env={**os.environ, "AMPSCOPE_DATA_DIR": str(tmp_path / "data"),
             "AMPSCOPE_CACHE_DIR": str(tmp_path / "cache")})
    assert run.returncode == 0, run.stdout + run.stderr
    trials = {t["precision"]: t for t in json.loads(out.read_text())["trials"]}
    fp32_loss = trials["fp32"]["summary"]["final_loss"]
    expected = {}
    for p in ("bf16-amp", FP8):
        layers = trials[p]["quant_error"]["layers"]
        assert len(layers) == 9  # tiny GPT-2: 2 blocks x 4 layers, and the LM head
        expected[p] = (str(len(layers)), _pair(r["weight_db"] for r in layers),
                       _pair(r["input_db"] for r in layers),
                       f"{trials[p]['summary']['final_loss'] - fp32_loss:+.4f}")
    assert trials["fp32"]["quant_error"] is None
    assert trials["fp32"]["quant_error_reason"] == "nothing is quantised: fp32 weights and inputs"

    lines = run.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Quantisation error"))
    header = next(i for i in range(start, len(lines)) if lines[i].startswith("precision"))
    table = lines[start:header + 4]
    assert max(map(len, table)) <= 100
    rows = {line.split()[0]: line for line in table[header - start + 1:]}
    assert rows["fp32"].split(None, 1)[1] == "n/a: nothing is quantised: fp32 weights and inputs"
    for p, cells in expected.items():
        assert re.split(r"\s{2,}", rows[p].strip())[1:] == list(cells), rows[p]

    page = render_html(read_json(out))
    section = page[page.index('<h3 id="quant-error">'):]
    section = section[:section.index("</table>")]
    for p, cells in expected.items():
        row = re.search(rf"</span>{re.escape(p)}</td>((?:<td[^>]*>[^<]*</td>){{4}})", section)
        assert row, p
        assert [html.unescape(c) for c in re.findall(r">([^<]*)</td>", row.group(1))] == \
            list(cells)
    # each trial's section lists its layers with the format they were rounded in
    assert f"<td>transformer.h.0.mlp.c_fc</td><td>{FP8_FORMAT}</td>" in page
