"""The profiled step's allocator peak beyond the tracked tensors: a kernel's own buffer (a bf16
matmul's fp32 output in oneDNN), named by the real ``main.py profile`` in its text and report.

Independent count: a plain step of the same model and batch shapes under the test's own
torch.profiler, once as torch runs it and once with oneDNN off (its bf16 matmul then
allocates only its output); the difference of the two allocator peaks is the workspace.
"""

import html
import json

import pytest
import torch
import transformers as tf
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from tests.cli_in_process import run_cli
from tests.engine.families import FAMILIES

BATCH, SEQ = 2, 32
FEW_KB = 4096  # the allocator's small scalars (the step's loss sum, the optimizer's steps)


def _main(*args) -> str:
    # in this process: the trials still run in their own child processes (spawned
    # ``profile``: test_cli_spread; spawned ``report``: test_cli_lost_updates)
    run = run_cli(*args)
    assert run.returncode == 0, run.stderr
    return run.stdout


def _profile_cli(folder, tmp_path) -> tuple[dict, str, str]:
    """The trials of the JSON report, the printed text, and the HTML report that ``report``
    writes from the same run."""
    out = tmp_path / "r.json"
    text = _main("profile", "--model", str(folder), "--precision", "fp32,bf16",
                 "--batch-size", str(BATCH), "--seq-len", str(SEQ), "--steps", "1",
                 "--warmup", "0", "--device", "cpu", "--data", "random", "--interleave", "off",
                 "--quiet", "--out", str(out))
    _main("report", str(out), "--out", str(tmp_path / "r.html"))
    trials = {t["precision"]: t for t in json.loads(out.read_text())["trials"]}
    return trials, text, (tmp_path / "r.html").read_text(encoding="utf-8")


def _allocator_rise(model, batch: dict, onednn: bool) -> int:
    """Highest net bytes the CPU allocator handed out during one plain training step (after
    a first one, so AdamW's state is already held, as after a trial's measured steps)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        model(**batch).loss.backward()
        torch.stack([p.grad.float().norm() for p in model.parameters()]).norm()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    with torch.backends.mkldnn.flags(enabled=onednn):
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            step()
    net = peak = 0
    for event in prof.profiler.kineto_results.events():
        if event.name() == "[memory]" and event.device_type() == DeviceType.CPU:
            net += event.nbytes()
            peak = max(peak, net)
    return peak


def _independent_workspace(family: str, dtype: torch.dtype) -> int:
    config = FAMILIES[family]()
    torch.manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (BATCH, SEQ))
    auto = tf.AutoModelForSeq2SeqLM if family == "t5" else tf.AutoModelForCausalLM
    batch = {"input_ids": ids, "labels": ids.clone()}
    if family == "t5":
        batch["decoder_input_ids"] = torch.cat([torch.zeros((BATCH, 1), dtype=ids.dtype),
                                                ids[:, :-1]], dim=1)
    rises = []
    for onednn in (True, False):
        torch.manual_seed(0)
        model = auto.from_config(config, dtype=dtype).train()
        rises.append(_allocator_rise(model, batch, onednn))
    return rises[0] - rises[1]


# torch.backends.mkldnn.flags sets oneDNN's TF32 switch too, and warns it has no Intel GPU
@pytest.mark.filterwarnings("ignore:TF32 acceleration on top of oneDNN")
@pytest.mark.parametrize("family", ["t5", "llama-gqa"])
def test_profile_names_the_kernel_workspace_beside_the_tensor_peak(family, tmp_path, monkeypatch):
    monkeypatch.setenv("AMPSCOPE_DATA_DIR", str(tmp_path / "data"))
    FAMILIES[family]().save_pretrained(tmp_path / "model")
    trials, text, page = _profile_cli(tmp_path / "model", tmp_path)
    for precision, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        trial = trials[precision]
        assert trial["status"] == "ok", trial["reason"]
        ps, tensors = trial["profiled_step"], trial["memory"]["total_bytes"]
        workspace = ps["kernel_workspace_bytes"]
        assert tensors + workspace == ps["peak_memory_bytes"]
        expected = _independent_workspace(family, dtype)
        assert abs(workspace - expected) <= FEW_KB, (precision, workspace, expected)
        if precision == "fp32":
            assert expected == 0 and workspace <= FEW_KB
        mib = 2 ** 20
        line = (f"kernel workspace, not a tensor: {workspace / mib:.2f} MiB ({workspace:,} B), "
                f"the allocator's peak {ps['peak_memory_bytes'] / mib:.2f} MiB "
                f"({ps['peak_memory_bytes']:,} B)")
        assert f"  {precision}: {line}" in text.splitlines()
        assert html.escape(line) in page
    if family == "t5":  # its LM-head weight gradient: a (700 x 96) fp32 buffer, +128 B
        assert trials["bf16"]["profiled_step"]["kernel_workspace_bytes"] > 200_000
