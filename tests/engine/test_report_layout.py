"""The HTML report's first screen: the verdict, then a comparison table that fits."""

from __future__ import annotations

from html.parser import HTMLParser

from engine.record.compare import format_bytes
from engine.report.html import render_html
from tests.engine.verdict_records import GiB, median_ms, record, trial


class _Outline(HTMLParser):
    """The page's verdict headline, its tables (header cells) and where each starts."""

    def __init__(self):
        super().__init__()
        self.events: list[tuple[str, int]] = []  # (what, position), as the page shows them
        self.tables: list[list[str]] = []
        self.headline = ""
        self._depth_details = 0
        self._in = None
        self.details_of_table: list[int] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "details":
            self._depth_details += 1
        elif tag == "table":
            self.tables.append([])
            self.details_of_table.append(self._depth_details)
            if not self._depth_details:  # what shows without unfolding anything
                self.events.append(("table", len(self.events)))
        elif tag == "th" and self.tables:
            self._in = "th"
            self.tables[-1].append("")
        elif tag == "p" and attrs.get("class") == "headline":
            self._in = "headline"
            self.events.append(("verdict", len(self.events)))
        elif tag == "h2":
            self._in = "h2"

    def handle_endtag(self, tag):
        if tag == "details":
            self._depth_details -= 1
        if tag in ("th", "p", "h2"):
            self._in = None

    def handle_data(self, data):
        if self._in == "th":
            self.tables[-1][-1] += data
        elif self._in == "headline":
            self.headline += data
        elif self._in == "h2":
            self.events.append((f"h2 {data}", len(self.events)))


def test_verdict_comes_first_then_a_table_that_fits_then_charts():
    fp32 = trial("fp32", 100.0, 8 * GiB, 3.0)
    bf16 = trial("bf16-amp", 50.0, 5 * GiB, 3.001)
    rec = record(fp32, bf16)
    rec.environment["libraries"] = {"torch": "2.13.0", "transformers": "5.23"}
    rec.config = {"model": "tiny", "precisions": ["fp32", "bf16-amp"]}
    page = _Outline()
    page.feed(render_html(rec))
    order = [what for what, _ in page.events]
    assert order.index("verdict") < order.index("table") < order.index("h2 Charts")
    assert order[:3] == ["verdict", "h2 Comparison", "table"]
    speedup = median_ms(fp32) / median_ms(bf16)
    assert page.headline.startswith(f"Train in bf16-amp: {speedup:.2f}x fp32's speed [")
    assert f"saves {format_bytes(3 * GiB)}" in page.headline
    first = next(t for t, depth in zip(page.tables, page.details_of_table) if not depth)
    assert len(first) <= 10 and first[:2] == ["Precision", "Status"]
    assert {"Step time", "Speed-up vs fp32", "Peak memory", "Memory saved vs fp32",
            "Final loss vs fp32"} <= set(first)
    # the secondary columns are folded, and so are the environment and the versions
    folded = [t for t, depth in zip(page.tables, page.details_of_table) if depth]
    assert any("Throughput" in t and "MFU (model FLOPs) vs datasheet peak" in t
               and "MFU (model FLOPs) vs measured matmul peak" in t for t in folded)
    assert all("torch" not in t for t, depth in zip(page.tables, page.details_of_table)
               if not depth)


def test_header_says_when_the_device_emulated_bf16():
    rec = record(trial("fp32", 100.0, 8 * GiB, 3.0), trial("bf16-amp", 300.0, 7 * GiB, 3.0),
                 bf16_hardware=False)
    rec.environment["device"]["description"] = "CPU (AMD EPYC 7B13)"
    page = render_html(rec)
    meta = page[page.index('<p class="meta">'):page.index("</p>", page.index('<p class="meta">'))]
    assert "CPU (AMD EPYC 7B13); bf16: emulated (no AVX512-BF16/AMX), slow" in meta
    rec.environment["device"]["bf16_hardware"] = True
    assert "emulated" not in render_html(rec).split("</header>")[0]
