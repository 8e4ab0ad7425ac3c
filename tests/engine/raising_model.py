"""A remote-code model folder whose forward raises a real exception, in a function of its own
file, when its weights are fp32: an fp32 trial of it ends in "error" with a traceback that
names ``raising_model.py`` and ``broken_block``, and a bf16 trial of it trains."""

from __future__ import annotations

import json
from pathlib import Path

SOURCE = '''
import torch
from transformers import GPT2Config, GPT2LMHeadModel


class RaisingConfig(GPT2Config):
    model_type = "ampscope-raising"


def broken_block(hidden):
    raise ValueError(f"the block cannot take {hidden.dtype} weights")


class RaisingModel(GPT2LMHeadModel):
    config_class = RaisingConfig

    def forward(self, *args, **kwargs):
        if self.dtype == torch.float32 and self.training:
            broken_block(self.lm_head.weight)
        return super().forward(*args, **kwargs)
'''
MESSAGE = "ValueError: the block cannot take torch.float32 weights"


def raising_model_folder(root: Path) -> Path:
    folder = Path(root) / "raising-model"
    folder.mkdir()
    (folder / "raising_model.py").write_text(SOURCE)
    config = {"model_type": "ampscope-raising", "n_layer": 1, "n_head": 2, "n_embd": 32,
              "n_positions": 64, "vocab_size": 128, "architectures": ["RaisingModel"],
              "auto_map": {"AutoConfig": "raising_model.RaisingConfig",
                           "AutoModelForCausalLM": "raising_model.RaisingModel"}}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def errored_run(root: Path, precisions=("fp32",), isolation: str = "inline"):
    """The ``Runner`` after a real, short run of the raising model (set ``HF_HOME`` and
    ``AMPSCOPE_DATA_DIR`` first: remote code is copied there, the journal goes there)."""
    from engine.core.config import RunConfig
    from engine.run.runner import Runner

    config = RunConfig(model=str(raising_model_folder(root)), precisions=tuple(precisions),
                       batch_size=1, seq_len=16, steps=1, warmup=0, device="cpu",
                       isolation=isolation, trust_remote_code=True, profile_step=False,
                       quant_error=False)
    runner = Runner(config)
    runner.run()
    return runner
