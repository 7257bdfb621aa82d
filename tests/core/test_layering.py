"""Imports point down the layers of docs/architecture.md; the pure layers do no I/O.

Read from the source (every import, function-level ones included), so a lazy import that
breaks a layer is caught as surely as one at the top of a module.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "cclctl"

#: the base: standard library only, importable by every layer
BASE = {
    "records",
    "records_inflight",
    "endings",
    "record_stages",
    "comm_info",
    "call_fault",
    "revocation",
    "errors",
    "config",
    "config_values",
    "config_check",
    "config_rendezvous",
    "bandwidth",
    "ranges",
    "periodic",
    "stack_records",
    "auth",
    "limits",
    "slow_signals",
    "probe_record",
    "host_status",
    "status_digest",
}

#: what each layer may import of cclctl, besides the base and itself
ALLOWED: dict[str, set[str]] = {
    "base": set(),
    "telemetry": set(),
    "store": set(),
    "diagnose": set(),
    "live": {"diagnose"},  # the live view reads verdicts onto its rows
    # a watchdog that expires a call asks the diagnosis which rank the hang waits on
    "runtime": {"telemetry", "store", "diagnose_io", "live", "diagnose"},
    "launch": {"runtime", "store"},
    "diagnose_io": {"diagnose", "live"},
    # a torch rank whose watchdog expires a call asks the diagnosis whom the hang waits on
    "integrations": {"runtime", "telemetry", "store", "diagnose_io", "live", "diagnose"},
    "benchmark": {"runtime", "telemetry", "store", "launch", "integrations", "package"},
    # cclctl probe: pure verdicts over ranks that move bytes on the job's own transport
    "probe": {"runtime", "telemetry", "store", "launch", "package"},
    "package": {"runtime"},  # cclctl/__init__.py: cclctl.init() and friends
    "torch": {"integrations"},  # cclctl/torch.py: import it to register the cclctl backend
    "commands": {
        "benchmark",
        "diagnose",
        "diagnose_io",
        "integrations",
        "launch",
        "live",
        "probe",
        "store",
        "runtime",
        "telemetry",
        "ui",
        "package",
    },
    "cli": {"commands", "ui", "package"},
    "ui": set(),
    "__main__": {"cli"},
}

#: third-party packages confined to a few modules (module prefixes, relative to cclctl/)
CONFINED = {
    "typer": ("cli", "commands/"),
    "rich": ("cli", "commands/", "ui"),
    "torch": ("integrations/", "benchmark/torch_backend"),
    "prometheus_client": ("telemetry/exporter",),
}

#: modules that mean I/O, which the pure layers never import
IO_MODULES = {
    "socket", "subprocess", "asyncio", "selectors", "select", "threading", "multiprocessing",
    "mmap", "psutil", "urllib", "http", "shutil", "signal",
}  # fmt: skip
PURE = {"diagnose", "live"}


def _layer(rel: Path) -> str:
    top = rel.parts[0]
    if top.endswith(".py"):
        name = top[:-3]
        if name == "__init__":
            return "package"
        return "base" if name in BASE else name
    return top


def _modules() -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE), ast.parse(path.read_text(), str(path))


def _imports(tree: ast.Module) -> Iterator[str]:
    """Every name a module imports, in full: ``import a.b`` is ``a.b``, ``from a.b import c``
    is ``a.b.c`` (a module, or a name in module ``a.b``). The one walk every rule reads."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def _target_layer(module: str) -> str:
    parts = module.split(".")
    if module == "cclctl.__version__":
        return "base"  # a constant; importing cclctl loads nothing else (see its __init__)
    found = len(parts) > 1 and any(
        (PACKAGE / name).exists() for name in (parts[1], f"{parts[1]}.py")
    )
    if not found:
        return "package"  # cclctl itself, or a name it exports (__version__, init)
    return "base" if parts[1] in BASE else parts[1]


def _upward(rel: Path, tree: ast.Module) -> list[str]:
    layer = _layer(rel)
    if layer not in ALLOWED:
        return [f"{rel}: a layer docs/architecture.md does not name"]
    wrong = []
    for module in _imports(tree):
        if module != "cclctl" and not module.startswith("cclctl."):
            continue
        target = _target_layer(module)
        if target not in (layer, "base") and target not in ALLOWED[layer]:
            wrong.append(f"{rel} ({layer}) imports {module} ({target})")
    return wrong


def test_every_cclctl_import_points_down() -> None:
    assert [line for rel, tree in _modules() for line in _upward(rel, tree)] == []


def test_the_rule_catches_a_lazy_upward_import() -> None:
    tree = ast.parse("def later():\n    from cclctl.runtime.comm import calls\n")
    assert _upward(Path("telemetry/hub.py"), tree) == [
        "telemetry/hub.py (telemetry) imports cclctl.runtime.comm.calls (runtime)"
    ]
    assert _upward(Path("commands/top.py"), tree) == []


#: the runtime's own floors, top first: each may import only the ones below it (and the
#: modules directly in runtime/, the failure state, which every floor shares)
RUNTIME_FLOORS = ("job", "relay", "comm", "algorithms", "transport")


def _runtime_floor(module: str) -> int:
    """A runtime module's floor (its index in RUNTIME_FLOORS); the runtime's own modules
    (``runtime/failure.py``) sit below every floor."""
    parts = module.split(".")
    return RUNTIME_FLOORS.index(parts[2]) if parts[2] in RUNTIME_FLOORS else len(RUNTIME_FLOORS)


def _runtime_upward(rel: Path, tree: ast.Module) -> list[str]:
    if rel.parts[0] != "runtime" or len(rel.parts) < 3:
        return []
    floor = _runtime_floor(".".join(("cclctl", *rel.with_suffix("").parts)))
    return [
        f"{rel} imports {module}"
        for module in _imports(tree)
        if module.startswith("cclctl.runtime.") and _runtime_floor(module) < floor
    ]


def test_the_runtime_floors_import_downward_only() -> None:
    assert [line for rel, tree in _modules() for line in _runtime_upward(rel, tree)] == []


def test_the_floor_rule_catches_a_transport_that_imports_the_communicator() -> None:
    tree = ast.parse("from cclctl.runtime.comm.calls import Calls\n")
    assert _runtime_upward(Path("runtime/transport/tcp.py"), tree) == [
        "runtime/transport/tcp.py imports cclctl.runtime.comm.calls.Calls"
    ]
    assert _runtime_upward(Path("runtime/job/init.py"), tree) == []


#: concrete transports, which algorithms reach only through transport/engines.py's Protocols
CONCRETE_TRANSPORTS = ("cclctl.runtime.transport.shm", "cclctl.runtime.transport.tcp")


def _concrete_transport_imports(rel: Path, tree: ast.Module) -> list[str]:
    if rel.parts[:2] != ("runtime", "algorithms"):
        return []
    return [f"{rel} imports {m}" for m in _imports(tree) if m.startswith(CONCRETE_TRANSPORTS)]


def test_algorithms_import_no_concrete_transport() -> None:
    assert [line for rel, t in _modules() for line in _concrete_transport_imports(rel, t)] == []


def test_the_transport_rule_catches_an_algorithm_that_imports_shm() -> None:
    tree = ast.parse("from cclctl.runtime.transport import shm\n")
    assert _concrete_transport_imports(Path("runtime/algorithms/ring.py"), tree) == [
        "runtime/algorithms/ring.py imports cclctl.runtime.transport.shm"
    ]
    assert _concrete_transport_imports(Path("runtime/comm/dispatch.py"), tree) == []


@pytest.mark.parametrize("package", sorted(CONFINED))
def test_third_party_packages_stay_in_their_modules(package: str) -> None:
    wrong = []
    for rel, tree in _modules():
        where = rel.with_suffix("").as_posix()
        for module in _imports(tree):
            if module.split(".")[0] == package and not where.startswith(CONFINED[package]):
                wrong.append(f"{rel} imports {module}")
    assert wrong == []


def test_the_pure_layers_open_no_socket_process_or_file() -> None:
    wrong = []
    for rel, tree in _modules():
        if _layer(rel) not in PURE:
            continue
        wrong += [f"{rel} imports {m}" for m in _imports(tree) if m.split(".")[0] in IO_MODULES]
        for node in ast.walk(tree):
            called = isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            if called and node.func.id == "open":  # type: ignore[attr-defined]
                wrong.append(f"{rel}:{node.lineno} calls open()")
    assert wrong == []


def test_the_cli_starts_without_the_runtimes_heavy_imports() -> None:
    """Every `cclctl` command (`top`, `diagnose`, `retry` ...) starts by importing the whole
    CLI; numpy and the runtime load only where a command runs them (bench's ranks)."""
    heavy = ("numpy", "cclctl.runtime.comm.communicator")
    code = f"import sys, cclctl.cli; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def _module_name(rel: Path) -> str:
    parts = rel.with_suffix("").parts
    return ".".join(("cclctl", *(parts[:-1] if parts[-1] == "__init__" else parts)))


def _imported_modules(tree: ast.Module, known: set[str]) -> Iterator[str]:
    """The cclctl modules a module imports, type-only and function-level imports included
    (``from a.b import c`` is module ``a.b.c`` where that exists, else ``a.b``)."""
    for name in _imports(tree):
        if name in known:
            yield name
        elif (module := name.rpartition(".")[0]) in known:
            yield module


def import_cycles(trees: dict[str, ast.Module]) -> list[list[str]]:
    """Every set of modules that import each other round (Tarjan's strongly connected
    components of more than one module); a package's own __init__ is not an edge."""
    known = set(trees)
    graph = {
        name: sorted({m for m in _imported_modules(tree, known) if not name.startswith(f"{m}.")})
        for name, tree in trees.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while (top := stack.pop()) != node:
                component.append(top)
            if component:
                cycles.append(sorted([node, *component]))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return sorted(cycles)


def test_no_module_imports_itself_round_a_cycle() -> None:
    """A callee is never written against its caller: no import cycle, even a type-only one
    (``if TYPE_CHECKING:``), which is the same knot of design with the runtime cost hidden."""
    assert import_cycles({_module_name(rel): tree for rel, tree in _modules()}) == []


def test_the_cycle_rule_catches_a_type_only_cycle() -> None:
    trees = {
        "cclctl.a": ast.parse("from cclctl.b import B\n"),
        "cclctl.b": ast.parse(
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from cclctl import a\n"
        ),
        "cclctl.c": ast.parse("import cclctl.a\n"),
    }
    assert import_cycles(trees) == [["cclctl.a", "cclctl.b"]]
