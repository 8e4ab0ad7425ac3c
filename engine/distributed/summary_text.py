"""Plain-text lines for distributed trials, printed under the comparison table."""

from __future__ import annotations

from engine.record.compare import format_bytes
from engine.record.run_record import RunRecord


def _mib(value) -> str:
    return "n/a" if value is None else format_bytes(value)


def wire_dtype(collective: str, dtype: str, collectives: dict) -> str:
    """A collective's dtype as the byte table shows it: a uint8 buffer says what it packs
    (FSDP2 gathers a unit of mixed dtypes, float8 weights and bf16 rest, as raw bytes)."""
    if dtype == "uint8" and collective in collectives:
        return f"uint8: {collectives[collective]}"
    return dtype


def distributed_lines(record: RunRecord) -> list[str]:
    """Per distributed trial: rank spread, per-rank memory and bytes per collective."""
    lines = []
    for trial in record.trials:
        d = trial.distributed
        if d is None or not trial.ranks:
            continue
        spread = "n/a" if d.step_spread_pct is None else f"{d.step_spread_pct:.1f}%"
        slowest = "n/a" if d.slowest_step_ms is None else f"{d.slowest_step_ms:.1f} ms"
        lines.append(f"{trial.precision} ({d.strategy}, {d.world_size} ranks, {d.backend}): "
                     f"slowest rank {d.slowest_rank} at {slowest}, spread {spread}; "
                     f"memory {_mib(d.min_memory_bytes)} to {_mib(d.max_memory_bytes)}"
                     + (f"; gradients reduced by {d.comm_hook}" if d.comm_hook else ""))
        for r in trial.ranks:
            m = r.memory
            if m is None:
                lines.append(f"  rank {r.rank}: {r.status}" + (f": {r.reason}" if r.reason else ""))
                continue
            total_err = r.memory_error_pct.get("total")
            err = "n/a" if total_err is None else f"{total_err:+.1f}%"
            lines.append(
                f"  rank {r.rank}: params {_mib(m.sharded_params_bytes)} (unsharded peak "
                f"{_mib(m.unsharded_params_bytes)}), grads {_mib(m.grads_bytes)}, optimizer "
                f"{_mib(m.optimizer_bytes)}, activations {_mib(m.activations_bytes)}, buckets "
                f"{_mib(m.comm_buffers_bytes)}; total {_mib(m.total_bytes)}, predicted "
                f"{_mib(r.predicted_memory.total_bytes if r.predicted_memory else None)} "
                f"({err})")
        for c in d.comm:
            expected = "n/a" if c.expected_bytes is None else format_bytes(c.expected_bytes)
            dtype = wire_dtype(c.collective, c.dtype, d.collectives)
            lines.append(f"  {c.collective} {dtype}: {_mib(c.measured_bytes)} per step "
                         f"(expected {expected})")
    return lines
