"""``python3 main.py plan --help`` shows each option's default, as parsed from the same
parser the command runs with."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_plan_help_shows_the_defaults():
    run = subprocess.run([sys.executable, "main.py", "plan", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    text = re.sub(r"\s+", " ", run.stdout)  # argparse wraps lines at the terminal width
    for option, default in (("--seq-len SEQ_LEN", "2048"), ("--batch-size BATCH_SIZE", "1"),
                            ("--optimizer {", "adamw"), ("--max-batch MAX_BATCH", "64"),
                            ("--card CARD", "RTX 4090,H100 SXM"),
                            ("--precision PRECISION", "fp32,bf16-amp")):
        after = text.split(f" {option}", 1)[1]
        shown = after.split(" --", 1)[0]  # the option's own help, up to the next option
        assert f"(default: {default})" in shown, (option, shown)
    assert "--full-trace" in text
