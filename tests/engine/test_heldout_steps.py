"""The held-out loss "after N steps" counts every optimiser step the model took before that
forward: warm-up, measured, the memory step and each step the profiled step ran (its shapes
step and its profiler schedule), on GPT-2 (tiny) and Llama (families.py), profiled or not."""

import pytest
import torch

from engine.core.config import RunConfig
from engine.models import heldout
from engine.run.runner import Runner
from tests.engine.families import causal_lm_folder


def _steps_before_each_heldout_forward(config: RunConfig, monkeypatch) -> tuple[list, object]:
    taken = {"n": 0}
    step = torch.optim.AdamW.step

    def counted(self, *args, **kwargs):
        taken["n"] += 1
        return step(self, *args, **kwargs)

    seen: list[int] = []
    loss = heldout.loss

    def watched(*args, **kwargs):
        seen.append(taken["n"])
        return loss(*args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", counted)
    monkeypatch.setattr(heldout, "loss", watched)
    record = Runner(config, lambda e: None).run()
    return seen, record.trial("fp32")


@pytest.mark.parametrize("family", ["tiny", "llama-gqa"])
@pytest.mark.parametrize("profiled", [True, False])
def test_the_heldout_loss_counts_every_step_before_it(family, profiled, tmp_path, monkeypatch):
    monkeypatch.setenv("AMPSCOPE_DATA_DIR", str(tmp_path / "data"))
    model = family if family == "tiny" else causal_lm_folder(family, str(tmp_path / family))
    config = RunConfig(model=model, precisions=("fp32",), batch_size=2, seq_len=16, steps=3,
                       warmup=1, device="cpu", isolation="inline", interleave="off",
                       profile_step=profiled)
    seen, trial = _steps_before_each_heldout_forward(config, monkeypatch)
    assert trial.status == "ok", trial.reason
    before, after = seen  # the forward before the first step, and the one after the last
    assert before == 0
    assert trial.heldout_loss.steps == after
    # warm-up 1, measured 3, the memory step, and on the CPU the profiler's one step (a GPU's
    # adds a shapes step, and its schedule a wait and a warm-up step)
    assert after == 1 + 3 + 1 + (1 if profiled else 0)
