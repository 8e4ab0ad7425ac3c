"""The versions AmpScope runs with, against the range it is tested on.

pyproject.toml declares these ranges for people installing AmpScope beside their own
torch; requirements.txt pins the newest end (what the README installs), and
scripts/test_oldest.sh runs the engine's tests on the oldest end (by hand, not in CI). A
version outside its range is said once, in one line, and the run goes on: features are
detected where they are used (DESIGN.md 19), so this only tells the user where an n/a or a
failure may come from. Read through package metadata, so nothing here imports torch; where
a package that imports has no metadata (a PyInstaller bundle carries a package's modules, and
its metadata only where the spec copies it), the module itself is asked: what the bundle
says about itself is what it carries.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import platform
import re
from dataclasses import dataclass

# package: (lowest tested, highest tested, what depends on it). A bound names a release
# prefix: "2.13" takes any 2.13.x. Keep in step with pyproject.toml (a test compares them).
TESTED: dict[str, tuple[str, str, str]] = {
    "python": ("3.10", "3.12", "everything"),
    "torch": ("2.11", "2.13", "every measurement: profiler tables, FLOP counting, autocast, "
              "the allocator's figures"),
    "transformers": ("5.17", "5.23", "building and training the models"),
    "torchao": ("0.18", "0.18", "the fp8, MXFP8 and NVFP4 recipes and the low-bit optimizers"),
    "bitsandbytes": ("0.50", "0.50", "the int8 and nf4 recipes and adamw8bit"),
    "peft": ("0.21", "0.21", "the LoRA adapters int8 and nf4 train"),
    "accelerate": ("1.15", "1.15", "loading quantised models"),
    "safetensors": ("0.8", "0.8", "reading local model folders"),
    "nvidia-ml-py": ("13.615", "13.615", "GPU utilisation, memory and power (NVML)"),
    "PySide6-Essentials": ("6.11", "6.11", "the window"),
    "pyqtgraph": ("0.14", "0.14", "the window's charts"),
}
# the module each package is imported as, where metadata is missing
MODULES = {"torch": "torch", "transformers": "transformers", "torchao": "torchao",
           "bitsandbytes": "bitsandbytes", "peft": "peft", "accelerate": "accelerate",
           "safetensors": "safetensors", "nvidia-ml-py": "pynvml",
           "PySide6-Essentials": "PySide6", "pyqtgraph": "pyqtgraph"}
NO_VERSION = "(version not recorded)"  # imports, but says no version: not flagged
# only the window needs these: a headless install (CLI, a GPU server) may lack them
WINDOW_ONLY = frozenset({"PySide6-Essentials", "pyqtgraph"})


@dataclass(frozen=True)
class VersionCheck:
    name: str
    version: str | None  # None: not installed
    lowest: str
    highest: str
    affects: str

    @property
    def in_range(self) -> bool:
        if self.version is None:
            return False
        if self.version == NO_VERSION:
            return True
        have = _release(self.version)
        return (_release(self.lowest) <= have[:len(_release(self.lowest))]
                and have[:len(_release(self.highest))] <= _release(self.highest))

    def line(self) -> str:
        tested = (self.lowest if self.lowest == self.highest
                  else f"{self.lowest}-{self.highest}")
        if self.version is None:
            return f"{self.name}: not installed (needed for {self.affects})"
        flag = "" if self.in_range else f"  OUTSIDE the tested {tested}: may affect {self.affects}"
        return f"{self.name} {self.version} (tested {tested}){flag}"


def _release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string: '2.11.0+cu130' -> (2, 11, 0)."""
    numbers = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(n) for n in numbers.group(0).split(".")) if numbers else (0,)


def installed(name: str) -> str | None:
    if name == "python":
        return platform.python_version()
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return _carried(MODULES.get(name))


def _carried(module: str | None) -> str | None:
    """The version of a package present without its metadata, from its module; None where
    it does not import."""
    if module is None or importlib.util.find_spec(module) is None:
        return None
    try:
        loaded = importlib.import_module(module)
    except Exception:  # noqa: BLE001 (present but broken: as good as missing here)
        return None
    version = str(getattr(loaded, "__version__", "") or "")
    return version if re.match(r"\d", version) else NO_VERSION  # torchao says "unknown"


def checks(window: bool = True) -> list[VersionCheck]:
    """Every tested package as installed here; without ``window``, the window's are left out."""
    return [VersionCheck(name, installed(name), *bounds) for name, bounds in TESTED.items()
            if window or name not in WINDOW_ONLY]


def outside_range(window: bool = True) -> list[VersionCheck]:
    return [c for c in checks(window) if not c.in_range]


def warning_line(window: bool = True) -> str | None:
    """One line naming every version outside its tested range (and what it affects), or None."""
    off = outside_range(window)
    if not off:
        return None
    parts = [f"{c.name} {c.version or 'missing'} (tested {c.lowest}-{c.highest}; "
             f"affects {c.affects})" for c in off]
    return "outside AmpScope's tested versions, going on: " + "; ".join(parts)


def report(window: bool = True) -> str:
    """What ``main.py --version`` prints: AmpScope's version, then one line per package."""
    from engine import VERSION

    lines = [f"AmpScope {VERSION}"] + [c.line() for c in checks(window)]
    return "\n".join(lines)
