"""Layering rules of docs/architecture.md, build-breaking: the pure core stays pure, the
lower layers (config, core) know no front end, the product never imports the lab, and no
module imports itself back."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "vmplacer"
CORE = PACKAGE / "core"
FRONT_ENDS = ("vmplacer.cli", "vmplacer.api", "vmplacer.web")
ALLOWED_THIRD_PARTY = {"numpy"}
FORBIDDEN_PROJECT = ("vmplacer.adapters", "vmplacer.app", "vmplacer.api", "vmplacer.cli",
                     "vmplacer.bootstrap", "vmplacer.config", "vmplacer.ports", "vmplacer.testbed")
# Standard-library modules that would smuggle I/O or a clock into the core.
FORBIDDEN_STDLIB = {"os", "subprocess", "socket", "time", "sqlite3", "threading", "shutil", "pathlib"}


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def test_core_imports_only_stdlib_numpy_and_core():
    import sys

    stdlib = set(sys.stdlib_module_names)
    problems = []
    files = sorted(CORE.rglob("*.py"))
    assert files, "vmplacer/core has no modules"
    for path in files:
        for name in _imports(path):
            top = name.split(".")[0]
            if name.startswith(FORBIDDEN_PROJECT) or top in FORBIDDEN_STDLIB:
                problems.append(f"{path.relative_to(CORE.parent.parent)} imports {name}")
            elif top == "vmplacer":
                if not name.startswith("vmplacer.core"):
                    problems.append(f"{path.relative_to(CORE.parent.parent)} imports {name}")
            elif top not in stdlib and top not in ALLOWED_THIRD_PARTY and top != "__future__":
                problems.append(f"{path.relative_to(CORE.parent.parent)} imports {name}")
    assert not problems, "vmplacer/core must stay pure:\n" + "\n".join(problems)


# ----- the package's import graph -------------------------------------------------------------
# Every import counts, those inside functions too: a lazy import still ties the two modules
# together (it only moves the failure to run time), so it may not close a cycle either.

def _module_names() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:`: names for annotations, never run."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and (
                (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
                or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")):
            found.update(id(inner) for child in node.body for inner in ast.walk(child))
    return found


def _project_imports(name: str, path: Path, modules: dict[str, Path], *, runtime_only: bool = False) -> set[str]:
    """The package's modules `name` imports (a `from X import y` names X.y when that is a module);
    `runtime_only` leaves out imports made for type annotations only (under TYPE_CHECKING)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    tree = ast.parse(path.read_text(), filename=str(path))
    annotations_only = _type_checking_only(tree) if runtime_only else set()
    for node in ast.walk(tree):
        if id(node) in annotations_only:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                       for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t in modules and t != name)
    return found


def _graph(*, runtime_only: bool = False) -> dict[str, set[str]]:
    modules = _module_names()
    return {name: _project_imports(name, path, modules, runtime_only=runtime_only)
            for name, path in modules.items()}


def test_config_and_core_import_no_front_end():
    """Settings and pure logic sit below the CLI and the API; they must not reach up into them."""
    problems = [f"{name} imports {target}"
                for name, targets in sorted(_graph().items())
                if name == "vmplacer.config" or name.startswith("vmplacer.core")
                for target in sorted(targets) if target.startswith(FRONT_ENDS)]
    assert not problems, "config and core import no front end:\n" + "\n".join(problems)


LOWER_LAYERS = ("vmplacer.core", "vmplacer.app", "vmplacer.adapters", "vmplacer.bootstrap", "vmplacer.ports")


def test_lower_layers_name_no_front_end_even_for_annotations():
    """Pure logic, the application, the adapters and the composition root never name the CLI,
    the API or the web view — not even under TYPE_CHECKING, where a cycle (the API importing the
    composition root, which names the API's services) would hide from the runtime graph."""
    problems = [f"{name} imports {target}"
                for name, targets in sorted(_graph().items()) if name.startswith(LOWER_LAYERS)
                for target in sorted(targets) if target.startswith(FRONT_ENDS)]
    assert not problems, "lower layers name no front end:\n" + "\n".join(problems)


def test_the_annotation_rule_has_teeth(tmp_path):
    module = tmp_path / "fleet.py"
    module.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                      "    from vmplacer.api.services import ApiServices\n")
    modules = _module_names()
    assert "vmplacer.api.services" in _project_imports("vmplacer.bootstrap.fleet", module, modules)
    assert "vmplacer.api.services" not in _project_imports("vmplacer.bootstrap.fleet", module, modules,
                                                           runtime_only=True)


def test_adapters_import_no_config():
    """Adapters take plain values (e.g. `libvirt_host.HostAddress`), not the config's types:
    the composition root reads the config and hands adapters what they need."""
    problems = [f"{name} imports {target}"
                for name, targets in sorted(_graph().items()) if name.startswith("vmplacer.adapters")
                for target in sorted(targets) if target == "vmplacer.config"]
    assert not problems, "adapters import no config:\n" + "\n".join(problems)


# ----- the lab ---------------------------------------------------------------------------------
# The simulator, its optimum and the evaluations measure the product; nothing the product runs on
# real hosts may depend on them. `vmplacer eval` is the one way in, and it imports the lab inside
# its handlers so every other command starts without it. Benchmarks and tests sit outside the
# package and may import it freely.

LAB = "vmplacer.lab"
LAB_USERS = {"vmplacer.cli.eval"}
LAB_MAY_IMPORT = ("vmplacer.core", "vmplacer.ports", "vmplacer.app", "vmplacer.adapters", LAB)


def _within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def _lab_problems(graph: dict[str, set[str]]) -> list[str]:
    """Imports of the lab by anything but its users, and imports by the lab of anything above
    core, ports, app and adapters."""
    problems = []
    for name, targets in sorted(graph.items()):
        inside = _within(name, (LAB,))
        for target in sorted(targets):
            if not inside and name not in LAB_USERS and _within(target, (LAB,)):
                problems.append(f"{name} imports {target}")
            elif inside and not _within(target, LAB_MAY_IMPORT):
                problems.append(f"{name} imports {target}")
    return problems


def test_only_vmplacer_eval_imports_the_lab_and_the_lab_imports_no_front_end():
    graph = _graph()
    assert LAB in graph and LAB_USERS <= graph.keys(), "the lab or its user moved: update this test"
    problems = _lab_problems(graph)
    assert not problems, "the product never imports vmplacer.lab:\n" + "\n".join(problems)


def test_vmplacer_eval_imports_the_lab_only_inside_its_handlers():
    """At module level `cli/eval.py` stays free of the lab: registering the command (as
    `vmplacer --help` does) must not load the simulator."""
    path = PACKAGE / "cli" / "eval.py"
    top = [name for node in ast.parse(path.read_text(), filename=str(path)).body
           for name in ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                        [node.module or ""] if isinstance(node, ast.ImportFrom) else [])]
    assert top and not [name for name in top if _within(name, (LAB,))]
    modules = _module_names()
    assert {m for m in _project_imports("vmplacer.cli.eval", path, modules) if _within(m, (LAB,))}


def test_the_lab_rule_has_teeth():
    graph = {"vmplacer.app.rebalance.rebalancer": {"vmplacer.lab.simulator"},
             "vmplacer.cli.eval": {"vmplacer.lab.evaluate"},
             "vmplacer.lab.evaluate": {"vmplacer.core.model.pairs", "vmplacer.lab.simulator", "vmplacer.bootstrap"},
             "vmplacer.lab.simulator": {"vmplacer.ports", "vmplacer.adapters.cpsat_layout", "vmplacer.app.apply.executor"}}
    assert _lab_problems(graph) == ["vmplacer.app.rebalance.rebalancer imports vmplacer.lab.simulator",
                                    "vmplacer.lab.evaluate imports vmplacer.bootstrap"]


def _cycle_from(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """One import path from `start` back to itself, or None."""
    stack, seen = [(start, [start])], set()
    while stack:
        name, path = stack.pop()
        for target in sorted(graph[name]):
            if target == start:
                return path + [start]
            if target not in seen:
                seen.add(target)
                stack.append((target, path + [target]))
    return None


def test_no_import_cycle_in_the_package():
    """Cycles of imports that run; a module may name a type of a module that imports it (under
    TYPE_CHECKING), as the API's helpers name `ApiServices`, without loading it."""
    graph = _graph(runtime_only=True)
    assert len(graph) > 50 and graph["vmplacer.cli.main"], "the import graph was not read"
    cycles = [" → ".join(cycle) for name in sorted(graph) if (cycle := _cycle_from(graph, name))]
    assert not cycles, "import cycles:\n" + "\n".join(cycles[:10])


def test_the_cycle_check_sees_a_cycle():
    """The graph check has teeth: a constructed two-module loop and a lazy-import edge are found."""
    graph = {"a": {"b"}, "b": {"a"}, "c": {"a"}}
    assert _cycle_from(graph, "a") == ["a", "b", "a"] and _cycle_from(graph, "c") is None
    modules = _module_names()
    lazy = _project_imports("vmplacer.cli.common", modules["vmplacer.cli.common"], modules)
    assert "vmplacer.bootstrap" in lazy  # imported inside CliContext.container only
    placing = modules["vmplacer.api.placing"]
    assert "vmplacer.api.services" in _project_imports("vmplacer.api.placing", placing, modules)
    assert "vmplacer.api.services" not in _project_imports("vmplacer.api.placing", placing, modules,
                                                           runtime_only=True)  # annotations only


def _database_imports(path: Path) -> list[str]:
    """What `path` imports that reaches the database: `adapters.db`, or SQLAlchemy beyond its
    exception classes (which a front end may catch)."""
    return [name for name in _imports(path)
            if name.startswith("vmplacer.adapters.db")
            or (name.split(".")[0] == "sqlalchemy" and name != "sqlalchemy.exc")]


def test_front_ends_reach_the_database_only_through_the_composition_root():
    """`api`, `cli` and `web` import no `adapters.db` module and run no SQL: stores, queries and
    migrations come from `vmplacer/bootstrap/`."""
    problems = [f"{where} imports {name}"
                for package in ("api", "cli", "web") for path in sorted((PACKAGE / package).rglob("*.py"))
                if (where := str(path.relative_to(PACKAGE.parent)))
                for name in _database_imports(path)]
    assert not problems, "front ends use the database through vmplacer/bootstrap only:\n" + "\n".join(problems)


def test_the_front_end_database_rule_has_teeth(tmp_path):
    module = tmp_path / "handler.py"
    module.write_text("from sqlalchemy.exc import SQLAlchemyError\n"
                      "def run():\n    from sqlalchemy import select\n"
                      "    from vmplacer.adapters.db.models import PlanRow\n")
    assert _database_imports(module) == ["sqlalchemy", "vmplacer.adapters.db.models"]


# ----- the routes ------------------------------------------------------------------------------
# Handlers receive ApiServices through the `api.deps.api_services` dependency; what builds
# adapters (rebalancer, profiler, protection loop) is reached through those services. A route
# module importing the composition root, even inside a function, or reading `app.state` itself
# would bypass both.

ROUTES = PACKAGE / "api" / "routes"
COMPOSITION_ROOT = "vmplacer.bootstrap"


def _reads_app_state(node: ast.AST) -> bool:
    """`<anything>.app.state`, or `getattr(<anything>.app, "state")`."""
    if isinstance(node, ast.Attribute) and node.attr == "state":
        return isinstance(node.value, ast.Attribute) and node.value.attr == "app"
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
            and len(node.args) >= 2 and isinstance(node.args[0], ast.Attribute) and node.args[0].attr == "app"
            and isinstance(node.args[1], ast.Constant) and node.args[1].value == "state")


def _route_problems(name: str, path: Path, modules: dict[str, Path]) -> list[str]:
    """Imports of the composition root (module level, inside functions, or named by string as
    `importlib.import_module` takes it) and reads of `app.state` in one route module."""
    where = f"{name} ({path.name})"
    problems = [f"{where} imports {target}" for target in sorted(_project_imports(name, path, modules))
                if _within(target, (COMPOSITION_ROOT,))]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if _reads_app_state(node):
            found.append((node.lineno, "reads app.state"))
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and _within(node.value, (COMPOSITION_ROOT,))):
            found.append((node.lineno, f"names {node.value}"))
    return problems + [f"{where} line {line} {what}" for line, what in sorted(found)]


def test_routes_take_their_services_by_dependency_and_never_import_the_composition_root():
    modules = _module_names()
    routes = {name: path for name, path in modules.items() if path.parent == ROUTES}
    assert len(routes) > 5 and "vmplacer.api.routes.plans" in routes, "the route modules moved: update this test"
    problems = [problem for name, path in sorted(routes.items()) for problem in _route_problems(name, path, modules)]
    assert not problems, "routes get services from vmplacer.api.deps only:\n" + "\n".join(problems)


def test_the_route_rule_has_teeth(tmp_path):
    modules = _module_names()
    clean = tmp_path / "clean.py"
    clean.write_text("from vmplacer.api.deps import Services\n"
                     "def handler(services: Services):\n    return services.rebalancer('api')\n")
    assert _route_problems("vmplacer.api.routes.plans", clean, modules) == []
    bad = tmp_path / "bad.py"
    bad.write_text("import importlib\n"
                   "from ...bootstrap import Container\n"
                   "def handler(request):\n"
                   "    from vmplacer.bootstrap.rebalance import build_rebalancer\n"
                   "    services = request.app.state.services\n"
                   "    state = getattr(request.app, 'state')\n"
                   "    return importlib.import_module('vmplacer.bootstrap.protect'), build_rebalancer, state\n")
    assert _route_problems("vmplacer.api.routes.plans", bad, modules) == [
        "vmplacer.api.routes.plans (bad.py) imports vmplacer.bootstrap",
        "vmplacer.api.routes.plans (bad.py) imports vmplacer.bootstrap.rebalance",
        "vmplacer.api.routes.plans (bad.py) line 5 reads app.state",
        "vmplacer.api.routes.plans (bad.py) line 6 reads app.state",
        "vmplacer.api.routes.plans (bad.py) line 7 names vmplacer.bootstrap.protect",
    ]
