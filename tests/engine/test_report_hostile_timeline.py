"""Reports and journals whose memory timeline or lost updates were edited into shapes no
AmpScope writes, read by the real ``main.py report`` as a user runs it: each is refused in
one line with exit 2 (never an IndexError, an empty-colour error, "lost at lr -500.0%" or a
minute spent drawing), and nothing is written to ``--out``. The window's File > Open of the
same files is tests/gui/test_open_hostile_timeline.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.record.validate import MAX_TIMELINE_CATEGORIES, MAX_TIMELINE_VALUES

ROOT = Path(__file__).resolve().parents[2]


def profile_bf16(folder: Path) -> tuple[Path, Path]:
    """A tiny pure-bf16 run on the CPU (a memory timeline and lost updates): its report and
    its journal."""
    out = folder / "r.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "AMPSCOPE_DATA_DIR": str(folder / "data")}
    run = subprocess.run(
        [sys.executable, "main.py", "profile", "--model", "tiny", "--precision", "bf16",
         "--batch-size", "1", "--seq-len", "16", "--steps", "1", "--warmup", "0",
         "--device", "cpu", "--isolation", "inline", "--quiet", "--no-kernel-profile",
         "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr
    (journal,) = (folder / "data" / "runs").glob("*.jsonl")
    return out, journal


def edit(node, key: str, change) -> int:
    """``change`` applied to every object under ``key`` in a parsed report or journal line;
    how many were changed."""
    found = 0
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key and isinstance(v, dict):
                change(v)
                found += 1
            else:
                found += edit(v, key, change)
    elif isinstance(node, list):
        found += sum(edit(v, key, change) for v in node)
    return found


def _crowded(timeline: dict) -> None:
    """Categories past the cap, each point widened to match (every other check holds)."""
    extra = MAX_TIMELINE_CATEGORIES + 4 - len(timeline["categories"])
    timeline["categories"] += [f"made_up_{i}" for i in range(extra)]
    for point in timeline["points"]:
        point["category_bytes"] += [0] * extra


def _too_many_values(timeline: dict) -> None:
    """Within the point cap and the category cap, past points x categories."""
    width = len(timeline["categories"])
    timeline["points"] = [timeline["points"][timeline["peak_index"]]] * (
        MAX_TIMELINE_VALUES // width + 1)
    timeline["peak_index"] = 0


CASES = {  # name: (key, change, what the line names)
    "no points": ("memory_timeline", lambda t: t.update(points=[]), "points: is empty"),
    "no categories": ("memory_timeline", lambda t: t.update(
        categories=[], points=[{**p, "category_bytes": []} for p in t["points"]]),
        "categories: 0 categories"),
    "too many categories": ("memory_timeline", _crowded,
                            f"a timeline has 1 to {MAX_TIMELINE_CATEGORIES}"),
    "too many values": ("memory_timeline", _too_many_values, f"{MAX_TIMELINE_VALUES:,} values"),
    "negative share": ("lost_updates", lambda lu: lu.update(min_lr_element_share=-5),
                       "min_lr_element_share: -5 is not a share (0 to 1)"),
    "lr of 0": ("lost_updates", lambda lu: lu.update(min_lr=0), "min_lr: 0 is not a learning rate"),
    "lr below 0": ("lost_updates", lambda lu: lu.update(lr=-1.0),
                   "lr: -1.0 is not a learning rate"),
    "a group's lr": ("lost_updates", lambda lu: lu["groups"][0].update(lr=0.0),
                     "groups[0].lr: 0.0 is not a learning rate"),
}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    return profile_bf16(tmp_path_factory.mktemp("timeline"))


def _refused(run: subprocess.CompletedProcess, out: Path, *fragments: str) -> None:
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1
    for fragment in fragments:
        assert fragment in run.stderr, run.stderr
    assert not out.exists()  # nothing half-written


def test_the_run_as_written_opens(written, tmp_path):
    report, journal = written
    for source in (report, journal):
        out = tmp_path / f"{source.stem}.html"
        run = subprocess.run([sys.executable, "main.py", "report", str(source), "--out",
                              str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        assert out.stat().st_size > 0


@pytest.mark.parametrize("case", CASES)
def test_an_edited_report_is_one_line(written, tmp_path, case):
    key, change, fragment = CASES[case]
    data = json.loads(written[0].read_text())
    assert edit(data, key, change) >= 1
    bad = tmp_path / "edited.json"
    bad.write_text(json.dumps(data))
    out = tmp_path / "x.html"
    run = subprocess.run([sys.executable, "main.py", "report", str(bad), "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    _refused(run, out, str(bad), key, fragment)


@pytest.mark.parametrize("case", ["no points", "no categories", "negative share", "lr of 0"])
def test_an_edited_journal_is_one_line(written, tmp_path, case):
    key, change, fragment = CASES[case]
    lines, changed = [], 0
    for line in written[1].read_text().splitlines():
        event = json.loads(line)
        found = edit(event, key, change)
        changed += found
        lines.append(json.dumps(event) if found else line)
    assert changed >= 1
    bad = tmp_path / "edited.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    out = tmp_path / "x.json"
    run = subprocess.run([sys.executable, "main.py", "report", str(bad), "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    _refused(run, out, str(bad), fragment)
