"""The package's shape: no import cycle anywhere in it, and a docstring on every public name.

Imports are read from the source (module level and inside functions alike, since a function-
level import only hides a cycle), leaving out those under `if TYPE_CHECKING:`, which never run.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import kafka_txn_sink

PACKAGE_DIR = Path(kafka_txn_sink.__file__).parent
PACKAGE = "kafka_txn_sink"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, ast.Module]:
    return {
        module_name(path): ast.parse(path.read_text(), str(path))
        for path in sorted(PACKAGE_DIR.rglob("*.py"))
    }


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node, less the bodies of `if TYPE_CHECKING:` blocks."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for child in node.orelse for n in _runtime_nodes_of(child))
            continue
        yield node
        yield from _runtime_nodes(node)


def _runtime_nodes_of(node: ast.AST) -> Iterator[ast.AST]:
    yield node
    yield from _runtime_nodes(node)


def imported(name: str, tree: ast.Module, known: set[str]) -> set[str]:
    """The package's modules `name` imports when it runs."""
    found: set[str] = set()
    package = name if name in known and _is_package(name) else name.rpartition(".")[0]
    for node in _runtime_nodes(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            submodules = [f"{base}.{alias.name}" for alias in node.names]
            # `from pkg import module` needs the module; `from pkg import name` needs pkg.
            needs_base = any(name not in known for name in submodules)
            targets = [*submodules, *([base] if needs_base else [])]
        found.update(t for t in targets if t in known and t != name)
    return found


def _is_package(name: str) -> bool:
    return (PACKAGE_DIR.parent / name.replace(".", "/") / "__init__.py").exists()


def import_graph() -> dict[str, set[str]]:
    trees = modules()
    known = set(trees)
    return {name: imported(name, tree, known) for name, tree in trees.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph`, as the list of modules along it, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)) is not None:
            return cycle
    return None


def test_the_package_has_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())

    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_a_cycle_hidden_in_a_function() -> None:
    a = ast.parse("import kafka_txn_sink.b\n")
    b = ast.parse("def f():\n    from kafka_txn_sink import a\n")
    c = ast.parse("if TYPE_CHECKING:\n    import kafka_txn_sink.a\n")
    known = {"kafka_txn_sink.a", "kafka_txn_sink.b", "kafka_txn_sink.c"}
    graph = {
        "kafka_txn_sink.a": imported("kafka_txn_sink.a", a, known),
        "kafka_txn_sink.b": imported("kafka_txn_sink.b", b, known),
        "kafka_txn_sink.c": imported("kafka_txn_sink.c", c, known),
    }

    assert find_cycle(graph) == ["kafka_txn_sink.a", "kafka_txn_sink.b", "kafka_txn_sink.a"]
    assert graph["kafka_txn_sink.c"] == set()


def _public_defs(tree: ast.Module) -> Iterator[tuple[str, ast.AST]]:
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name.startswith("_"):
                continue
            yield node.name, node
            if isinstance(node, ast.ClassDef):
                for member in node.body:
                    if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                        not member.name.startswith("_")
                    ):
                        yield f"{node.name}.{member.name}", member


def test_every_public_module_class_and_function_has_a_docstring() -> None:
    missing = []
    for name, tree in modules().items():
        if (ast.get_docstring(tree) or "TODO").strip() == "TODO":
            missing.append(name)
        for qualified, node in _public_defs(tree):
            assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            if ast.get_docstring(node) is None and not _is_overload_or_property_setter(node):
                missing.append(f"{name}.{qualified}")

    assert missing == [], f"{len(missing)} public names without a docstring: {missing}"


def _is_overload_or_property_setter(node: ast.AST) -> bool:
    decorators = getattr(node, "decorator_list", [])
    return any(ast.unparse(d).endswith((".setter", "overload")) for d in decorators)


WITHOUT_PYSPARK = """
import sys


class NoPySpark:
    def find_spec(self, name, path=None, target=None):
        if name == "pyspark" or name.startswith("pyspark."):
            raise ImportError(f"No module named {name!r} (hidden by the test)")


sys.meta_path.insert(0, NoPySpark())
import kafka_txn_sink.cli
import kafka_txn_sink.files.republish
import kafka_txn_sink.testing
import kafka_txn_sink.verify

kafka_txn_sink.cli.main(["--help"])
"""


def test_the_command_line_runs_without_pyspark() -> None:
    """PySpark is an extra: `kafka-txn-sink`, recovery of files mode and the verifier need none."""
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_PYSPARK], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "usage: kafka-txn-sink" in done.stdout


def test_importing_the_sink_does_not_import_pandas() -> None:
    # Spark starts a fresh Python worker for each batch's commit: pandas would cost it 0.3-0.5 s.
    code = "import sys, kafka_txn_sink.datasource; print('pandas' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


TASK_SIDE = (
    "kafka_txn_sink.protocol.prepare",
    "kafka_txn_sink.kafka.producer",
    "kafka_txn_sink.records.output",
    "kafka_txn_sink.serde.encode",
    "pyarrow.compute",
)


@pytest.mark.parametrize(
    ("worker", "imports", "not_loaded"),
    [
        ("commit", "kafka_txn_sink.commit_worker", ("kafka_txn_sink.planner", *TASK_SIDE)),
        # kafka-python: loaded once a step asks a transaction coordinator, which a planner
        # with its log in place does not (tests/integration/test_cold_planner.py).
        ("planner", "kafka_txn_sink.planner", ("kafka", *TASK_SIDE)),
    ],
)
def test_the_drivers_workers_load_none_of_the_tasks_modules(
    worker: str, imports: str, not_loaded: tuple[str, ...]
) -> None:
    """Spark unpickles the data source in each batch's planner and commit worker, new Python
    processes once the last ones idled a minute: what they import is paid before every such
    batch (commit_worker.py, planner.py, docs/performance.md)."""
    code = (
        f"import sys, pyspark.worker, kafka_txn_sink.datasource, {imports}; "
        f"print([m for m in {not_loaded!r} if m in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", worker
