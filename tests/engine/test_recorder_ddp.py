"""A user's own DDP loop under torchrun (issue #19): each rank of a Recorder run journals
to its own file named by rank, with one run id, and ``report`` merges the ranks as the
engine's distributed trials do. Two real gloo ranks on the CPU, launched by
``torch.distributed.run``; each rank leaves what its own loop saw in a JSON file."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine.record.journal import read_journal
from engine.record.json_report import read_json

ROOT = Path(__file__).resolve().parents[2]
STEPS = 5

RANK_SCRIPT = textwrap.dedent("""
    import contextlib, json, sys
    from pathlib import Path
    import torch
    import torch.distributed as dist
    import ampscope
    from tests.engine.test_recorder import padded_batch, tiny_gpt2, tiny_llama

    out, family, steps = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.parallel.DistributedDataParallel(
        {"gpt2": tiny_gpt2, "llama": tiny_llama}[family]())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda it: 0.7**it)
    seen = {"loss": [], "tokens": [], "lr": []}
    # "rank0": only rank 0 records, as loops that log on the main process only do
    only_rank0 = len(sys.argv) > 4 and sys.argv[4] == "rank0"
    rec = (ampscope.Recorder(model, opt, journal=out / "ddp.jsonl",
                             out=out / "ddp-report.json")
           if rank == 0 or not only_rank0 else contextlib.nullcontext())
    with rec:
        for it in range(steps):
            # each rank its own data: different lengths, so different token counts
            batch = padded_batch(10 * rank + it, lengths=(12, 7, 4) if rank else (9, 9))
            loss = model(**batch).loss
            loss.backward()
            seen["lr"].append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
            opt.zero_grad()
            seen["loss"].append(loss.item())
            seen["tokens"].append(int(batch["attention_mask"].sum()))
            if hasattr(rec, "step"):
                rec.step(loss=loss)
    (out / f"seen{rank}.json").write_text(json.dumps({**seen,
                                                      "run_id": getattr(rec, "run_id", None)}))
    dist.destroy_process_group()
""")


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_torchrun_ranks_journal_apart_and_report_merges_them(tmp_path, family):
    script = tmp_path / "train_ddp.py"
    script.write_text(RANK_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    ran = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
         "2", str(script), str(tmp_path), family, str(STEPS)],
        cwd=ROOT, env=env, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr[-3000:]
    seen = [json.loads((tmp_path / f"seen{r}.json").read_text()) for r in range(2)]
    # one journal per rank, named by rank, one run id
    assert not (tmp_path / "ddp.jsonl").exists()
    ranks = [read_journal(tmp_path / f"ddp.rank{r}.jsonl") for r in range(2)]
    assert {r.run_id for r in ranks} == {seen[0]["run_id"]} == {seen[1]["run_id"]}
    assert [r.config["rank"] for r in ranks] == [0, 1]
    assert {r.config["strategy"] for r in ranks} == {"ddp"}
    for record, own in zip(ranks, seen):
        assert [s.loss for s in record.trials[0].steps] == pytest.approx(own["loss"])
    # report from either rank's journal: the ranks merged
    out = tmp_path / "merged.json"
    done = subprocess.run([sys.executable, "main.py", "report",
                           str(tmp_path / "ddp.rank1.jsonl"), "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    for record in (read_json(out), read_json(tmp_path / "ddp-report.json")):  # rank 0's too
        (trial,) = record.trials
        assert [r.rank for r in trial.ranks] == [0, 1]
        assert trial.distributed.world_size == 2 and trial.distributed.strategy == "ddp"
        steps = trial.steps
        assert len(steps) == STEPS
        # the global step: the ranks' mean loss, their summed tokens, the slowest time
        assert [s.loss for s in steps] == pytest.approx(
            [(a + b) / 2 for a, b in zip(seen[0]["loss"], seen[1]["loss"])])
        assert [s.tokens for s in steps] == [a + b for a, b in zip(seen[0]["tokens"],
                                                                    seen[1]["tokens"])]
        assert seen[0]["tokens"] != seen[1]["tokens"]
        assert [s.learning_rate for s in steps] == pytest.approx(seen[0]["lr"], rel=1e-12)
        for i, s in enumerate(steps):
            per_rank = [r.steps[i].step_ms for r in trial.ranks]
            assert s.step_ms == max(per_rank)
            assert s.tokens_per_s == pytest.approx(s.tokens / (s.step_ms / 1e3))


def test_a_recorder_on_rank_0_alone_records_without_waiting_for_the_others(tmp_path):
    """No collective inside the Recorder: a loop that records on its main process only
    runs to its end, and its one rank's journal reads as a run."""
    script = tmp_path / "train_ddp.py"
    script.write_text(RANK_SCRIPT)
    ran = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
         "2", str(script), str(tmp_path), "gpt2", "3", "rank0"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
        capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert [p.name for p in tmp_path.glob("ddp.rank*.jsonl")] == ["ddp.rank0.jsonl"]
    (trial,) = read_json(tmp_path / "ddp-report.json").trials
    own = json.loads((tmp_path / "seen0.json").read_text())
    assert [s.loss for s in trial.steps] == pytest.approx(own["loss"])
    assert [r.rank for r in trial.ranks] == [0]
