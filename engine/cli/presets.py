"""``python main.py presets``: the built-in models, their sizes, and the precisions."""

from __future__ import annotations

import json

from engine.cli.model_args import precision_lines
from engine.cli.output import say


def add_parser(sub) -> None:
    p = sub.add_parser("presets", help="list the built-in models")
    p.add_argument("--json", action="store_true", help="print JSON")


def run(args) -> int:
    from engine.models.presets import param_count, presets

    say("counting each preset's parameters (one and two layers built on the meta device, "
        "no weights)...", err=True)
    items = []
    for i, p in enumerate(presets(), 1):
        say(f"[{i}/{len(presets())}] {p.name}", err=True)
        items.append({"name": p.name, "task": p.task, "params": param_count(p.name),
                      "description": p.description})
    if args.json:
        print(json.dumps(items, indent=2))
        return 0
    for item in items:
        print(f"{item['name']:<12} {item['params']:>15,} params  {item['task']:<9}  "
              f"{item['description']}")
    print(f"\nprecisions (--precision):\n{precision_lines()}")
    return 0
