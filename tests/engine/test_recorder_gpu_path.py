"""ampscope.Recorder's GPU-path decisions, proven on the CPU (issue #16, "Recorder").

Host syncs inside ``rec.step()``, where torch.compile compiles relative to the FLOP
counter, the summary's medians, and the TF32 setting as transformers sets it.
"""

import dataclasses
import inspect
import statistics
import time
from pathlib import Path

import pytest
import torch
from torch._dynamo.testing import CompileCounter
from torch.utils.flop_counter import FlopCounterMode
from transformers.utils.import_utils import enable_tf32

import ampscope
import ampscope.recorder as recorder_mod
from engine.measure.device import probe
from engine.record.journal import read_journal
from tests.engine.test_recorder import padded_batch, tiny_gpt2


class TinyLM(torch.nn.Module):
    """A nanoGPT-shaped model small enough to compile in seconds: ids in, loss out."""

    def __init__(self, vocab=64, width=32):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, width)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                       torch.nn.Linear(4 * width, width))
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, ids, targets):
        logits = self.head(self.mlp(self.emb(ids)))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def lm_batch(seed, rows=4, width=8):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 64, (rows, width + 1), generator=g)
    return ids[:, :-1], ids[:, 1:]


class SyncGuard:
    """Counts the calls that make the host wait for the device, while ``active``.

    Each call is noted with the storage it read (``None`` for a device-wide wait), so a
    test can tell a read of the previous step's values from one of the current step's.
    """

    READS = ("item", "tolist", "__float__", "__int__", "__bool__")

    def __init__(self, monkeypatch):
        self.active = False
        self.calls: list[tuple[str, int | None]] = []
        for name in self.READS:
            monkeypatch.setattr(torch.Tensor, name, self._wrap(getattr(torch.Tensor, name), name))
        monkeypatch.setattr(torch.cuda, "synchronize",
                            self._wrap(torch.cuda.synchronize, "cuda.synchronize"))
        monkeypatch.setattr(torch.cuda.Event, "synchronize",
                            self._wrap(torch.cuda.Event.synchronize, "Event.synchronize"))

    def _wrap(self, real, name):
        guard = self

        def wrapper(*args, **kwargs):
            if guard.active:
                first = args[0] if args else None
                ptr = (first.untyped_storage().data_ptr()
                       if isinstance(first, torch.Tensor) else None)
                guard.calls.append((name, ptr))
            return real(*args, **kwargs)

        return wrapper

    def during(self, fn, *args, **kwargs) -> list[tuple[str, int | None]]:
        self.calls = []
        self.active = True
        try:
            fn(*args, **kwargs)
        finally:
            self.active = False
        return self.calls


def test_step_reads_only_the_previous_steps_values(tmp_path, monkeypatch):
    model = tiny_gpt2()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    guard = SyncGuard(monkeypatch)
    losses, reads = [], []
    rec = ampscope.Recorder(model, opt, scaler, journal=tmp_path / "g.jsonl")
    rec.start()
    for i in range(5):
        loss = model(**padded_batch(i)).loss
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        losses.append(loss.detach())  # kept alive: storages are not reused while we look
        reads.append(guard.during(rec.step, loss=loss))
    rec.finish()
    ptrs = [loss.untyped_storage().data_ptr() for loss in losses]
    assert reads[0] == []  # nothing to read yet: step 0 is read while step 1 runs
    for k in range(1, 5):
        names = {name for name, _ in reads[k]}
        assert names <= {"item"}, reads[k]  # no device-wide wait, only single values
        read = [ptr for _, ptr in reads[k]]
        assert ptrs[k] not in read, f"step {k} read its own loss: a sync on the running step"
        assert read.count(ptrs[k - 1]) == 1
    # the values read late are still the right ones
    (trial,) = read_journal(tmp_path / "g.jsonl").trials
    assert [s.loss for s in trial.steps] == pytest.approx([float(x) for x in losses], rel=1e-6)
    assert all(s.loss_scale == 2.0**10 for s in trial.steps)


def test_every_groups_tensor_lr_is_read_late_as_group_0s(tmp_path, monkeypatch):
    """Learning rates as tensors in two parameter groups, changed in place by a scheduler:
    every group's is read as group 0's is, by engine.measure.trackers' late readers (on a
    GPU: copied behind its step, read through that copy's event), never with ``.item()`` on
    the value itself, which on a GPU waits for the step running then (the CPU takes the
    same path; the caller of each read tells which)."""
    model = tiny_gpt2()
    params = list(model.parameters())
    opt = torch.optim.AdamW([{"params": params[:2], "lr": torch.tensor(1e-3)},
                             {"params": params[2:], "lr": torch.tensor(4e-4)}], foreach=False)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    readers, real_item = [], torch.Tensor.item

    def item(tensor):
        readers.append(inspect.stack()[1].filename)
        return real_item(tensor)

    with ampscope.Recorder(model, opt, journal=tmp_path / "lr.jsonl") as rec:
        for i in range(4):
            model(**padded_batch(i)).loss.backward()
            opt.step()
            sched.step()
            opt.zero_grad()
            monkeypatch.setattr(torch.Tensor, "item", item)
            rec.step()
            monkeypatch.setattr(torch.Tensor, "item", real_item)
    elsewhere = [f for f in readers if Path(f).parts[-3:] != ("engine", "measure", "trackers.py")]
    assert readers and elsewhere == []
    record = read_journal(tmp_path / "lr.jsonl")
    assert [s.learning_rate for s in record.trials[0].steps] == pytest.approx(
        [1e-3 * 0.5**i for i in range(4)])
    assert [x.value for x in record.scalars if x.name == "lr_group1"] == pytest.approx(
        [4e-4 * 0.5**i for i in range(4)])


def test_compiled_model_compiles_in_the_warmup_step_and_is_counted_eagerly(tmp_path):
    torch.manual_seed(0)
    net = TinyLM()
    batches = [lm_batch(i) for i in range(5)]
    reference = TinyLM()
    counter = FlopCounterMode(display=False)
    with counter:
        reference(*batches[1]).backward()
    expected = counter.get_total_flops()

    backend = CompileCounter()
    model = torch.compile(net, backend=backend)  # as nanoGPT's train.py does
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    frames = []
    with ampscope.Recorder(model, opt, journal=tmp_path / "c.jsonl") as rec:
        for ids, targets in batches:
            model(ids, targets).backward()
            opt.step()
            opt.zero_grad()
            rec.step()
            frames.append(backend.frame_count)
    # it compiled in step 0 (a warm-up step) and never again: no measured step compiles
    assert frames[0] >= 1
    assert frames == [frames[0]] * len(frames)
    (trial,) = read_journal(tmp_path / "c.jsonl").trials
    assert trial.flops.counted_per_step == expected
    assert [s.warmup for s in trial.steps] == [True, True, False, False, False]


def test_summary_is_the_median_of_measured_steps(tmp_path):
    model = tiny_gpt2()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with ampscope.Recorder(model, opt, journal=tmp_path / "m.jsonl") as rec:
        for i in range(7):
            loss = model(**padded_batch(i)).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            if i == 4:
                time.sleep(0.4)  # one slow measured step (a checkpoint save)
            rec.step(loss=loss)
    (trial,) = read_journal(tmp_path / "m.jsonl").trials
    measured = [s for s in trial.steps if not s.warmup]
    assert len(measured) == 5
    seconds = [s.step_ms / 1e3 for s in measured]
    # 12 + 7 + 4 real tokens in every batch of padded_batch
    assert trial.summary.tokens_per_s == pytest.approx(statistics.median(23 / t for t in seconds))
    assert trial.summary.median_step_ms == pytest.approx(1e3 * statistics.median(seconds))
    # the slow step would have pulled a total-over-total figure well below the median
    assert 23 * len(seconds) / sum(seconds) < 0.8 * trial.summary.tokens_per_s


@pytest.fixture
def h100(monkeypatch):
    """The Recorder's device description says H100; the tensors stay on the CPU."""
    cpu = probe("cpu")
    gpu = dataclasses.replace(cpu, kind="cuda", index=0, name="NVIDIA H100 80GB HBM3",
                              compute_capability=(9, 0), nvml_available=False,
                              tf32_supported=True, unsupported={})
    monkeypatch.setattr(recorder_mod, "probe", lambda requested: gpu)
    return gpu


def test_tf32_set_the_way_transformers_sets_it(tmp_path, h100):
    model = tiny_gpt2()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    enable_tf32(True)  # what TrainingArguments(tf32=True) calls: the fp32_precision API
    try:
        with ampscope.Recorder(model, opt, journal=tmp_path / "t.jsonl") as rec:
            for i in range(3):
                loss = model(**padded_batch(i)).loss
                loss.backward()
                opt.step()
                opt.zero_grad()
                rec.step(loss=loss)
    finally:
        torch.backends.fp32_precision = "none"
    (trial,) = read_journal(tmp_path / "t.jsonl").trials
    assert trial.precision == "tf32"
    # every fp32 matmul of the counted step is filed under the TF32 peak
    assert set(trial.flops.by_peak_dtype) == {"tf32"}
    assert sum(trial.flops.by_peak_dtype.values()) == trial.flops.counted_per_step
