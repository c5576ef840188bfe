"""scripts/manual_corpus.py: what it keeps of a page, where it cuts the held-out text, how it mixes manuals."""
import importlib.util
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "manual_corpus.py")
spec = importlib.util.spec_from_file_location("manual_corpus", SCRIPT)
corpus = importlib.util.module_from_spec(spec)
spec.loader.exec_module(corpus)

SPHINX = """<html><body><div class="sphinxsidebar" role="navigation">Contents</div>
<div role="main"><h1>Title {i}</h1><p>Prose of page {i},
over two lines.</p><pre>code = {i}</pre><div class="note"><p>A note.</p></div></div>
<div class="footer">Copyright</div></body></html>"""

DJANGO = """<html><body><div id="hd">Django home</div><div id="bd"><div id="yui-main"><div class="yui-b">
<div class="yui-g"><h1>Django page {i}</h1><p>Django prose {i}.</p></div></div></div>
<div class="yui-b" id="sidebar">Table of contents</div></div></body></html>"""

DOCBOOK = """<html><body><div class="navheader"><table><tr><th>2.{i}. Header</th></tr></table></div>
<div class="sect1" id="S{i}"><div class="titlepage"><h2>2.{i}. Section</h2></div><p>SQL prose {i}.</p>
<pre class="programlisting">SELECT {i};</pre></div><div class="navfooter">Prev Next</div></body></html>"""


def site(tmp_path, name, template, n, extra=()):
    root = tmp_path / name
    for i in range(n):
        (root / f"p{i:02d}.html").parent.mkdir(parents=True, exist_ok=True)
        (root / f"p{i:02d}.html").write_text(template.format(i=i), encoding="utf-8")
    for rel in extra:                                   # pages that must be left out
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(template.format(i=99), encoding="utf-8")
    return str(root)


def test_each_theme_keeps_the_main_text_without_code_or_navigation(tmp_path):
    for manual, template, word, extra in (
            ("python", SPHINX, "Prose of page 3, over two lines.", ("c-api/x.html", "_static/y.html")),
            ("django", DJANGO, "Django prose 3.", ("releases/1.0.html", "genindex.html")),
            ("postgresql", DOCBOOK, "SQL prose 3.", ("release-15-1.html", "bookindex.html"))):
        root = site(tmp_path, manual, template, 5, extra)
        texts = corpus.pages(manual, root)
        assert len(texts) == 5, manual                  # the extra pages are left out
        page = texts[3]
        assert word in page and page.endswith("\n\n") and "\n\n" not in page[:-2], manual
        for dropped in ("code = 3", "SELECT 3", "Contents", "Copyright", "Table of contents",
                        "Django home", "Header", "Prev Next", "99"):
            assert dropped not in page, (manual, dropped)


def test_the_held_out_pages_are_those_that_start_after_the_cut():
    texts = ["a" * 30 + "\n\n", "b" * 48 + "\n\n", "c" * 8 + "\n\n", "d" * 8 + "\n\n"]   # 32, 50, 10, 10 characters
    # 102 characters, 10% held out: the limit is 91; page 2 ends at 92 > 91, so pages 2 and 3 are held out
    assert corpus.split(texts, 0.1) == (texts[:2], texts[2:])
    # the same cut as "the last page break before the limit" on the joined text
    joined = "".join(texts)
    assert joined.rfind("\n\n", 0, 91) + 2 == len("".join(texts[:2]))
    assert corpus.split(texts, 0.01) == (texts[:3], texts[3:])


def test_manuals_are_interleaved_evenly_in_their_own_order():
    a = [f"a{i}" for i in range(4)]
    b = ["b0", "b1"]
    assert corpus.interleave([a, b]) == ["a0", "b0", "a1", "a2", "b1", "a3"]
    assert corpus.interleave([a]) == a


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


def test_files_written_and_bad_arguments_refused_in_one_line(tmp_path):
    root = site(tmp_path, "python", SPHINX, 10)
    out, held = tmp_path / "train.txt", tmp_path / "held.txt"
    r = run(str(out), "--html", root, "--heldout", str(held))
    assert r.returncode == 0, r.stderr
    texts = corpus.pages("python", root)
    assert out.read_text(encoding="utf-8") + held.read_text(encoding="utf-8") == "".join(texts)
    assert held.read_text(encoding="utf-8") == texts[-1]
    for args, said in ((["--manual", "nope"], "--manual nope"),
                       (["--manual", "python,django", "--html", root], "--html"),
                       (["--html", root, "--heldout", str(held), "--fraction", "1.5"], "--fraction 1.5"),
                       (["--html", str(tmp_path / "empty")], "no HTML pages")):
        r = run(str(out), *args)
        assert r.returncode != 0 and said in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_without_heldout_every_page_goes_into_out(tmp_path):
    root = site(tmp_path, "python", SPHINX, 4)
    out = tmp_path / "all.txt"
    assert run(str(out), "--html", root, "--fraction", "0.5").returncode == 0
    assert out.read_text(encoding="utf-8") == "".join(corpus.pages("python", root))
