"""engine.run.plan_autocast: CUDA's autocast policy on a CPU trace, checked against the
installed torch build's own AutocastCUDA kernels (run on fake CUDA tensors, which a CPU
build can compute dtypes on without autograd), and a plan traced as the card runs it
against bytes counted by hand."""

import html
import json
import subprocess

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from engine.measure.kernel_workspace import PLAN_NOTE as WORKSPACE_NOTE
from engine.run.plan_autocast import FP32, FP32_OUTPUT, LOWER, PROMOTE, CudaAutocast
from tests.cli_in_process import run_cli
from tests.engine.families import FAMILIES
from tests.engine.families import F as FFN

CATEGORIES = ("params_bytes", "buffers_bytes", "grads_bytes", "optimizer_bytes",
              "inputs_bytes", "weight_copies_bytes", "activations_bytes", "temporaries_bytes",
              "total_bytes")


def test_op_lists_are_the_builds_autocast_cuda_kernels():
    """Every op the build registers an AutocastCUDA kernel for is in one list, once."""
    registered = {op.split("::")[1].split(".")[0] for op in torch._C._dispatch_get_all_op_names()
                  if torch._C._dispatch_has_kernel_for_dispatch_key(op, "AutocastCUDA")}
    lists = (LOWER, FP32, FP32_OUTPUT, PROMOTE)
    assert set().union(*lists) == registered
    assert sum(len(x) for x in lists) == len(registered)  # no op in two lists


def _inputs(device: str, dtype: torch.dtype) -> dict:
    """The calls' arguments, made in place (a view of a fake CUDA tensor needs a device
    guard the CPU build has not)."""
    def rand(*shape, dt=dtype):
        return torch.rand(*shape, device=device, dtype=dt)

    return {"a": rand(4, 8), "b": rand(8, 8), "c": rand(1, 4, 8), "d": rand(1, 8, 8),
            "v": rand(8), "a32": rand(4, 8, dt=torch.float32),
            "t": torch.zeros(4, dtype=torch.long, device=device)}


# (name, call): each op with floating inputs in the autocast dtype and in fp32
CALLS = [
    ("linear", lambda x: F.linear(x["a"], x["b"])),
    ("matmul", lambda x: x["a"] @ x["b"]),
    ("bmm", lambda x: torch.bmm(x["c"], x["d"])),
    ("addmm", lambda x: torch.addmm(x["a"], x["a"], x["b"])),
    ("baddbmm", lambda x: torch.baddbmm(x["c"], x["c"], x["d"])),
    ("einsum", lambda x: torch.einsum("ij,jk->ik", x["a"], x["b"])),
    ("mv", lambda x: torch.mv(x["a"], x["v"])),
    ("pow", lambda x: torch.pow(x["a"], 3.0)),
    ("__pow__", lambda x: x["a"] ** 3),
    ("Tensor.pow", lambda x: x["a"].pow(2)),
    ("rpow", lambda x: 2.0 ** x["a"]),
    ("exp", lambda x: x["a"].exp()),
    ("log1p", lambda x: torch.log1p(x["a"])),
    ("rsqrt", lambda x: torch.rsqrt(x["a"])),
    ("tanh", lambda x: torch.tanh(x["a"])),
    ("gelu", lambda x: F.gelu(x["a"], approximate="tanh")),
    ("layer_norm", lambda x: F.layer_norm(x["a"], (8,))),
    ("group_norm", lambda x: F.group_norm(x["a"], 2)),
    ("softmax", lambda x: F.softmax(x["a"], -1)),
    ("Tensor.softmax", lambda x: x["a"].softmax(-1)),
    ("log_softmax", lambda x: F.log_softmax(x["a"], -1)),
    ("softmax named dtype", lambda x: F.softmax(x["a"], -1, dtype=x["a"].dtype)),
    ("sum", lambda x: x["a"].sum()),
    ("cumsum", lambda x: x["a"].cumsum(0)),
    ("cross_entropy", lambda x: F.cross_entropy(x["a"], x["t"])),
    ("mse_loss", lambda x: F.mse_loss(x["a"], x["a32"])),
    ("addcmul mixed", lambda x: torch.addcmul(x["a"], x["a"], x["a32"])),
    ("add mixed", lambda x: x["a"] + x["a32"]),
    ("cat mixed", lambda x: torch.cat([x["a"], x["a32"]])),
]


def _cuda_autocast_dtype(call, dtype, lowered: torch.dtype) -> torch.dtype:
    """The dtype the build's AutocastCUDA kernels give the call (fake CUDA tensors; CUDA
    autocast switched on below ``torch.autocast``, which refuses without a GPU)."""
    before = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    torch.set_autocast_dtype("cuda", lowered)
    torch.set_autocast_enabled("cuda", True)
    torch.autocast_increment_nesting()
    try:
        with FakeTensorMode():
            return call(_inputs("cuda", dtype)).dtype
    finally:
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()
        torch.set_autocast_enabled("cuda", before[0])
        torch.set_autocast_dtype("cuda", before[1])


@pytest.mark.parametrize("lowered", (torch.bfloat16, torch.float16))
@pytest.mark.parametrize("dtype", (torch.float32, "lowered"))
@pytest.mark.parametrize("name,call", CALLS, ids=[c[0] for c in CALLS])
def test_casts_as_the_builds_cuda_autocast(name, call, dtype, lowered):
    dtype = lowered if dtype == "lowered" else dtype
    want = _cuda_autocast_dtype(call, dtype, lowered)
    x = _inputs("cpu", dtype)
    with CudaAutocast(), torch.autocast("cpu", dtype=lowered):
        got = call(x).dtype
    assert got == want, (name, got, want)


def test_outside_autocast_calls_run_as_given():
    a = torch.rand(4, 8, dtype=torch.bfloat16)
    with CudaAutocast():
        assert torch.pow(a, 3.0).dtype == torch.bfloat16
        assert F.layer_norm(a, (8,)).dtype == torch.bfloat16


def _plan(source: str, trace_as: str, *args) -> subprocess.CompletedProcess:
    """``main.py plan`` in this process (its figures and text are the subject; the plan
    command is spawned end to end by test_plan.py and test_plan_h200.py)."""
    run = run_cli("plan", "--model", source, "--precision", "fp32,bf16-amp,fp16-amp",
                  "--batch-size", "2", "--seq-len", "32", "--card", "H200", "--max-batch", "0",
                  "--no-history", "--no-levers", "--trace-as", trace_as, "--quiet", *args)
    assert run.returncode == 0, run.stderr
    return run


def test_cli_gpt2_traced_as_the_card_keeps_gelu_new_in_fp32(tmp_path):
    """GPT-2's gelu_new, 0.5 x (1 + tanh(c (x + 0.044715 pow(x, 3)))), under CUDA autocast:
    pow upcasts x, so backward keeps x in fp32 (pow's input), tanh's output and 1 + tanh in
    fp32, 0.5 x in half and the product's half copy for c_proj: 16 bytes an element of the
    MLP's width, where CPU autocast keeps all five in half (10 bytes). At the peak (late in
    backward, every layer's saved tensors still alive at this shape) the card's trace holds
    6 bytes x batch x tokens x width x layers more activations, and nothing else differs."""
    FAMILIES["gpt2"]().save_pretrained(tmp_path / "gpt2")
    source = str(tmp_path / "gpt2")
    # the card's: JSON on stdout and the HTML report; the CPU's: the text and a JSON report
    card = _plan(source, "card", "--json", "--out", str(tmp_path / "card.html"))
    text = _plan(source, "cpu", "--out", str(tmp_path / "cpu.json")).stdout.splitlines()
    page = (tmp_path / "card.html").read_text(encoding="utf-8")
    plans = {trace_as: {t["precision"]: t for t in json.loads(data)["trials"]}
             for trace_as, data in (("card", card.stdout),
                                    ("cpu", (tmp_path / "cpu.json").read_text("utf-8")))}
    layers = 2
    for precision in ("bf16-amp", "fp16-amp"):
        card_trial, cpu = plans["card"][precision], plans["cpu"][precision]
        assert "AutocastCUDA" in card_trial["autocast_policy"]
        assert "AutocastCPU" in cpu["autocast_policy"]
        # a CPU plan says what it cannot trace: the kernels' own buffers a CPU trial names
        assert WORKSPACE_NOTE in cpu["memory"]["notes"]
        assert WORKSPACE_NOTE not in card_trial["memory"]["notes"]
        assert card_trial["memory"]["peak_phase"] == cpu["memory"]["peak_phase"] == "backward"
        extra = 6 * 2 * 32 * FFN * layers
        for name in CATEGORIES:
            want = cpu["memory"][name] + (extra if name in ("activations_bytes",
                                                            "total_bytes") else 0)
            assert card_trial["memory"][name] == want, name
        assert f"autocast traced: {html.escape(card_trial['autocast_policy'])}" in page
        assert text[text.index(next(x for x in text if x.startswith(f"{precision}: peak")))
                    + 1] == f"  autocast traced: {cpu['autocast_policy']}"
    # no autocast region: the same trace, no policy named
    for name in CATEGORIES:
        assert plans["card"]["fp32"]["memory"][name] == plans["cpu"]["fp32"]["memory"][name]
    assert plans["card"]["fp32"]["autocast_policy"] is None
    assert page.count("autocast traced:") == 2
    assert sum(x.startswith("  autocast traced:") for x in text) == 2


def test_attention_dropout_is_traced_as_the_cards_fused_kernel(tmp_path):
    """A GPT-2 with attention dropout: CUDA's flash / memory-efficient kernels keep the
    same tensors for backward with or without dropout (they replay it from the RNG state),
    so traced as the card runs it, the step equals the step without dropout; traced as the
    CPU runs it (SDPA's math path: no fused CPU kernel takes dropout), it keeps at least
    the attention probabilities (half), the dropout mask (bool) and the dropped
    probabilities (half) more, batch x heads x tokens^2 each, for every layer."""
    from engine.run.plan import PlanConfig, plan

    batch, seq, layers, heads = 2, 32, 2, 6
    for pdrop in (0.0, 0.1):
        config = FAMILIES["gpt2"]()
        config.attn_pdrop = pdrop
        config.save_pretrained(tmp_path / str(pdrop))
    traced = {}
    for pdrop in (0.0, 0.1):
        for trace_as in ("card", "cpu"):
            config = PlanConfig(model=str(tmp_path / str(pdrop)), precisions=("bf16-amp",),
                                batch_size=batch, seq_len=seq, max_batch=0, cards=("H200",),
                                history=False, levers=False, trace_as=trace_as)
            traced[pdrop, trace_as] = plan(config).trials[0].memory
    for name in CATEGORIES:
        assert getattr(traced[0.1, "card"], name) == getattr(traced[0.0, "card"], name), name
    assert "fused kernel" in traced[0.1, "card"].notes
    matrix = batch * heads * seq * seq * layers
    assert (traced[0.1, "cpu"].activations_bytes - traced[0.0, "cpu"].activations_bytes
            >= matrix * (2 + 1 + 2))


@pytest.mark.parametrize("family", ("gpt2", "llama-gqa"))
def test_checkpointed_layers_recompute_under_the_cards_casts(family, tmp_path):
    """torch recomputes a checkpointed layer with Python function modes off: without the
    card's casts entered around each recompute, the recomputed tensors came out in the CPU's
    dtypes, checkpoint refused them and the plan fell back to the memory model. Traced under
    the card's op lists with checkpointing, the step is traced, its peak no higher than
    without."""
    FAMILIES[family]().save_pretrained(tmp_path)
    model = str(tmp_path)

    from engine.run.plan import PlanConfig, plan

    done = run_cli("plan", "--model", model, "--precision", "bf16-amp", "--batch-size", "2",
                   "--seq-len", "32", "--card", "H200", "--max-batch", "0", "--no-history",
                   "--no-levers", "--json", "--quiet", "--grad-checkpointing")
    assert done.returncode == 0, done.stderr
    (checkpointed,) = json.loads(done.stdout)["trials"]
    # the step without checkpointing, planned directly in the test's process
    (plain,) = plan(PlanConfig(model=model, precisions=("bf16-amp",), batch_size=2,
                               seq_len=32, cards=("H200",), max_batch=0, history=False,
                               levers=False)).trials
    for method, reason, policy in ((checkpointed["method"], checkpointed.get("reason"),
                                    checkpointed["autocast_policy"]),
                                   (plain.method, plain.reason, plain.autocast_policy)):
        assert method == "traced", reason
        assert policy and "CUDA" in policy
    # at these sizes the peak may fall in the optimiser step (no activations left there)
    assert checkpointed["memory"]["total_bytes"] <= plain.memory.total_bytes
