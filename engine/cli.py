"""The headless command line: ``profile``, ``footprint``, ``presets``, ``numerics``.

Bad input prints one line to stderr that says what to do and exits 2, before any
file is written.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

from engine.core.config import (
    DATA_DOCS,
    DEFAULT_PRECISIONS,
    INTERLEAVE,
    OPTIMIZERS,
    PRECISIONS,
    RunConfig,
    parse_precisions,
    recipe_name,
    warmup_steps,
)

EXIT_FAILED = 1  # trials failed, or the report could not be written
EXIT_BAD_INPUT = 2  # nothing ran
SIGNAL_GRACE_S = 5.0  # after SIGTERM/SIGHUP, a trial has this long to stop on its own


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not argparse's usage block
        command = " ".join(self.prog.split()[1:])
        help_cmd = f"python main.py {command} --help" if command else "python main.py --help"
        raise ValueError(f"{message} (see '{help_cmd}')")


def precision_lines() -> str:
    """Each precision and what it trains, one line each (``--help`` and ``presets``)."""
    from engine.core.resources import precision_descriptions

    texts = precision_descriptions()
    width = max(map(len, texts))
    return "\n".join(f"  {name:<{width}} {text}" for name, text in texts.items())


def _add_model_args(p: argparse.ArgumentParser, precisions_default: str) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter  # keep the lines below as written
    p.epilog = f"precisions:\n{precision_lines()}"
    p.add_argument("--model", default="tiny",
                   help="preset name (see 'presets'), a local model folder, or a cached hub id")
    p.add_argument("--precision", default=precisions_default,
                   help=f"comma-separated, from: {','.join(PRECISIONS)}; RECIPE+OPTIM "
                        "gives one trial its own optimizer (e.g. bf16-amp+adamw8bit)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow a model folder or hub id to run its own code")
    p.add_argument("--seed", type=int, default=0)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="main.py", description="AmpScope: mixed-precision training profiler")
    parser.add_argument("--version", action="store_true",
                        help="list the versions in use against the tested ranges, and exit")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)

    prof = sub.add_parser("profile", help="train each precision for timed steps and compare")
    _add_model_args(prof, ",".join(DEFAULT_PRECISIONS))
    prof.add_argument("--batch-size", type=int, default=4)
    prof.add_argument("--seq-len", type=int, default=128)
    prof.add_argument("--steps", type=int, default=10, help="measured steps per precision")
    prof.add_argument("--warmup", type=int, default=2, help="unmeasured steps first")
    prof.add_argument("--grad-accum", type=int, default=1)
    prof.add_argument("--optimizer", default="adamw", choices=OPTIMIZERS)
    prof.add_argument("--lr", type=float, default=1e-4)
    prof.add_argument("--grad-checkpointing", action="store_true")
    prof.add_argument("--compile", action="store_true", help="torch.compile the model")
    prof.add_argument("--init-scale", type=float, default=2.0**16, help="GradScaler init scale")
    prof.add_argument("--growth-interval", type=int, default=2000,
                      help="GradScaler growth interval (steps)")
    prof.add_argument("--lora-r", type=int, default=8, help="LoRA rank for int8 and nf4")
    prof.add_argument("--isolation", default="process", choices=("process", "inline"),
                      help="each trial in a child process (default) or in this one")
    prof.add_argument("--interleave", default="auto", choices=INTERLEAVE,
                      help="run the precisions in mirrored rounds (ABBA) to cancel drift; "
                           "auto: where each trial is cheap (at most 400 M parameters, no "
                           "--compile, 5+ measured steps per round)")
    prof.add_argument("--rounds", type=int, default=2,
                      help="rounds per precision when interleaving (steps are split over them)")
    prof.add_argument("--data", default=DATA_DOCS, metavar="docs|random|FILE",
                      help="what the trials train and measure held-out loss on: docs (default: "
                           "CPython's pydoc_data.topics, tokenised for the model), random "
                           "(uniform random tokens) or FILE: UTF-8 text, nanoGPT's uint16 .bin "
                           "or a 1-D integer .npy of token ids; the last 10%% is held out")
    prof.add_argument("--out", help="report file: .json, .csv or .html")
    prof.add_argument("--card", help="the card whose predicted fp8 payoff an ':auto' recipe "
                      "(fp8:auto, fp8-rowwise:auto) converts by, e.g. \"H100 SXM\" (see "
                      "'plan'); default: the GPU the trial runs on; required on the CPU")
    prof.add_argument("--numerics", action="store_true",
                      help="after the trials, run the numerics lab on the first precision and "
                           "add it (with advice citing the trials) to the report")
    prof.add_argument("--quiet", action="store_true", help="no progress display")
    prof.add_argument("--wide", action="store_true",
                      help="print every column of the comparison table (p10..p90, CV, "
                           "tokens/s, MFU, HFU, energy); the default fits 120 columns")
    prof.add_argument("--trace", metavar="DIR",
                      help="write each precision's profiled step as a Chrome trace "
                           "(<precision>.trace.json, opens in Perfetto) and, on CUDA, a memory "
                           "snapshot (<precision>.memory.pickle, pytorch.org/memory_viz)")
    prof.add_argument("--no-kernel-profile", action="store_true",
                      help="skip the extra profiled step (kernel time by dtype)")
    prof.add_argument("--no-quant-error", action="store_true",
                      help="skip the untimed forward that measures each layer's quantisation "
                           "error (SQNR)")
    prof.add_argument("--measure-peak", action="store_true",
                      help="measure this machine's matmul peak again (MFU's second "
                           "denominator; otherwise measured once per machine and cached)")
    from engine.distributed.cli_args import add_distributed_args

    add_distributed_args(prof)

    foot = sub.add_parser("footprint", help="load footprint of each precision (no training)")
    _add_model_args(foot, "fp32,fp16,bf16,int8,nf4")
    foot.add_argument("--json", action="store_true", help="print JSON")

    pres = sub.add_parser("presets", help="list the built-in models")
    pres.add_argument("--json", action="store_true", help="print JSON")

    num = sub.add_parser("numerics", help="formats, live numeric demos, gradient ranges, advice")
    _add_model_args(num, "fp16-amp")
    num.add_argument("--batch-size", type=int, default=2)
    num.add_argument("--seq-len", type=int, default=64)
    num.add_argument("--json", action="store_true", help="print JSON")
    num.add_argument("--out", help="also write a report (.json or .html) with the numerics")
    num.epilog = f"--precision takes one precision here\n\n{num.epilog}"

    fit = sub.add_parser("fit", help="largest micro-batch per precision within a memory budget")
    _add_model_args(fit, ",".join(DEFAULT_PRECISIONS))
    fit.add_argument("--seq-len", type=int, default=128)
    fit.add_argument("--memory-budget", help="e.g. 24GiB; on CUDA defaults to the GPU's "
                     "memory (a smaller one emulates a smaller card); required on the CPU")
    fit.add_argument("--max-batch", type=int, default=1024, help="largest batch to try")
    fit.add_argument("--optimizer", default="adamw", choices=OPTIMIZERS)
    fit.add_argument("--isolation", default="process", choices=("process", "inline"),
                     help="each probe in a child process (default) or in this one")
    fit.add_argument("--json", action="store_true", help="print JSON")
    fit.add_argument("--quiet", action="store_true", help="no progress display")

    rep = sub.add_parser("report", help="list a run's trials (why any failed), or write a "
                                        "report from a run journal (or a JSON report)")
    rep.add_argument("source", help="a run journal (runs/<run id>.jsonl in the data folder) "
                                    "or a JSON report")
    rep.add_argument("--out", help="report file: .json, .csv or .html; without it, each "
                                   "trial's status and reason is printed")
    rep.add_argument("--traceback", action="store_true",
                     help="print the full traceback of each trial an exception ended "
                          "(also with --out)")

    wat = sub.add_parser("watch", help="follow a run journal live in the terminal (Ctrl-C ends)")
    wat.add_argument("journal", help="a run journal (runs/<run id>.jsonl), local or mounted")
    wat.add_argument("--interval", type=float, default=0.5, help="seconds between reads")

    # plan lives in engine/plan_cli.py (arguments and handler together)
    from engine.plan_cli import add_plan_parser

    add_plan_parser(sub)
    from engine.peak_cli import add_peak_parser

    add_peak_parser(sub)
    from engine.trace_cli import add_trace_parser

    add_trace_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from engine.core.quiet import quiet_libraries

    quiet_libraries()
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.version:
            from engine.core.versions import report

            _say(report())
            return 0
        _warn_versions()
        if args.command is None:
            parser.print_help()
            return 0
        handler = {"profile": _profile, "footprint": _footprint, "presets": _presets,
                   "numerics": _numerics, "report": _report, "fit": _fit,
                   "watch": _watch, "plan": _plan, "peak": _peak,
                   "trace": _trace}[args.command]
        return handler(args)
    except ValueError as exc:
        _say(f"ampscope: error: {exc}", err=True)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        _say("ampscope: stopped (Ctrl-C)", err=True)
        return 128 + signal.SIGINT


# --- profile -----------------------------------------------------------------------


def _profile(args) -> int:
    from engine.distributed.cli_args import distributed_config

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
    from engine.core.collector import imports_paused

    with imports_paused():  # torch, transformers, the report writer: seconds of imports
        if config.isolation == "process" and config.strategy == "none":
            from engine.run.trial_process import start_server

            start_server(config.device)  # the trials' server imports while this process does
        out = _check_out(args.out) if args.out else None
        if args.measure_peak:  # the first trial finds no cached peak and measures it
            from engine.measure import matmul_peak
            from engine.measure.device import probe

            matmul_peak.forget(probe(config.device))
        from engine.run.fits import refuse_if_too_big

        fit = refuse_if_too_big(config)  # a run bigger than the free memory is refused
        if fit.free_bytes is None and fit.predicted_bytes is not None:
            print(f"note: {fit.note}", file=sys.stderr)  # not checked: said, not skipped quietly
        from engine.run.runner import Runner

    progress = _Progress(config, enabled=not args.quiet)
    runner = Runner(config, progress)
    signals = _Signals(runner, inline=config.isolation == "inline")
    with signals.installed():
        try:
            record = runner.run()
        except KeyboardInterrupt:  # inline trials: a second Ctrl-C stops in the step
            record = _journaled_record(runner)
        progress.close()
        if args.numerics and not signals.received:
            _add_numerics(runner, record, config, signals)
        return _finish(record, runner, out, signals, args.trace, args.wide)


def _check_out(out: str):
    from engine.report.writer import check_writable

    return check_writable(out)


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
    _say("running the numerics lab (Ctrl-C stops it and keeps the trials)...", err=True)
    try:
        numerics = run_lab_in_child(lab_args, lambda: bool(signals.received))
    except (ValueError, RuntimeError) as exc:
        _say(f"numerics lab failed, the trials are kept: {str(exc).splitlines()[0]}", err=True)
        return
    if numerics is None:
        _say("numerics lab stopped; the trials are kept", err=True)
        return
    runner.add_numerics(numerics)
    record.numerics = numerics
    advice = numerics.get("advice", {})
    if advice.get("recommended"):
        _say(f"advisor: {advice['recommended']}")


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

    _say(_verdict_text(recommend(record)))
    verdict = speed_verdict(record.trials)
    rows = comparison_rows(record, verdict)
    _say(format_table(rows, wide=wide))
    data = data_line(record)
    if data:
        _say("\n".join(textwrap.wrap(data, TABLE_WIDTH, subsequent_indent="  ",
                                      break_on_hyphens=False)))
    from engine.run.fp8_auto import auto_notes

    for note in auto_notes(record.trials):  # the layers each ':auto' recipe converted
        _say("\n".join(textwrap.wrap(note, TABLE_WIDTH, subsequent_indent="  ")))
    mfu = format_mfu(record.trials)
    if mfu:
        _say(mfu)
    quant = format_quant_error(record.trials,
                               {r.precision: r.final_loss_diff_vs_fp32 for r in rows})
    if quant:
        _say(quant)
    from engine.measure.lost_updates_text import format_lost_updates

    lost = format_lost_updates(record.trials)
    if lost:
        _say(lost)
    if record.config.get("strategy", "none") != "none":
        from engine.distributed.summary_text import distributed_lines

        _say("\n".join(distributed_lines(record)))
    reason = baseline_reason(record)
    if reason:
        _say(f"note: {reason}")
    _say(f"speed: {verdict.text}" + (f"\n  suggestion: {verdict.suggestion}"
                                      if verdict.suggestion else ""))
    from engine.measure.flops_text import flops_by_dtype_lines

    lines = flops_by_dtype_lines(record.trials)
    if lines:
        _say("\n".join(lines))
    _say_kernels(record, trace)
    journal = runner.journal_path
    code = 0
    kept = journal if runner.journal is not None and not runner.journal.error else None
    if out is not None:
        if _write_report(record, out, _journal_note(runner)):
            _say(f"report written to {_written(out)}")
            if Path(out).suffix.lower() == ".json":  # the file the user named holds them too
                kept = out
        else:
            code = EXIT_FAILED
    failed = [t for t in record.trials if t.status not in ("ok", "unsupported")]
    if signals.received:
        name = signal.Signals(signals.received[0]).name
        finished = sum(1 for t in record.trials if t.status in ("ok", "unsupported"))
        _say(f"stopped by {name}: {finished} of {len(record.trials)} trials finished"
             + (f"; the run is in the journal {journal}" if journal else ""), err=True)
        return 128 + signals.received[0]
    if failed:
        from engine.record.failure_text import failed_line

        if kept is None:  # neither journal nor JSON report holds them: printed, not lost
            for trial in failed:
                if trial.traceback:
                    _say(f"{trial.precision}'s traceback:\n{trial.traceback}", err=True)
        _say(failed_line(record, len(failed), kept), err=True)
        return EXIT_FAILED
    return code


def _say_kernels(record, trace: str | None) -> None:
    """The profiled step's kernel table, GPM figures, and where the traces went."""
    from engine.measure.gpm import format_gpm
    from engine.measure.kernels import format_profiled

    for text in (format_profiled(record.trials), format_gpm(record.trials)):
        if text:
            _say(text)
    if trace:
        files = [f for t in record.trials if t.profiled_step
                 for f in (t.profiled_step.trace_file, t.profiled_step.memory_snapshot_file) if f]
        _say(f"traces written to {trace}: {', '.join(os.path.basename(f) for f in files)}"
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


def _warn_versions() -> None:
    """One line on stderr when a library is outside the tested range; the command goes on."""
    from engine.core.versions import warning_line

    line = warning_line(window=False)
    if line:
        _say(f"ampscope: {line}", err=True)


def _say(text: str, err: bool = False) -> None:
    """Print, surviving a terminal that is gone (SIGHUP): the report matters more."""
    stream = sys.stderr if err else sys.stdout
    try:
        print(text, file=stream, flush=True)
    except (OSError, ValueError):
        pass


class _Signals:
    """Ctrl-C, SIGTERM and SIGHUP during a run: the first stops the run, keeping what was
    measured; a second one stops the running trial at once. The report is still written."""

    HANDLED = tuple(s for s in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, s))

    def __init__(self, runner, inline: bool):
        self.runner = runner
        self.inline = inline
        self.received: list[int] = []

    @contextlib.contextmanager
    def installed(self):
        numbers = [getattr(signal, name) for name in self.HANDLED]
        previous = {n: signal.signal(n, self._handle) for n in numbers}
        try:
            yield self
        finally:
            for n, handler in previous.items():
                signal.signal(n, handler)

    def _handle(self, signum, _frame) -> None:
        self.received.append(signum)
        first = len(self.received) == 1
        if first and signum == signal.SIGINT:
            _note("stopping after this step (Ctrl-C again to stop at once)...")
            self.runner.cancel()
        elif first:
            _note(f"{signal.Signals(signum).name}: stopping the run, keeping what was measured")
            self.runner.cancel(grace_s=SIGNAL_GRACE_S)
        else:
            _note("stopping now; what was measured is kept")
            self.runner.abort()
            if self.inline and len(self.received) == 2:
                raise KeyboardInterrupt  # an inline trial cannot be ended from outside


def _note(text: str) -> None:
    # os.write, not print: a signal handler may interrupt a print to the same stream
    try:
        os.write(2, f"\n{text}\n".encode())
    except OSError:
        pass


class _Progress:
    """Progress on stderr: one rewritten line on a terminal, a line a step in a log."""

    # the phases no step line shows: loading is the trial's first line, steps say warm-up
    SAID = {"memory step": "one untimed step tracking memory...",
            "profiled step": "one extra step under torch.profiler (not measured)...",
            "between rounds": "round done; its next round waits for the other precisions"}

    def __init__(self, config: RunConfig, enabled: bool):
        self.config = config
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.total = warmup_steps(config.warmup) + config.steps
        self.index = 0

    def __call__(self, event) -> None:
        from engine.core.events import (
            LogEvent,
            PhaseChanged,
            StepSample,
            TrialFinished,
            TrialStarted,
        )

        if not self.enabled:
            return
        if isinstance(event, PhaseChanged) and event.phase in self.SAID:
            self._line(f"  {event.precision}: {self.SAID[event.phase]}", end=True)
        if isinstance(event, TrialStarted):
            self.index = event.index + 1
            part = f" round {event.round + 1}/{event.rounds}" if event.rounds > 1 else ""
            # every round warms up again
            self.total = event.rounds * warmup_steps(self.config.warmup) + self.config.steps
            self._line(f"[{self.index}/{event.total}] {event.precision}{part}: loading", end=True)
        elif isinstance(event, StepSample):
            kind = "warm-up" if event.warmup else "step"
            scale = f"  scale {event.loss_scale:g}" if event.loss_scale is not None else ""
            skip = "  SKIPPED (inf/NaN)" if event.skipped else ""
            loss = f"{event.loss:.4f}" if event.loss is not None else "n/a"
            self._line(f"  {event.precision} {kind} {event.step + 1}/{self.total}  "
                       f"{event.step_ms:8.1f} ms  {event.tokens_per_s:10.0f} tok/s  "
                       f"loss {loss}{scale}{skip}")
        elif isinstance(event, TrialFinished):
            r = event.result
            why = f": {r.reason}" if r.reason else ""
            self._line(f"  {r.precision}: {r.status}{why}", end=True)
        elif isinstance(event, LogEvent) and event.level != "info":
            self._line(f"  {event.level}: {event.message}", end=True)

    def _line(self, text: str, end: bool = False) -> None:
        try:  # a closed terminal (SIGHUP) must not stop the run
            if self.tty:
                sys.stderr.write("\r\033[K" + text + ("\n" if end else ""))
            else:
                sys.stderr.write(text + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            self.enabled = False

    def close(self) -> None:
        if self.enabled and self.tty:
            _say("", err=True)


# --- footprint ---------------------------------------------------------------------


def footprint_rows(model: str, precisions: tuple[str, ...], device: str, seed: int = 0,
                   trust_remote_code: bool = False,
                   progress: Callable[[str], None] = lambda _: None) -> list[dict]:
    """Load footprint of each precision, as transformers' get_memory_footprint counts it."""
    from collections import Counter

    from engine.measure.inventory import count_params, dtype_map
    from engine.measure.memtrack import quant_state_parts, quant_state_tensors, unique_bytes
    from engine.models.load import load_model
    from engine.run.runner import preflight

    info = preflight(RunConfig(model=model, precisions=precisions, device=device, seq_len=1))
    rows = []
    for i, precision in enumerate(precisions, 1):
        progress(f"[{i}/{len(precisions)}] loading {model} as {precision}...")
        reason = info.unsupported_reason(precision)
        if reason:
            rows.append({"precision": precision, "status": "unsupported", "reason": reason,
                         "footprint_bytes": None, "params": None, "bytes_by_dtype": {}})
            continue
        try:
            loaded = load_model(model, precision, info.torch_device, seed, trust_remote_code,
                                train=False)
        except Exception as exc:  # a model folder that passed the checks and still fails
            from engine.models.model_health import one_line

            raise ValueError(f"{model} could not be loaded as {precision}: "
                             f"{one_line(exc)}") from None
        by_dtype: Counter = Counter()
        for p in dtype_map(loaded.model):
            if p.tied_to is None:
                by_dtype[p.dtype] += p.bytes
        rows.append({"precision": precision, "status": "ok", "reason": None,
                     "footprint_bytes": loaded.footprint_bytes,
                     "params": count_params(loaded.model)[0],
                     "bytes_by_dtype": dict(by_dtype), "note": loaded.footprint_note,
                     # absmax / quant map / SCB live beside the packed weights, outside
                     # the footprint
                     "quant_state_bytes": unique_bytes(quant_state_tensors(loaded.model)),
                     "quant_state_parts": list(dict.fromkeys(
                         name for name, _ in quant_state_parts(loaded.model)))})
        del loaded
    return rows


def _footprint(args) -> int:
    precisions = parse_precisions(args.precision)
    RunConfig(model=args.model, precisions=precisions, device=args.device)  # checks, no torch
    _say("loading torch and transformers...", err=True)
    rows = footprint_rows(args.model, precisions, args.device, args.seed,
                          args.trust_remote_code, lambda text: _say(text, err=True))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'precision':<10} {'footprint':>14} {'parameters':>14}  bytes by dtype")
    for r in rows:
        if r["status"] != "ok":
            print(f"{r['precision']:<10} {'n/a':>14} {'n/a':>14}  {r['reason']}")
            continue
        dtypes = ", ".join(f"{k} {v / 2**20:.2f} MiB" for k, v in r["bytes_by_dtype"].items())
        quant = r["quant_state_bytes"]
        beside = (f"; + quantisation state {quant / 2**20:.2f} MiB "
                  f"({', '.join(r['quant_state_parts'])})" if quant else "")
        print(f"{r['precision']:<10} {r['footprint_bytes'] / 2**20:>10.2f} MiB "
              f"{r['params']:>14,}  {dtypes}{beside}")
    notes = {r["note"] for r in rows if r.get("note")}
    for note in notes:
        print(f"note: {note}")
    return 0


# --- presets -----------------------------------------------------------------------


def _presets(args) -> int:
    from engine.models.presets import param_count, presets

    _say("counting each preset's parameters (one and two layers built on the meta device, "
         "no weights)...", err=True)
    items = []
    for i, p in enumerate(presets(), 1):
        _say(f"[{i}/{len(presets())}] {p.name}", err=True)
        items.append({"name": p.name, "task": p.task, "params": param_count(p.name),
                      "description": p.description})
    if args.json:
        print(json.dumps(items, indent=2))
        return 0
    for item in items:
        print(f"{item['name']:<12} {item['params']:>15,} params  {item['task']:<9}  "
              f"{item['description']}")
    print(f"\nprecisions (--precision):\n{precision_lines()}")
    return 0


# --- numerics ----------------------------------------------------------------------


def _numerics(args) -> int:
    precisions = parse_precisions(args.precision)
    if len(precisions) != 1:
        raise ValueError(f"numerics takes one precision (got {len(precisions)}): "
                         "pass one to --precision")
    RunConfig(model=args.model, precisions=precisions, device=args.device,
              batch_size=args.batch_size, seq_len=args.seq_len)  # checks before torch loads
    out = None
    if args.out:
        if Path(args.out).suffix.lower() == ".csv":
            raise ValueError("numerics --out takes .json or .html: a CSV holds training steps, "
                             "and the numerics lab runs none (use profile --out x.csv)")
        out = _check_out(args.out)
    _say("loading torch and transformers...", err=True)
    from engine.measure.device import probe
    from engine.measure.environment import collect
    from engine.numerics.lab import format_lab_text, run_lab
    from engine.record.run_record import RunRecord

    result = run_lab(args.model, precisions[0], args.device, args.batch_size, args.seq_len,
                     args.seed, trust_remote_code=args.trust_remote_code,
                     progress=lambda stage: _say(f"numerics: {stage}...", err=True))
    print(json.dumps(result, indent=2) if args.json else format_lab_text(result))
    if args.out:
        config = RunConfig(model=args.model, precisions=precisions, device=args.device,
                           batch_size=args.batch_size, seq_len=args.seq_len, seed=args.seed)
        record = RunRecord(config=config.to_dict(), environment=collect(probe(args.device)),
                           numerics=result, status="ok")
        if not _write_report(record, out):
            return EXIT_FAILED
        print(f"report written to {out}")
    return 0


# --- report ------------------------------------------------------------------------


def _write_report(record, out, note: str = "") -> bool:
    """Write ``record`` to ``out``; on failure say why in one line (with ``note``)."""
    from engine.report.writer import write_report

    try:
        write_report(record, out)
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        _say(f"ampscope: error: could not write the report {out} ({why})"
             + (f"; {note}" if note else ""), err=True)
        return False
    return True


def _written(out) -> str:
    """Where a report went: a CSV report is two files, the steps and the comparison."""
    if Path(out).suffix.lower() != ".csv":
        return str(out)
    from engine.report.csv_io import comparison_path

    return f"{out} (steps) and {comparison_path(out)} (comparison table)"


def _report(args) -> int:
    """A journal's (or JSON report's) trials, or the run in any report format."""
    from engine.report.writer import check_writable

    out = check_writable(args.out) if args.out else None
    from engine.record.failure_text import trial_lines
    from engine.record.journal import read_run

    record = read_run(args.source)
    if record.repaired:
        _say(f"ampscope: note: {record.repaired}", err=True)
    if out is None or args.traceback:
        _say("\n".join(trial_lines(record, args.source, args.traceback)))
    if out is None:
        return 0
    if not _write_report(record, out):
        return EXIT_FAILED
    _say(f"report of run {record.run_id} ({record.status}) written to {_written(out)}")
    return 0


# --- fit ---------------------------------------------------------------------------


def _fit(args) -> int:
    import dataclasses

    from engine.run.fit import (
        FitCancelled,
        FitConfig,
        format_fit,
        format_probe,
        parse_bytes,
        run_fit,
    )

    budget = parse_bytes(args.memory_budget) if args.memory_budget is not None else None
    config = FitConfig(model=args.model, precisions=parse_precisions(args.precision),
                       seq_len=args.seq_len, memory_budget_bytes=budget, device=args.device,
                       max_batch=args.max_batch, optimizer=args.optimizer,
                       isolation=args.isolation, seed=args.seed,
                       trust_remote_code=args.trust_remote_code)

    def progress(precision, probe) -> None:
        if not args.quiet:
            print(format_probe(precision, probe), file=sys.stderr, flush=True)

    try:
        budget, results = run_fit(config, progress)
    except (KeyboardInterrupt, FitCancelled):
        print("ampscope: fit stopped by the user before it finished: no batch reported",
              file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps({"budget_bytes": budget,
                          "results": [dataclasses.asdict(r) for r in results]}, indent=2))
    else:
        print(format_fit(budget, results))
    return 0
# --- plan --------------------------------------------------------------------------


def _peak(args) -> int:
    from engine.peak_cli import run_peak

    return run_peak(args)


def _trace(args) -> int:
    from engine.trace_cli import run_trace

    return run_trace(args)


def _plan(args) -> int:
    from engine.plan_cli import run_plan

    return run_plan(args)


# --- watch -------------------------------------------------------------------------


def _watch(args) -> int:
    """A live view of a journal; Ctrl-C ends the view, never the run it watches."""
    from engine.record.watch import watch

    if not 0 < args.interval <= 3600:
        raise ValueError(f"--interval must be above 0 and at most 3600 seconds "
                         f"(got {args.interval})")
    try:
        return watch(args.journal, _say, args.interval)
    except KeyboardInterrupt:
        _say("ampscope: stopped watching (the run itself goes on)", err=True)
        return 0
