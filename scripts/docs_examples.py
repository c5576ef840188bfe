"""Run every example command of README.md and docs/*.md, and rewrite its output from the real run.

    python3 scripts/docs_examples.py            # run them all, rewrite the outputs in place
    python3 scripts/docs_examples.py --check    # run them all, change nothing, exit 1 if one fails
    python3 scripts/docs_examples.py --list     # print the commands found

An example is a code block (``` fenced, or indented four spaces) whose lines start with `$ `:
    $ ffnlab shapes --preset gpt2          <- a command (a trailing `\\` continues it)
    MLP of openai-community/gpt2: ...      <- its output: the lines up to the next `$ ` or the end
                                              of the block (blank lines inside included)
A block right after a line `<!-- examples: not run (why) -->` is not run (its inputs are made
elsewhere, e.g. by the fuzz suite). A command followed by `# a comment` shows a selection of its output (selected keys, one table
row, ...): it is run and must succeed, but its output lines are left as written. Every other
`ffnlab` command's output is replaced by what the command prints now (stdout and stderr, as
a terminal shows them). Commands run in order, per file, in one scratch
directory (so `train --out x` then `export x` works) that holds a link to the repository's
docs/, so `docs/data/...` paths resolve; `ffnlab` is this checkout's (sys.executable -m
ffnlab.cli.main).

A line `_Timings above: ..._` says where the timings of the examples before it (run's ffnlab_perf
lines, tokens/s) come from; a rewrite puts this machine's CPU, load average, commit and date in it.

tests/engines/test_docs_examples.py imports find_examples() and runs every command with small sizes
(SMALL below), so a doc example that stops working fails a test.
"""
import argparse
import datetime
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md"] + sorted(f"docs/{f}" for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))

# flags the test shrinks so every example runs in seconds (the rewrite uses the docs' own values)
SMALL = {"--steps": "2", "--seeds": "1", "--mult": "1", "--ffn": "gelu,swiglu", "--eval-every": "1",
         "--eval-batches": "1", "--calib-chunks": "1", "--eval-chunks": "1", "--chunks": "1", "--max-windows": "2",
         "-n": "4", "--batch": "2", "--seq-len": "16", "--units": "2", "--samples": "1"}


@dataclass
class Example:
    path: str                 # the doc, relative to the repository
    line: int                 # 0-based index of the `$ ` line in the file
    command: str              # the shell command (continuations joined)
    comment: str              # text after ` # `, or ""
    indent: str               # the block's indentation ("" fenced, "    " indented)
    out_start: int            # first output line index
    out_end: int              # one past the last output line
    output: list = field(default_factory=list)

    @property
    def rewritable(self) -> bool:
        return not self.comment and re.search(r"(^|\|\s*)ffnlab ", self.command) is not None


def _split_comment(cmd):
    """'ffnlab x --json   # selected keys' -> ('ffnlab x --json', 'selected keys'); a # inside quotes stays."""
    quote = None
    for i, c in enumerate(cmd):
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and i and cmd[i - 1].isspace():
            return cmd[:i].rstrip(), cmd[i + 1:].strip()
    return cmd, ""


def _output_end(lines, j, indent):
    """One past a command's last output line: the next `$ ` line or the end of the block (a fence,
    or for an indented block the first line that is not indented); blank lines inside count."""
    end = j
    while j < len(lines) and not lines[j].startswith("```"):
        line = lines[j]
        if line.strip() and (not line.startswith(indent) or line[len(indent):].startswith("$ ")):
            break
        j += 1
        if line.strip():
            end = j                                   # trailing blank lines are not output
    return end


def find_examples(path) -> list[Example]:
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        lines = f.read().split("\n")
    out, i, fenced, skip = [], 0, False, False
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            fenced = not fenced
            prev = next((x for x in reversed(lines[:i]) if x.strip()), "")
            skip = fenced and prev.strip().startswith("<!-- examples: not run")
            i += 1
            continue
        indent = "" if fenced else ("    " if line.startswith("    $ ") else None)
        if indent is None or not line[len(indent):].startswith("$ ") or (fenced and skip):
            i += 1
            continue
        start, cmd = i, line[len(indent) + 2:]
        while cmd.endswith("\\") and i + 1 < len(lines):
            i += 1
            cmd = cmd[:-1].rstrip() + " " + lines[i].strip()
        cmd, comment = _split_comment(cmd)
        j = _output_end(lines, i + 1, indent)
        out.append(Example(path, start, cmd, comment, indent, i + 1, j, [x[len(indent):] for x in lines[i + 1:j]]))
        i = j
    return out


def all_examples() -> list[Example]:
    return [e for p in DOCS for e in find_examples(p)]


SHELL_OPERATORS = {"|", "&&", "||", ";", ">", ">>", "<", "2>&1"}
HEAVY = ("train", "ablate", "perplexity", "prune", "neurons", "run", "causal-trace")


def shell_command(cmd, small=False) -> str:
    """The command as run: each `ffnlab` -> this checkout's module; with small, SMALL's flag values
    for the commands that train or scan (HEAVY). Pipes and other shell operators stay as they are."""
    words, sub = shlex.split(cmd), None
    out = []
    for i, w in enumerate(words):
        if w in SHELL_OPERATORS:
            sub = None
            out.append(w)
            continue
        if w == "ffnlab":
            sub = words[i + 1] if i + 1 < len(words) else None
            out += [sys.executable, "-m", "ffnlab.cli.main"]
            continue
        prev = words[i - 1] if i else ""
        if small and sub in HEAVY and prev in SMALL and w != "-1":
            w = SMALL[prev]
        out.append(shlex.quote(w))
    return " ".join(out)


def scratch_dir():
    d = tempfile.mkdtemp(prefix="ffnlab-docs-")
    os.symlink(os.path.join(ROOT, "docs"), os.path.join(d, "docs"))
    os.symlink(os.path.join(ROOT, "README.md"), os.path.join(d, "README.md"))
    return d


def run_example(e: Example, cwd, small=False, timeout=1800) -> subprocess.CompletedProcess:
    """-> CompletedProcess; .stdout holds stdout and stderr merged in the order they were written
    (PYTHONUNBUFFERED), as a terminal shows them."""
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
               COLUMNS="120", PYTHONUNBUFFERED="1")
    return subprocess.run(shell_command(e.command, small), shell=True, cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)


def expected_rc(e: Example) -> int:
    """1 when the documented output is an error line (the example shows a refusal), else 0."""
    return 1 if any(": error: " in x for x in e.output[-1:]) else 0


# the line under a doc's examples that says where their timings come from (see the module docstring)
STAMP = re.compile(r"^_Timings above: .*_$")


def timing_stamp(load_average) -> str:
    """-> '_Timings above: <CPU>, <n> CPUs, load average <l> at the start, commit <c>, <date>._' for this
    machine and checkout: a doc's timings mean nothing without the machine and its load behind them."""
    spec = importlib.util.spec_from_file_location("machine", os.path.join(ROOT, "bench", "machine.py"))
    machine = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(machine)
    git = ["git", "-C", ROOT]
    commit = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    # only the code's changes count: the rewrite itself changes the docs
    dirty = subprocess.run(git + ["status", "--porcelain", "--", "src"], capture_output=True, text=True).stdout
    commit = (commit or "unknown") + (" with changes to src/" if dirty.strip() else "")
    date = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    return (f"_Timings above: {machine.cpu_model()}, {os.cpu_count()} CPUs, load average {load_average:.1f} at the "
            f"start, commit {commit}, {date}._")


def rewrite(path, done, stamp=None):
    """Replace the outputs of the rewritable examples of one file with done[line] (lists of lines), and
    with stamp (a timing_stamp()) every `_Timings above: ..._` line."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        lines = f.read().split("\n")
    for e in sorted(find_examples(path), key=lambda e: -e.line):          # bottom up: indices stay valid
        if e.line in done:
            lines[e.out_start:e.out_end] = [(e.indent + x).rstrip() for x in done[e.line]]
    if stamp:
        lines = [stamp if STAMP.match(x) else x for x in lines]
    with open(os.path.join(ROOT, path), "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="run every example, change nothing")
    ap.add_argument("--list", action="store_true", help="print the examples found and exit")
    ap.add_argument("--small", action="store_true", help="with --check: shrink sizes as the test does")
    ap.add_argument("files", nargs="*", help="only these docs (default: README.md and docs/*.md)")
    args = ap.parse_args()
    files = args.files or DOCS
    failed = 0
    for path in files:
        examples = find_examples(path)
        if args.list:
            for e in examples:
                print(f"{path}:{e.line + 1}: {'rewrite' if e.rewritable else 'run    '} {e.command}")
            continue
        cwd, done, load = scratch_dir(), {}, os.getloadavg()[0]
        for e in examples:
            r = run_example(e, cwd, small=args.small)
            ok = r.returncode == expected_rc(e)
            print(f"{path}:{e.line + 1}: {'ok  ' if ok else 'FAIL'} {e.command}", file=sys.stderr)
            if not ok:
                failed += 1
                print(r.stdout[-2000:], file=sys.stderr)
            elif e.rewritable:
                text = r.stdout.rstrip("\n")
                done[e.line] = text.split("\n") if text else []
        if not args.check and not args.list:
            rewrite(path, done, timing_stamp(load) if done else None)
        shutil.rmtree(cwd, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
