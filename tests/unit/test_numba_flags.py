"""Every compiled kernel that a fastmath kernel calls states its own fastmath setting.

Why: numba compiles a jitted callee that sets no fastmath with its caller's flags, and keeps that
one build for every later call (and in its disk cache). A helper written for exact roundings
(a dequantizer, a RoPE rotation, ggml's ordered sums) then runs with "contract" or "reassoc"
whenever a fastmath kernel happened to compile it first: its bits depend on the order in which
a process (or the warm-up's workers) first called the kernels. The one-token step's RoPE once did
exactly that: one bit off the prompt's RoPE in some values, after its fastmath caller had compiled it.

The scan reads the source (ast): kernels are functions decorated with njit/jit; a call is matched
by the callee's name. It reports every kernel without an explicit fastmath= that some kernel with
fastmath reaches, directly or through other such kernels.
"""
import ast
import pathlib

import ffnlab

SRC = pathlib.Path(ffnlab.__file__).parent
JIT = {"njit", "jit"}


def _flag_dicts(tree):
    """module-level NAME = dict(...) -> {keyword: source}"""
    out = {}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and getattr(node.value.func, "id", "") == "dict" and isinstance(node.targets[0], ast.Name)):
            out[node.targets[0].id] = {k.arg: ast.unparse(k.value) for k in node.value.keywords if k.arg}
    return out


def kernels():
    """-> {(file:line, name): (fastmath source or None, {names it calls})}"""
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        dicts = _flag_dicts(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef):
                continue
            for dec in node.decorator_list:
                fn = dec.func if isinstance(dec, ast.Call) else dec
                if ast.unparse(fn).split(".")[-1] not in JIT:
                    continue
                kw = {}
                for k in getattr(dec, "keywords", []):
                    if k.arg:
                        kw[k.arg] = ast.unparse(k.value)
                    elif isinstance(k.value, ast.Name):            # **FLAGS
                        kw.update(dicts.get(k.value.id, {}))
                calls = {c.func.id if isinstance(c.func, ast.Name) else c.func.attr
                         for c in ast.walk(node) if isinstance(c, ast.Call)
                         and isinstance(c.func, (ast.Name, ast.Attribute))}
                found[(f"{path.relative_to(SRC.parent)}:{node.lineno}", node.name)] = (kw.get("fastmath"), calls)
    return found


def inheriting(found):
    """kernels without fastmath= reached from a kernel with fastmath (they would take its flags);
    a call reaches every kernel of that name (the scan does not resolve imports)"""
    by_name = {}
    for key in found:
        by_name.setdefault(key[1], []).append(key)
    todo = [k for k, (fm, _) in found.items() if fm not in (None, "False")]
    seen = set()
    while todo:
        for callee in found[todo.pop()][1]:
            for key in by_name.get(callee, ()):
                if found[key][0] is None and key not in seen:
                    seen.add(key)
                    todo.append(key)
    return sorted(seen)


def test_the_scan_finds_kernels_and_fastmath_callers():
    found = kernels()
    assert len(found) > 100
    rows = [v for (where, name), v in found.items() if name == "attend_rows" and "decode_kernels" in where]
    assert rows and rows[0][0] is not None and "_softmax_row" in rows[0][1]


def test_no_kernel_takes_its_callers_fastmath():
    found = kernels()
    bad = inheriting(found)
    assert not bad, ("kernels called from fastmath kernels with no fastmath= of their own (numba would "
                     "compile them with the caller's flags; say fastmath=False, or the flags they are meant "
                     "to have): " + "; ".join(f"{name} ({where})" for where, name in bad))
