"""The trellis package's modules import each other as a DAG: no module imports one that
(transitively) imports it back, counting imports inside functions too (a cycle hidden in a
function works until someone moves the import, then fails at import time). And each module
imports on its own, first among the package's (no module relies on another being loaded)."""
import ast
import os
import subprocess
import sys

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PACKAGE = os.path.join(REPO, "worker-lib", "python", "trellis")
BUILD = os.environ.get("TRELLIS_BUILD_DIR", "")


def modules():
    """{dotted name: source path} of the package's Python modules (not the C extension)."""
    out = {}
    for name in sorted(os.listdir(PACKAGE)):
        if name.endswith(".py"):
            stem = name[:-3]
            out["trellis" if stem == "__init__" else "trellis." + stem] = os.path.join(PACKAGE, name)
    return out


def imports_of(name, path, known):
    """The package modules `name`'s source imports, anywhere in the file."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    package = "trellis"  # every module of this flat package resolves relative imports here
    found = set()

    def add(target):
        if target in known and target != name:
            found.add(target)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                assert node.level == 1, "%s: import beyond the package: %s" % (path, ast.dump(node))
                base = package + ("." + node.module if node.module else "")
            else:
                base = node.module or ""
            add(base)
            for alias in node.names:  # `from trellis import _keys` imports the module _keys
                add(base + "." + alias.name)
    return found


def graph():
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def test_the_graph_sees_every_kind_of_import():
    g = graph()
    assert {"trellis", "trellis.torch", "trellis._state", "trellis._rejoin"} <= set(g)
    assert "trellis._state" in g["trellis.torch"]          # from . import _state
    assert "trellis._keys" in g["trellis._grad_sync"]      # from trellis import _keys
    assert "trellis._loader_watch" in g["trellis._rejoin"]  # from trellis._loader_watch import
    assert "trellis" in g["trellis._rejoin"]               # import trellis as _trellis


def test_imports_form_a_dag():
    g = graph()
    cycles = []
    done, path = set(), []

    def visit(m):
        if m in path:
            cycles.append(" -> ".join(path[path.index(m):] + [m]))
            return
        if m in done:
            return
        path.append(m)
        for n in sorted(g[m]):
            visit(n)
        path.pop()
        done.add(m)

    for m in sorted(g):
        visit(m)
    assert not cycles, "import cycles in the trellis package:\n" + "\n".join(cycles)


def test_nothing_imports_the_public_torch_module():
    # trellis.torch is the public surface: the private modules below it never reach up to it.
    users = sorted(m for m, deps in graph().items() if "trellis.torch" in deps)
    assert users == []


def test_each_module_imports_first():
    # One interpreter (importing PyTorch 16 times cost ~45 s): before each module, every trellis
    # module is forgotten, so each is imported first among them.
    pytest.importorskip("torch", reason="PyTorch (python3-torch) is not importable")
    if not BUILD:
        pytest.skip("TRELLIS_BUILD_DIR not set (the built package and its extension)")
    env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, "python"))
    env.pop("TRELLIS_SCHEDULER", None)
    code = ("import importlib, sys\n"
            "for m in sys.argv[1:]:\n"
            "    for k in [k for k in sys.modules if k == 'trellis' or k.startswith('trellis.')]:\n"
            "        del sys.modules[k]\n"
            "    importlib.import_module(m)\n"
            "    print('imported', m)\n")
    r = subprocess.run([sys.executable, "-c", code] + sorted(modules()), env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("imported ") == len(modules()), r.stdout
