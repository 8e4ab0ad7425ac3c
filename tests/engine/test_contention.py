"""A busy host: its load is recorded per trial, journaled, and stops the speed ranking.

The load source is a fake fed /proc/loadavg-shaped text, driven through the real
runner, monitor, journal and comparison code.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from engine.core.config import RunConfig
from engine.core.events import TrialFinished
from engine.measure.contention import LoadSampler, parse_loadavg
from engine.measure.device import cpu_bf16_hardware
from engine.record.compare import speed_verdict
from engine.record.journal import read_journal
from engine.record.run_record import RunRecord
from engine.record.validate import validate_report
from engine.record.verdict import verdict
from engine.run.runner import Runner

IDLE = ("0.52 0.58 0.59 2/812 4242", 2.0)  # /proc/loadavg text, other processes' CPU %
# oversubscribed on any machine the suite runs on: above twice the cores of a 64-core host
BUSY = ("171.3 2.90 1.80 6/812 4242", 45.0)


class PhasedLoad:
    """Answers like LoadSampler; the test switches it to BUSY between the two trials."""

    def __init__(self):
        self.phase = IDLE
        self.lock = threading.Lock()

    def sample(self) -> dict:
        with self.lock:
            text, other = self.phase
        return {"load_avg_1m": parse_loadavg(text), "other_cpu_pct": other}


def _busy_during_bf16(load: PhasedLoad):
    # switched when fp32 has finished, before bf16-amp's window opens: every sample stamped in
    # that window was read after the switch (the monitor stamps a sample as its reading begins)
    def on_event(event):
        if isinstance(event, TrialFinished) and event.result.precision == "fp32":
            with load.lock:
                load.phase = BUSY
    return on_event


# /proc/cpuinfo of an AMD EPYC 7B13 (Zen 3): AVX-512 absent, so no AVX512-BF16 either
EPYC_FLAGS = ("processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu vme de pse tsc "
              "msr pae mce cx8 apic sse sse2 ht syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm "
              "avx avx2 bmi1 bmi2 fma f16c sha_ni vaes vpclmulqdq\n")


@pytest.fixture(scope="module")
def busy_run():
    import engine.measure.device

    load = PhasedLoad()
    config = RunConfig(model="tiny", precisions=("fp32", "bf16-amp"), batch_size=1, seq_len=16,
                       steps=6, warmup=1, device="cpu", isolation="inline", interleave="off",
                       profile_step=False, monitor_hz=20.0)
    runner = Runner(config, _busy_during_bf16(load), load=load)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(engine.measure.device, "_cpuinfo", lambda: EPYC_FLAGS)
        return runner.run(), runner.journal_path


def test_each_trial_keeps_the_load_measured_while_it_ran(busy_run):
    record, _ = busy_run
    fp32, bf16 = record.trial("fp32").host_load, record.trial("bf16-amp").host_load
    assert fp32.samples > 0 and bf16.samples > 0
    # the fed values, read independently of the parser: first field of the text
    assert fp32.load_avg_1m_mean == pytest.approx(float(IDLE[0].split()[0]), abs=0.3)
    assert bf16.load_avg_1m_max == float(BUSY[0].split()[0])
    assert fp32.other_cpu_pct_mean == pytest.approx(IDLE[1], abs=3)
    assert bf16.other_cpu_pct_mean == pytest.approx(BUSY[1], abs=5)
    # and the monitor samples carry it, so charts and reports can show it
    assert {m.load_avg_1m for m in record.monitor_samples} >= {0.52, 171.3}


def test_busy_host_refuses_to_rank_speed_and_the_verdict_says_why(busy_run):
    record, _ = busy_run
    speed = speed_verdict(record.trials)
    assert speed.noisy and speed.ranking is None
    assert "oversubscribed during bf16-amp: 1-minute load average" in speed.text
    assert "45% of the CPU during bf16-amp" in speed.text
    # the run still answers, on what load does not move (memory, loss), and says so
    v = verdict(record)
    assert v.headline.startswith(f"Train in {v.precision}")
    assert "speed not ranked: the machine was busy" in v.headline


def test_the_journal_and_the_report_keep_the_load(busy_run):
    record, journal = busy_run
    back = read_journal(journal)
    assert back.trial("bf16-amp").host_load == record.trial("bf16-amp").host_load
    assert [m.other_cpu_pct for m in back.monitor_samples] == \
        [m.other_cpu_pct for m in record.monitor_samples]
    data = json.loads(json.dumps(record.to_dict()))  # as a report file holds it
    validate_report(data)
    assert RunRecord.from_dict(data).trials == record.trials


def test_an_old_report_without_load_fields_opens_and_still_ranks(busy_run):
    record, _ = busy_run
    data = json.loads(json.dumps(record.to_dict()))
    for trial in data["trials"]:
        del trial["host_load"]
    for sample in data["monitor_samples"]:
        del sample["load_avg_1m"], sample["other_cpu_pct"]
    validate_report(data)
    old = RunRecord.from_dict(data)
    assert all(t.host_load is None for t in old.trials)
    assert "busy" not in speed_verdict(old.trials).text


def test_the_real_sampler_reads_loadavg_text_and_cpu_counters():
    sampler = LoadSampler(loadavg=lambda: BUSY[0])
    first = sampler.sample()
    assert first == {"load_avg_1m": 171.3, "other_cpu_pct": None}  # no interval yet
    sum(i * i for i in range(200_000))  # let some CPU time pass
    share = sampler.sample()["other_cpu_pct"]
    assert share is None or 0.0 <= share <= 100.0
    assert LoadSampler(loadavg=lambda: None).sample()["load_avg_1m"] is None


@pytest.mark.parametrize(("flags", "expected"), [
    ("flags\t\t: fpu vme de pse tsc msr pae mce cx8 avx2 avx512f avx512bw", False),  # EPYC 7xx3
    ("flags\t\t: fpu avx512f avx512_bf16 amx_bf16 amx_tile amx_int8", True),  # Sapphire Rapids
    ("Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics bf16 i8mm", True),  # Arm
    ("processor\t: 0\nmodel name\t: Some CPU", None),
])
def test_bf16_hardware_is_read_from_cpuinfo_flags(flags, expected):
    assert cpu_bf16_hardware(flags) is expected


def test_a_cpu_without_bf16_units_is_said_to_emulate_bf16(busy_run):
    record, _ = busy_run
    assert record.environment["device"]["bf16_hardware"] is False
    warnings = [x.message for x in record.logs if x.level == "warning"]
    assert any(m.startswith("bf16: emulated (no AVX512-BF16/AMX), slow: ") and "bf16-amp" in m
               for m in warnings), warnings
    assert any("bf16 is emulated" in r for r in verdict(record).reasons)


def test_a_busy_host_is_said_within_the_first_trial_with_what_to_do():
    from engine.core.events import LogEvent, StepSample
    from engine.measure.busy_notice import WINDOW_S

    load = PhasedLoad()
    load.phase = BUSY
    events = []

    def on_event(event):
        # each of the first trial's steps lasts at least 50 ms (the event comes in the
        # trial's thread): its 150 steps outlast the notice's window on any machine
        events.append(event)
        if isinstance(event, StepSample) and event.precision == "fp32":
            time.sleep(0.05)

    assert 150 * 0.05 > 3 * WINDOW_S
    config = RunConfig(model="tiny", precisions=("fp32", "bf16-amp"), batch_size=1, seq_len=16,
                       steps=150, warmup=1, device="cpu", isolation="inline", interleave="off",
                       profile_step=False, monitor_hz=20.0)
    Runner(config, on_event, journal=False, load=load).run()
    said = [i for i, e in enumerate(events) if isinstance(e, LogEvent)
            and e.message.startswith("the machine is busy (1-minute load average 171.3")]
    first_done = next(i for i, e in enumerate(events) if isinstance(e, TrialFinished))
    assert len(said) == 1 and said[0] < first_done  # once, before the first trial ended
    message = events[said[0]].message
    assert "speeds will not be ranked" in message and "To do: stop the run" in message
