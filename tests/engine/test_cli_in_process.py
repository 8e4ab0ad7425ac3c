"""tests/cli_in_process.run_cli leaves the test process as it found it: the command's heap
freeze (right for a process that soon ends) and its trial's seeding stay inside the call."""

import gc

import torch

from tests.cli_in_process import run_cli


def test_a_command_in_process_leaves_the_collector_and_the_generator_as_found():
    state = torch.random.get_rng_state()
    done = run_cli("profile", "--model", "tiny", "--precision", "fp32", "--device", "cpu",
                   "--isolation", "inline", "--batch-size", "1", "--seq-len", "16", "--steps",
                   "1", "--warmup", "0", "--no-kernel-profile", "--no-quant-error", "--quiet")
    assert done.returncode == 0, done.stderr
    assert "fp32" in done.stdout  # the table of the run it made
    assert gc.get_freeze_count() == 0
    assert gc.isenabled()
    assert torch.equal(torch.random.get_rng_state(), state)
