"""The run journal: every event of a run, appended as one JSON line as it happens.

A run writes ``runs/<run id>.jsonl`` in the user data folder (``AMPSCOPE_DATA_DIR``
moves it). Each line is ``{"e": <event kind>, ...fields}`` of the same frozen
dataclasses the engine emits (see docs/journal.md). Lines are flushed as they are
written and the file is fsynced at trial boundaries, so a run that ends in any way,
SIGKILL included, keeps every event written before the end. ``read_journal`` rebuilds
the ``RunRecord``: a journal without ``RunFinished`` is an ``interrupted`` run with what
it measured. A torn last line (the process died mid-write) is ignored.

Compactness: fields that are ``None`` are left out (the reader puts them back),
monitor samples (the bulk of a run) use short keys and times to the millisecond, and a finished
trial's steps are not written twice when they are the steps already journaled.
"""

from __future__ import annotations

import dataclasses
import json
import json.scanner
import os
import time
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from engine.core.events import (
    ErrorEvent,
    LogEvent,
    MonitorSample,
    PhaseChanged,
    RunFinished,
    RunStarted,
    ScalarLog,
    StepSample,
    TrialFinished,
    TrialResult,
    TrialStarted,
    TrialSummary,
    from_dict,
    to_dict,
)
from engine.core.file_kind import open_to_read
from engine.record import json_report, nonfinite
from engine.record.columns import Columns, line_keys
from engine.record.run_record import RunRecord
from engine.record.summary import summarise
from engine.record.validate import MAX_NAME, validate_event, validate_lab

DATA_DIR_ENV = "AMPSCOPE_DATA_DIR"
JOURNAL_VERSION = 1
KINDS = {
    "run": RunStarted,
    "trial": TrialStarted,
    "phase": PhaseChanged,
    "step": StepSample,
    "mon": MonitorSample,
    "log": LogEvent,
    "scalar": ScalarLog,
    "error": ErrorEvent,
    "done": TrialFinished,
    "end": RunFinished,
}
_KIND_OF = {cls: kind for kind, cls in KINDS.items()}
# short keys for monitor samples: several a second over a whole run
_MONITOR_KEYS = {
    "time_s": "t", "source": "src", "gpu_util_pct": "gu", "mem_util_pct": "mu",
    "gpu_mem_used_bytes": "gm", "gpu_mem_total_bytes": "gt", "power_w": "pw",
    "temperature_c": "tc", "sm_clock_mhz": "sm", "energy_j": "ej",
    "process_mem_bytes": "pm", "cpu_pct": "cpu", "host_rss_bytes": "rss",
    "host_mem_used_bytes": "hm", "gpm_tensor_any_util_pct": "ta",
    "gpm_tensor_hmma_util_pct": "th", "gpm_tensor_imma_util_pct": "ti", "gpm_sm_util_pct": "sa",
    "gpm_sm_occupancy_pct": "so", "gpm_dram_bw_util_pct": "db", "gpm_reason": "gr",
    "load_avg_1m": "la", "other_cpu_pct": "oc",
}
_MONITOR_FIELDS = {short: name for name, short in _MONITOR_KEYS.items()}
_MONITOR_LINE = line_keys(MonitorSample, _MONITOR_FIELDS)
_STEP_LINE = line_keys(StepSample)
STEPS_JOURNALED = "journal"  # a finished trial's steps are the "step" lines above it
RUN_STATUSES = ("ok", "cancelled", "error")  # what a RunFinished line may say
MAX_HEAD_LINE = 8 * 2**20  # the run's start line; a longer one is damaged, not read whole


def data_dir() -> Path:
    """The user data folder (``platformdirs``), or ``$AMPSCOPE_DATA_DIR`` when set."""
    return Path(os.environ.get(DATA_DIR_ENV) or platformdirs.user_data_dir("AmpScope"))


def runs_dir() -> Path:
    return data_dir() / "runs"


def journal_path(run_id: str) -> Path:
    return runs_dir() / f"{run_id}.jsonl"


def _strip_none(data: dict) -> dict:
    return {k: v for k, v in data.items() if v is not None}


def _encode_monitor(m: MonitorSample) -> dict:
    out = {}
    for name, short in _MONITOR_KEYS.items():
        value = getattr(m, name)
        if value is None:
            continue
        # times to the millisecond; values as measured (cumulative counters such as
        # energy_j are read as differences, which rounding would destroy)
        out[short] = round(value, 3) if name == "time_s" else value
    return out


def encode(event, journaled_steps: list[StepSample] | None = None) -> dict:
    """One journal line (as a dict) for ``event``."""
    kind = _KIND_OF[type(event)]
    if isinstance(event, MonitorSample):
        return {"e": kind, **_encode_monitor(event)}
    if isinstance(event, TrialFinished):
        result = to_dict(event.result)
        if journaled_steps is not None and list(event.result.steps) == journaled_steps:
            result["steps"] = STEPS_JOURNALED
        return {"e": kind, "time_s": event.time_s, "result": result}
    # to_dict, not dataclasses.asdict: the same dict without deep-copying every field (a
    # user's loop writes a step line per step, and asdict was most of rec.step()'s time)
    return {"e": kind, **_strip_none(to_dict(event))}


def _with_nones(cls, data: dict) -> dict:
    """Put back the ``None`` fields ``encode`` left out (those without a default)."""
    filled = dict(data)
    for f in dataclasses.fields(cls):
        no_default = (f.default is dataclasses.MISSING
                      and f.default_factory is dataclasses.MISSING)
        if f.name not in filled and no_default:
            filled[f.name] = None
    return filled


def decode(line: dict, steps_by_precision: dict[str, list[StepSample]]):
    """The event a journal line holds (``steps_by_precision`` restores a trial's steps)."""
    kind = line.get("e")
    if kind not in KINDS:
        raise ValueError(f"unknown journal event {kind!r}")
    cls = KINDS[kind]
    if cls is MonitorSample:
        return MonitorSample(**{_MONITOR_FIELDS[k]: v for k, v in line.items()
                                if k in _MONITOR_FIELDS})
    body = {k: v for k, v in line.items() if k != "e"}
    if cls is TrialFinished:
        result = dict(body["result"])
        if result.get("steps") == STEPS_JOURNALED:
            result["steps"] = []
            trial = from_dict(TrialResult, result)
            steps = steps_by_precision.get(trial.precision, [])
            # columns: a view of the rows so far (a later round adds rows after them)
            steps = steps.head(len(steps)) if isinstance(steps, Columns) else list(steps)
            trial = dataclasses.replace(trial, steps=steps)
        else:
            trial = from_dict(TrialResult, result)
        return TrialFinished(trial, body["time_s"])
    return from_dict(cls, _with_nones(cls, body))


class JournalWriter:
    """Appends events to one journal file; never raises into the run.

    A write that fails (disk full, folder gone) turns the journal off and is reported
    once through ``on_failure``: losing the journal must not cost the run itself.
    """

    def __init__(self, path: Path, on_failure=None) -> None:
        self.path = Path(path)
        self.error: str | None = None
        self._on_failure = on_failure
        self._steps: dict[str, list[StepSample]] = {}
        self._nulled: set[str] = set()  # fields a non-finite reading was nulled in, said once
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (lives with the run)
            if self._fh.tell() == 0:  # a new journal; appending to one keeps its header
                self._write_line({"e": "journal", "version": JOURNAL_VERSION,
                                  "pid": os.getpid()})
        except OSError as exc:
            self._fh = None
            self._fail(exc)

    def write(self, event) -> None:
        if self._fh is None:
            return
        journaled = None
        if isinstance(event, TrialStarted):
            if event.round == 0:  # later rounds of an interleaved precision add to the first's
                self._steps[event.precision] = []
        elif isinstance(event, StepSample):
            self._steps.setdefault(event.precision, []).append(event)
        elif isinstance(event, TrialFinished):
            journaled = self._steps.pop(event.result.precision, [])
        try:
            self._write_line(encode(event, journaled))
            if isinstance(event, (RunStarted, TrialStarted, TrialFinished, RunFinished)):
                os.fsync(self._fh.fileno())  # trial boundaries: durable even on power loss
        except (OSError, ValueError) as exc:
            self._fail(exc)

    def write_numerics(self, numerics: dict) -> None:
        """The numerics lab's dict, when it ran after the trials."""
        if self._fh is None:
            return
        try:
            self._write_line({"e": "numerics", "numerics": numerics})
            os.fsync(self._fh.fileno())
        except (OSError, ValueError) as exc:
            self._fail(exc)

    def _write_line(self, data: dict) -> None:
        try:  # strict: NaN / Infinity only where a loss or grad norm holds it
            text = json.dumps(data, separators=(",", ":"), allow_nan=False)
        except ValueError:
            text = self._null_nonfinite(data)
        self._fh.write(text + "\n")
        self._fh.flush()

    def _null_nonfinite(self, data: dict) -> str:
        """The line with each non-finite hardware reading as null; the first time a field
        needs it, a warning line says so (the run goes on: a journal is never refused)."""
        clean, paths = nonfinite.scrub(data)
        if data.get("e") == "mon":
            paths = [_MONITOR_FIELDS.get(p, p) for p in paths]
        new = {nonfinite.fold(p): p for p in paths if nonfinite.fold(p) not in self._nulled}
        if new:
            self._nulled.update(new)
            new = list(new.values())
            note = nonfinite.write_note([f"{data.get('e')}.{p}" for p in new], "the journal")
            self._fh.write(json.dumps({"e": "log", "level": "warning", "message": note,
                                       "time_s": time.time()}) + "\n")
        return json.dumps(clean, separators=(",", ":"))

    def _fail(self, exc: Exception) -> None:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        self.error = f"the run journal {self.path} could not be written ({reason})"
        fh, self._fh = self._fh, None
        if fh is not None:
            try:
                fh.close()
            except OSError:
                pass
        if self._on_failure is not None:
            self._on_failure(self.error)

    def close(self) -> None:
        fh, self._fh = self._fh, None
        if fh is not None:
            try:
                os.fsync(fh.fileno())
                fh.close()
            except OSError:
                pass


def append_numerics(path: Path, numerics: dict) -> None:
    """Add a numerics lab result to a finished run's journal (the window's lab)."""
    writer = JournalWriter(path)
    writer.write_numerics(numerics)
    writer.close()


# --- reading ------------------------------------------------------------------------


def _read_lines(path: Path):
    """``(line number, object)`` for each line after the header, read one line at a time
    (a journal can be far larger than what its events need in memory)."""
    # closed after the generator's last line
    with open_to_read(path, "journal", "a run journal (.jsonl)") as fh:
        damaged = None  # a bad line is an error unless it is the last (torn) one
        header = False
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            if damaged is not None:
                raise ValueError(
                    f"{path} line {damaged} is damaged: this is not an AmpScope run journal, "
                    "or it was edited")
            try:
                data = _parse(line.decode("utf-8"))
                if not isinstance(data, dict):
                    raise ValueError("not an object")
            except (ValueError, UnicodeDecodeError, RecursionError):
                damaged = number
                continue
            if not header:
                _check_header(path, data)
                header = True
                continue
            yield number, data
        if not header:
            raise ValueError(f"{path} is not an AmpScope run journal (no journal header line)")


_SCAN = json.scanner.make_scanner(json.JSONDecoder())


def _parse(text: str):
    """``json.loads`` without its per-call wrapping (a journal has a million lines): the
    scanner reads the object at the line's start; anything else goes to ``json.loads``,
    which accepts or refuses it as it would."""
    try:
        data, end = _SCAN(text, 0)
    except StopIteration:  # no value at the very start (leading spaces, an empty line)
        return json.loads(text)
    if text[end:].strip():
        return json.loads(text)  # raises: something follows the object
    return data


def _check_header(path: Path, data: dict) -> None:
    if data.get("e") != "journal":
        raise ValueError(f"{path} is not an AmpScope run journal (no journal header line)")
    version = data.get("version")
    if not isinstance(version, int) or version > JOURNAL_VERSION:
        raise ValueError(f"journal version {version!r} of {path} is newer than this AmpScope "
                         f"reads ({JOURNAL_VERSION}): update AmpScope to open it")


def checked_event(path: Path, number: int, line: dict, steps: dict,
                  repaired: list[str] | None = None):
    """The event of one journal line after the report schema's checks; a bad line is
    refused naming the file, the line and the field. A non-finite hardware reading an
    older writer left (NVML's NaN) reads as n/a, its field added to ``repaired``."""
    if repaired is not None:
        line, nulled = nonfinite.scrub(line)
        if line.get("e") == "mon":
            nulled = [f"mon.{_MONITOR_FIELDS.get(p, p)}" for p in nulled]
        repaired += nulled
    kind = line.get("e")
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ValueError(f"{path} line {number}: unknown journal event {kind!r}: this "
                         "journal was written by a newer AmpScope, or edited")
    body = {k: v for k, v in line.items() if k != "e"}
    if cls is MonitorSample:
        body = {_MONITOR_FIELDS[k]: v for k, v in body.items() if k in _MONITOR_FIELDS}
    elif cls is TrialFinished and isinstance(body.get("result"), dict) \
            and body["result"].get("steps") == STEPS_JOURNALED:
        body = {**body, "result": {**body["result"], "steps": []}}
    elif cls is not TrialFinished:
        body = _with_nones(cls, body)
    try:
        validate_event(cls, body)
        return decode(line, steps)
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
        raise ValueError(f"{path} line {number}: a journal event is damaged ({exc})") from None


def read_journal(path: str | os.PathLike) -> RunRecord:
    """Rebuild the run record from a journal in one pass; raises ``ValueError`` naming the
    file, the line and the field of the first event a report could not hold. Steps and
    monitor samples are kept as columns (``engine.record.columns``): most lines take its typed
    fast path, and a line that does not fit it gets the full schema check."""
    path = Path(path)
    record = RunRecord(started_s=0.0)
    monitor = record.monitor_samples = Columns(MonitorSample)
    steps = record.live_steps  # precision -> Columns, as the trials start
    started: list[str] = []
    numerics = None
    repaired: list[str] = []
    for number, line in _read_lines(path):
        kind = line.get("e")
        if kind == "mon":
            if not monitor.add_line(line, _MONITOR_LINE):
                monitor.append(checked_event(path, number, line, steps, repaired))
            continue
        if kind == "step":
            precision = line.get("precision")  # the full check names a damaged one
            rows = steps.get(precision) if isinstance(precision, str) else None
            if rows is None or not rows.add_line(line, _STEP_LINE):
                event = checked_event(path, number, line, steps, repaired)
                steps.setdefault(event.precision, Columns(StepSample)).append(event)
            continue
        if kind == "numerics":
            numerics = line.get("numerics")
            try:
                validate_lab(numerics)
            except ValueError as exc:
                raise ValueError(f"{path} line {number}: the numerics lab's results are "
                                 f"damaged ({exc})") from None
            continue
        event = checked_event(path, number, line, steps, repaired)
        record.apply(event)
        if isinstance(event, TrialStarted) and event.round == 0:
            steps[event.precision] = Columns(StepSample)
            started.append(event.precision)
    if not record.run_id:
        raise ValueError(f"{path} holds no run (it ends before the run started)")
    record.numerics = numerics
    if repaired:
        record.repaired = nonfinite.repair_note(str(path), repaired)
        record.logs.append(LogEvent("warning", record.repaired, None, record.started_s))
    if record.finished_s is None:
        _mark_interrupted(record, started)
    return record


def _mark_interrupted(record: RunRecord, started: list[str]) -> None:
    """A run without ``RunFinished``: the trial that was running keeps its steps."""
    record.status = "interrupted"
    last = max([record.started_s]
               + [_latest(steps) for steps in record.live_steps.values()]
               + [_latest(record.monitor_samples)])
    record.finished_s = None
    tokens = _tokens_per_step(record.config)
    for precision in started:
        if record.trial(precision) is not None:
            continue
        steps = record.live_steps.get(precision, [])
        measured = sum(1 for s in steps if not s.warmup)
        record.trials.append(TrialResult(
            precision=precision,
            status="cancelled",
            reason=(f"interrupted: the run ended before this trial finished "
                    f"({measured} measured steps journaled)"),
            steps=steps.head(len(steps)) if isinstance(steps, Columns) else list(steps),
            summary=summary_from_steps(steps, tokens),
            finished_s=last,
            source=record.config.get("source", "profile"),  # a user's run says so in its config
        ))
    record.order_trials()


def _latest(rows) -> float:
    """The latest ``time_s`` of steps or monitor samples (columns or a list)."""
    if isinstance(rows, Columns):
        return float(rows.column("time_s").max()) if len(rows) else float("-inf")
    return max((r.time_s for r in rows), default=float("-inf"))


def _tokens_per_step(config: dict) -> int | None:
    try:
        return int(config["batch_size"]) * int(config["seq_len"]) * int(
            config.get("grad_accum", 1))
    except (KeyError, TypeError, ValueError):
        return None


def summary_from_steps(steps: list[StepSample], tokens_per_step: int | None) -> TrialSummary:
    """What the steps alone tell about a trial that never reported its own summary, by the
    builder a finished trial's summary comes from (no FLOPs, peak or memory reached disk)."""
    interrupted = "the trial was interrupted before it reported its FLOPs and peak"
    return summarise(steps, tokens_per_step=tokens_per_step, model_flops_per_step=None,
                     counted_flops_per_step=None, peak=None,
                     memory_reason="not measured: the trial was interrupted",
                     no_steps_reason=interrupted, no_flops_reason=interrupted,
                     no_measured_peak_reason=interrupted)


def journaled_runs() -> list[Path]:
    """Journal files in the data folder, newest first."""
    folder = runs_dir()
    if not folder.is_dir():
        return []
    paths = [p for p in folder.glob("*.jsonl") if p.is_file()]
    return sorted(paths, key=lambda p: p.stat().st_mtime, reverse=True)


def read_run(path: str | os.PathLike) -> RunRecord:
    """A run from a journal (``.jsonl``) or a JSON report, for ``report`` and File > Open;
    one rank's journal of a user's torchrun run reads every rank's, merged."""
    if Path(path).suffix.lower() == ".jsonl":
        from engine.record.rank_journals import rank_of, read_rank_journals

        if rank_of(Path(path)) is not None:
            return read_rank_journals(Path(path), read_journal)
        return read_journal(path)
    return json_report.read_json(path)


@dataclass(frozen=True)
class JournalEntry:
    """What History lists for a journaled run, read without parsing the whole file."""

    run_id: str
    path: Path
    started_s: float
    model: str
    precisions: tuple[str, ...]
    device: str
    status: str  # the RunFinished status, "interrupted", or "damaged"
    problem: str | None = None  # for a damaged journal: the file, line and field


_TAIL_BYTES = 4096


def _damaged(path: Path, problem: str) -> JournalEntry:
    try:
        started = path.stat().st_mtime
    except OSError:
        started = 0.0
    return JournalEntry(run_id=path.stem[:MAX_NAME], path=path, started_s=started, model="",
                        precisions=(), device="", status="damaged",
                        problem=f"{path} {problem}")


def journal_entry(path: Path) -> JournalEntry | None:
    """The run a journal holds (from its first lines and its end). A file that is not a
    journal is None; a journal whose first lines a report could not hold is listed as
    damaged, naming the line and the field."""
    try:
        with open(path, "rb") as fh:
            head = [fh.readline(MAX_HEAD_LINE) for _ in range(2)]
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - _TAIL_BYTES))
            tail = fh.read().split(b"\n")
        header = json.loads(head[0])
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(header, dict) or header.get("e") != "journal":
        return None
    try:
        run = json.loads(head[1])
    except (ValueError, RecursionError):
        return _damaged(path, "line 2: not a complete JSON object (or longer than "
                              f"{MAX_HEAD_LINE:,} bytes)")
    if not isinstance(run, dict) or run.get("e") != "run":
        return _damaged(path, "line 2: the run's start is missing")
    try:
        validate_event(RunStarted, {k: v for k, v in run.items() if k != "e"})
    except ValueError as exc:
        return _damaged(path, f"line 2: {exc}")
    # no end yet: still running if the process that writes it is alive
    status = "running" if writer_alive(header.get("pid")) else "interrupted"
    for line in reversed(tail):
        try:
            end = json.loads(line)
        except (ValueError, RecursionError):
            continue  # blank, torn, or cut by the tail's start
        if isinstance(end, dict) and end.get("e") == "end":
            status = end.get("status") if end.get("status") in RUN_STATUSES else status
            break
    config = run["config"]
    device = run["environment"].get("device")
    device = device if isinstance(device, dict) else {}
    return JournalEntry(
        run_id=run["run_id"],
        path=Path(path),
        started_s=float(run["time_s"]),
        model=str(config.get("model", "")),
        precisions=tuple(config.get("precisions") or ()),
        device=str(device.get("description") or device.get("name")
                   or config.get("device", ""))[:MAX_NAME],
        status=status,
    )


def writer_alive(pid) -> bool:
    """Whether the process that writes a journal (its header's pid) still runs here."""
    return isinstance(pid, int) and not isinstance(pid, bool) and _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return pid > 0
    return True


def journal_entries(exclude: set[str] = frozenset()) -> list[JournalEntry]:
    """Journaled runs whose id is not in ``exclude`` (the History database), newest first."""
    entries = []
    for path in journaled_runs():
        if path.stem in exclude:
            continue
        entry = journal_entry(path)
        if entry is not None and entry.run_id not in exclude:
            entries.append(entry)
    return sorted(entries, key=lambda e: e.started_s, reverse=True)
