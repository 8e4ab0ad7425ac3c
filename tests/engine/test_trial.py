import pytest
import torch
from transformers import AutoModelForCausalLM

from engine.core.config import RunConfig
from engine.core.events import LogEvent, StepSample
from engine.measure.device import probe
from engine.run import trial_setup, trial_steps, trial_untimed
from engine.run.trial import run_trial
from tests.engine.families import FAMILIES

CPU = probe("cpu")


def _config(**kw):
    base = dict(model="tiny", batch_size=2, seq_len=32, steps=3, warmup=1, device="cpu",
                isolation="inline")
    base.update(kw)
    return RunConfig(**base)


# a test that reads no figure of the profiled step turns it off (profile_step=False):
# it is one more step, under torch.profiler, after the ones the test reads
def _run(precision, events=None, cancelled=lambda: False, **kw):
    sink = events if events is not None else []
    return run_trial(_config(**kw), precision, CPU, sink.append, cancelled)


def test_fp32_trial_measures_every_category_exactly():
    events = []
    result = _run("fp32", events)
    assert result.status == "ok", result.reason
    steps = [e for e in events if isinstance(e, StepSample)]
    assert [s.step for s in steps] == [0, 1, 2, 3]
    assert [s.warmup for s in steps] == [True, False, False, False]
    n = result.param_count
    mem = result.memory
    assert mem.params_bytes == 4 * n  # tied wte/lm_head counted once
    assert mem.buffers_bytes == 0  # tiny's causal mask is no buffer in this transformers
    # AdamW: exp_avg and exp_avg_sq in fp32 plus one fp32 step counter per tensor
    assert 8 * n <= mem.optimizer_bytes <= 8 * n + 4 * 64
    at_step = mem.at_phase_start_bytes["optimizer"]
    assert at_step["grads"] == 4 * n  # every gradient before the optimiser step
    assert mem.at_phase_start_bytes["backward"]["activations"] > 0
    assert mem.total_bytes == sum(v or 0 for v in (
        mem.params_bytes, mem.buffers_bytes, mem.quant_state_bytes, mem.grads_bytes,
        mem.optimizer_bytes, mem.weight_copies_bytes, mem.activations_bytes,
        mem.temporaries_bytes, mem.inputs_bytes))  # the categories at the peak add up
    assert result.summary.peak_memory_bytes == mem.total_bytes
    assert result.summary.steps_measured == 3
    assert result.summary.mfu is None and "CPU" in result.summary.mfu_reason
    assert result.summary.hfu is None
    # tflops are model FLOPs over time; hardware FLOPs (recompute included) are more
    s = result.summary
    assert s.tflops == pytest.approx(result.flops.analytic_per_step / s.median_step_ms / 1e9)
    assert s.hardware_tflops > s.tflops
    assert result.flops.counted_per_step > result.flops.analytic_per_step
    assert result.predicted_memory.error_pct["params"] == pytest.approx(0.0)
    tied = [p for p in result.dtype_map if p.tied_to]
    assert [(p.name, p.tied_to) for p in tied] == [("lm_head.weight", "transformer.wte.weight")]


def test_loss_scale_halves_on_overflow_and_records_the_skip():
    # 2**100 times the loss overflows fp16 activation gradients on the first backward
    result = _run("fp16-amp", init_scale=2.0**100, steps=2, warmup=0, profile_step=False)
    warm, first, second = result.steps  # --warmup 0 still warms up one step
    assert warm.warmup and warm.skipped and warm.loss_scale == 2.0**99
    assert first.skipped and first.loss_scale == 2.0**98
    assert second.skipped and second.loss_scale == 2.0**97
    assert result.summary.skipped_steps == 2
    # a skipped step's gradients held inf/NaN: its norm is null, not a number (schema)
    assert first.grad_norm is None and second.grad_norm is None


def test_loss_scale_grows_after_growth_interval():
    result = _run("fp16-amp", init_scale=1024.0, growth_interval=2, steps=4, warmup=0,
                  profile_step=False)
    # the first is the warm-up step --warmup 0 still runs
    assert [s.loss_scale for s in result.steps] == [1024.0, 2048.0, 2048.0, 4096.0, 4096.0]
    assert not any(s.skipped for s in result.steps)
    assert all(s.grad_norm is not None and s.grad_norm > 0 for s in result.steps)


def test_pure_fp16_trains_without_nan_and_says_why_eps_changed():
    events = []
    result = _run("fp16", events, steps=3, profile_step=False)
    assert result.status == "ok"
    assert all(s.loss == s.loss for s in result.steps)  # no NaN
    warnings = [e.message for e in events if isinstance(e, LogEvent) and e.level == "warning"]
    assert any("rounds to 0 in float16" in m for m in warnings)
    assert result.memory.params_bytes == 2 * result.param_count


@pytest.mark.parametrize(("precision", "trained_dtype"), [
    ("int8", torch.float32), ("fp16", torch.float16)])
def test_adam_epsilon_follows_the_trained_weights_dtype(monkeypatch, precision, trained_dtype):
    # int8 freezes an fp16 base and trains fp32 LoRA adapters: 1e-8 survives in fp32, so
    # Adam keeps it; pure fp16 trains fp16 weights, where 1e-8 is 0
    built = []

    def keep(*args, **kw):
        built.append(real(*args, **kw))
        return built[-1]

    real = trial_setup.make_optimizer
    monkeypatch.setattr(trial_setup, "make_optimizer", keep)
    events = []
    result = _run(precision, events, steps=1, warmup=0, profile_step=False)
    assert result.status == "ok", result.reason
    (optimizer,) = built
    trained = [p for g in optimizer.param_groups for p in g["params"]]
    assert trained and {p.dtype for p in trained} == {trained_dtype}
    expected = 1e-8 if torch.tensor(1e-8, dtype=trained_dtype).item() != 0 \
        else torch.finfo(torch.float16).tiny
    assert [g["eps"] for g in optimizer.param_groups] == [expected] * len(optimizer.param_groups)
    warned = [e for e in events if isinstance(e, LogEvent) and "epsilon" in e.message]
    assert bool(warned) == (expected != 1e-8)


@pytest.mark.parametrize("precision", ["bf16-amp", "bf16", "int8", "nf4"])
def test_other_cpu_recipes_run(precision):
    result = _run(precision, steps=2)
    assert result.status == "ok", result.reason
    assert len(result.steps) == 3
    if precision in ("int8", "nf4"):
        assert 0 < result.trainable_params < result.param_count / 2
    # a CPU peak cannot see bitsandbytes' temporaries inside one op: quantised trials say so
    said = [n for n in result.notes if "bitsandbytes' temporaries" in n]
    assert len(said) == (1 if precision in ("int8", "nf4") else 0)


@pytest.mark.parametrize("optimizer", ["sgd", "adamw8bit"])
def test_optimizers(optimizer):
    result = _run("fp32", optimizer=optimizer, steps=1, profile_step=False)
    assert result.status == "ok", result.reason
    if optimizer == "sgd":
        assert result.memory.optimizer_bytes == 0
    else:  # 8-bit states: about 2 bytes per parameter, far below AdamW's 8
        assert result.memory.optimizer_bytes < 3 * result.param_count


def test_grad_accumulation_and_checkpointing_options():
    result = _run("fp32", grad_accum=2, grad_checkpointing=True, steps=1)
    assert result.status == "ok", result.reason
    plain = _run("fp32", steps=1)
    assert result.flops.counted_per_step > plain.flops.counted_per_step  # 2 micro-batches
    saved = result.memory.at_phase_start_bytes["backward"]["activations"]
    assert saved < plain.memory.at_phase_start_bytes["backward"]["activations"]


def test_unsupported_precision_is_a_result_not_a_crash():
    result = _run("tf32")
    assert result.status == "unsupported" and "TF32" in result.reason
    assert result.summary is None


def test_exception_becomes_error_status(monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("weights corrupted")

    monkeypatch.setattr(trial_setup, "load_model", boom)
    result = _run("fp32")
    assert result.status == "error" and "RuntimeError: weights corrupted" in result.reason
    assert ", in boom\n" in result.traceback  # where it raised, for a bug report


def test_oom_keeps_the_steps_measured_before_it(monkeypatch):
    calls = {"n": 0}
    real = trial_steps.StepTimer.stop

    def stop(self):
        calls["n"] += 1
        if calls["n"] == 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(self)

    monkeypatch.setattr(trial_steps.StepTimer, "stop", stop)
    result = _run("fp32", steps=5)
    assert result.status == "oom" and "2.00 GiB" in result.reason
    assert len(result.steps) == 2


def test_cancel_keeps_what_was_measured():
    events = []

    def cancelled():
        return sum(isinstance(e, StepSample) for e in events) >= 2

    result = _run("fp32", events, cancelled=cancelled, steps=10)
    measured = result.summary.steps_measured
    assert result.status == "cancelled" and f"{measured} measured steps" in result.reason
    assert 2 <= len(result.steps) < 11
    assert measured == len(result.steps) - 1  # one warm-up step


def test_torch_compile_option_trains_the_compiled_model():
    result = _run("fp32", compile=True, steps=2)
    assert result.status == "ok", result.reason
    assert len(result.steps) == 3 and all(s.loss == s.loss for s in result.steps)


def _folder(tmp_path, family, weights):
    config = FAMILIES[family]()
    if weights:
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    else:
        config.save_pretrained(tmp_path)
    return str(tmp_path)


@pytest.mark.parametrize("family", ["gpt2", "llama-gqa"])
def test_int8_row_scales_are_quantisation_state_in_the_trial(tmp_path, family):
    import bitsandbytes as bnb
    from transformers import BitsAndBytesConfig

    folder = _folder(tmp_path, family, weights=True)
    result = _run("int8", model=folder, steps=1, warmup=0, profile_step=False)
    assert result.status == "ok", result.reason
    # independently: transformers' own 8-bit load, one fp32 scale per output row
    net = AutoModelForCausalLM.from_pretrained(
        folder, quantization_config=BitsAndBytesConfig(load_in_8bit=True), device_map="cpu")
    int8 = [m for m in net.modules() if isinstance(m, bnb.nn.Linear8bitLt)]
    scales = sum(m.weight.SCB.numel() * 4 for m in int8)
    assert int8 and scales == sum(m.out_features * 4 for m in int8)
    assert result.memory.quant_state_bytes == scales
    assert result.predicted_memory.quant_state_bytes == scales


@pytest.mark.parametrize("family", ["gpt2", "llama-gqa"])
def test_a_folder_with_weights_trains_without_the_key_value_cache(tmp_path, monkeypatch,
                                                                  family):
    loaded = []

    def keep(*args, **kw):
        loaded.append(real(*args, **kw))
        return loaded[-1]

    real = trial_setup.load_model
    monkeypatch.setattr(trial_setup, "load_model", keep)
    saved = _run("fp32", model=_folder(tmp_path / "w", family, weights=True), steps=1,
                 warmup=0, profile_step=False)
    bare = _run("fp32", model=_folder(tmp_path / "c", family, weights=False), steps=1,
                warmup=0, profile_step=False)
    assert saved.status == bare.status == "ok", (saved.reason, bare.reason)
    ids = torch.randint(0, 700, (1, 8))
    assert loaded[0].model(input_ids=ids).past_key_values is None
    # the same shapes, random or saved weights: the same activations
    act = [r.memory.at_phase_start_bytes["backward"]["activations"] for r in (saved, bare)]
    assert act[0] == act[1]


@pytest.mark.parametrize("family", ["gpt2", "llama-gqa"])
def test_cpu_int8_recipe_text_names_the_matmuls_that_ran(tmp_path, family):
    result = _run("int8", model=_folder(tmp_path, family, weights=False), steps=1, warmup=0,
                  profile_step=False)
    assert result.status == "ok", result.reason
    ran = set(result.flops.by_peak_dtype)  # the dtypes FlopCounterMode saw the matmuls run in
    assert ran and "int8" not in ran
    assert "runs an int8 matmul" not in result.recipe and "no int8 matmul" in result.recipe
    assert all(dtype in result.recipe for dtype in ran), (ran, result.recipe)


def _keep(monkeypatch, name):
    """Calls of ``engine.run.trial_setup.<name>`` run as before; what they return is kept."""
    kept, real = [], getattr(trial_setup, name)

    def call(*args, **kw):
        kept.append(real(*args, **kw))
        return kept[-1]

    monkeypatch.setattr(trial_setup, name, call)
    return kept


def _layers(config, n):
    for key in ("num_hidden_layers", "n_layer"):
        if key in config.to_dict():
            setattr(config, key, n)
    return config


@pytest.mark.parametrize("family", ["gpt2", "llama-gqa"])
def test_checkpointing_counts_each_layers_saved_rng_state(tmp_path, family):
    # a checkpointed layer keeps its input and the CPU generator's state (to replay dropout
    # when it reruns): one more layer adds exactly those bytes to what backward starts with
    saved, predicted = [], []
    for n in (2, 3):
        _layers(FAMILIES[family](), n).save_pretrained(tmp_path / str(n))
        result = _run("fp32", model=str(tmp_path / str(n)), steps=1, warmup=0,
                      grad_checkpointing=True, profile_step=False)
        assert result.status == "ok", result.reason
        saved.append(result.memory.at_phase_start_bytes["backward"]["activations"])
        predicted.append(result.predicted_memory.activations_bytes)
    layer_input = 2 * 32 * 96 * 4  # batch x sequence x hidden, fp32
    rng_state = torch.get_rng_state().numel()  # a uint8 tensor: one byte per element
    assert saved[1] - saved[0] == layer_input + rng_state
    assert predicted[1] - predicted[0] == layer_input + rng_state


@pytest.mark.parametrize("family", ["gpt2", "llama-gqa"])
def test_bf16_grad_norm_is_summed_in_fp32(tmp_path, monkeypatch, family):
    optimizers = _keep(monkeypatch, "make_optimizer")
    norms = []
    real_make = trial_setup.make_optimizer  # the keeping wrapper

    def with_hook(*args, **kw):
        opt = real_make(*args, **kw)
        trained = [p for g in opt.param_groups for p in g["params"]]
        opt.register_step_pre_hook(lambda *_: norms.append(float(torch.linalg.vector_norm(
            torch.cat([p.grad.float().flatten() for p in trained])))))
        return opt

    monkeypatch.setattr(trial_setup, "make_optimizer", with_hook)
    result = _run("bf16", model=_folder(tmp_path, family, weights=False), steps=3, warmup=0,
                  profile_step=False)
    assert result.status == "ok", result.reason
    # the warm-up (--warmup 0 runs one), three timed steps, the watched one, and the
    # lost-update step at its two learning rates
    assert len(optimizers) == 1 and len(norms) == 7
    # fp32 sums in another order differ by a few 1e-5 (a bf16 sum would be off by 1e-2)
    assert [s.grad_norm for s in result.steps] == pytest.approx(norms[:4], rel=1e-4)


@pytest.mark.parametrize("family", ["gpt2", "llama-gqa"])
def test_profiled_step_peak_counts_int8_row_scales(tmp_path, monkeypatch, family):
    import bitsandbytes as bnb

    models, optimizers = _keep(monkeypatch, "load_model"), _keep(monkeypatch, "make_optimizer")
    batches, live = _keep(monkeypatch, "training_batches"), []
    real_profile = trial_untimed.profile_step

    def profile(step, device, live_bytes, *args):
        live.append(live_bytes)
        return real_profile(step, device, live_bytes, *args)

    monkeypatch.setattr(trial_untimed, "profile_step", profile)
    result = _run("int8", model=_folder(tmp_path, family, weights=False), steps=1, warmup=0)
    assert result.status == "ok" and result.profiled_step is not None, result.reason
    model = models[0].model
    state = [v for s in optimizers[0].state.values() for v in s.values()
             if isinstance(v, torch.Tensor)]
    scales = [m.state.SCB for m in model.modules() if isinstance(m, bnb.nn.Linear8bitLt)]
    held = {}
    for t in [*model.parameters(), *model.buffers(), *state, *scales,
              *(v for b in batches[0] for v in b.values())]:
        held[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    assert scales and live == [sum(held.values())]
    assert result.profiled_step.peak_memory_bytes >= live[0]
