import subprocess
import sys
from pathlib import Path

import pytest

from gui.app import XCB_PACKAGES, install_line, missing_xcb_libraries, screen_problem, xcb_plugin

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def _none_missing():
    return []


def test_no_display_is_one_clear_line_not_a_qt_abort():
    assert "no screen found" in screen_problem({}, "linux", _none_missing)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(ROOT)}
    run = subprocess.run([sys.executable, "main.py"], cwd=ROOT, env=env, capture_output=True,
                         text=True)
    assert run.returncode == 2
    assert run.stderr.startswith("ampscope: error: no screen found") and run.stderr.count("\n") == 1


def test_missing_xcb_libraries_are_named_with_the_exact_apt_line():
    def ldd(_plugin):
        return ["libxcb-icccm.so.4", "libxcb-keysyms.so.1"]

    missing = missing_xcb_libraries(xcb_plugin(), ldd)
    problem = screen_problem({"DISPLAY": ":0"}, "linux", lambda: missing)
    assert "libxcb-icccm.so.4, libxcb-keysyms.so.1" in problem
    assert "'sudo apt-get install libxcb-icccm4 libxcb-keysyms1'" in problem


def test_without_ldd_each_library_is_tried_by_loading_it():
    missing = missing_xcb_libraries(xcb_plugin(), lambda _plugin: None)
    assert set(missing) <= set(XCB_PACKAGES)
    assert "libc.so.6" not in missing


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the xcb plugin is Linux's")
def test_the_table_covers_every_system_library_the_installed_plugin_links():
    """ldd of the real plugin: everything outside PySide6 and the C runtime has a package."""
    out = subprocess.run(["ldd", str(xcb_plugin())], capture_output=True, text=True).stdout
    runtime = ("linux-vdso", "ld-linux", "libc.so", "libm.so", "libstdc++", "libgcc_s",
               "libpthread", "libdl.so", "librt.so")
    direct = subprocess.run(["readelf", "-d", str(xcb_plugin())], capture_output=True,
                            text=True).stdout
    needed = [line.split("[")[1].rstrip("]") for line in direct.splitlines() if "NEEDED" in line]
    system = [n for n in needed if not n.startswith("libQt6") and not n.startswith(runtime)]
    assert system and set(system) <= set(XCB_PACKAGES)
    for line in out.splitlines():
        if "not found" in line:
            assert line.split("=>")[0].strip() in XCB_PACKAGES


def test_readme_lists_every_package_of_the_table():
    text = README.read_text()
    for package in install_line(list(XCB_PACKAGES)).split()[3:]:
        assert f"`{package}`" in text


def test_a_usable_screen_or_an_explicit_platform_is_fine():
    assert screen_problem({"DISPLAY": ":0"}, "linux", _none_missing) is None
    assert screen_problem({"QT_QPA_PLATFORM": "offscreen"}, "linux", lambda: ["x"]) is None
    assert screen_problem({}, "win32", lambda: ["x"]) is None
