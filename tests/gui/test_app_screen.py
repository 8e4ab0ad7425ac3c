import subprocess
import sys
from pathlib import Path

from gui.app import screen_problem

ROOT = Path(__file__).resolve().parents[2]


def _has(name):
    return "/usr/lib/libfake.so"


def test_no_display_is_one_clear_line_not_a_qt_abort():
    assert "no screen found" in screen_problem({}, "linux", _has)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(ROOT)}
    run = subprocess.run([sys.executable, "main.py"], cwd=ROOT, env=env, capture_output=True,
                         text=True)
    assert run.returncode == 2
    assert run.stderr.startswith("ampscope: error: no screen found") and run.stderr.count("\n") == 1


def test_missing_xcb_cursor_is_named_with_the_package_to_install():
    problem = screen_problem({"DISPLAY": ":0"}, "linux", lambda name: None)
    assert "libxcb-cursor0" in problem


def test_a_usable_screen_or_an_explicit_platform_is_fine():
    assert screen_problem({"DISPLAY": ":0"}, "linux", _has) is None
    assert screen_problem({"QT_QPA_PLATFORM": "offscreen"}, "linux", lambda n: None) is None
    assert screen_problem({}, "win32", _has) is None
