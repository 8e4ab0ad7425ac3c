"""``python main.py profile``: train each precision for timed steps, then the verdict, the
tables and the report. Ctrl-C, SIGTERM and SIGHUP stop the run and keep what it measured
(``signals``); the progress lines are ``progress``'s."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
from pathlib import Path

from engine.cli.distributed_args import add_distributed_args, distributed_config
from engine.cli.model_args import add_model_args
from engine.cli.output import EXIT_FAILED, say
from engine.cli.progress import Progress
from engine.cli.report_out import check_out, write_report, written
from engine.cli.signals import Signals
from engine.core.config import (
    DATA_DOCS,
    DEFAULT_PRECISIONS,
    INTERLEAVE,
    OPTIMIZERS,
    RunConfig,
    parse_precisions,
    recipe_name,
)
from engine.models.source import resolve_source


def add_parser(sub) -> None:
    p = sub.add_parser("profile", help="train each precision for timed steps and compare")
    add_model_args(p, ",".join(DEFAULT_PRECISIONS))
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=10, help="measured steps per precision")
    p.add_argument("--warmup", type=int, default=2, help="unmeasured steps first")
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--optimizer", default="adamw", choices=OPTIMIZERS)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--grad-checkpointing", action="store_true")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--init-scale", type=float, default=2.0**16, help="GradScaler init scale")
    p.add_argument("--growth-interval", type=int, default=2000,
                   help="GradScaler growth interval (steps)")
    p.add_argument("--lora-r", type=int, default=8, help="LoRA rank for int8 and nf4")
    p.add_argument("--isolation", default="process", choices=("process", "inline"),
                   help="each trial in a child process (default) or in this one")
    p.add_argument("--interleave", default="auto", choices=INTERLEAVE,
                   help="run the precisions in mirrored rounds (ABBA) to cancel drift; "
                        "auto: where each trial is cheap (at most 400 M parameters, no "
                        "--compile, 5+ measured steps per round)")
    p.add_argument("--rounds", type=int, default=2,
                   help="rounds per precision when interleaving (steps are split over them)")
    p.add_argument("--data", default=DATA_DOCS, metavar="docs|random|FILE",
                   help="what the trials train and measure held-out loss on: docs (default: "
                        "CPython's pydoc_data.topics, tokenised for the model), random "
                        "(uniform random tokens) or FILE: UTF-8 text, nanoGPT's uint16 .bin "
                        "or a 1-D integer .npy of token ids; the last 10%% is held out")
    p.add_argument("--out", help="report file: .json, .csv or .html")
    p.add_argument("--card", help="the card whose predicted fp8 payoff an ':auto' recipe "
                   "(fp8:auto, fp8-rowwise:auto) converts by, e.g. \"H100 SXM\" (see "
                   "'plan'); default: the GPU the trial runs on; required on the CPU")
    p.add_argument("--numerics", action="store_true",
                   help="after the trials, run the numerics lab on the first precision and "
                        "add it (with advice citing the trials) to the report")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.add_argument("--wide", action="store_true",
                   help="print every column of the comparison table (p10..p90, CV, "
                        "tokens/s, MFU, HFU, energy); the default fits 120 columns")
    p.add_argument("--trace", metavar="DIR",
                   help="write each precision's profiled step as a Chrome trace "
                        "(<precision>.trace.json, opens in Perfetto) and, on CUDA, a memory "
                        "snapshot (<precision>.memory.pickle, pytorch.org/memory_viz)")
    p.add_argument("--no-kernel-profile", action="store_true",
                   help="skip the extra profiled step (kernel time by dtype)")
    p.add_argument("--no-quant-error", action="store_true",
                   help="skip the untimed forward that measures each layer's quantisation "
                        "error (SQNR)")
    p.add_argument("--measure-peak", action="store_true",
                   help="measure this machine's matmul peak again (MFU's second "
                        "denominator; otherwise measured once per machine and cached)")
    add_distributed_args(p)


def run(args) -> int:
    # every check that needs no torch comes first: a typo is refused in well under a second
    config = RunConfig(
        model=args.model, precisions=parse_precisions(args.precision),
        batch_size=args.batch_size, seq_len=args.seq_len, steps=args.steps,
        warmup=args.warmup, grad_accum=args.grad_accum, optimizer=args.optimizer, lr=args.lr,
        grad_checkpointing=args.grad_checkpointing, compile=args.compile,
        init_scale=args.init_scale, growth_interval=args.growth_interval, lora_r=args.lora_r,
        device=args.device, isolation=args.isolation, seed=args.seed,
        trust_remote_code=args.trust_remote_code, interleave=args.interleave, rounds=args.rounds,
        profile_step=not args.no_kernel_profile, trace_dir=_trace_dir(args),
        quant_error=not args.no_quant_error, data=args.data, payoff_card=args.card,
        **distributed_config(args),
    )
    from engine.run.fp8_auto import check_auto

    check_auto(config)  # an ':auto' recipe needs a card with fp8 to pick its layers by
    out = check_out(args.out) if args.out else None
    resolve_source(config.model)  # a wrong path, before the trials' server starts importing
    from engine.core.collector import imports_paused

    with imports_paused():  # torch, transformers: seconds of imports
        if config.isolation == "process" and config.strategy == "none":
            from engine.run.trial_process import start_server

            start_server(config.device)  # the trials' server imports while this process does
        if args.measure_peak:  # the first trial finds no cached peak and measures it
            from engine.measure import matmul_peak
            from engine.measure.device import probe

            matmul_peak.forget(probe(config.device))
        from engine.run.fits import refuse_if_too_big

        fit = refuse_if_too_big(config)  # a run bigger than the free memory is refused
        if fit.free_bytes is None and fit.predicted_bytes is not None:
            print(f"note: {fit.note}", file=sys.stderr)  # not checked: said, not skipped quietly
        from engine.run.runner import Runner

    progress = Progress(config, enabled=not args.quiet)
    runner = Runner(config, progress)
    signals = Signals(runner, inline=config.isolation == "inline")
    with signals.installed():
        try:
            record = runner.run()
        except KeyboardInterrupt:  # inline trials: a second Ctrl-C stops in the step
            record = _journaled_record(runner)
        progress.close()
        if args.numerics and not signals.received:
            _add_numerics(runner, record, config, signals)
        return _finish(record, runner, out, signals, args.trace, args.wide)


def _verdict_text(v) -> str:
    """The verdict as the CLI prints it first: the headline, then what to do."""
    return f"verdict: {v.headline}" + (f"\n  to do: {v.advice}" if v.advice else "")


def _journaled_record(runner):
    """The run as its journal holds it (the record in memory may stop mid-event)."""
    from engine.record.journal import read_journal

    if runner.journal is not None:
        runner.journal.close()
        try:
            return read_journal(runner.journal.path)
        except ValueError:
            pass
    record = runner.record
    record.status = "cancelled"
    return record


def _add_numerics(runner, record, config: RunConfig, signals) -> None:
    """The numerics lab in a child process: a stop or a failure there keeps the trials."""
    from engine.core.events import to_dict
    from engine.run.runner import run_lab_in_child

    lab_args = dict(model=config.model, precision=recipe_name(config.precisions[0]),
                    device=config.device,
                    batch_size=config.batch_size, seq_len=config.seq_len, seed=config.seed,
                    trials=[to_dict(t) for t in record.trials],
                    loss_scale=config.init_scale, trust_remote_code=config.trust_remote_code)
    say("running the numerics lab (Ctrl-C stops it and keeps the trials)...", err=True)
    try:
        numerics = run_lab_in_child(lab_args, lambda: bool(signals.received))
    except (ValueError, RuntimeError) as exc:
        say(f"numerics lab failed, the trials are kept: {str(exc).splitlines()[0]}", err=True)
        return
    if numerics is None:
        say("numerics lab stopped; the trials are kept", err=True)
        return
    runner.add_numerics(numerics)
    record.numerics = numerics
    advice = numerics.get("advice", {})
    if advice.get("recommended"):
        say(f"advisor: {advice['recommended']}")


def _finish(record, runner, out, signals, trace: str | None = None, wide: bool = False) -> int:
    """Table, report, and the exit code: 0 only when every trial is ok or unsupported."""
    from engine.measure.matmul_peak import format_mfu
    from engine.measure.quant_error_text import format_quant_error
    from engine.record.compare import (
        TABLE_WIDTH,
        baseline_reason,
        comparison_rows,
        format_table,
        speed_verdict,
    )
    from engine.record.data_text import data_line
    from engine.record.verdict import verdict as recommend

    say(_verdict_text(recommend(record)))
    verdict = speed_verdict(record.trials)
    rows = comparison_rows(record, verdict)
    say(format_table(rows, wide=wide))
    data = data_line(record)
    if data:
        say("\n".join(textwrap.wrap(data, TABLE_WIDTH, subsequent_indent="  ",
                                     break_on_hyphens=False)))
    from engine.run.fp8_auto import auto_notes

    for note in auto_notes(record.trials):  # the layers each ':auto' recipe converted
        say("\n".join(textwrap.wrap(note, TABLE_WIDTH, subsequent_indent="  ")))
    mfu = format_mfu(record.trials)
    if mfu:
        say(mfu)
    quant = format_quant_error(record.trials,
                               {r.precision: r.final_loss_diff_vs_fp32 for r in rows})
    if quant:
        say(quant)
    from engine.measure.lost_updates_text import format_lost_updates

    lost = format_lost_updates(record.trials)
    if lost:
        say(lost)
    if record.config.get("strategy", "none") != "none":
        from engine.distributed.summary_text import distributed_lines

        say("\n".join(distributed_lines(record)))
    reason = baseline_reason(record)
    if reason:
        say(f"note: {reason}")
    say(f"speed: {verdict.text}" + (f"\n  suggestion: {verdict.suggestion}"
                                     if verdict.suggestion else ""))
    from engine.measure.flops_text import flops_by_dtype_lines

    lines = flops_by_dtype_lines(record.trials)
    if lines:
        say("\n".join(lines))
    _say_kernels(record, trace)
    journal = runner.journal_path
    code = 0
    kept = journal if runner.journal is not None and not runner.journal.error else None
    if out is not None:
        if write_report(record, out, _journal_note(runner)):
            say(f"report written to {written(out)}")
            if Path(out).suffix.lower() == ".json":  # the file the user named holds them too
                kept = out
        else:
            code = EXIT_FAILED
    failed = [t for t in record.trials if t.status not in ("ok", "unsupported")]
    if signals.received:
        name = signal.Signals(signals.received[0]).name
        finished = sum(1 for t in record.trials if t.status in ("ok", "unsupported"))
        say(f"stopped by {name}: {finished} of {len(record.trials)} trials finished"
            + (f"; the run is in the journal {journal}" if journal else ""), err=True)
        return 128 + signals.received[0]
    if failed:
        from engine.record.failure_text import failed_line

        if kept is None:  # neither journal nor JSON report holds them: printed, not lost
            for trial in failed:
                if trial.traceback:
                    say(f"{trial.precision}'s traceback:\n{trial.traceback}", err=True)
        say(failed_line(record, len(failed), kept), err=True)
        return EXIT_FAILED
    return code


def _say_kernels(record, trace: str | None) -> None:
    """The profiled step's kernel table, GPM figures, and where the traces went."""
    from engine.measure.gpm import format_gpm
    from engine.measure.kernels import format_profiled

    for text in (format_profiled(record.trials), format_gpm(record.trials)):
        if text:
            say(text)
    if trace:
        files = [f for t in record.trials if t.profiled_step
                 for f in (t.profiled_step.trace_file, t.profiled_step.memory_snapshot_file) if f]
        say(f"traces written to {trace}: {', '.join(os.path.basename(f) for f in files)}"
            if files else f"no trace written to {trace}: no profiled step ran")


def _trace_dir(args) -> str | None:
    """The --trace folder, made now so a bad path fails before the run."""
    if not args.trace:
        return None
    if args.no_kernel_profile:
        raise ValueError("--trace writes the profiled step: leave out --no-kernel-profile")
    try:
        os.makedirs(args.trace, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"cannot create the trace folder {args.trace}: {exc.strerror}: "
                         "pick another --trace folder") from None
    if not os.access(args.trace, os.W_OK):
        raise ValueError(f"the trace folder {args.trace} is not writable: pick another --trace")
    return os.path.abspath(args.trace)


def _journal_note(runner) -> str:
    journal = runner.journal
    if journal is None or journal.error:
        why = journal.error if journal is not None else "no journal was kept"
        return f"the run could not be journaled either ({why})"
    return (f"the run is kept in the journal {journal.path}: write it with "
            f"'python main.py report {journal.path} --out other.html'")
