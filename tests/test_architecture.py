"""The layout a reader relies on: adapters meet their contract and are found through `ADAPTERS`, and
imports run one way down the floors (no cycle, counting imports inside functions; pre-training never
reaches into the fine-tuning runner)."""

import ast
import inspect
from pathlib import Path

import pytest

from bert_suite import adapters, cards, runner
from bert_suite.adapters import ADAPTERS, TaskAdapter

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "bert_suite"
FINE_TUNING = ("bert_suite.runner", "bert_suite.grid", "bert_suite.cli", "bert_suite.adapters", "bert_suite.glue_package")


# ----------------------------------------------------------------------------------------------- adapters

def _protocol_members():
    """The attributes and functions the Protocol declares (what isinstance checks)."""
    return [*TaskAdapter.__annotations__, *(n for n, v in vars(TaskAdapter).items() if inspect.isfunction(v)
                                             and not n.startswith("_"))]


@pytest.mark.parametrize("family", list(ADAPTERS))
def test_every_adapter_meets_the_protocol(family):
    module = ADAPTERS[family]
    assert isinstance(module, TaskAdapter)
    for name in _protocol_members():
        assert hasattr(module, name), f"adapters/{family}.py lacks {name}"
        expected = getattr(TaskAdapter, name, None)
        if not callable(expected) or isinstance(expected, type):
            continue
        wanted = list(inspect.signature(expected).parameters)[1:]  # without self
        got = inspect.signature(getattr(module, name)).parameters
        assert list(got)[: len(wanted)] == wanted, f"adapters/{family}.py: {name}{tuple(got)} vs {tuple(wanted)}"
        extra = list(got.values())[len(wanted):]
        assert all(p.default is not p.empty for p in extra), f"adapters/{family}.py: {name} needs more arguments"
    assert isinstance(module.METRICS_USE_EXAMPLES, bool)
    assert issubclass(module.MODEL_CLASS, __import__("torch").nn.Module)


def test_the_protocol_catches_a_module_that_misses_a_function():
    import types

    half = types.SimpleNamespace(**{n: getattr(ADAPTERS["ner"], n) for n in _protocol_members() if n != "collator"})
    assert not isinstance(half, TaskAdapter)


def test_card_families_are_the_adapters_and_an_unknown_family_names_the_known_ones():
    assert tuple(ADAPTERS) == cards.FAMILIES
    card = cards.load_card("rte")
    assert runner.adapter_for(card) is adapters.classification
    card.family = "parsing"
    with pytest.raises(runner.RunError, match=r"rte\.yaml: no task adapter for family 'parsing'; known families: "
                                              r"classification, squad, multiple_choice, ner"):
        runner.adapter_for(card)


# ----------------------------------------------------------------------------------------------- imports

def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> list[tuple[str, int]]:
    """(imported bert_suite module, line) for every import in the file, inside functions included."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import sub` imports the submodule; `from pkg import name` imports pkg
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        found += [(t, node.lineno) for t in targets if t in modules and t != name]
    return found


def import_graph() -> dict[str, dict[str, int]]:
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: dict(_imports(path, set(files))) for name, path in files.items()}


def _cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, {})):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_imports_have_no_cycle_counting_imports_inside_functions():
    graph = import_graph()
    assert len(graph) > 25 and "bert_suite.pretraining.text_files" in graph["bert_suite.pretraining.instances"]
    assert "bert_suite.runner" in graph["bert_suite.feature_based"]  # a function-level import is seen
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(
        f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:], strict=False)) + f" -> {cycle[-1]}"


def test_the_cycle_finder_finds_a_cycle():
    graph = import_graph()
    graph["bert_suite.io"] = {**graph["bert_suite.io"], "bert_suite.runner": 1}  # runner -> ... -> io -> runner
    assert _cycle(graph) is not None


def test_pretraining_never_imports_the_fine_tuning_floors():
    for name, targets in import_graph().items():
        if name.startswith("bert_suite.pretraining") or name == "bert_suite.tokenization":
            bad = {t: line for t, line in targets.items() if t.startswith(FINE_TUNING)}
            assert not bad, f"{name} imports {bad} (module: line)"
