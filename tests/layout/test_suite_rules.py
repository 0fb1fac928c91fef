"""The suite's own rules (docs/developer/testing.md), held by tests: no test module (or conftest,
or helper) imports a test module or a conftest, since what several modules share lives in
tests/support/ or a helper module of the folder; and every test that reads a session run, directly
or through another fixture (pytest's own fixture closure), is in that run's scope
(tests/support/scheduling.py), so that one worker makes the run once in the whole suite."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.scheduling import SESSION_RUNS, scope_of

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"

# Collects the suite in a process of its own (nothing runs) and writes each test's fixture closure.
COLLECT = """
import json, sys
import pytest

class Closures:
    found = {}

    def pytest_collection_finish(self, session):
        Closures.found = {item.nodeid: sorted(getattr(item, "fixturenames", ()))
                          for item in session.items}

code = pytest.main(["--collect-only", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", "tests"],
                   plugins=[Closures()])
json.dump({"exit": int(code), "closures": Closures.found}, open(sys.argv[1], "w"))
"""


def offending_imports(source: str) -> list[str]:
    """The imports in `source` of a test module (`test_*`) or a conftest, in every form: absolute
    (tests.x.test_y), relative (.test_y), through the folder's own path entry (test_y), or a name
    taken from a package (from tests.x import test_y)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        named = [t for t in targets
                 if any(part.startswith("test_") or part == "conftest" for part in t.split("."))]
        found += [f"line {node.lineno}: {named[0]}"] if named else []
    return found


def misgrouped(closures: dict[str, list[str]], root: Path) -> list[str]:
    """Tests whose fixture closure holds a session run that their scope is not (that run would be
    made again on the other worker), and modules grouped with a run none of their tests reads."""
    wrong, readers = [], {}
    for nodeid, fixtures in closures.items():
        runs = [run for run in SESSION_RUNS if run in fixtures]
        scope = scope_of(nodeid, root)
        module = nodeid.split("::", 1)[0]
        if len(runs) > 1 or (runs and scope != runs[0]):
            wrong.append(f"{nodeid} reads {', '.join(runs)} but its scope is {scope}")
        readers.setdefault(module, set()).update(runs)
    for module, runs in readers.items():
        scope = scope_of(module, root)
        if scope in SESSION_RUNS and scope not in runs:
            wrong.append(f"{module} goes with {scope}, which none of its tests reads")
    return wrong


def test_no_test_module_imports_a_test_module_or_a_conftest():
    offenders = {str(path.relative_to(ROOT)): found for path in sorted(TESTS.rglob("*.py"))
                 if (found := offending_imports(path.read_text()))}
    assert offenders == {}, "move what they share into tests/support/ (or a conftest, for fixtures)"


@pytest.mark.parametrize("line", [
    "from tests.engines.test_metrics_scrape import scrape, value",
    "from .test_resend import post_once",
    "from test_fsdp_actor import config, rollout_like, step",
    "from tests.training import test_trainer",
    "from . import test_trainer",
    "import tests.health.test_prefect_health",
    "from tests.engines.conftest import engine",
    "from .conftest import router",
    "import conftest",
])
def test_every_form_of_such_an_import_is_found(line):
    [found] = offending_imports(f"import json\n{line}\n")
    assert found.startswith("line 2: ")


@pytest.mark.parametrize("line", [
    "from tests.support.metrics import scrape, value",
    "from tracking_helpers import run_synthetic",
    "from .probes import MAX_BATCH, TOKEN",
    "import torch.testing",
    "from miles.engines import scheduler",
])
def test_imports_of_helpers_are_not_found(line):
    assert offending_imports(line) == []


def whole_suite(session: pytest.Session) -> bool:
    """Whether this session collected every test module and left out no test (`make test`: each
    worker collects the whole suite), so its items' closures are the suite's."""
    leaving_out = ("markexpr", "keyword", "deselect", "lf", "stepwise")  # options that drop tests
    if any(session.config.getoption(name, default=None) for name in leaving_out):
        return False
    modules = {str(path.relative_to(ROOT)) for path in TESTS.rglob("test_*.py")}
    return modules <= {item.nodeid.split("::", 1)[0] for item in session.items}


@pytest.fixture(scope="module")
def closures(request, tmp_path_factory) -> dict[str, list[str]]:
    """Every test of the suite with its fixture closure, as pytest collects it: this session's own
    collection when it holds the whole suite, else a collection in a process of its own."""
    if whole_suite(request.session):
        return {item.nodeid: list(item.fixturenames) for item in request.session.items}
    out = tmp_path_factory.mktemp("closures") / "closures.json"
    done = subprocess.run([sys.executable, "-c", COLLECT, str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    collected = json.loads(out.read_text())
    assert collected["exit"] == 0, "the suite does not collect:\n" + done.stdout[-3000:]
    return collected["closures"]


def test_every_reader_of_a_session_run_is_in_its_scope(closures):
    readers = {run: [n for n, fixtures in closures.items() if run in fixtures]
               for run in SESSION_RUNS}
    assert all(readers.values()), readers  # a check that found no reader would check nothing
    assert misgrouped(closures, ROOT) == []


def test_a_reader_through_another_fixture_is_found(tmp_path):
    """The hazard of a scope read from a module's text: a module that reads `flow_run` only through
    a fixture of a conftest does not name it, goes to a worker of its own, and the flow would run
    there too."""
    def function(name: str, argument: str) -> str:  # (written so that this module names no run)
        return f"def {name}({argument}):\n    pass\n\n\n"

    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_direct.py").write_text(function("test_a", "flow_run"))
    (tests / "test_indirect.py").write_text(function("test_b", "flow_report"))
    (tests / "test_named.py").write_text(function("helper", "plain_run") + function("test_c", ""))
    closures = {"tests/test_direct.py::test_a": ["flow_run", "prefect_api"],
                "tests/test_indirect.py::test_b": ["flow_report", "flow_run"],
                "tests/test_named.py::test_c": ["tmp_path"]}
    assert misgrouped(closures, tmp_path) == [
        "tests/test_indirect.py::test_b reads flow_run but its scope is tests/test_indirect.py",
        "tests/test_named.py goes with plain_run, which none of its tests reads"]
