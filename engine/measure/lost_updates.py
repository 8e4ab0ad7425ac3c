"""Lost updates: what share of one optimiser step weights stored below fp32 did not take.

A weight stored in bf16 has 8 significant bits: an update smaller than about half the
spacing between neighbouring values (2^-8 of the weight) rounds back to the same value
and is lost, step after step. AMP recipes keep an fp32 master copy that takes every
update; stochastic rounding (``+adamw-bf16-sr``) keeps each update on average.

The measurement, in an untimed step after the measured ones: one backward on a training
batch, then, at each learning rate, (1) the *intended* update, the same optimiser step
computed in float64 on copies of the weights, gradients and optimiser state, and (2)
the *real* step on the stored weights, after which the weights and the optimiser state
are put back. An element is lost when its intended update is non-zero and its stored
weight did not change.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from engine.core.events import LostUpdateGroup, LostUpdates
from engine.measure.lost_updates_text import STOCHASTIC

# an LR schedule's floor: nanoGPT's and GPT-3's cosine schedules decay to a tenth of the peak
MIN_LR_FRACTION = 0.1
GROUPS = ("embeddings", "norms", "matmul weights", "other")
SUPPORTED = ("adamw", "sgd", "adamw-bf16-sr")
METHOD = (
    "one untimed optimiser step after the measured ones, from the trial's own optimiser "
    "state and one training batch's gradients: the intended update is the same step in "
    "float64 (torch AdamW/SGD on float64 copies of weights, gradients and state, one tensor "
    "at a time); an element is lost when that update is non-zero and the stored weight did "
    "not change in the real step. "
    "element_share: lost elements / updated elements; norm_share: ||update on lost "
    "elements|| / ||update||; kept_share: (applied change . update) / ||update||^2. At the "
    f"configured lr and at the schedule's smallest, lr x {MIN_LR_FRACTION:g} (a cosine "
    "schedule's floor, as nanoGPT's)")


def reason_none(params: list[torch.Tensor], optimizer_name: str) -> str | None:
    """Why a trial's lost updates are not measured (None: they are)."""
    dtypes = {p.dtype for p in params if p.dtype.is_floating_point}
    if not dtypes or all(torch.finfo(d).bits >= 32 for d in dtypes):
        return ("n/a: the trained weights are stored in fp32 (an fp32 master copy): every "
                "update a step makes lands")
    if optimizer_name not in SUPPORTED:
        return (f"not measured: the fp32 copy of {optimizer_name}'s step is not available "
                f"(measured for {', '.join(SUPPORTED)})")
    return None


def param_groups(model: nn.Module) -> dict[int, str]:
    """Each trainable parameter's group by the module that holds it, keyed by id: an
    embedding table tied to the LM head counts as an embedding."""
    out: dict[int, str] = {}
    for module in model.modules():
        kind = ("embeddings" if isinstance(module, nn.Embedding)
                else "norms" if "norm" in type(module).__name__.lower()
                else None)
        for name, p in module.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            if kind is None:
                kind_here = "matmul weights" if name == "weight" and p.dim() >= 2 else "other"
            else:
                kind_here = kind
            if out.get(id(p)) != "embeddings":
                out[id(p)] = kind_here
    return out


def _set_lr(optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        if isinstance(group["lr"], torch.Tensor):  # torchao keeps lr as a tensor
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr


def _intended(optimizer, name: str, p: torch.Tensor, grad: torch.Tensor, lr: float
              ) -> torch.Tensor:
    """The step the optimiser means for one parameter, computed in float64 on copies (one
    tensor at a time: the copies of a large model's weights and state never coexist)."""
    group = optimizer.param_groups[0]
    shadow = p.detach().double().clone().requires_grad_(True)
    shadow.grad = grad.double()
    if name == "sgd":
        opt = torch.optim.SGD([shadow], lr=lr, foreach=False)
    else:
        opt = torch.optim.AdamW([shadow], lr=lr, betas=group["betas"], eps=group["eps"],
                                weight_decay=group["weight_decay"],
                                amsgrad=group.get("amsgrad", False), foreach=False)
        st = optimizer.state.get(p)
        if st:
            opt.state[shadow] = {"step": torch.tensor(float(st["step"])),
                                 "exp_avg": st["exp_avg"].double(),
                                 "exp_avg_sq": st["exp_avg_sq"].double()}
    opt.step()
    return shadow.detach() - p.detach().double()


def _on_host(value):
    """A copy of a state dict with its tensors in host memory (load_state_dict moves them
    back to each parameter's device)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _on_host(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_on_host(v) for v in value)
    return copy.deepcopy(value)


def _applied(optimizer, params, weights, grads, saved_state, lr: float) -> list[torch.Tensor]:
    """The stored weights after the real step; then weights and state are put back."""
    _set_lr(optimizer, lr)
    with torch.no_grad():
        for p, w, g in zip(params, weights, grads, strict=True):
            p.copy_(w)
            p.grad = g.clone()
    optimizer.step()
    after = [p.detach().to("cpu", copy=True) for p in params]
    # a copy: load_state_dict adopts the tensors it is given, which the next step would change
    optimizer.load_state_dict(copy.deepcopy(saved_state))
    with torch.no_grad():
        for p, w, g in zip(params, weights, grads, strict=True):
            p.copy_(w)
            p.grad = g
    return after


class _Tally:
    """Sums over elements, per group: updated and lost elements, norms, projection."""

    def __init__(self):
        self.n = self.lost = 0
        self.sq = self.lost_sq = self.dot = 0.0

    def add(self, intended: torch.Tensor, change: torch.Tensor) -> None:
        moved = intended != 0
        lost = moved & (change == 0)
        self.n += int(moved.sum())
        self.lost += int(lost.sum())
        u = intended
        self.sq += float((u * u).sum())
        self.lost_sq += float((u * u * lost).sum())
        self.dot += float((change * u).sum())

    def shares(self) -> tuple[float | None, float | None, float | None]:
        if not self.n or not self.sq:
            return None, None, None
        return self.lost / self.n, (self.lost_sq / self.sq) ** 0.5, self.dot / self.sq


def count(optimizer, name: str, params, weights, after, groups: list[str], lr: float
          ) -> dict[str, _Tally]:
    """Per group (and "all"): the intended updates against the applied changes."""
    tallies = {g: _Tally() for g in ("all", *GROUPS)}
    for p, w, a, g in zip(params, weights, after, groups, strict=True):
        u = _intended(optimizer, name, p, p.grad, lr).cpu()
        change = a.double() - w.double()
        tallies["all"].add(u, change)
        tallies[g].add(u, change)
    return tallies


def measure(model: nn.Module, params: list[torch.Tensor], optimizer, optimizer_name: str,
            lr: float, weight_dtype: torch.dtype) -> LostUpdates:
    """Lost updates of one step from the gradients the parameters hold now (unscaled).

    The weights, gradients-free state and optimiser state are as they were afterwards."""
    kinds = param_groups(model)
    live = [p for p in params if p.grad is not None]
    groups = [kinds.get(id(p), "other") for p in live]
    # the copies that wait (weights, optimiser state) are kept in host memory: on a GPU the
    # trial's model may leave little room
    weights = [p.detach().to("cpu", copy=True) for p in live]
    grads = [p.grad.detach().clone() for p in live]
    saved = _on_host(optimizer.state_dict())
    configured = optimizer.param_groups[0]["lr"]
    configured = float(configured) if isinstance(configured, torch.Tensor) else configured
    rates = (lr, lr * MIN_LR_FRACTION)
    results = []
    try:
        for rate in rates:
            after = _applied(optimizer, live, weights, grads, saved, rate)
            results.append(count(optimizer, optimizer_name, live, weights, after, groups, rate))
    finally:
        _set_lr(optimizer, configured)
        for p in live:
            p.grad = None
    at_lr, at_min = results
    by_group = [LostUpdateGroup(g, rate, t[g].n, *t[g].shares())
                for rate, t in zip(rates, results, strict=True) for g in GROUPS if t[g].n]
    return LostUpdates(
        method=METHOD, weight_dtype=str(weight_dtype).removeprefix("torch."),
        rounding="stochastic" if optimizer_name in STOCHASTIC else "nearest",
        lr=rates[0], min_lr=rates[1],
        element_share=at_lr["all"].shares()[0], norm_share=at_lr["all"].shares()[1],
        kept_share=at_lr["all"].shares()[2],
        min_lr_element_share=at_min["all"].shares()[0],
        min_lr_norm_share=at_min["all"].shares()[1],
        min_lr_kept_share=at_min["all"].shares()[2],
        groups=by_group)


def measure_trial(model: nn.Module, params: list[torch.Tensor], optimizer, optimizer_name: str,
                  scaler, rec, batch: dict, device: torch.device, lr: float
                  ) -> tuple[LostUpdates | None, str | None]:
    """A trial's lost updates from one more backward on ``batch`` (untimed), or the reason
    there are none. The weights and the optimiser state are left as they were."""
    from engine.core.recipes import autocast_for

    reason = reason_none(params, optimizer_name)
    if reason is not None:
        return None, reason
    optimizer.zero_grad(set_to_none=True)
    with autocast_for(rec, device):
        loss = model(**batch).loss
    (scaler.scale(loss) if scaler else loss).backward()
    grads = [p.grad for p in params if p.grad is not None]
    if scaler:  # unscaled as GradScaler.unscale_ does: in the gradient's dtype
        inv = 1.0 / float(scaler.get_scale())
        for g in grads:
            g.mul_(inv)
    if not all(bool(torch.isfinite(g).all()) for g in grads):
        optimizer.zero_grad(set_to_none=True)
        return None, "not measured: the measuring step's gradients were not finite"
    dtype = min((p.dtype for p in params if p.dtype.is_floating_point),
                key=lambda d: torch.finfo(d).bits)
    try:
        return measure(model, params, optimizer, optimizer_name, lr, dtype), None
    finally:
        optimizer.zero_grad(set_to_none=True)
