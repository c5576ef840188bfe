"""The tests' layout holds: every test module sits in a tier (unit/, model/, engines/, fuzz/), shared code sits in
reference/ (imported, never collected), and no test module imports another test module, so a tier runs alone."""
import ast
import os

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIERS = ("unit", "model", "engines", "fuzz")


def python_files():
    """-> every .py file under tests/, relative to tests/."""
    for root, dirs, files in os.walk(TESTS):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if name.endswith(".py"):
                yield os.path.relpath(os.path.join(root, name), TESTS)


def imported_modules(path):
    """-> the top-level module names a file imports, at any depth (function-local imports included)."""
    tree = ast.parse(open(os.path.join(TESTS, path), encoding="utf-8").read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            yield node.module.split(".")[0]


def test_every_python_file_is_in_a_tier_or_in_reference():
    misplaced = []
    for path in python_files():
        folder, name = os.path.split(path)
        if folder in TIERS:
            ok = name.startswith("test_") or name == "conftest.py"
        elif folder == "reference":
            ok = not name.startswith("test_")              # reference/ is imported, never collected
        else:
            ok = path == "conftest.py"
        if not ok:
            misplaced.append(path)
    assert not misplaced, (f"tests/{misplaced[0]}: test modules go in tests/{{{','.join(TIERS)}}}/, "
                           "shared code in tests/reference/")


def test_no_test_module_imports_another():
    found = [(path, mod) for path in python_files() for mod in imported_modules(path)
             if mod.startswith("test_")]
    assert not found, [f"tests/{p} imports {m}: move what it shares into tests/reference/" for p, m in found]


def test_the_checks_see_this_layout():
    """The two checks above would pass vacuously on an empty walk: they must see every tier and the references."""
    folders = {os.path.dirname(p) for p in python_files()}
    assert set(TIERS) | {"reference"} <= folders
    assert "block_checks" in {m for m in imported_modules("unit/test_hooks.py")}
