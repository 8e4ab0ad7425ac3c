"""docs/architecture.md's "Where is this number made" names, for each figure, the module and
the function that make it. Every ``module -> name`` pair there must exist, so a rename or a
move that forgets the map fails here, naming the line."""

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
SECTION = "## Where is this number made"

MODULE = re.compile(r"`([\w/]+\.py)`")
# "-> `module.py`" or "-> `name`, `name` / `name`": what follows an arrow
ARROW = re.compile(r"->\s*((?:`[\w./]+`(?:\s*(?:/|,|and)\s*(?=`))?)+)")


def module_name(path: str) -> str:
    """`run/trial.py` is engine/run/trial.py; `ampscope/...` and `engine/...` are from the root."""
    if not path.startswith(("engine/", "ampscope/")):
        path = "engine/" + path
    return path.removesuffix(".py").replace("/", ".")


def pairs(text: str) -> list[tuple[int, str, str]]:
    """(line number, module, name) for each name after an arrow in the section. A name
    belongs to the last module named before it on its line, else to its heading's."""
    found = []
    heading_module = None
    lines = text.splitlines()
    start = lines.index(SECTION)
    for number, line in enumerate(lines[start + 1:], start + 2):
        if line.startswith("## "):
            break
        if line.startswith("### "):
            modules = MODULE.findall(line)
            heading_module = modules[0] if modules else None
        for arrow in ARROW.finditer(line):
            names = re.findall(r"`([\w./]+)`", arrow.group(1))
            if names[0].endswith(".py"):
                continue  # a module: its names follow the next arrow
            before = MODULE.findall(line[:arrow.start()])
            module = before[-1] if before else heading_module
            assert module is not None, f"line {number}: {line!r} names no module"
            found.extend((number, module_name(module), name) for name in names)
    return found


def missing(found: list[tuple[int, str, str]]) -> list[str]:
    problems = []
    for number, module, name in found:
        try:
            target = importlib.import_module(module)
        except ImportError as exc:
            problems.append(f"line {number}: {module} does not import: {exc}")
            continue
        for part in name.split("."):
            if not hasattr(target, part):
                problems.append(f"line {number}: {module} has no {name}")
                break
            target = getattr(target, part)
    return problems


def test_every_module_and_function_the_map_names_exists():
    found = pairs(DOC.read_text(encoding="utf-8"))
    assert len(found) > 100  # the whole section was read, not its first lines
    assert missing(found) == []


def test_the_map_covers_the_reports_new_figures():
    modules = {module for _, module, _ in pairs(DOC.read_text(encoding="utf-8"))}
    for module in ("engine.measure.quant_error", "engine.measure.traffic",
                   "engine.run.plan_measured", "engine.measure.matmul_peak",
                   "ampscope.recorder", "engine.report.json_io", "engine.report.html"):
        assert module in modules


def test_a_wrong_name_or_module_is_reported_with_its_line():
    text = (f"{SECTION}\n\n### Report charts (`report/charts.py`)\n"
            "- Loss -> `loss_chart`, `no_such_chart`\n"
            "- Step time -> `run/trial_state.py` -> `TrialState._summary`, `TrialState.nope` "
            "(`ignored`)\n"
            "- Gone -> `run/no_such_module.py` -> `anything`\n## Next\n- x -> `cli.py` -> `y`\n")
    found = pairs(text)
    assert found == [(4, "engine.report.charts", "loss_chart"),
                     (4, "engine.report.charts", "no_such_chart"),
                     (5, "engine.run.trial_state", "TrialState._summary"),
                     (5, "engine.run.trial_state", "TrialState.nope"),
                     (6, "engine.run.no_such_module", "anything")]
    assert missing(found) == ["line 4: engine.report.charts has no no_such_chart",
                              "line 5: engine.run.trial_state has no TrialState.nope",
                              "line 6: engine.run.no_such_module does not import: "
                              "No module named 'engine.run.no_such_module'"]
