"""The layers, checked on the source: imports point down and no module imports one that imports
it back (a lazy import inside a function counts: it is a circle with the cycle hidden)."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("config", "tracker", "forecasting", "alerts", "dashboard", "curveset", "bench")
# Each layer may import the ones after it, never the ones before.
LAYERS = ("dashboard", "alerts", "forecasting", "tracker")


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[:2] == ["client", "runcast"]:
        parts = parts[1:]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _sources() -> dict[str, Path]:
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    files += list((ROOT / "client" / "runcast").rglob("*.py"))
    return {
        _module_name(p): p for p in files if "migrations" not in p.parts and ".venv" not in p.parts
    }


MODULES = _sources()


def _imports(path: Path) -> set[str]:
    """Every module this file imports, at any depth of the file (lazy imports included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from pkg import mod` is an import of the module pkg.mod, not of pkg's names.
            subs = {f"{node.module}.{a.name}" for a in node.names} & MODULES.keys()
            found.update(subs or {node.module})
    return found


def _internal(name: str) -> str | None:
    """The project module an imported name refers to (longest known prefix), if any."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in MODULES:
            return candidate
    return None


GRAPH = {
    mod: {t for i in _imports(path) if (t := _internal(i)) is not None and t != mod}
    for mod, path in MODULES.items()
}


def _is_package_parent(a: str, b: str) -> bool:
    # A package's __init__ re-exporting its own submodule is not a circle between layers.
    return b.startswith(a + ".") or a.startswith(b + ".")


def _cycles() -> list[list[str]]:
    cycles, state, stack = [], dict.fromkeys(GRAPH, 0), []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(GRAPH[node]):
            if state.get(nxt) == 1:
                cycle = [*stack[stack.index(nxt) :], nxt]
                if not all(_is_package_parent(a, b) for a, b in itertools.pairwise(cycle)):
                    cycles.append(cycle)
            elif state.get(nxt) == 0:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(GRAPH):
        if state[node] == 0:
            visit(node)
    return cycles


def test_it_finds_the_modules_it_checks() -> None:
    assert {"tracker.models", "forecasting.compute", "alerts.tasks", "dashboard.views"} <= set(
        MODULES
    )
    assert "forecasting.compute" in GRAPH["forecasting.tasks"]


def test_no_module_imports_one_that_imports_it_back() -> None:
    assert _cycles() == []


@pytest.mark.parametrize("lower", LAYERS)
def test_imports_point_down(lower: str) -> None:
    above = LAYERS[: LAYERS.index(lower)]
    wrong = sorted(
        f"{mod} imports {target}"
        for mod, targets in GRAPH.items()
        if mod == lower or mod.startswith(lower + ".")
        for target in targets
        if target.split(".")[0] in above
    )
    assert wrong == []


# Pure packages and the project modules each may use: no Django, so they run anywhere.
PURE = {
    "forecasting.estimators": ("forecasting.estimators",),
    "runcast": ("runcast",),
    "curveset": ("curveset", "forecasting.estimators"),
}


def test_estimators_and_the_client_import_nothing_of_django() -> None:
    wrong = []
    for mod, path in MODULES.items():
        allowed = next(
            (ok for pkg, ok in PURE.items() if mod == pkg or mod.startswith(pkg + ".")), None
        )
        if allowed is None:
            continue
        for name in _imports(path):
            internal = _internal(name)
            outside = internal is not None and not internal.startswith(allowed)
            if name.split(".")[0] == "django" or outside:
                wrong.append(f"{mod} imports {name}")
    assert wrong == []


# -- What issue 21 established: one writer per state table, explicit enqueueing, one settings
# surface, sub-domains as packages, modules a newcomer can read.

SERVER = ("config", "tracker", "forecasting", "alerts", "dashboard")


def _server_sources() -> dict[str, Path]:
    return {m: p for m, p in MODULES.items() if m.split(".")[0] in SERVER}


def _calls(path: Path) -> list[tuple[str, ast.Call]]:
    """(dotted callee, call) for every call in the file: `Flag.objects.filter(...).update(...)`
    reads as 'Flag.objects.filter().update'."""

    def dotted(node: ast.AST) -> str:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Attribute):
            return f"{dotted(node.value)}.{node.attr}"
        if isinstance(node, ast.Call):
            return f"{dotted(node.func)}()"
        return "?"

    tree = ast.parse(path.read_text())
    return [(dotted(n.func), n) for n in ast.walk(tree) if isinstance(n, ast.Call)]


FLAG_WRITES = ("create", "bulk_create", "get_or_create", "update_or_create", "delete")


def test_flag_rows_are_written_in_one_module_only() -> None:
    """forecasting.flags is the one writer of the alerts' outbox; the dispatcher's claim (an
    UPDATE of processed_at, nothing else) is the only other write."""
    wrong = []
    for mod, path in _server_sources().items():
        if mod == "forecasting.flags":
            continue
        for callee, call in _calls(path):
            if not callee.startswith("Flag.objects"):
                continue
            method = callee.rsplit(".", 1)[-1]
            claim = method == "update" and [k.arg for k in call.keywords] == ["processed_at"]
            if method in FLAG_WRITES or (method == "update" and not claim):
                wrong.append(f"{mod}: {callee}")
    assert wrong == []
    assert any(c.startswith("Flag.objects") for c, _ in _calls(MODULES["forecasting.flags"]))


def test_no_work_starts_from_a_model_signal() -> None:
    """Receivers subscribe to explicit signals sent after commit by a writer; a post_save
    receiver hides who sends an alert, and a bulk_create would silently send nothing."""
    model_signals = {"post_save", "pre_save", "post_delete", "pre_delete", "m2m_changed"}
    wrong = [
        f"{mod} imports {alias.name}"
        for mod, path in _server_sources().items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if alias.name in model_signals
    ]
    assert wrong == []


def test_only_the_settings_read_the_environment() -> None:
    """One typed settings surface: nothing else on the server reads os.environ or repeats a
    default with getattr(settings, ..., default). Setting DJANGO_SETTINGS_MODULE's default
    before Django starts (wsgi, the Celery app) is bootstrapping, not a setting."""
    wrong = []
    for mod, path in _server_sources().items():
        if mod.startswith("config.settings"):
            continue
        for callee, call in _calls(path):
            bootstrap = (
                callee == "os.environ.setdefault"
                and isinstance(call.args[0], ast.Constant)
                and call.args[0].value == "DJANGO_SETTINGS_MODULE"
            )
            if callee.startswith(("os.environ", "os.getenv")) and not bootstrap:
                wrong.append(f"{mod}: {callee}")
            first = call.args[0] if call.args else None
            if callee == "getattr" and isinstance(first, ast.Name) and first.id == "settings":
                wrong.append(f"{mod}: getattr(settings, ...)")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
                wrong.append(f"{mod}: os.environ[...]")
    assert wrong == []


MAX_MODULE_LINES = 800


def test_no_production_module_is_over_800_lines() -> None:
    long = sorted(
        f"{mod}: {n} lines"
        for mod, path in MODULES.items()
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    )
    assert long == []


def test_sub_domains_are_packages_not_prefixes() -> None:
    """`gpu_views.py`, `alerts_urls.py`, `settings_services.py` beside their app's own modules
    were sub-domains wanting a package (dashboard/gpu/, dashboard/alerts/, ...)."""
    prefixed = sorted(
        mod
        for mod in _server_sources()
        if len(mod.split(".")) == 2
        and any(
            mod.split(".")[1].startswith(p)
            for p in ("gpu_", "alerts_", "settings_", "team_", "rank_")
        )
        and mod != "tracker.rank_timings"  # one module, no family
    )
    assert prefixed == []
    assert "forecasting.stragglers" in MODULES
    assert "forecasting.estimators.stragglers" not in MODULES  # the same name, two jobs
