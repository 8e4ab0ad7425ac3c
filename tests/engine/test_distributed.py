"""Distributed trials as a user runs them: ``main.py profile --strategy ...`` in a real
process, two gloo ranks on the CPU started by torchrun, the tiny preset, a few steps.

Each figure is checked against a count made here from the model itself.
"""

import json
import math
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import torch

from engine.record.run_record import RunRecord

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--model", "tiny", "--seq-len", "16", "--steps", "2", "--warmup", "0",
        "--device", "cpu", "--quiet"]


def _profile(tmp_path, name: str, *args: str) -> dict:
    out = tmp_path / f"{name}.json"
    proc = subprocess.run([sys.executable, "main.py", "profile", *TINY, *args, "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    return json.loads(out.read_text())


def _trial(report: dict, precision: str) -> dict:
    return next(t for t in report["trials"] if t["precision"] == precision)


def _comm(trial: dict, collective: str) -> dict:
    return next(c for c in trial["distributed"]["comm"] if c["collective"] == collective)


@pytest.fixture(scope="module")
def tiny_model():
    """The tiny preset built here with transformers, to count its parameters independently."""
    from transformers import GPT2Config, GPT2LMHeadModel

    preset = json.loads((ROOT / "resources" / "presets.json").read_text())["presets"][0]
    cfg = dict(preset["config"])
    cfg.pop("model_type")
    return GPT2LMHeadModel(GPT2Config(**cfg))


def _unique_params(model) -> int:
    return sum(p.numel() for p in {p.data_ptr(): p for p in model.parameters()}.values())


@pytest.fixture(scope="module")
def single_report(tmp_path_factory):
    """One process on the global batch of two ranks of 2 rows."""
    return _profile(tmp_path_factory.mktemp("one"), "one", "--batch-size", "4",
                    "--precision", "fp32")


@pytest.fixture(scope="module")
def fsdp2_report(tmp_path_factory):
    """One FSDP2 run for the FSDP2 tests: each trial is its own torchrun all the same."""
    return _profile(tmp_path_factory.mktemp("fsdp"), "fsdp", "--strategy", "fsdp2",
                    "--nproc-per-node", "2", "--batch-size", "2",
                    "--precision", "fp32,bf16-amp,fp8,fp8-fsdp-ag")


@pytest.fixture(scope="module")
def ddp_report(tmp_path_factory):
    return _profile(tmp_path_factory.mktemp("ddp"), "ddp", "--strategy", "ddp",
                    "--nproc-per-node", "2", "--batch-size", "2",
                    "--precision", "fp32,fp32@bf16,int8,tf32")


def test_ddp_bf16_compression_halves_the_all_reduce_bytes(ddp_report, tiny_model):
    fp32, bf16 = _trial(ddp_report, "fp32"), _trial(ddp_report, "fp32@bf16")
    assert fp32["status"] == bf16["status"] == "ok", (fp32["reason"], bf16["reason"])
    full, half = _comm(fp32, "all_reduce"), _comm(bf16, "all_reduce")
    assert (full["dtype"], half["dtype"]) == ("float32", "bfloat16")
    # every trainable parameter's gradient crosses once per step: 4 B, then 2 B
    n = _unique_params(tiny_model)
    assert full["measured_bytes"] == 4 * n == full["expected_bytes"]
    assert half["measured_bytes"] == 2 * n == half["expected_bytes"]
    assert "bf16_compress_hook" in bf16["recipe"]
    # one entry per rank, each with its own steps, memory and monitor samples
    assert [r["rank"] for r in fp32["ranks"]] == [0, 1]
    for rank in fp32["ranks"]:
        assert len(rank["steps"]) == 2 and rank["monitor_samples"]
        assert rank["memory"]["sharded_params_bytes"] == 4 * n  # DDP: a full replica
        assert rank["memory"]["grads_bytes"] == 4 * n
        assert rank["memory"]["comm_buffers_bytes"] == 4 * n  # the gradient buckets
    dist = fp32["distributed"]
    slowest = max(fp32["ranks"], key=lambda r: r["median_step_ms"])
    assert dist["slowest_rank"] == slowest["rank"]
    assert dist["slowest_step_ms"] == slowest["median_step_ms"]
    fastest = min(r["median_step_ms"] for r in fp32["ranks"])
    assert dist["step_spread_pct"] == pytest.approx(100 * (slowest["median_step_ms"] - fastest)
                                                    / fastest)
    assert dist["total_tokens_per_s"] == pytest.approx(2 * 2 * 16 / (dist["slowest_step_ms"]
                                                                    / 1e3))


def test_unsupported_recipe_is_named_not_run(ddp_report):
    int8 = _trial(ddp_report, "int8")
    assert int8["status"] == "unsupported" and "ddp" in int8["reason"]


def test_what_the_cpu_cannot_run_alone_it_does_not_run_in_ranks(ddp_report):
    # tf32 on a CPU is fp32 arithmetic: run under DDP it was once ranked 1.41x "faster"
    from engine.measure.device import probe

    tf32 = _trial(ddp_report, "tf32")
    assert tf32["status"] == "unsupported" and not tf32["steps"]
    assert tf32["reason"] == probe("cpu").unsupported_reason("tf32")


def test_the_report_names_the_hook_that_ran_on_gloo(ddp_report):
    bf16, fp32 = _trial(ddp_report, "fp32@bf16"), _trial(ddp_report, "fp32")
    hook = bf16["distributed"]["comm_hook"]
    assert "bf16_compress_hook" in hook and "compress_hook_on_gloo" in hook
    assert fp32["distributed"]["comm_hook"] is None


def test_ddp_losses_equal_one_process_on_the_same_global_batch(ddp_report, single_report):
    # the one-process trial warms up one step whatever --warmup says (engine/run/trial_steps.py);
    # the ranks do not, so their two steps are its warm-up step and its first measured one
    one = _trial(single_report, "fp32")["steps"][:2]
    ddp = _trial(ddp_report, "fp32")
    got = [s["loss"] for s in ddp["steps"]]
    assert len(got) == len(one) == 2
    assert got == pytest.approx([s["loss"] for s in one], rel=1e-5)
    # averaged gradients: every rank's norm is the model's
    assert [s["grad_norm"] for s in ddp["steps"]] == pytest.approx(
        [s["grad_norm"] for s in one], rel=1e-4)
    # each rank's own steps carry the loss of its own rows, whose mean is the global one
    own = [[s["loss"] for s in r["steps"]] for r in ddp["ranks"]]
    assert own[0] != own[1]
    assert [(a + b) / 2 for a, b in zip(*own)] == pytest.approx(got, rel=1e-5)


def test_fsdp2_shards_parameters_and_gathers_in_the_policy_dtype(fsdp2_report, tiny_model,
                                                                single_report):
    report = fsdp2_report
    fp32, amp = _trial(report, "fp32"), _trial(report, "bf16-amp")
    assert fp32["status"] == amp["status"] == "ok", (fp32["reason"], amp["reason"])
    # the global batch of one process: the same losses, and the norm of the whole model
    # from the ranks' shards (a rank's own steps carry no norm: its shards' is not it);
    # the one-process trial's forced warm-up step is the ranks' first
    one = _trial(single_report, "fp32")["steps"][:len(fp32["steps"])]
    assert [s["loss"] for s in fp32["steps"]] == pytest.approx([s["loss"] for s in one],
                                                               rel=1e-5)
    assert [s["grad_norm"] for s in fp32["steps"]] == pytest.approx(
        [s["grad_norm"] for s in one], rel=1e-4)
    assert all(s["grad_norm"] is None for r in fp32["ranks"] for s in r["steps"])
    whole = _trial(single_report, "fp32")["memory"]["params_bytes"]
    n = _unique_params(tiny_model)
    for rank in fp32["ranks"]:
        shard = rank["memory"]["sharded_params_bytes"]
        assert shard == pytest.approx(whole / 2, rel=0.01)
        predicted = rank["predicted_memory"]["sharded_params_bytes"]
        assert predicted == 4 * math.ceil(n / 2)
        assert rank["memory_error_pct"]["sharded_params"] == pytest.approx(
            100 * (predicted - shard) / shard)
    # reduce-scatter carries every gradient once: fp32 under both recipes
    assert _comm(fp32, "reduce_scatter")["measured_bytes"] == 4 * n
    assert _comm(amp, "reduce_scatter")["measured_bytes"] == 4 * n
    gather32, gather16 = _comm(fp32, "all_gather"), _comm(amp, "all_gather")
    assert (gather32["dtype"], gather16["dtype"]) == ("float32", "bfloat16")
    assert gather16["measured_bytes"] * 2 == gather32["measured_bytes"]
    assert "MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)" in amp["recipe"]
    # the whole report reads back into the same objects
    record = RunRecord.from_dict(report)
    assert record.trial("fp32").ranks[1].memory.sharded_params_bytes == shard
    assert record.trial("fp32").distributed.collectives == {"all_gather": "fp32",
                                                            "reduce_scatter": "fp32"}
    from engine.report.html import render_html

    assert "Ranks (fsdp2, 2 ranks, gloo" in render_html(record)


def test_fp8_all_gather_on_two_gloo_ranks_gathers_float8_weights(fsdp2_report, tiny_model):
    report = fsdp2_report
    plain, ag = _trial(report, "fp8"), _trial(report, "fp8-fsdp-ag")
    assert plain["status"] == ag["status"] == "ok", (plain["reason"], ag["reason"])
    assert ag["support"] == "emulated"  # the CPU has no fp8 matrix unit, said so
    # counted here from the model: the blocks' matmul weights (2-D, float8) at 1 byte, the
    # rest of each block at 2 (bf16), each block gathered twice; the root once, in bf16
    blocks = tiny_model.transformer.h
    f8 = sum(p.numel() for b in blocks for p in b.parameters() if p.dim() == 2)
    rest = sum(p.numel() for b in blocks for p in b.parameters()) - f8
    root = _unique_params(tiny_model) - f8 - rest
    comm = {(c["collective"], c["dtype"]): c["measured_bytes"]
            for c in ag["distributed"]["comm"]}
    assert comm[("all_gather", "uint8")] == 2 * (f8 + 2 * rest)
    assert comm[("all_gather", "bfloat16")] == 2 * root
    layers = sum(1 for b in blocks for p in b.parameters() if p.dim() == 2)
    assert comm[("all_reduce", "float32")] == 4 * layers  # the scale precompute
    assert _comm(plain, "all_gather")["measured_bytes"] == 2 * (2 * (f8 + rest) + root)
    assert "precompute_float8_dynamic_scale_for_fsdp" in ag["recipe"]
    from engine.report.html import render_html

    assert "uint8: fp8 Linear weights + bf16 rest" in render_html(RunRecord.from_dict(report))


def _rank_processes(root: psutil.Process) -> dict[int, psutil.Process]:
    found = {}
    for proc in root.children(recursive=True):
        try:
            if "engine.distributed.rank_main" in " ".join(proc.cmdline()):
                found[int(proc.environ()["RANK"])] = proc
        except (psutil.Error, KeyError):
            pass
    return found


def test_a_killed_rank_ends_its_trial_and_leaves_no_process(tmp_path):
    out = tmp_path / "killed.json"
    args = [sys.executable, "main.py", "profile", "--model", "tiny", "--seq-len", "16",
            "--batch-size", "1", "--steps", "20", "--warmup", "0", "--device", "cpu",
            "--strategy", "ddp", "--nproc-per-node", "2", "--precision", "fp32,fp32@fp16",
            "--out", str(out)]
    proc = subprocess.Popen(args, cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            text=True)
    main = psutil.Process(proc.pid)
    seen: dict[int, psutil.Process] = {}
    for line in proc.stderr:  # progress: one line per step, once both ranks finished it
        seen.update({p.pid: p for p in main.children(recursive=True)})
        if line.strip().startswith("fp32 step 2/"):
            break
    ranks = _rank_processes(main)
    assert set(ranks) == {0, 1}
    seen.update({p.pid: p for p in main.children(recursive=True)})
    ranks[1].send_signal(signal.SIGKILL)
    rest = proc.stderr.read()
    assert proc.wait(timeout=300) == 1, rest[-3000:]  # 1: a trial failed, the run went on
    assert "1 of 2 trials failed" in rest
    alive = [p for p in seen.values() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert alive == [], [p.cmdline() for p in alive]
    report = json.loads(out.read_text())
    killed = _trial(report, "fp32")
    assert killed["status"] == "oom" and "rank 1" in killed["reason"]
    assert killed["distributed"]["failed_rank"] == 1
    statuses = {r["rank"]: r["status"] for r in killed["ranks"]}
    assert statuses == {0: "stopped", 1: "oom"}
    assert killed["steps"], "the steps measured before the kill are kept"
    assert _trial(report, "fp32@fp16")["status"] == "ok"  # the run went on


@pytest.mark.parametrize(("args", "fragment"), [
    (["--nproc-per-node", "2"], "--strategy ddp or fsdp2"),
    (["--precision", "fp32@bf16"], "needs a distributed run"),
    (["--strategy", "ddp", "--precision", "fp32@int8"], "unknown gradient-reduction dtype"),
    (["--strategy", "fsdp2", "--compile"], "drop --compile"),
    (["--strategy", "ddp", "--isolation", "inline"], "drop --isolation inline"),
    (["--strategy", "ddp", "--device", "cuda:1"], "use --device cuda or cpu"),
    (["--strategy", "ddp", "--interleave", "on"], "not interleaved"),
    (["--precision", "fp8-fsdp-ag"], "run it with --strategy fsdp2"),
    (["--strategy", "ddp", "--precision", "fp32,fp8-fsdp-ag"], "run it with --strategy fsdp2"),
])
def test_bad_distributed_input_is_one_line_and_exit_2(args, fragment, tmp_path, capsys):
    from engine.cli import main

    out = tmp_path / "r.json"
    assert main(["profile", *TINY, *args, "--out", str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], lines
    assert not out.exists()


def test_an_old_report_without_ranks_still_reads():
    from tests.engine.sample_record import make_record

    data = make_record().to_dict()
    for trial in data["trials"]:
        trial.pop("ranks", None)
        trial.pop("distributed", None)
    record = RunRecord.from_dict(data)
    assert all(t.ranks == [] and t.distributed is None for t in record.trials)


@pytest.mark.gpu
def test_nccl_ddp_on_two_gpus(tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs")
    report = _profile(tmp_path, "nccl", "--strategy", "ddp", "--nproc-per-node", "2",
                      "--batch-size", "2", "--device", "cuda",
                      "--precision", "bf16-amp,bf16-amp@bf16")
    amp, compressed = _trial(report, "bf16-amp"), _trial(report, "bf16-amp@bf16")
    assert amp["distributed"]["backend"] == "nccl"
    assert (_comm(compressed, "all_reduce")["measured_bytes"] * 2
            == _comm(amp, "all_reduce")["measured_bytes"])
    assert all(r["memory"]["peak_allocated_bytes"] for r in amp["ranks"])


def test_ctrl_c_stops_the_ranks_and_leaves_no_process(tmp_path):
    out = tmp_path / "stopped.json"
    args = [sys.executable, "main.py", "profile", "--model", "tiny", "--seq-len", "16",
            "--batch-size", "1", "--steps", "200", "--warmup", "0", "--device", "cpu",
            "--strategy", "fsdp2", "--nproc-per-node", "2", "--precision", "fp32",
            "--out", str(out)]
    proc = subprocess.Popen(args, cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            text=True)
    main = psutil.Process(proc.pid)
    seen: dict[int, psutil.Process] = {}
    for line in proc.stderr:
        seen.update({p.pid: p for p in main.children(recursive=True)})
        if line.strip().startswith("fp32 step 2/"):
            break
    assert set(_rank_processes(main)) == {0, 1}
    seen.update({p.pid: p for p in main.children(recursive=True)})
    proc.send_signal(signal.SIGINT)
    rest = proc.stderr.read()
    proc.wait(timeout=300)
    alive = [p for p in seen.values() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert alive == [], [p.cmdline() for p in alive]
    trial = _trial(json.loads(out.read_text()), "fp32")
    assert trial["status"] == "cancelled", rest[-2000:]
    assert 2 <= len(trial["steps"]) < 200  # what was measured before the stop is kept


def test_multi_node_options_reach_torchrun_unchanged():
    from torch.distributed.run import get_args_parser

    from engine.cli import build_parser
    from engine.cli.distributed_args import distributed_config
    from engine.core.config import RunConfig
    from engine.distributed.launch import torchrun_argv

    args = build_parser().parse_args([
        "profile", "--strategy", "fsdp2", "--nproc-per-node", "8", "--nnodes", "2",
        "--node-rank", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", "node0:29400",
        "--rdzv-id", "run1"])
    config = RunConfig(**distributed_config(args))
    parsed = get_args_parser().parse_args(
        torchrun_argv(config.nproc_per_node, list(config.torchrun_args), "/tmp/x"))
    assert (parsed.nproc_per_node, parsed.nnodes, parsed.node_rank) == ("8", "2", 1)
    assert (parsed.rdzv_backend, parsed.rdzv_endpoint, parsed.rdzv_id) == (
        "c10d", "node0:29400", "run1")
    assert not parsed.standalone and parsed.max_restarts == 0
    alone = get_args_parser().parse_args(torchrun_argv(2, [], "/tmp/x"))
    assert alone.standalone  # one machine: a free port, never torchrun's fixed default


def test_a_reduce_dtype_label_keeps_its_base_colour_lightened_and_distinct():
    from engine.record.colors import PRECISION_COLORS, color_of

    def rgb(color):
        return [int(color[i:i + 2], 16) for i in (1, 3, 5)]

    for base, color in PRECISION_COLORS.items():
        assert color_of(base) == color
        variants = [color_of(f"{base}@{d}") for d in ("fp32", "bf16", "fp16")]
        assert len({color, *variants}) == 4
        for variant in variants:
            assert all(v >= c for v, c in zip(rgb(variant), rgb(color)))
    assert color_of("fp12@bf16") == "#444444"


@pytest.mark.gpu
def test_nccl_fsdp2_on_two_gpus(tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs")
    report = _profile(tmp_path, "nccl-fsdp", "--strategy", "fsdp2", "--nproc-per-node", "2",
                      "--batch-size", "2", "--device", "cuda",
                      "--precision", "bf16-amp,bf16-amp@bf16")
    amp, bf16 = _trial(report, "bf16-amp"), _trial(report, "bf16-amp@bf16")
    assert amp["status"] == bf16["status"] == "ok", (amp["reason"], bf16["reason"])
    assert (_comm(bf16, "reduce_scatter")["measured_bytes"] * 2
            == _comm(amp, "reduce_scatter")["measured_bytes"])
    assert all(r["memory"]["peak_allocated_bytes"] for r in amp["ranks"])


@pytest.mark.parametrize(("optimizer", "strategy", "kind", "fused"), [
    ("adamw", "ddp", "cuda", True), ("adamw", "fsdp2", "cuda", True),
    ("sgd", "ddp", "cuda", True),
    # torch has no DTensor sharding rule for aten._fused_sgd_ (test_distributed_at_scale.py)
    ("sgd", "fsdp2", "cuda", False),
    ("adamw", "ddp", "cpu", False), ("sgd", "fsdp2", "cpu", False),
])
def test_the_rank_optimizer_is_fused_on_cuda(optimizer, strategy, kind, fused):
    from engine.core.config import RunConfig
    from engine.distributed.rank_main import rank_optimizer
    from engine.distributed.recipes import dist_recipe

    params = [torch.nn.Parameter(torch.zeros(4))]  # fused Adam/SGD also build on the CPU
    device = torch.device(kind, 0) if kind == "cuda" else torch.device(kind)
    built = rank_optimizer(RunConfig(optimizer=optimizer), params,
                           dist_recipe("fp16-amp", strategy), device)
    assert bool(built.defaults["fused"]) is fused
    assert type(built) is {"adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}[optimizer]


def test_a_followed_step_has_the_global_loss_only_when_every_rank_is_local():
    from engine.core.config import RunConfig
    from engine.core.events import StepSample
    from engine.distributed.trial import _combined

    def sample(loss, ms):
        return StepSample("fp32", 0, False, loss, ms, 0.0, None, None, None, None, None, False,
                          None, 0.0)

    config = RunConfig(batch_size=2, seq_len=16)
    samples = [sample(2.0, 10.0), sample(3.0, 12.0)]
    for world, loss in ((2, (2.0 + 3.0) / 2), (4, None)):  # two of four ranks on this node
        ranks = {r: {"start": {"world_size": world}} for r in range(2)}
        step = _combined(samples, config, ranks)
        assert step.loss == loss and step.step_ms == 12.0
        assert step.tokens_per_s == pytest.approx(world * 2 * 16 / 0.012)
