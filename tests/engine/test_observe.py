"""AmpScope observes and never changes: a trial trains exactly as a plain loop would.

For each recipe on two families (GPT-2 with biases, dropout and widths that are not
multiples of 64; a Mistral-style model), a real inline trial runs with every untimed
measurement on (FLOP counting, SQNR, held-out loss before and after, the memory step, the
profiled step, lost updates). A plain loop written here then loads the same weights and
trains on the same batches with the same recipe. Equal, bit for bit: every step's loss,
and after the trial's last step the trainable weights, the optimizer's state, the
scaler's scale and the RNG (dropout draws from it). The trial is observed, not replaced:
the test only keeps references to the model loader's arguments and to the optimizer and
scaler the trial made.

bitsandbytes converts 4-bit weights to a CPU inference layout in an eval-mode forward
without gradients where the CPU has AVX512-BF16; tests/conftest.py tells the layers the
CPU has it (on any CPU) and refuses the conversion, so no trial may trigger it.
"""

import functools

import pytest
import torch
import transformers as tf

from engine.core.config import TORCHAO_STEP, RunConfig
from engine.core.events import StepSample
from engine.core.recipes import recipe
from engine.models.training_data import BATCH_POOL
from engine.run import trial_setup, trial_untimed
from engine.run.runner import Runner

H, HEADS, F, V = 96, 6, 200, 700


def _gpt2(h, f, heads):
    return tf.GPT2Config(n_embd=h, n_layer=2, n_head=heads, n_inner=f, vocab_size=V,
                         n_positions=64, resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1)


def _mistral(h, f, heads):
    return tf.MistralConfig(hidden_size=h, intermediate_size=f, num_hidden_layers=2,
                            num_attention_heads=heads, num_key_value_heads=2, vocab_size=V,
                            max_position_embeddings=64)


FAMILIES = {
    "gpt2": lambda: _gpt2(H, F, HEADS),
    "mistral": lambda: _mistral(H, F, HEADS),
    # block-scaled GEMMs need every width a multiple of 32 (key/value: 2 heads of 32)
    "gpt2-32": lambda: _gpt2(128, 256, 4),
    "mistral-32": lambda: _mistral(128, 256, 4),
}
RECIPES = ["fp32", "fp16-amp", "bf16-amp", "fp16", "bf16", "int8", "nf4", "fp8",
           "fp8-rowwise", "fp8-rowwise-gw-hp", "bf16-amp+adamw8bit", "bf16+adamw-bf16-sr"]
CASES = ([(f, p) for p in RECIPES for f in ("gpt2", "mistral")]
         + [(f, "mxfp8") for f in ("gpt2-32", "mistral-32")])


@functools.cache
def _folder(family: str, root: str) -> str:
    torch.manual_seed(0)
    tf.AutoModelForCausalLM.from_config(FAMILIES[family]()).save_pretrained(root)
    return root


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("observe")
    return {f: _folder(f, str(root / f)) for f in FAMILIES}


class _Seen:
    """What the trial made, kept by reference (nothing is replaced)."""

    def __init__(self, monkeypatch):
        self.load_args = self.optimizer = self.scaler = None
        self.rng_end = None
        load, make_opt, make_scaler = (trial_setup.load_model, trial_setup.make_optimizer,
                                       trial_setup.make_scaler)

        def load_model(*a, **kw):
            self.load_args = (a, kw)
            return load(*a, **kw)

        def make_optimizer(*a, **kw):
            self.optimizer = make_opt(*a, **kw)
            return self.optimizer

        def make_scaler_(*a, **kw):
            self.scaler = make_scaler(*a, **kw)
            return self.scaler

        def release(device):  # the trial's last call: what the RNG holds at its end
            self.rng_end = torch.get_rng_state()

        monkeypatch.setattr(trial_setup, "load_model", load_model)
        monkeypatch.setattr(trial_setup, "make_optimizer", make_optimizer)
        monkeypatch.setattr(trial_setup, "make_scaler", make_scaler_)
        self._release = trial_untimed.release
        monkeypatch.setattr(trial_untimed, "release", lambda d: (release(d), self._release(d)))


def _plain_loop(seen: _Seen, precision: str, steps: list[int], batches: list[dict]):
    """The user's loop: load, then for each step forward (autocast if the recipe has it),
    scaled backward, optimizer step, zero_grad."""
    rec = recipe(precision.split("+")[0])
    torch._dynamo.reset()  # compiles as the trial did (torchao's optimizers compile their step)
    a, kw = seen.load_args
    torch.manual_seed(0)
    model = trial_setup.load_model(*a, **kw).model  # the same weights: loading is not measured
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = seen.optimizer
    kw = {k: v for k, v in opt.defaults.items() if k in ("lr", "eps", "betas", "weight_decay")}
    if hasattr(opt, "bf16_stochastic_round"):  # torchao keeps it outside the defaults
        kw["bf16_stochastic_round"] = opt.bf16_stochastic_round
    optimizer = type(opt)(params, **kw)
    scaler = None
    if seen.scaler is not None:
        s = seen.scaler
        scaler = type(s)("cpu", init_scale=s._init_scale, growth_interval=s._growth_interval)
    losses = []
    for i in steps:
        batch = batches[i]
        if rec.autocast_dtype is not None:
            with torch.autocast("cpu", dtype=rec.autocast_dtype):
                loss = model(**batch).loss
        else:
            loss = model(**batch).loss
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach().float().item())
    return model, optimizer, scaler, losses


def _tensors(state) -> list:
    out = []
    for v in (state.values() if isinstance(state, dict) else state):
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, dict | list | tuple):
            out.extend(_tensors(v))
    return out


@pytest.mark.parametrize(("family", "precision"), CASES)
def test_a_trial_trains_as_a_plain_loop(family, precision, folders, tmp_path, monkeypatch):
    monkeypatch.setenv("AMPSCOPE_DATA_DIR", str(tmp_path))
    seen = _Seen(monkeypatch)
    config = RunConfig(model=folders[family], precisions=(precision,), batch_size=2,
                       seq_len=16, steps=2, warmup=1, device="cpu", isolation="inline",
                       lr=1e-3)
    events: list = []
    record = Runner(config, events.append).run()
    result = record.trial(precision)
    assert result.status == "ok", result.reason
    assert result.heldout_loss is not None, result.heldout_loss_reason
    assert result.lost_updates is not None or result.lost_updates_reason, "not measured"
    # the batches each step trained on, as the trial drew them
    from engine.models.training_data import training_batches

    a, kw = seen.load_args
    loaded = trial_setup.load_model(*a, **kw)
    samples = [e for e in events if isinstance(e, StepSample)]
    n = len(samples)
    pool = training_batches(loaded, config, min(BATCH_POOL, n), "cpu")
    # warm-up and measured steps, the memory step (first batch), the profiled step
    profiled = 1 if result.profiled_step is not None else 0  # one step on the CPU
    order = [i % len(pool) for i in range(n)] + [0] + [n % len(pool)] * profiled
    model, optimizer, scaler, losses = _plain_loop(seen, precision, order, pool)
    assert [s.loss for s in samples] == losses[:n]
    if precision.partition("+")[2] in TORCHAO_STEP:
        # torchao compiles its optimizer step; the memory step runs it eagerly (the memory
        # watcher cannot be traced), whose rounding and random bits differ from the
        # compiled step's: from there on the weights are not the plain loop's
        return
    trial_params = [p for g in seen.optimizer.param_groups for p in g["params"]]
    plain_params = [p for g in optimizer.param_groups for p in g["params"]]
    assert len(trial_params) == len(plain_params)
    for x, y in zip(trial_params, plain_params):
        assert torch.equal(x.detach(), y.detach())
    for x, y in zip(_tensors(seen.optimizer.state_dict()["state"]),
                    _tensors(optimizer.state_dict()["state"])):
        assert torch.equal(x, y)
    if scaler is not None:
        assert seen.scaler.get_scale() == scaler.get_scale()
    assert torch.equal(seen.rng_end, torch.get_rng_state())
