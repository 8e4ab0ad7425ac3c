#!/usr/bin/env bash
# Builds .gpu-site/ in the project root: the Python packages AmpScope's engine needs that a
# GPU machine without a package index may lack when its Python already has torch,
# transformers, accelerate, peft, nvidia-ml-py, psutil, matplotlib and numpy (docs/gpu.md).
# Run it from the project root on a machine that reaches the index; on the GPU machine run
#   PYTHONPATH=$PWD/.gpu-site python3 scripts/gpu_acceptance.py --out RESULTS
# Versions come from requirements.txt; wheels for x86-64 Linux and the GPU machine's Python
# (PYTHON_VERSION, 3.12 by default). bitsandbytes' builds for other CUDA versions and for
# ROCm and XPU are dropped to keep the folder small (about 29 MiB).
set -eu
[ -f requirements.txt ] || { echo "run from the project root"; exit 2; }
PYTHON_VERSION=${PYTHON_VERSION:-3.12}
pin() { grep -iE "^$1==" requirements.txt | head -1; }
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
for spec in "$(pin torchao)" "$(pin bitsandbytes)" "$(pin platformdirs)"; do
  [ -n "$spec" ] || continue
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYTHON_VERSION" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
    -d "$W" "$spec"
done
rm -rf .gpu-site && mkdir .gpu-site
for w in "$W"/*.whl; do (cd .gpu-site && python3 -m zipfile -e "$w" .); done
rm -f .gpu-site/bitsandbytes/libbitsandbytes_cuda1[12]*.so .gpu-site/bitsandbytes/libbitsandbytes_rocm*.so \
      .gpu-site/bitsandbytes/libbitsandbytes_xpu*.so
du -sh .gpu-site  # ignored by git (.gitignore)
