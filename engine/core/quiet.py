"""Silence library chatter that is not about the user's run."""

from __future__ import annotations

import logging
import os
import sys
import warnings


def quiet_libraries() -> None:
    """Keep library chatter (progress bars, advice, optional-kernel notices) off the terminal.

    torchao and bitsandbytes log a warning for each optional kernel they cannot load
    on this machine, and torch a deprecation note when torchao registers its enums.
    """
    for name in ("torchao", "torch.utils._pytree", "bitsandbytes"):
        logging.getLogger(name).setLevel(logging.ERROR)
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
