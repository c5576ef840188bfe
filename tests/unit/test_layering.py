"""The package's layers hold by themselves: no import cycle between ffnlab's modules, and no module
importing one of a higher layer -- counting imports inside functions too, since a function-local
import is still a dependency (it only hides the cycle from Python's import machinery).

    core      config, kinds, errors, progress, threads, families (what is true of each model family in
              every format: data and small functions), the package's lazy front door (__init__)
    kernels   ops, quant (layouts, compiled products)
    model     weights, block / attention / FFN forward and backward, hooks, KV cache, kernel warm-up
    io        formats (GGUF, HF, checkpoints, tokenizers, export, PEFT)
    runtime   runtime (the executor and its Ray backend, the warm-up command), generation, tracing
    lab       interventions, evaluation, analysis, training, pruning, features, experiments, pictures
    cli       one module per command

A module may import its own layer and the layers below. ALLOWED lists the upward imports that stay,
each with its reason; a new one fails here until it is moved or listed with a reason of its own.
"""
import ast
import os

import pytest

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src")
LAYERS = [("core", ["config", "errors", "progress", "threads", "kinds", "families", "__init__"]),
          ("kernels", ["ops", "quant"]),
          ("model", ["model"]),
          ("io", ["formats", "token_text"]),
          ("runtime", ["runtime", "generation", "tracing"]),
          ("lab", ["interventions", "evaluation", "analysis", "training", "pruning", "features", "experiments",
                   "pictures"]),
          ("cli", ["cli", "__main__"])]
LAYER = {pkg: i for i, (_, pkgs) in enumerate(LAYERS) for pkg in pkgs}
ALLOWED = {   # (module, module it imports): why the upward import stays
    ("ffnlab.model", "ffnlab.training.lora"): "Model.apply_lora, the public object's way to add an adapter, "
                                              "reads it (io) and attaches it (training/lora.py) at call time",
    ("ffnlab.model", "ffnlab.generation"): "Model.generate, the public object's way to generate, calls the "
                                           "generation loop at call time",
    ("ffnlab.model", "ffnlab.generation.generate"): "as above",
}


def modules():
    """{dotted name: path} of every module of src/ffnlab."""
    out = {}
    for d, _, files in os.walk(os.path.join(SRC, "ffnlab")):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(d, f)
                name = os.path.relpath(path, SRC)[:-3].replace(os.sep, ".")
                out[name[:-len(".__init__")] if name.endswith(".__init__") else name] = path
    return out


def imports(mods):
    """{module: {(imported module, line)}} for every ffnlab import anywhere in the module's source."""
    out = {}
    for name, path in mods.items():
        pkg = name if path.endswith("__init__.py") else name.rsplit(".", 1)[0]
        found = set()
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = pkg.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t.startswith("ffnlab") and t != name:
                    found.add((t, node.lineno))
        out[name] = found
    return out


def top(name):
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def cycles(graph):
    """Tarjan's strongly connected components of more than one module, each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


@pytest.fixture(scope="module")
def graph():
    return imports(modules())


def test_every_package_has_a_layer():
    assert sorted({top(m) for m in modules()} - set(LAYER)) == []


def test_no_import_cycle(graph):
    found = cycles({m: {t for t, _ in ts} for m, ts in graph.items()})
    assert found == [], "import cycles (counting imports inside functions): " + "; ".join(" -> ".join(c) for c in found)


def test_no_upward_import(graph):
    up = sorted(f"{m}:{line} imports {t} ({LAYERS[LAYER[top(m)]][0]} -> {LAYERS[LAYER[top(t)]][0]})"
                for m, ts in graph.items() for t, line in ts
                if LAYER[top(t)] > LAYER[top(m)] and (m, t) not in ALLOWED)
    assert up == []


def test_allowed_upward_imports_are_still_needed(graph):
    present = {(m, t) for m, ts in graph.items() for t, _ in ts}
    assert sorted(set(ALLOWED) - present) == []


def test_the_scan_sees_function_local_imports(tmp_path):
    """A cycle hidden in a function body is a cycle: the scan is not fooled by the lazy import."""
    (tmp_path / "ffnlab").mkdir()
    (tmp_path / "ffnlab" / "__init__.py").write_text("")
    (tmp_path / "ffnlab" / "a.py").write_text("from . import b\n")
    (tmp_path / "ffnlab" / "b.py").write_text("def f():\n    from .a import g\n")
    global SRC
    saved, SRC = SRC, str(tmp_path)
    try:
        g = imports(modules())
    finally:
        SRC = saved
    assert cycles({m: {t for t, _ in ts} for m, ts in g.items()}) == [["ffnlab.a", "ffnlab.b"]]
