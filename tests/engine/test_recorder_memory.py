"""The memory of a user's step on the CPU (issue #19): the Recorder watches step 1 (untimed
by the summary) with engine.measure.memtrack, so the report has the activations and the real
peak, named as such, not only parameters + gradients + optimizer state."""

import copy

import pytest
import torch

import ampscope
from engine.measure.memtrack import storages
from engine.record.journal import read_journal
from tests.engine.test_recorder import padded_batch, tiny_gpt2, tiny_llama


def _alive_after_forward(model, batch) -> int:
    """Bytes of the storages a training forward leaves alive as it returns that did not
    exist before it (weights and the batch excluded): what it saved for backward, counted
    with autograd's own saved-tensor hooks, and its outputs (logits, loss)."""
    before = {id(st) for t in [*model.parameters(), *model.buffers(), *batch.values()]
              for st in storages(t)}
    alive = {}

    def keep(t):
        for st in storages(t):
            if id(st) not in before:
                alive[id(st)] = st.nbytes()

    def pack(t):
        keep(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(**batch)
    keep(out.logits)
    keep(out.loss)
    return sum(alive.values())


@pytest.mark.parametrize("build", [tiny_gpt2, tiny_llama])
def test_the_watched_step_gives_activations_and_the_real_peak(tmp_path, build):
    model = build()
    model.config.use_cache = False  # a forward leaves no key/value cache behind
    reference = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with ampscope.Recorder(model, opt, journal=tmp_path / "m.jsonl") as rec:
        for it in range(4):
            loss = model(**padded_batch(it)).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            rec.step(loss=loss)
    (trial,) = read_journal(tmp_path / "m.jsonl").trials
    memory = trial.memory
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    state = sum(t.numel() * t.element_size() for s in opt.state.values()
                for t in s.values() if isinstance(t, torch.Tensor))
    # what step 1's forward left as it returned, against autograd's own count
    alive = _alive_after_forward(reference, padded_batch(1))
    at_backward = memory.at_phase_start_bytes["backward"]
    # plus the Recorder's own token count (attention_mask.sum(), one int64), made in the
    # model's forward pre-hook and read a step later
    assert at_backward["activations"] == alive + 8
    assert (at_backward["params"], at_backward["optimizer"], at_backward["grads"]) == (
        params, state, 0)  # the loop set the gradients to None before the step
    # the real peak: at least the weights, their state and the forward's activations
    assert memory.total_bytes >= params + state + alive
    assert memory.activations_bytes is not None and memory.activations_method
    assert "engine.measure.memtrack over the user's step 1" in memory.total_method
    assert trial.summary.peak_memory_bytes == memory.total_bytes
    # before the fix the figure was parameters + gradients + optimizer state alone
    assert memory.total_bytes != params + params + state
