"""Silence library chatter that is not about the user's run."""

from __future__ import annotations

import logging
import os
import sys
import warnings

# torchao's "Failed to load <extension>: <why>" notices, kept instead of printed: the
# gating names the one that means a feature is missing (engine/measure/device.py)
_EXTENSION_FAILURES: list[str] = []


class _KeepExtensionFailures(logging.Handler):
    """Keeps torchao's extension-load warnings; passes its errors on to stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if record.levelno >= logging.ERROR:
            logging.lastResort.handle(record)
        elif message.startswith("Failed to load"):
            _EXTENSION_FAILURES.append(message)


def extension_failures() -> list[str]:
    """torchao's compiled extensions that did not load in this process (after its import)."""
    return list(_EXTENSION_FAILURES)


def quiet_libraries() -> None:
    """Keep library chatter (progress bars, advice, optional-kernel notices) off the terminal.

    torchao and bitsandbytes log a warning for each optional kernel they cannot load
    on this machine (torchao's are kept for the gating), torch a deprecation note when
    torchao registers its enums, and Python 3.12 a SyntaxWarning for an escape sequence in
    a torchao docstring whenever torchao is compiled anew (a fresh or read-only install).
    """
    for name in ("torch.utils._pytree", "bitsandbytes"):
        logging.getLogger(name).setLevel(logging.ERROR)
    torchao = logging.getLogger("torchao")
    if not any(isinstance(h, _KeepExtensionFailures) for h in torchao.handlers):
        torchao.setLevel(logging.WARNING)
        torchao.propagate = False
        torchao.addHandler(_KeepExtensionFailures())
    # 3.12: SyntaxWarning; 3.10-3.11: DeprecationWarning (hidden unless -W shows it)
    for category in (SyntaxWarning, DeprecationWarning):
        warnings.filterwarnings("ignore", message="invalid escape sequence",
                                category=category, module=r".*torchao")
    # read by transformers and huggingface_hub when they are imported
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    # read when torch.profiler first starts: kineto's stage and USDT lines on stderr
    # (profiler_start / profiler_stop) at each profiled step
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    if "transformers" in sys.modules:  # imported already: the variables above came too late
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
