#!/usr/bin/env bash
# The oldest end of AmpScope's tested range: torch 2.11 and transformers 5.17
# (requirements-oldest.txt) on Python 3.12 (or AMPSCOPE_OLDEST_PYTHON, e.g. a 3.10), in a
# virtual environment of its own. It installs AmpScope beside them as a user would (pip install
# of the checkout, which must keep their torch and transformers), runs `profile` on the tiny
# preset from outside the checkout and checks every table is filled, then runs the engine
# tests that touch the version-sensitive parts: profiler events, FLOP counting, autocast,
# GradScaler, torchao recipes, bitsandbytes, the Trainer, the report readers and writers.
# The first run downloads torch's CUDA wheels (about 3 GB); later runs reuse the venv.
# --if-available (as .ci/run calls it): where that environment cannot be set up here (no
# Python 3.12, no package index), say so in one line and exit 0; a failing test still fails.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
if_available=false
[ "${1:-}" = "--if-available" ] && if_available=true
cannot() {  # the environment cannot be set up: an error, or a line and 0 with --if-available
  if $if_available; then echo "test_oldest: skipped: $1"; exit 0; fi
  echo "test_oldest: $1"; exit 2
}
py=${AMPSCOPE_OLDEST_PYTHON:-}
if [ -z "$py" ]; then
  for candidate in python3.12 "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3.12; do
    if command -v "$candidate" >/dev/null 2>&1; then py=$(command -v "$candidate"); break; fi
  done
fi
[ -n "$py" ] || cannot "no Python 3.12 found (set AMPSCOPE_OLDEST_PYTHON)"
venv=${AMPSCOPE_OLDEST_VENV:-$root/.venv-oldest}
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv" || cannot "$py could not make a venv"
vpy=$venv/bin/python
echo "== oldest tested versions: $("$vpy" --version) in $venv"
# bounded: CI's 90 minutes hold the main suite too
timeout 1500 "$vpy" -m pip install -q --timeout 60 -r requirements-oldest.txt \
  || cannot "pip could not install requirements-oldest.txt in 25 minutes (no package index?)"
"$vpy" -m pip install -q --no-build-isolation "$root"
"$vpy" - <<'PY'
import importlib.metadata as m
have = {name: m.version(name) for name in ("torch", "transformers")}
assert have == {"torch": "2.11.0", "transformers": "5.17.0"}, f"pip install . changed {have}"
print("installed beside torch 2.11.0 and transformers 5.17.0, which it kept")
PY
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
(cd "$work" && "$venv/bin/ampscope" --version && AMPSCOPE_DATA_DIR=$work/data \
  "$venv/bin/ampscope" profile --model tiny --precision fp32,bf16-amp,fp8 --steps 2 --warmup 1 \
  --quiet --out "$work/report.json" >"$work/profile.txt" 2>&1) \
  || { cat "$work/profile.txt"; exit 1; }
"$vpy" "$root/scripts/check_tables.py" "$work/report.json" "$work/profile.txt"
# AMPSCOPE_OLDEST_WORKERS: pytest-xdist workers (2 as CI runs it; 1 on a shared machine)
"$vpy" -m pytest -n "${AMPSCOPE_OLDEST_WORKERS:-2}" --dist loadfile -p no:cacheprovider -q \
  tests/engine/test_kernels.py tests/engine/test_kernel_names.py tests/engine/test_trace_replay.py \
  tests/engine/test_gpu_figures.py tests/engine/test_flops.py tests/engine/test_numerics_optrace.py \
  tests/engine/test_numerics_demos.py tests/engine/test_trial.py tests/engine/test_float8_recipes.py \
  tests/engine/test_mx_recipes.py tests/engine/test_optim_axis.py tests/engine/test_quant_error.py \
  tests/engine/test_models.py tests/engine/test_memtrack.py tests/engine/test_journal.py \
  tests/engine/test_reports.py tests/engine/test_report_validate.py \
  tests/engine/test_trainer_callback.py tests/engine/test_versions.py \
  tests/engine/test_quiet_startup.py tests/engine/test_gating.py
