"""Lost updates (engine.measure.lost_updates) against a count written here.

The module computes the intended update by running torch's AdamW in fp32 on copies; this
test computes it from Adam's formula in float64 by hand, takes the real step on the stored
weights itself, and counts the elements that did not move. Real models (the tiny preset and
GPT-NeoX), real optimisers, a few real training steps first so Adam's state is not empty.
"""

from __future__ import annotations

import copy

import pytest
import torch

from engine.core.recipes import autocast_for, recipe
from engine.measure import lost_updates
from engine.models.load import load_model, make_batches
from engine.models.optimizers import adam_eps, make_optimizer
from tests.engine.families import FAMILIES

LR = 1e-4
EMBEDDINGS = ("wte", "wpe", "embed_in")
NORMS = ("ln_", "layernorm", "layer_norm")


def group_of(name: str, p: torch.Tensor) -> str:
    """The parameter's group from its name, as a reader of the model would file it."""
    if any(k in name for k in EMBEDDINGS):
        return "embeddings"
    if any(k in name for k in NORMS):
        return "norms"
    return "matmul weights" if name.endswith("weight") and p.dim() == 2 else "other"


def hand_count(model, opt, lr: float) -> dict[str, list[float]]:
    """Per group: [updated elements, lost elements, sum u^2, sum u^2 on lost, sum change.u],
    the update u from AdamW's formula (decoupled decay, bias-corrected) in float64."""
    group = opt.param_groups[0]
    (b1, b2), eps, wd = group["betas"], group["eps"], group["weight_decay"]
    named = [(n, p) for n, p in model.named_parameters() if p.grad is not None]
    before = [p.detach().clone() for _, p in named]
    saved = copy.deepcopy(opt.state_dict())
    grads = [p.grad.clone() for _, p in named]
    intended = []
    for _, p in named:
        st = opt.state[p]
        t = float(st["step"]) + 1
        g, w = p.grad.double(), p.detach().double()
        m = b1 * st["exp_avg"].double() + (1 - b1) * g
        v = b2 * st["exp_avg_sq"].double() + (1 - b2) * g * g
        intended.append(-lr * wd * w - lr * (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt() + eps))
    for g in opt.param_groups:
        if isinstance(g["lr"], torch.Tensor):
            g["lr"].fill_(lr)
        else:
            g["lr"] = lr
    opt.step()
    tallies: dict[str, list[float]] = {}
    for (name, p), w0, u in zip(named, before, intended, strict=True):
        change = (p.detach().double() - w0.double())
        moved = u != 0
        lost = moved & (change == 0)
        t = tallies.setdefault(group_of(name, p), [0, 0, 0.0, 0.0, 0.0])
        t[0] += int(moved.sum())
        t[1] += int(lost.sum())
        t[2] += float((u * u).sum())
        t[3] += float((u * u * lost).sum())
        t[4] += float((change * u).sum())
    opt.load_state_dict(saved)
    with torch.no_grad():
        for (_, p), w0, g in zip(named, before, grads, strict=True):
            p.copy_(w0)
            p.grad = g
    for g in opt.param_groups:
        if isinstance(g["lr"], torch.Tensor):
            g["lr"].fill_(LR)
        else:
            g["lr"] = LR
    return tallies


def _trained(model_source: str, precision: str):
    """The model after two real steps at ``precision``, with one more batch's gradients."""
    rec = recipe(precision)
    loaded = load_model(model_source, rec, torch.device("cpu"), seed=0)
    model = loaded.model
    params = [p for p in model.parameters() if p.requires_grad]
    name = rec.optimizer or "adamw"
    opt = make_optimizer(name, params, LR, adam_eps(params))
    batches = make_batches(loaded.config, loaded.task, 2, 16, 3, 0, "cpu")
    for batch in batches:
        opt.zero_grad(set_to_none=True)
        with autocast_for(rec, torch.device("cpu")):
            model(**batch).loss.backward()
        if batch is not batches[-1]:
            opt.step()
    return model, params, opt, name, rec


@pytest.fixture(scope="module")
def neox(tmp_path_factory):
    path = tmp_path_factory.mktemp("neox")
    FAMILIES["gpt-neox"]().save_pretrained(path)
    return str(path)


@pytest.mark.parametrize(("family", "precision"), [
    ("tiny", "bf16"), ("tiny", "fp16"), ("gpt-neox", "bf16"), ("gpt-neox", "fp16"),
    ("tiny", "bf16+adamw-bf16-sr")])
def test_lost_shares_match_a_hand_count(family, precision, neox):
    source = neox if family == "gpt-neox" else family
    model, params, opt, name, rec = _trained(source, precision)
    grads = [p.grad.clone() for p in params]
    weights = [p.detach().clone() for p in params]
    state = copy.deepcopy(opt.state_dict()["state"])
    torch.manual_seed(1)
    lu = lost_updates.measure(model, params, opt, name, LR, rec.weight_dtype)
    # the trial's weights and optimiser state are as they were
    assert all(torch.equal(p, w) for p, w in zip(params, weights, strict=True))
    after = opt.state_dict()["state"]
    assert all(torch.equal(torch.as_tensor(after[i][k]), torch.as_tensor(v))
               for i, st in state.items() for k, v in st.items())
    for p, g in zip(params, grads, strict=True):  # measure() put the weights back, not grads
        p.grad = g
    mine = {lr: hand_count(model, opt, lr) for lr in (LR, LR * lost_updates.MIN_LR_FRACTION)}
    stochastic = "sr" in precision
    assert lu.rounding == ("stochastic" if stochastic else "nearest")
    assert (lu.lr, lu.min_lr) == (LR, LR * 0.1)
    for g in lu.groups:
        n, lost, sq, lost_sq, dot = mine[g.lr][g.group]
        assert g.updated_elements == n, (g.group, g.lr)
        if stochastic:  # another draw of the random rounding: the shares agree statistically
            assert g.element_share == pytest.approx(lost / n, abs=0.03 if n > 5000 else 0.2)
        else:  # the same deterministic step: the same elements are lost
            assert g.element_share == lost / n
            assert g.norm_share == pytest.approx((lost_sq / sq) ** 0.5, rel=1e-3, abs=1e-6)
            assert g.kept_share == pytest.approx(dot / sq, rel=1e-3, abs=1e-6)
    total = [sum(t[i] for t in mine[LR].values()) for i in range(5)]
    assert lu.element_share == pytest.approx(total[1] / total[0], abs=0.02 if stochastic else 0)
    if stochastic:  # stochastic rounding keeps the update on average
        assert lu.kept_share == pytest.approx(1.0, abs=0.05)
        assert lu.min_lr_kept_share == pytest.approx(1.0, abs=0.1)
    else:  # a tenth of the learning rate loses more of the update
        assert lu.min_lr_norm_share > lu.norm_share


def test_fp32_weights_have_no_lost_updates():
    model, params, opt, name, _ = _trained("tiny", "bf16-amp")
    assert lost_updates.reason_none(params, name).startswith(
        "n/a: the trained weights are stored in fp32")
