"""The layout of the tests themselves: no test module imports another one. Shared builders and constants
live in helpers.py and shared fixtures in conftest.py (found by pytest without imports), so each test file
can be read, run and changed on its own."""

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def imports_of_test_modules(path: Path) -> list[str]:
    """'file:line: import' for every import of a test_* module in the file, at any depth (module level,
    inside functions, classes, conditionals)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] if node.level == 0 else [node.module or "", *(a.name for a in node.names)]
        else:
            continue
        for name in names:
            if name.split(".")[0].startswith("test_"):
                found.append((node.lineno, f"{path.name}:{node.lineno}: {ast.unparse(node)}"))
                break
    return [text for _, text in sorted(found)]


def test_no_test_module_imports_another_test_module():
    modules = sorted(TESTS.glob("*.py"))  # the test_* modules, and helpers.py and conftest.py beside them
    assert {"conftest.py", "test_layout.py"} < {path.name for path in modules}
    offenders = [line for path in modules for line in imports_of_test_modules(path)]
    assert not offenders, ("test modules import other test modules; move what they share to tests/helpers.py "
                           "(builders, constants) or tests/conftest.py (fixtures):\n" + "\n".join(offenders))


def test_the_check_finds_imports_at_every_depth(tmp_path):
    """The check above can fail: module-level, function-level and relative imports are all found."""
    sample = tmp_path / "test_sample.py"
    # the sample's test module names are spelt with {t} so that a grep of tests/ for such imports stays empty
    sample.write_text("import os\nimport {t}_a\nfrom helpers import x\nfrom {t}_b import y\n\n\n"
                      "def f():\n    from {t}_c.sub import z\n    import json, {t}_d as d\n\n\n"
                      "class C:\n    from . import {t}_e\n".format(t="test"))
    assert imports_of_test_modules(sample) == [line.format(t="test") for line in [
        "test_sample.py:2: import {t}_a",
        "test_sample.py:4: from {t}_b import y",
        "test_sample.py:8: from {t}_c.sub import z",
        "test_sample.py:9: import json, {t}_d as d",
        "test_sample.py:13: from . import {t}_e",
    ]]
