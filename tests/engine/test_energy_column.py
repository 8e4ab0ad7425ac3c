import dataclasses

from engine.record.compare import comparison_rows, format_table

from .sample_record import make_record


def _with_energy(record, joules_per_token: dict):
    trials = []
    for t in record.trials:
        j = joules_per_token.get(t.precision)
        summary = dataclasses.replace(t.summary, energy_per_token_j=j) if t.summary else None
        trials.append(dataclasses.replace(t, summary=summary))
    record.trials = trials
    return record


def test_energy_per_token_vs_fp32_is_the_ratio_of_the_counters():
    record = make_record()
    others = [t.precision for t in record.trials if t.precision != "fp32" and t.summary]
    energy = {"fp32": 0.004, **{p: 0.001 * (i + 1) for i, p in enumerate(others)}}
    rows = {r.precision: r for r in comparison_rows(_with_energy(record, energy))}
    assert rows["fp32"].energy_per_token_vs_fp32 == 1.0
    for p in others:
        assert rows[p].energy_per_token_vs_fp32 == energy[p] / 0.004
    assert "Energy/token vs fp32" in format_table(list(rows.values()), wide=True).splitlines()[0]


def test_no_energy_counter_means_na_not_zero():
    rows = comparison_rows(make_record())  # CPU-like trials: no energy figures
    assert all(r.energy_per_token_vs_fp32 is None for r in rows)
