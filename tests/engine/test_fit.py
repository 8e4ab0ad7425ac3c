import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.run.fit import CARDS, FitProbe, linear_fit, parse_bytes, search

ROOT = Path(__file__).resolve().parents[2]


def _main(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "main.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.parametrize("limit", [0, 1, 2, 3, 5, 8, 13, 63, 64, 100])
def test_search_finds_the_largest_fitting_batch_with_few_probes(limit):
    asked = []

    def fits(b):
        asked.append(b)
        return b <= limit

    found = search(fits, 100)
    brute = max((b for b in range(1, 101) if b <= limit), default=None)
    assert found == brute
    assert len(asked) <= 2 * math.ceil(math.log2(100)) + 2
    if found is not None and found < 100:
        assert found + 1 in asked  # the boundary was measured on both sides


def test_linear_fit_and_cards_match_a_hand_computation():
    probes = [FitProbe(b, fits, "ok", None, peak, "", None, None) for b, fits, peak in
              [(1, True, 300 * 2**20), (2, True, 400 * 2**20), (4, True, 600 * 2**20),
               (8, False, 1000 * 2**20)]]
    slope, fixed, line, cards = linear_fit(probes)
    assert line == (2, 4)
    assert slope == 100 * 2**20 and fixed == 200 * 2**20
    for card in cards:
        assert card.max_batch == (card.capacity_bytes // 2**20 - 200) // 100
    assert [c.capacity_bytes for c in cards] == [c.capacity_bytes for c in CARDS]


def test_parse_bytes():
    assert parse_bytes("24GiB") == 24 * 2**30
    assert parse_bytes("512 MiB") == 512 * 2**20
    assert parse_bytes("8GB") == 8 * 10**9
    assert parse_bytes("1000") == 1000
    for bad in ("0", "0GiB", "lots", "12 parsecs", "-1GiB"):
        with pytest.raises(ValueError, match="--memory-budget"):
            parse_bytes(bad)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ([], "the memory budget is required"),
        (["--memory-budget", "0"], "above 0"),
        (["--memory-budget", "1GiB", "--precision", "fp12"], "unknown precision 'fp12'"),
        (["--memory-budget", "1GiB", "--max-batch", "0"], "--max-batch"),
    ],
)
def test_bad_fit_input_is_one_line_and_exit_2(args, fragment):
    done = _main("fit", "--model", "tiny", "--device", "cpu", "--precision", "fp32", *args)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ampscope: error: ")
    assert fragment in lines[0]
    assert done.stdout == ""


def test_fit_on_the_cpu_finds_the_boundary_batch():
    budget = int(11.5 * 2**20)
    done = _main("fit", "--model", "tiny", "--precision", "fp32", "--seq-len", "32",
                 "--memory-budget", str(budget), "--max-batch", "8", "--device", "cpu",
                 "--isolation", "inline", "--json", "--quiet")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["budget_bytes"] == budget
    (result,) = out["results"]
    probes = {p["batch_size"]: p for p in result["probes"]}
    best = result["batch_size"]
    assert 1 < best < 8
    # the found batch's measured peak is within the budget, the next one's is not
    assert probes[best]["fits"] and probes[best]["peak_bytes"] <= budget
    assert not probes[best + 1]["fits"] and probes[best + 1]["peak_bytes"] > budget
    assert result["memory_bytes"] == probes[best]["peak_bytes"]
    assert result["tokens_per_s"] > 0 and result["predicted_bytes"] > 0
    # independent floor: during the optimizer step, fp32 weights, gradients and AdamW's
    # m and v (4 bytes each) are all alive
    from engine.models.presets import param_count

    assert probes[best]["peak_bytes"] >= 16 * param_count("tiny")
    peaks = [probes[b]["peak_bytes"] for b in sorted(probes)]
    assert peaks == sorted(peaks) and len(set(peaks)) == len(peaks)
    # "will it fit": the line through the two largest fitting probes, recomputed here
    fitting = sorted(b for b, p in probes.items() if p["fits"])
    b1, b2 = fitting[-2], fitting[-1]
    slope = (probes[b2]["peak_bytes"] - probes[b1]["peak_bytes"]) / (b2 - b1)
    fixed = probes[b1]["peak_bytes"] - slope * b1
    assert result["line_batches"] == [b1, b2]
    for card in result["cards"]:
        assert card["max_batch"] == math.floor((card["capacity_bytes"] - fixed) / slope)
    assert "prediction" in result["cards_note"]


@pytest.mark.gpu
def test_fit_on_cuda_emulates_a_smaller_card():
    total = torch.cuda.get_device_properties(0).total_memory
    budget = 2 * 2**30
    done = _main("fit", "--model", "gpt2", "--precision", "fp32,bf16-amp", "--seq-len", "256",
                 "--memory-budget", str(budget), "--max-batch", "64", "--device", "cuda",
                 "--json", "--quiet")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert budget < total
    for result in out["results"]:
        probes = {p["batch_size"]: p for p in result["probes"]}
        best = result["batch_size"]
        # the allocator gets the budget less the CUDA context NVML measured
        allocator = budget - (result["context_bytes"] or 0)
        assert best is not None and probes[best]["peak_bytes"] <= allocator
        if best < 64:
            nxt = probes[best + 1]
            assert not nxt["fits"] and (nxt["status"] == "oom"
                                        or nxt["peak_bytes"] > allocator)


def _is_probe(process) -> bool:
    import psutil

    try:
        return "spawn_main" in " ".join(process.cmdline())
    except psutil.Error:  # it ended meanwhile
        return False


def test_ctrl_c_stops_the_search_and_its_probe_process():
    import signal
    import time

    import psutil

    proc = subprocess.Popen(
        [sys.executable, "main.py", "fit", "--model", "tiny", "--precision", "fp32",
         "--seq-len", "32", "--memory-budget", "1GiB", "--device", "cpu"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    parent = psutil.Process(proc.pid)
    children = []
    while not children and proc.poll() is None:  # wait for the first probe's process
        children = [c for c in parent.children(recursive=True) if _is_probe(c)]
        time.sleep(0.1)
    assert children, "no probe process started"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == (
        "ampscope: fit stopped by the user before it finished: no batch reported")
    assert "Traceback" not in err and out == ""
    for child in children:
        assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE


def test_fit_text_names_the_prediction_and_the_method():
    from engine.run.fit import FitResult, format_fit

    probes = [FitProbe(b, fits, "ok", None if fits else "over", peak, "the method", 100.0 * b,
                       peak + 2**20) for b, fits, peak in
              [(1, True, 300 * 2**20), (2, True, 400 * 2**20), (4, False, 600 * 2**20),
               (3, True, 500 * 2**20)]]
    slope, fixed, line, cards = linear_fit(probes)
    result = FitResult("bf16-amp", 550 * 2**20, 3, None, 500 * 2**20, "the method", 300.0,
                       501 * 2**20, probes, slope, fixed, line, cards, "prediction note")
    text = format_fit(550 * 2**20, [result])
    row = next(line for line in text.splitlines() if line.startswith("bf16-amp "))
    assert row.split()[:9] == ["bf16-amp", "3", "500.0", "MiB", "501.0", "MiB", "300", "1", "2"]
    assert row.rstrip().endswith("1 2 4x 3")
    assert "memory: the method" in text and "PREDICTION" in text
    cards_row = [line for line in text.splitlines() if line.startswith("bf16-amp ")][1]
    assert cards_row.split()[1:] == [str((c.capacity_bytes // 2**20 - 200) // 100)
                                     for c in CARDS]
