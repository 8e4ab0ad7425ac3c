#!/usr/bin/env bash
# Build the desktop bundle (dist/AmpScope/) and prove it runs: a tiny headless profile
# on the CPU must write its JSON report. Takes several minutes (torch is large).
#
#     scripts/build_bundle.sh
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m pip install -r requirements-bundle.txt
python3 -m PyInstaller --noconfirm --clean pyinstaller.spec

report="$(mktemp -d)/bundle-check.json"
dist/AmpScope/AmpScope profile --model tiny --precision fp32 --steps 2 --warmup 0 \
    --batch-size 1 --seq-len 16 --device cpu --isolation inline --out "$report"
python3 - "$report" <<'PY'
import json
import sys

report = json.load(open(sys.argv[1], encoding="utf-8"))
trial = report["trials"][0]
if trial["status"] != "ok":
    sys.exit(f"the bundle ran but the fp32 trial ended '{trial['status']}': {trial['reason']}")
print(f"bundle OK: dist/AmpScope/AmpScope wrote {sys.argv[1]} "
      f"({trial['summary']['steps_measured']} measured steps)")
PY
