"""An English corpus from Debian's python3.11-doc package: the prose of the Python 3.11 manual.

    apt-get install python3.11-doc
    python3 scripts/pydocs_corpus.py OUT.txt [--html /usr/share/doc/python3.11/html]

Every page's main text (`<div role="main">`), code blocks dropped, in sorted path order, one
page after another; the C API pages (c-api/: mostly signatures) are left out. The manual is under the PSF licence (copyright.html in the package);
docs/features.md names the version it was made from and the file's sha256.
"""
import argparse
import os
from html.parser import HTMLParser

SKIP = {"pre", "script", "style"}          # code examples and page machinery: not prose


class MainText(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
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
        elif tag == "div" and dict(attrs).get("role") == "main":
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--html", default="/usr/share/doc/python3.11/html")
    args = ap.parse_args()
    pages = sorted(os.path.join(d, f) for d, _, fs in os.walk(args.html) for f in fs
                   if f.endswith(".html") and "/_" not in d[len(args.html):] and "/c-api" not in d[len(args.html):])
    if not pages:
        raise SystemExit(f"{args.html}: no HTML pages (apt-get install python3.11-doc)")
    with open(args.out, "w", encoding="utf-8") as out:
        for p in pages:
            parser = MainText()
            with open(p, encoding="utf-8") as f:
                parser.feed(f.read())
            out.write(parser.text() + "\n")
    print(f"{args.out}: {len(pages)} pages, {os.path.getsize(args.out):,} bytes")


if __name__ == "__main__":
    main()
