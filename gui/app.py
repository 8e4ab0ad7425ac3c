"""Start the desktop window: ``python main.py`` with no arguments lands here."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from PySide6.QtWidgets import QApplication

from engine.core.quiet import quiet_libraries
from engine.run.trial_process import start_server
from gui import settings

# Libraries the xcb platform plugin loads from the system, with the Debian/Ubuntu package
# of each: the NEEDED entries of PySide6's libqxcb.so, libQt6XcbQpa.so.6 and
# libQt6Gui.so.6 (readelf -d), less Qt's own and the C/C++ runtime. README lists them.
XCB_PACKAGES = {
    "libxcb.so.1": "libxcb1",
    "libxcb-cursor.so.0": "libxcb-cursor0",
    "libxcb-icccm.so.4": "libxcb-icccm4",
    "libxcb-image.so.0": "libxcb-image0",
    "libxcb-keysyms.so.1": "libxcb-keysyms1",
    "libxcb-randr.so.0": "libxcb-randr0",
    "libxcb-render.so.0": "libxcb-render0",
    "libxcb-render-util.so.0": "libxcb-render-util0",
    "libxcb-shape.so.0": "libxcb-shape0",
    "libxcb-shm.so.0": "libxcb-shm0",
    "libxcb-sync.so.1": "libxcb-sync1",
    "libxcb-util.so.1": "libxcb-util1",
    "libxcb-xfixes.so.0": "libxcb-xfixes0",
    "libxcb-xkb.so.1": "libxcb-xkb1",
    "libX11.so.6": "libx11-6",
    "libX11-xcb.so.1": "libx11-xcb1",
    "libxkbcommon.so.0": "libxkbcommon0",
    "libxkbcommon-x11.so.0": "libxkbcommon-x11-0",
    "libEGL.so.1": "libegl1",
    "libGL.so.1": "libgl1",
    "libfontconfig.so.1": "libfontconfig1",
    "libfreetype.so.6": "libfreetype6",
    "libglib-2.0.so.0": "libglib2.0-0",
    "libgthread-2.0.so.0": "libglib2.0-0",
    "libdbus-1.so.3": "libdbus-1-3",
}


def xcb_plugin() -> Path:
    import PySide6

    return Path(PySide6.__file__).parent / "Qt" / "plugins" / "platforms" / "libqxcb.so"


def _ldd_missing(plugin: Path) -> list[str] | None:
    """Libraries the plugin (and what it links) cannot find, as ldd reports; None without
    ldd."""
    try:
        out = subprocess.run(["ldd", str(plugin)], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return list(dict.fromkeys(line.split("=>")[0].strip() for line in out.splitlines()
                              if "not found" in line))


def _dlopen_missing(names) -> list[str]:
    missing = []
    for name in names:
        try:
            ctypes.CDLL(name)
        except OSError:
            missing.append(name)
    return missing


def missing_xcb_libraries(plugin: Path | None = None,
                          ldd: Callable[[Path], list[str] | None] = _ldd_missing) -> list[str]:
    """Sonames the xcb plugin needs and this system lacks (ldd, else trying to load each)."""
    plugin = plugin or xcb_plugin()
    found = ldd(plugin) if plugin.exists() else None
    return found if found is not None else _dlopen_missing(XCB_PACKAGES)


def install_line(missing: list[str]) -> str:
    packages = dict.fromkeys(XCB_PACKAGES.get(name, name) for name in missing)
    return "sudo apt-get install " + " ".join(packages)


def screen_problem(environ=os.environ, platform: str = sys.platform,
                   missing: Callable[[], list[str]] = missing_xcb_libraries) -> str | None:
    """Why Qt could not open a window here, said before Qt aborts the process; None if fine."""
    if not platform.startswith("linux") or environ.get("QT_QPA_PLATFORM"):
        return None
    if not environ.get("DISPLAY") and not environ.get("WAYLAND_DISPLAY"):
        return ("no screen found (neither DISPLAY nor WAYLAND_DISPLAY is set): on a server use "
                "the headless commands ('python main.py --help') and open their JSON report "
                "in the app on a desktop")
    if not environ.get("WAYLAND_DISPLAY"):
        lacking = missing()
        if lacking:
            return (f"Qt's X11 plugin needs {', '.join(lacking)}, which this system lacks: "
                    f"install them (Debian/Ubuntu: '{install_line(lacking)}') and start again")
    return None


def main(argv: list[str] | None = None) -> int:
    problem = screen_problem()
    if problem:
        print(f"ampscope: error: {problem}", file=sys.stderr)
        return 2
    # before any thread of the window imports torchao or torch: their notices are not the
    # user's business (the CLI does the same, engine/cli/parser.py)
    quiet_libraries()
    app = QApplication.instance() or QApplication(sys.argv if argv is None else argv)
    app.setOrganizationName(settings.ORGANISATION)
    app.setApplicationName(settings.APPLICATION)
    # imported after the QApplication exists: the window's modules build Qt objects
    from gui.main_window import MainWindow
    from gui.signals import close_on_signals

    window = MainWindow()
    window.show()
    close_on_signals(window)
    # on a machine with no GPU every run's trials fork from this server: its imports run
    # while the user sets the first run up, not after Run is clicked
    start_server("auto")
    return app.exec()
