"""Time from launching the window to seeing it, and to the device probe's answer.

Spawns a fresh Python process that starts the real ``gui.app.main`` (the same code as
``python3 main.py``) with an application-wide event filter: the first paint of the
main window is "window shown", the window's ``ready`` signal is "charts built" (the
views that need pyqtgraph are built after the first paint), and the first
``device_changed`` with an answer is "device probed" (the probe runs in a thread, so
the window does not wait for torch).
Times count from just before the process is spawned, interpreter start-up included;
the CPU time the process had used when its window appeared is printed beside them, as
a figure that a machine busy with other work inflates far less than wall-clock time.

    QT_QPA_PLATFORM=offscreen python3 benchmarks/startup.py [--repeat 3]

Goal: window shown in < 1.5 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOAL_S = 1.5

# run in the child: prints "shown", "ready" (every chart view built after the first
# paint) and "probed", each with its epoch time, then quits
CHILD = r"""
import sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from PySide6.QtCore import QEvent, QObject, QSettings
from PySide6.QtWidgets import QApplication, QMainWindow

QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, sys.argv[2])
app = QApplication([])

class Watch(QObject):
    window = None
    def eventFilter(self, obj, event):
        if self.window is None and event.type() == QEvent.Type.Paint and isinstance(
                obj, QMainWindow):
            self.window = obj
            print("shown", time.time(), flush=True)
            app.removeEventFilter(self)  # a Python filter on every event would slow the rest
            print("cpu", time.process_time(), flush=True)
            self.marks = set()
            obj.ready.connect(lambda: self.mark("ready"))
            panel = obj.config_panel
            if not panel.device_pending():
                self.probed(panel.device_info)
            panel.device_changed.connect(self.probed)
        return False
    def probed(self, info):
        if info is not None or not self.window.config_panel.device_pending():
            self.mark("probed")
    def mark(self, name):
        if name not in self.marks:
            self.marks.add(name)
            print(name, time.time(), flush=True)
        if self.marks == {"ready", "probed"}:
            app.quit()

watch = Watch()
app.installEventFilter(watch)
from gui.app import main
main([])
"""


def launch_once() -> tuple[float, float, float | None]:
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "AMPSCOPE_DATA_DIR": str(Path(folder) / "data")}
        env.setdefault("QT_QPA_PLATFORM", "offscreen")
        start = time.time()
        out = subprocess.run(
            [sys.executable, "-c", CHILD, str(ROOT), str(Path(folder) / "cfg")],
            env=env, capture_output=True, text=True, timeout=300, check=False)
    marks = dict(line.split() for line in out.stdout.splitlines()
                 if line.startswith(("shown ", "ready ", "probed ", "cpu ")))
    if "shown" not in marks:
        raise SystemExit(f"the window was never shown:\n{out.stderr[-2000:]}")
    probed = float(marks["probed"]) - start if "probed" in marks else None
    ready = float(marks["ready"]) - start if "ready" in marks else None
    return float(marks["shown"]) - start, float(marks["cpu"]), ready, probed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="launches to time")
    args = parser.parse_args()
    shown, cpu, ready, probed = [], [], [], []
    for _ in range(args.repeat):
        s, c, r, p = launch_once()
        shown.append(s)
        cpu.append(c)
        if r is not None:
            ready.append(r)
        if p is not None:
            probed.append(p)
    print(f"machine: {os.cpu_count()} CPU cores, QT_QPA_PLATFORM="
          f"{os.environ.get('QT_QPA_PLATFORM', 'offscreen')}, {args.repeat} launches")
    print("window shown after launch: "
          + ", ".join(f"{s:.2f} s" for s in shown) + f" (median {statistics.median(shown):.2f} s)")
    # CPU seconds the process had used by then: what a busy machine does not inflate
    print("CPU time used until shown:  "
          + ", ".join(f"{c:.2f} s" for c in cpu) + f" (median {statistics.median(cpu):.2f} s)")
    if ready:  # pyqtgraph and the chart views load after the window is on screen
        print("charts built:              "
              + ", ".join(f"{r:.2f} s" for r in ready)
              + f" (median {statistics.median(ready):.2f} s)")
    if probed:
        print("device probe answered:     "
              + ", ".join(f"{p:.2f} s" for p in probed)
              + f" (median {statistics.median(probed):.2f} s)")
    print(f"goal window < {GOAL_S} s: "
          f"{'met' if statistics.median(shown) < GOAL_S else 'NOT met'} (median)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
