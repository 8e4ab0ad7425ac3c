"""An interleaved precision counts its FLOPs in its first round only (engine/run/rounds.py,
RoundBook.prior_flops): a later round takes them over instead of running another uncounted
forward+backward, and every FLOP figure (the counts, each later step's TFLOP/s)
equals that of the same run with every round counting, on GPT-2 (the tiny preset) and Llama
(families.py), inline and in trial processes."""

import pytest

from engine.core.config import RunConfig
from engine.measure.flops import counting_mode
from engine.run.rounds import RoundBook
from engine.run.runner import Runner
from tests.engine.families import causal_lm_folder

COUNTER = type(counting_mode()[0])  # FlopCounterMode as the trials run it

PRECISIONS = ("fp32", "bf16-amp")


def _run(model: str, isolation: str):
    config = RunConfig(model=model, precisions=PRECISIONS, batch_size=2, seq_len=16, steps=4,
                       warmup=1, device="cpu", isolation=isolation, interleave="on", rounds=2,
                       profile_step=False, quant_error=False)
    return Runner(config).run()


def _counted_rounds(monkeypatch) -> list:
    """Each FlopCounterMode the trials (inline) enter, as the precision's round count so far."""
    entered: list = []
    own = COUNTER.__enter__

    def enter(self):
        entered.append(1)
        return own(self)

    monkeypatch.setattr(COUNTER, "__enter__", enter)
    return entered


@pytest.mark.parametrize(("family", "isolation"), [("tiny", "inline"), ("llama-gqa", "inline"),
                                                   ("tiny", "process")])
def test_a_later_round_takes_the_first_rounds_flops(family, isolation, tmp_path, monkeypatch):
    monkeypatch.setenv("AMPSCOPE_DATA_DIR", str(tmp_path / "data"))
    model = family if family == "tiny" else causal_lm_folder(family, str(tmp_path / family))
    entered = _counted_rounds(monkeypatch)
    now = _run(model, isolation)
    if isolation == "inline":  # a trial process's counting is not seen here
        assert len(entered) == len(PRECISIONS)  # once per precision, not once per round
    with monkeypatch.context() as m:  # the earlier way: every round counts its own
        m.setattr(RoundBook, "prior_flops", lambda self, precision: None)
        entered.clear()
        before = _run(model, isolation)
        if isolation == "inline":
            assert len(entered) == 2 * len(PRECISIONS)
    for p in PRECISIONS:
        a, b = now.trial(p), before.trial(p)
        assert a.status == b.status == "ok", (a.reason, b.reason)
        assert a.flops == b.flops and a.flops.counted_per_step
        # GPT-2 and Llama: the hardware count is at least the model's (6 x matmul params x
        # tokens, attention added), an independent lower bound
        assert a.flops.counted_per_step >= a.flops.analytic_per_step > 0
        later = [s for s in a.steps if s.round == 1 and not s.warmup]
        assert later
        for s in later:  # each later step's rates come from the same counts, by its own time
            assert s.tflops == pytest.approx(a.flops.analytic_per_step / (s.step_ms / 1e3)
                                             / 1e12)
