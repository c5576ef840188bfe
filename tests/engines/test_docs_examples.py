"""Every `$ ffnlab ...` example in README.md and docs/*.md runs as written from a fresh install
(installed model names, docs/data/ files), with small sizes where the docs train or scan a lot
(scripts/docs_examples.py's SMALL), and ends as documented: exit 0, or 1 where the doc shows an
error line. The outputs themselves are rewritten from real runs by `python3 scripts/docs_examples.py`.
"""
import importlib.util
import os

import pytest

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location("docs_examples", os.path.join(ROOT, "scripts", "docs_examples.py"))
D = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(D)


def needs(e):
    """The optional engine an example needs, or None."""
    if "--against llama.cpp" in e.command:
        return "llama_cpp"
    if "--against hf" in e.command:
        return "transformers"
    return None


def test_parser_reads_commands_outputs_comments_and_skips(tmp_path, monkeypatch):
    doc = tmp_path / "x.md"
    doc.write_text("text\n\n```\n$ ffnlab a --x 1 \\\n      --y 2\nout 1\nout 2\n\n$ ffnlab b '#not' # shown: part\n"
                   "row\n```\n\n    $ ffnlab c\n    c out\n\n<!-- examples: not run (made elsewhere) -->\n```\n"
                   "$ ffnlab d\n```\n")
    monkeypatch.setattr(D, "ROOT", str(tmp_path))
    ex = D.find_examples("x.md")
    assert [(e.command, e.comment, e.output, e.rewritable) for e in ex] == [
        ("ffnlab a --x 1 --y 2", "", ["out 1", "out 2"], True),
        ("ffnlab b '#not'", "shown: part", ["row"], False),
        ("ffnlab c", "", ["c out"], True)]
    D.rewrite("x.md", {ex[0].line: ["new"], ex[2].line: ["C", "C2"]})
    assert doc.read_text().startswith("text\n\n```\n$ ffnlab a --x 1 \\\n      --y 2\nnew\n\n$ ffnlab b")
    assert "    $ ffnlab c\n    C\n    C2\n\n" in doc.read_text()


def test_rewrite_stamps_the_timing_lines_with_this_machine(tmp_path, monkeypatch):
    doc = tmp_path / "x.md"
    doc.write_text("```\n$ ffnlab a\nold\n```\n\n_Timings above: a laptop, 2019._\nprose _Timings above: stays._\n")
    monkeypatch.setattr(D, "ROOT", str(tmp_path))
    D.rewrite("x.md", {D.find_examples("x.md")[0].line: ["new"]}, "_Timings above: here._")
    assert doc.read_text() == "```\n$ ffnlab a\nnew\n```\n\n_Timings above: here._\nprose _Timings above: stays._\n"


def test_timing_stamp_names_the_cpu_load_and_commit():
    stamp = D.timing_stamp(1.34)
    spec = importlib.util.spec_from_file_location("machine", os.path.join(ROOT, "bench", "machine.py"))
    machine = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(machine)
    assert D.STAMP.match(stamp) and machine.cpu_model() in stamp and "load average 1.3 at the start" in stamp
    assert "commit unknown" not in stamp                  # this checkout is a git repository


def test_small_sizes_only_shrink_the_heavy_commands():
    assert D.shell_command("ffnlab train --steps 2000 --data x", small=True).endswith("train --steps 2 --data x")
    assert D.shell_command("ffnlab analyze llama3-8b --batch 8", small=True).endswith("analyze llama3-8b --batch 8")


@pytest.mark.slow
@pytest.mark.parametrize("path", D.DOCS)
def test_doc_examples_run_as_written(path):
    import shutil
    examples = D.find_examples(path)
    cwd, failures = D.scratch_dir(), []
    try:
        _run_all(path, examples, cwd, failures)
    finally:
        shutil.rmtree(cwd, ignore_errors=True)
    assert not failures, "\n".join(failures)


def _run_all(path, examples, cwd, failures):
    for e in examples:
        mod = needs(e)
        if mod and importlib.util.find_spec(mod) is None:
            continue                                      # its reference engine is not installed here
        r = D.run_example(e, cwd, small=True, timeout=900)
        if r.returncode != D.expected_rc(e):
            failures.append(f"{path}:{e.line + 1}: `{e.command}` exited {r.returncode}: "
                            f"{r.stdout.strip()[-600:]}")
