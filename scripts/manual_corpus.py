"""An English corpus from Debian's documentation packages: the prose of the Python 3.11,
Django 3.2 and PostgreSQL 15 manuals.

    apt-get install python3.11-doc python-django-doc postgresql-doc-15
    python3 scripts/manual_corpus.py OUT.txt [--manual python|django|postgresql|python,django,...]
                                     [--html DIR] [--heldout HELDOUT.txt [--fraction 0.1]]

Every page's main text (Sphinx's `<div role="main">`, `<div id="yui-main">` in Django's theme, the
DocBook section after the navigation header in PostgreSQL's), code blocks dropped, in sorted path
order, one page after another; several manuals' pages are interleaved evenly. With --heldout,
each manual's last pages (those that start after the first 1 - --fraction of its characters) go
there instead of into OUT. Left out: the Python manual's C API pages (c-api/: mostly signatures); Django's and PostgreSQL's release notes (lists of changes) and their index and search
pages. Licences: the Python manual PSF (copyright.html in the package), Django BSD-3-Clause,
PostgreSQL the PostgreSQL licence (/usr/share/doc/<package>/copyright); docs/features.md names the
versions the corpus was made from and each file's sha256.
"""
import argparse
import os
from html.parser import HTMLParser

SKIP = {"pre", "script", "style"}          # code examples and page machinery: not prose

DOCBOOK = {"sect1", "refentry", "chapter", "appendix", "part", "reference", "preface", "bibliography"}


def sphinx_main(attrs):
    return attrs.get("role") == "main" or attrs.get("id") == "yui-main"


def docbook_main(attrs):
    return attrs.get("class") in DOCBOOK


# manual: (Debian's package, where it installs the HTML, folders left out, page-name prefixes left out, the main div)
MANUALS = {
    "python": ("python3.11-doc", "/usr/share/doc/python3.11/html", ("c-api",), (), sphinx_main),
    "django": ("python-django-doc", "/usr/share/doc/python-django-doc/html", ("releases",),
               ("genindex.html", "py-modindex.html", "search.html"), sphinx_main),
    "postgresql": ("postgresql-doc-15", "/usr/share/doc/postgresql-doc-15/html", (),
                   ("release", "index.html", "bookindex.html", "search.html"), docbook_main),
}


class MainText(HTMLParser):
    def __init__(self, is_main=sphinx_main):
        super().__init__(convert_charrefs=True)
        self.is_main = is_main
        self.depth = 0                      # >0: inside the main div (its nesting depth)
        self.skip = 0
        self.parts = []

    def handle_starttag(self, tag, attrs):
        if self.depth:
            if tag == "div":
                self.depth += 1
            if tag in SKIP:
                self.skip += 1
            if tag in ("p", "li", "dt", "dd", "h1", "h2", "h3", "h4", "tr", "br"):
                self.parts.append("\n")
        elif tag == "div" and self.is_main(dict(attrs)):
            self.depth = 1

    def handle_endtag(self, tag):
        if not self.depth:
            return
        if tag in SKIP and self.skip:
            self.skip -= 1
        if tag == "div":
            self.depth -= 1

    def handle_data(self, data):
        if self.depth and not self.skip:
            self.parts.append(data.replace("\n", " "))

    def text(self):
        lines = [" ".join(line.split()) for line in "".join(self.parts).replace("\u00b6", "").splitlines()]
        return "\n".join(line for line in lines if line) + "\n"


def pages(manual, html=None):
    """The manual's pages as text, in sorted path order."""
    package, root, folders, names, is_main = MANUALS[manual]
    root = html or root
    skip = ("/_",) + tuple("/" + f + "/" for f in folders)       # /_static, /_sources, ...: not pages
    paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs
                   if f.endswith(".html") and not f.startswith(names)
                   and not any(s in d[len(root):] + "/" for s in skip))
    if not paths:
        raise SystemExit(f"{root}: no HTML pages (apt-get install {package})")
    texts = []
    for p in paths:
        parser = MainText(is_main)
        with open(p, encoding="utf-8") as f:
            parser.feed(f.read())
        texts.append(parser.text() + "\n")
    return texts


def split(texts, fraction):
    """(training pages, held-out pages): the held-out ones are the last pages that start after
    the first 1 - fraction of the characters."""
    limit, end = int(sum(map(len, texts)) * (1 - fraction)), 0
    for i, t in enumerate(texts):
        end += len(t)
        if end > limit:
            return texts[:i], texts[i:]
    return texts, []


def interleave(manuals):
    """Each manual's pages in order, the manuals mixed evenly: page i of n sits at (i + 0.5) / n."""
    keyed = [((i + 0.5) / len(texts), m, t) for m, texts in enumerate(manuals) for i, t in enumerate(texts)]
    return [t for _, _, t in sorted(keyed, key=lambda k: k[:2])]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--manual", default="python",
                    help=f"one of {', '.join(MANUALS)}, or several joined by commas (their pages interleaved)")
    ap.add_argument("--html", help="one manual's HTML folder (default: where Debian installs it)")
    ap.add_argument("--heldout", help="write each manual's last pages here (in manual order) instead of into OUT")
    ap.add_argument("--fraction", type=float, default=0.1, help="the held-out share of each manual's characters")
    args = ap.parse_args()
    manuals = args.manual.split(",")
    for m in manuals:
        if m not in MANUALS:
            raise SystemExit(f"--manual {m}: not one of {', '.join(MANUALS)}")
    if args.html and len(manuals) > 1:
        raise SystemExit("--html: names one manual's folder; give one --manual with it")
    if args.heldout and not 0 < args.fraction < 1:
        raise SystemExit(f"--fraction {args.fraction}: must lie between 0 and 1")
    train, held = [], []
    for m in manuals:
        texts = pages(m, args.html)
        t, h = split(texts, args.fraction) if args.heldout else (texts, [])
        train.append(t)
        held += h
        print(f"{m}: {len(texts)} pages, {len(t)} for OUT ({sum(map(len, t)):,} characters)")
    if args.heldout:
        with open(args.heldout, "w", encoding="utf-8") as f:
            f.write("".join(held))
        print(f"{args.heldout}: {len(held)} pages, {sum(map(len, held)):,} characters")
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("".join(interleave(train)))
    print(f"{args.out}: {sum(map(len, train))} pages")


if __name__ == "__main__":
    main()
