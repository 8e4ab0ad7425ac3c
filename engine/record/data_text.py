"""What a run's trials trained on, in one line: the CLI's summary and the HTML report.

The source and its split are the run's (``RunRecord.data``); how many batches the trials
drew from it is theirs (``TrialSummary.distinct_batches``, ``HeldOutLoss``), as they ran.
"""

from __future__ import annotations

from engine.record.run_record import RunRecord


def data_line(record: RunRecord) -> str | None:
    """"data: ..." for a run; None for one whose report does not say (older AmpScope, a
    user's own loop)."""
    data = record.data
    if data is None:
        return None
    config = record.config if isinstance(record.config, dict) else {}
    rows, seq = config.get("batch_size"), config.get("seq_len")
    pools = sorted({t.summary.distinct_batches for t in record.trials
                    if t.summary is not None and t.summary.distinct_batches})
    helds = sorted({(t.heldout_loss.batches, t.heldout_loss.tokens) for t in record.trials
                    if t.heldout_loss is not None})
    train = ", ".join(f"{k} distinct training batches"
                      + (f" ({k * rows * seq:,} tokens)" if rows and seq else "")
                      for k in pools) or "training batches"
    held = ", ".join(f"{b} held-out batches ({n:,} tokens)" for b, n in helds) \
        or "held-out batches"
    if data.tokens is None:  # random tokens: the loss cannot fall below ln(vocab)
        return (f"data: {data.source} (seed {config.get('seed', 'n/a')}): {train}; {held} "
                "by another seed; a loss cannot fall below ln(vocab) on them")
    return (f"data: {data.source}, {data.tokens:,} tokens, {data.tokenisation}: {train} from "
            f"the first {data.train_part_tokens:,} tokens; {held} from the last "
            f"{data.heldout_part_tokens:,}")
