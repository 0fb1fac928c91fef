"""The floor plan of `miles/`, held by the import graph: every import points down, no module imports
itself in a circle, the top level holds only the story, and a module's name tells its job."""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "miles"

# Rooms (a top-level module or a subpackage of miles/) by floor: a room may import only rooms on lower
# floors (and itself). The story files stand on top; the run directory's schema and config at the bottom.
FLOORS = [
    {"miles", "miles.record"},                                      # what a run writes; the version
    {"miles.config"},                                               # flags, resolve, secrets, run names
    {"miles.serving"},                                              # what servers (and their clients) share
    {"miles.rollout"},                                              # rollout functions, the /generate client
    {"miles.tiny"},                                                 # the tiny task and model
    {"miles.moe"},                                                  # MoE routers' statistics and capture
    {"miles.pretrained", "miles.compare"},                          # real checkpoints by name; a run against its baselines
    {"miles.engines", "miles.router", "miles.health"},              # inference servers; training signals
    {"miles.cluster", "miles.tracking", "miles.mlflow_ui", "miles.run"},  # Ray and services; trackers; loop support
    {"miles.profiling"},
    {"miles.diagnose"},                                             # why a run is stuck: stacks, probes, verdict
    {"miles.backends", "miles.dashboard"},
    {"miles.preflight", "miles.loop"},
    {"miles.trainer", "miles.prepare"},
    {"miles.train"},
]
STORY = {"train", "prepare", "loop", "trainer", "preflight"}
# Names several packages use for the same role in each (its CLI, its app, its server process, ...).
ROLE_NAMES = {"__init__", "cli", "app", "launch", "server", "actor", "base", "metrics", "names", "weights",
              "logprobs", "model"}


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The miles modules `path` imports, at any depth of the file (TYPE_CHECKING and function bodies too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("miles")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("miles"):
            submodules = {f"{node.module}.{a.name}" for a in node.names} & known.keys()
            named = {f"{node.module}.{a.name}" for a in node.names} - submodules
            found |= submodules | ({node.module} if named or not submodules else set())
    return found & known.keys()


def room(module: str) -> str:
    return ".".join(module.split(".")[:2])


def floor_of(name: str) -> int:
    return next(i for i, rooms in enumerate(FLOORS) if name in rooms)


def test_every_room_has_a_floor():
    rooms = {room(m) for m in modules()}
    assert rooms - set().union(*FLOORS) == set(), "a new room of miles/: give it a floor in FLOORS"


def test_every_import_points_down():
    known = modules()
    upward = [f"{m} -> {d}" for m, path in known.items() for d in imports(path, known)
              if room(d) != room(m) and floor_of(room(d)) >= floor_of(room(m))]
    assert upward == []


def test_no_import_circle():
    known = modules()
    graph = {m: imports(path, known) - {m} for m, path in known.items()}
    # a package's __init__ that re-exports its modules is not a circle with them
    graph = {m: {d for d in deps if not (m.startswith(d + ".") and known[d].name == "__init__.py")}
             for m, deps in graph.items()}
    state, circles = defaultdict(int), []

    def visit(m, trail):
        state[m] = 1
        for d in sorted(graph[m]):
            if state[d] == 1:
                circles.append(" -> ".join(trail[trail.index(d):] + [d]))
            elif state[d] == 0:
                visit(d, trail + [d])
        state[m] = 2

    for m in sorted(graph):
        if state[m] == 0:
            visit(m, [m])
    assert circles == []


def test_the_top_level_holds_only_the_story():
    loose = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    assert loose == STORY


def test_a_module_name_tells_its_job():
    places = defaultdict(list)
    for path in PACKAGE.rglob("*.py"):
        places[path.stem].append(str(path.relative_to(ROOT)))
    # config/<subsystem>.py holds the flags of that subsystem: it shares the subsystem's name on purpose
    shared = {stem: paths for stem, paths in places.items() if len(paths) > 1 and stem not in ROLE_NAMES
              and len([p for p in paths if not p.startswith("miles/config/")]) > 1}
    assert shared == {}


def test_the_library_never_imports_prefect_or_the_drivers():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names
                          if n.split(".")[0] in ("prefect", "prefect_ray", "flows", "tasks")]
    assert offenders == []


def test_the_train_command_runs_the_flows_which_never_reach_back():
    """`miles train` (flows/train_command.py: prepare, server, the flow, the summary), the flows it
    runs (flows/grpo.py: the flows and the retry layer, nothing else) and the flow run around them
    (flows/flow_run.py: its name, tags, description, what the command hands over) are modules with
    one job each; neither flows module has a command in it or imports the command."""
    from flows.cli import SUBCOMMANDS

    assert SUBCOMMANDS["train"][0] == "flows.train_command:main"
    for name in ("grpo.py", "flow_run.py"):
        tree = ast.parse((ROOT / "flows" / name).read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert "flows.train_command" not in imported and "main" not in {
            n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, name
    tree = ast.parse((ROOT / "flows" / "grpo.py").read_text())
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert defined == {"grpo", "train_on_ray", "run_chunk_to_end", "mark_crashed"}
