"""The engine's layout stays true: each stage imports only the stages below it, nothing in
the engine imports the window, the public API or Qt, and no two engine modules import each
other, however indirectly. Read from the source with ``ast`` (imports inside functions
count: a lazy import is still a dependency), so a new import that breaks the layout fails
here with its file and line. The command line is one package, and no other module parses
arguments.

Stages, bottom to top (docs/architecture.md):
    core < measure < models < record < numerics < distributed < run < report < cli

The runner starts distributed trials, so ``run`` sits above ``distributed``; what a rank
shares with a one-process trial (the optimiser, the grad norm, the batch pool, the child
process guard) lives in the stages below both.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "engine"

TOP = 8  # engine/cli/, the headless commands, imports every stage
RANKS = {"core": 0, "measure": 1, "models": 2, "record": 3, "numerics": 4, "distributed": 5,
         "run": 6, "report": 7, "cli": TOP}
FORBIDDEN = ("gui", "ampscope", "PySide6", "pyqtgraph", "shiboken6")


def _modules() -> dict[str, Path]:
    mods = {}
    for path in ENGINE.rglob("*.py"):
        parts = list(path.relative_to(ENGINE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


def _imports(name: str, path: Path, mods: dict[str, Path]):
    """(imported name, line) for every import in the file, relative ones resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            for alias in node.names:  # `from pkg import module` imports the module
                full = f"{base}.{alias.name}"
                yield (full if full in mods else base), node.lineno


def graph() -> dict[str, dict[str, int]]:
    """engine module -> {engine module it imports: first line}."""
    mods = _modules()
    edges: dict[str, dict[str, int]] = {m: {} for m in mods}
    for name, path in mods.items():
        for target, line in _imports(name, path, mods):
            while target and target not in mods:  # engine.x.y.attr -> engine.x.y
                target = target.rpartition(".")[0]
            if target and target != name and target != "engine":  # engine: VERSION only
                edges[name].setdefault(target, line)
    return edges


def stage_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in RANKS) else None


def rank(module: str) -> int:
    stage = stage_of(module)
    return TOP if stage is None else RANKS[stage]


def upward(edges: dict[str, dict[str, int]]) -> list[tuple[str, str, int]]:
    """Imports of a stage at or above the importer's own (a stage's modules import each
    other freely)."""
    bad = []
    for src, targets in edges.items():
        for dst, line in targets.items():
            if stage_of(src) == stage_of(dst):
                continue
            if rank(dst) >= rank(src):
                bad.append((src, dst, line))
    return bad


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """One circle per strongly connected group of modules (Tarjan), each as a path."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_engine_imports_no_window_no_public_api_no_qt():
    mods = _modules()
    bad = [f"{path.relative_to(ENGINE.parent)}:{line} imports {target}"
           for name, path in mods.items() for target, line in _imports(name, path, mods)
           if target.split(".")[0] in FORBIDDEN]
    assert not bad, "\n".join(bad)


def test_each_stage_imports_only_the_stages_below_it():
    bad = upward(graph())
    assert not bad, "imports against the stage order (docs/architecture.md):\n" + "\n".join(
        f"{src} (line {line}) imports {dst}" for src, dst, line in bad)


def test_no_import_circles_between_engine_modules():
    found = cycles(graph())
    assert not found, "modules that import each other:\n" + "\n".join(
        " <-> ".join(group) for group in found)


def test_every_engine_module_sits_in_a_stage():
    loose = sorted(p.name for p in ENGINE.glob("*.py") if p.stem != "__init__")
    assert not loose, f"place these in a stage package (docs/architecture.md): {loose}"
    unranked = sorted(p.parent.name for p in ENGINE.glob("*/__init__.py")
                      if p.parent.name not in RANKS)
    assert not unranked, f"give these packages a rank (docs/architecture.md): {unranked}"


PARSERS = ("argparse", "optparse", "getopt")


def parser_imports(folder: Path):
    """(file, line, module) for each import of an argument parser under ``folder``, inside
    functions too."""
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                if name.split(".")[0] in PARSERS:
                    yield path.relative_to(ROOT), node.lineno, name


def test_only_the_command_line_parses_arguments():
    cli = ENGINE / "cli"
    bad = [f"{path}:{line} imports {name}"
           for folder in (ENGINE, ROOT / "gui", ROOT / "ampscope")
           for path, line, name in parser_imports(folder)
           if cli not in (ROOT / path).parents]
    assert not bad, ("arguments are parsed in engine/cli/ alone: move the options there "
                     "(as engine/cli/distributed_args.py holds profile's distributed ones)\n"
                     + "\n".join(bad))
    # the reader finds what it looks for: the command line's parser is built with argparse
    assert (Path("engine/cli/parser.py"), "argparse") in {(p, n) for p, _, n in
                                                          parser_imports(cli)}


def test_the_checks_catch_what_they_look_for():
    """The checkers on a made-up graph: an upward import and a circle are both found."""
    edges = {"engine.measure.nvml": {"engine.run.trial": 3},
             "engine.run.trial": {"engine.measure.nvml": 1, "engine.core.config": 2},
             "engine.core.config": {}}
    assert upward(edges) == [("engine.measure.nvml", "engine.run.trial", 3)]
    assert cycles(edges) == [["engine.measure.nvml", "engine.run.trial"]]
    assert rank("engine.cli") == TOP and rank("engine.cli.plan") == TOP
    assert rank("engine.report.html") == RANKS["report"]
    assert upward({"engine.report.html": {"engine.cli.output": 4}}) == [
        ("engine.report.html", "engine.cli.output", 4)]


def test_a_rank_never_imports_the_runners_stage():
    """The runner starts distributed trials (a downward import); distributed importing run,
    as its ranks once did for the trial's optimiser, is an upward one."""
    edges = {"engine.distributed.rank_main": {"engine.run.trial": 45},
             "engine.run.runner": {"engine.distributed.trial": 214}}
    assert upward(edges) == [("engine.distributed.rank_main", "engine.run.trial", 45)]
