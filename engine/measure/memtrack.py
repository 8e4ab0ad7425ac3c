"""Peak memory of a training step, measured the same way on any device.

``MemoryWatcher`` is a ``TorchDispatchMode``: it sees every tensor an aten op returns,
forward, backward (the autograd engine's threads inherit the mode) and in the optimiser,
and keeps a weak reference to each new storage, whose callback fires when the storage is
freed. Live bytes rise and fall with the real allocations, so the peak is a peak, not a
sum of categories, and the storages alive at that moment give the categories at the peak.

The categories: tensors that existed before the step (parameters, buffers, quantisation
state, optimiser state, the input batch) by what holds them; new storages by who made
them: a cast or dequantised copy of a weight (autocast's low-precision weight copies,
bitsandbytes' dequantised weights), or anything else computed from weights alone outside
the optimiser (float8/MX quantised weights and their block scales), is a *weight copy*;
one made inside a module's forward,
including the forward that gradient checkpointing reruns in backward, is an *activation*;
anything else (backward's intermediates, the optimiser's scratch) a *temporary*. A storage
that becomes a ``.grad`` or optimiser state is relabelled when it does.

Every change of the live bytes is also logged (engine.measure.memory_timeline turns the
log into the step's timeline): which storage, how many bytes, the aten op count, the
phase and the module whose forward was running. A storage counts in the timeline under
the category it ends with, as it does at the peak, so the timeline's highest point is
the peak with the same categories.

What it cannot see: scratch memory a kernel allocates and frees inside one op (cuBLAS
workspaces, attention's tiles) and the caching allocator's rounding beyond 512-byte
blocks; on a GPU the allocator's own peak stands beside this figure for that reason.
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves

from engine.measure.memory_timeline import build_timeline

CATEGORIES = ("params", "buffers", "quant_state", "optimizer", "inputs", "grads",
              "weight_copies", "activations", "temporaries")
_CUDA_BLOCK = 512  # the caching allocator's smallest block: a storage costs at least this
_aten = torch.ops.aten
_COPY_OPS = {_aten._to_copy.default, _aten.clone.default, _aten.to.dtype,
             _aten.to.dtype_layout, _aten.to.device}
_WEIGHT_FORMS = ("params", "quant_state", "weight_copies")
_DEQUANT_OPS = ("dequantize_4bit", "dequantize_blockwise", "int8_vectorwise_dequant")


def storages(tensor: torch.Tensor) -> list[torch.UntypedStorage]:
    """The storages behind a tensor; a wrapper subclass (torchao's float8, its low-bit
    optimiser state: codes, block scales, lookup map) holds several."""
    if is_traceable_wrapper_subclass(tensor):
        names, _ = tensor.__tensor_flatten__()
        # a DTensor (FSDP2's shards) names its device mesh beside its local tensor
        inner = (getattr(tensor, n) for n in names)
        return [s for t in inner if isinstance(t, torch.Tensor) for s in storages(t)]
    try:
        return [tensor.untyped_storage()]
    except (NotImplementedError, RuntimeError):  # sparse, or a subclass without storage
        return []


def unique_bytes(tensors: Iterable) -> int:
    """Bytes of the distinct storages behind ``tensors`` (shared ones, such as the 8-bit
    optimiser's quantisation maps, once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            for st in storages(t):
                seen[st.data_ptr() or id(st)] = st.nbytes()
    return sum(seen.values())


def quant_state_parts(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """bitsandbytes' quantisation state beside the packed weights, named: 4-bit blocks'
    absmax and quant map (the NF4/FP4 code book; with double quantisation the nested
    state's too, and its offset), int8's per-row scales (SCB).

    Linear8bitLt's first forward moves SCB from its weight to the module's MatmulLtState
    (bitsandbytes 0.50 ``Linear8bitLt.init_8bit_state``), so it is looked for on both.
    """
    found = []
    for p in model.parameters():
        qs = getattr(p, "quant_state", None)
        if qs is not None:
            found += [("absmax", qs.absmax), ("quant map", qs.code)]
            if getattr(qs, "state2", None) is not None:
                found += [("nested absmax", qs.state2.absmax),
                          ("nested quant map", qs.state2.code)]
            if getattr(qs, "offset", None) is not None:
                found.append(("offset", qs.offset))
        found.append(("SCB", getattr(p, "SCB", None)))
    for m in model.modules():
        found.append(("SCB", getattr(getattr(m, "state", None), "SCB", None)))
    return [(name, t) for name, t in found if isinstance(t, torch.Tensor)]


def quant_state_tensors(model: nn.Module) -> list[torch.Tensor]:
    return [t for _, t in quant_state_parts(model)]


def optimizer_tensors(optimizer) -> list[torch.Tensor]:
    return [v for state in optimizer.state.values() for v in tree_leaves(state)
            if isinstance(v, torch.Tensor)]


class _Record:
    __slots__ = ("nbytes", "category", "ref", "index")

    def __init__(self, nbytes: int, category: str, index: int):
        self.nbytes, self.category, self.ref, self.index = nbytes, category, None, index


@dataclass(frozen=True)
class MeasuredPeak:
    """The most bytes the step's tensors held at once, and who held them at that moment."""

    peak_bytes: int
    at_peak: dict = field(default_factory=dict)  # category -> bytes, summing to peak_bytes
    phase: str = ""  # "forward", "backward" or "optimizer": when the peak happened
    start_bytes: int = 0  # held before the step began (weights, state, batch)
    # phase -> category -> bytes held when that phase first began: at "backward", what the
    # forward saved for backward; at "optimizer", every gradient
    at_phase_start: dict = field(default_factory=dict)
    # engine.core.events.MemoryTimeline of the watched step; None where no step was watched
    timeline: object = None


class MemoryWatcher(TorchDispatchMode):
    """Watch one step on ``device``. Use as a context; ``phase`` is set by the caller."""

    def __init__(self, device: torch.device | str, timeline: bool = True):
        super().__init__()
        self._logging = timeline  # off: no change log, no timeline (benchmarks/memory_timeline)
        self.device = torch.device(device)
        self._phase = "forward"
        self._at_phase: dict = {}
        self._records: dict[int, _Record] = {}
        self._lock = threading.RLock()
        self._live = 0
        self._peak = 0
        self._peak_records: list[_Record] = []
        self._peak_phase = ""
        self._start = 0
        self._depth = 0
        self._hooks: list = []
        # the timeline's raw log: one (ops, record index, bytes, segment, module) per change
        self._log: list[tuple[int, int, int, int, int]] = []
        self._all: list[_Record] = []  # every record, by index: its category at the end
        self._ops = 0  # aten ops dispatched while watching
        self._segments: list[str] = ["before the step"]
        self._segment = 0
        self._modules: list[str | None] = [None]  # module names by index; 0: none known
        self._layers: list[str | None] = [None]  # the layer (a ModuleList's item) holding each
        self._segment_row = 0  # the log row where the current segment began
        self._module_index: dict[int, int] = {}  # id(module) -> index in _modules
        self._stack: list[int] = [0]  # the modules whose forward is running, innermost last
        self._entered = 0  # the log's length when the step began

    @property
    def phase(self) -> str:
        return self._phase

    @phase.setter
    def phase(self, value: str) -> None:
        if value != "forward" and value not in self._at_phase:
            self._at_phase[value] = self.live()
        self._phase = value
        self.mark(value)

    def mark(self, segment: str) -> None:
        """Begin a segment of the timeline (a phase, or a part of one such as zero_grad)
        without changing what the categories mean."""
        with self._lock:
            if self._segments[self._segment] == segment:
                return
            self._segments.append(segment)
            self._segment = len(self._segments) - 1
            self._segment_row = len(self._log)
            self._log.append((self._ops, 0, 0, self._segment, self._stack[-1]))

    def _recompute(self, layer: str) -> None:
        """A checkpointed layer's forward reruns in backward; its submodules are called one
        by one (transformers checkpoints the layer's bare ``forward``), and the ops between
        them (residual adds) belong to the same recompute, not to backward."""
        label = f"recompute {layer}"
        with self._lock:
            before = self._segment - 1
            if self._segments[self._segment] == "backward" and self._segments[before] == label:
                self._log[self._segment_row:] = [row[:3] + (before,) + row[4:]
                                                 for row in self._log[self._segment_row:]]
                self._segments.pop()
                self._segment = before
            else:
                self.mark(label)

    # --- what existed before the step ------------------------------------------

    def track(self, tensors: Iterable, category: str) -> None:
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self._add(t, category)

    def track_training(self, model: nn.Module, optimizer=None, batch: dict | None = None) -> None:
        """Parameters, buffers, quantisation state, optimiser state and the batch, as held now."""
        self.track(model.parameters(), "params")
        self.track(model.buffers(), "buffers")
        self.track(quant_state_tensors(model), "quant_state")
        self.track((p.grad for p in model.parameters() if p.grad is not None), "grads")
        if optimizer is not None:
            self.track(optimizer_tensors(optimizer), "optimizer")
        if batch:
            self.track(batch.values(), "inputs")
        for p in model.parameters():
            if p.requires_grad:
                self._hooks.append(p.register_post_accumulate_grad_hook(self._grad_ready))
        named = list(model.named_modules())
        items = {f"{name}.{key}" if name else key for name, m in named
                 if isinstance(m, nn.ModuleList) for key in m._modules}
        for name, module in named:
            self._module_index[id(module)] = len(self._modules)
            self._modules.append(name or type(module).__name__)
            parts = name.split(".")
            outer = (".".join(parts[:i]) for i in range(1, len(parts) + 1))
            self._layers.append(next((p for p in outer if p in items), self._modules[-1]))
        self._start = self._live

    def held_at_rest(self, model: nn.Module, optimizer=None, batch: dict | None = None) -> dict:
        """Bytes by category that training holds between steps, with no step watched (what
        is known of a trial stopped before its watched step)."""
        self.track_training(model, optimizer, batch)
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        return self.live()

    def mark_optimizer_state(self, optimizer) -> None:
        """Relabel storages the optimiser now holds as its state (the first step makes them)."""
        self._relabel(optimizer_tensors(optimizer), "optimizer")

    # --- bookkeeping -----------------------------------------------------------

    def _on_device(self, t: torch.Tensor) -> bool:
        dev = t.device
        return dev.type == self.device.type and (
            self.device.index is None or dev.index in (None, self.device.index))

    def _add(self, tensor: torch.Tensor, category: str) -> None:
        if not self._on_device(tensor):
            return
        for st in storages(tensor):
            key = id(st)
            nbytes = st.nbytes()
            if key in self._records or nbytes == 0:
                continue
            if self.device.type == "cuda":
                nbytes = -(-nbytes // _CUDA_BLOCK) * _CUDA_BLOCK
            with self._lock:
                record = _Record(nbytes, category, len(self._all))
                record.ref = weakref.ref(st, lambda _, k=key: self._free(k))
                if self._logging:
                    self._all.append(record)
                    self._log.append((self._ops, record.index, nbytes, self._segment,
                                      self._stack[-1]))
                self._records[key] = record
                self._live += nbytes
                if self._live > self._peak:
                    self._peak = self._live
                    self._peak_records = list(self._records.values())
                    self._peak_phase = self.phase

    def _free(self, key: int) -> None:
        with self._lock:
            record = self._records.pop(key, None)
            if record is not None:
                self._live -= record.nbytes
                if self._logging:
                        self._log.append((self._ops, record.index, -record.nbytes,
                                      self._segment, self._stack[-1]))

    def _relabel(self, tensors: Iterable, category: str) -> None:
        for t in tensors:
            if isinstance(t, torch.Tensor):
                for st in storages(t):
                    record = self._records.get(id(st))
                    if record is not None:
                        record.category = category

    def _grad_ready(self, param: torch.Tensor) -> None:
        if param.grad is not None:
            self._relabel([param.grad], "grads")

    def _creator(self, func, args) -> str:
        name = func.name() if hasattr(func, "name") else str(func)
        cast = func in _COPY_OPS or (name.startswith("bitsandbytes::")
                                     and name.split("::")[1].split(".")[0] in _DEQUANT_OPS)
        if cast:
            first = next((a for a in tree_leaves(args) if isinstance(a, torch.Tensor)), None)
            if first is not None:
                held = [self._records.get(id(st)) for st in storages(first)]
                if any(r is not None and r.category in ("params", "quant_state") for r in held):
                    return "weight_copies"
        if self.phase != "optimizer" and self._from_weights_only(args):
            return "weight_copies"
        if self._depth > 0 or self.phase == "forward":
            return "activations"
        return "temporaries"

    def _from_weights_only(self, args) -> bool:
        """Whether every tensor an op reads is a weight, its quantisation state or a copy of
        one: then its output is another form of the weight (MX/float8 block scales and
        quantised data, an emulated kernel's dequantised weight), not an activation.
        Scalar constants (``torch.where(x, 0.0, ...)`` makes them) are neither."""
        weights = False
        for t in tree_leaves(args):
            if not isinstance(t, torch.Tensor):
                continue
            held = [self._records.get(id(st)) for st in storages(t)]
            if held and all(r is not None and r.category in _WEIGHT_FORMS for r in held):
                weights = True
            elif t.numel() > 1:
                return False
        return weights

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self._ops += 1
        category = self._creator(func, args)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._add(t, category)
        return out

    # --- module forward depth (checkpointing reruns forwards inside backward) -----

    def _enter_forward(self, module, args):
        index = self._module_index.get(id(module), 0)
        if self._depth == 0 and self._phase == "backward":  # a checkpointed layer reruns
            self._recompute(self._layers[index] or type(module).__name__)
        self._depth += 1
        self._stack.append(index)

    def _leave_forward(self, module, args, output):
        self._depth -= 1
        if len(self._stack) > 1:
            self._stack.pop()
        if self._depth == 0 and self._phase == "backward":
            self.mark("backward")

    # --- the CPU generator's state, which no aten op returns ------------------------

    def _rng_state(self) -> torch.Tensor:
        # gradient checkpointing keeps one per checkpointed call (torch.utils.checkpoint,
        # preserve_rng_state) and fork_rng another while a layer reruns
        state = self._get_rng_state()
        self._add(state, "activations" if self._depth > 0 or self.phase == "forward"
                  else "temporaries")
        return state

    def __enter__(self):
        hooks = nn.modules.module
        self._hooks.append(hooks.register_module_forward_pre_hook(self._enter_forward))
        self._hooks.append(hooks.register_module_forward_hook(self._leave_forward,
                                                              always_call=True))
        # checkpointing looks torch.get_rng_state up at each call: seen for this step only
        self._get_rng_state, torch.get_rng_state = torch.get_rng_state, self._rng_state
        self._entered = len(self._log)
        self.mark(self._phase)
        return super().__enter__()

    def __exit__(self, *exc):
        torch.get_rng_state = self._get_rng_state
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        return super().__exit__(*exc)

    def live(self) -> dict:
        """Bytes held now, by category."""
        with self._lock:
            held = Counter()
            for record in self._records.values():
                held[record.category] += record.nbytes
            return {c: held.get(c, 0) for c in CATEGORIES}

    def result(self) -> MeasuredPeak:
        with self._lock:
            at_peak = Counter()
            for record in self._peak_records:
                at_peak[record.category] += record.nbytes
            categories = [CATEGORIES.index(r.category) for r in self._all]
            timeline = build_timeline(self._log, self._entered, categories, CATEGORIES,
                                      self._segments, self._modules, self._ops) \
                if self._logging and len(self._log) > self._entered else None
            return MeasuredPeak(
                peak_bytes=self._peak,
                at_peak={c: at_peak.get(c, 0) for c in CATEGORIES},
                phase=self._peak_phase,
                start_bytes=self._start,
                at_phase_start=dict(self._at_phase),
                timeline=timeline,
            )
