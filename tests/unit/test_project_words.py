"""The project speaks of itself in dates, commits, machines and figures, never in the words of its own
process: "session 11", "issue 12", "floor (issue 13)", "this VM" tell a reader nothing, because the
reader cannot open the work session or the tracker entry they point at. Every tracked text file
(`git ls-files`, binary files skipped) is searched; a hit fails with file:line.

Chosen: a number written as "#123" ("GitHub issue #123", llama.cpp's "PR #4567") is upstream's and
may stay, next to its link; a bare "issue 12" is the project's own tracker and may not. Ordinary
prose passes: "a test session", "once per session", "the issue is", "issue forth".
"""
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
THIS = os.path.relpath(os.path.abspath(__file__), ROOT)          # quotes the words to show what is caught

PROCESS_WORDS = re.compile(
    r"\bsessions?\s+\d+"                   # session 11, Session 9, sessions 10-11
    r"|\bthis\s+session\b"                 # "before this session": which one?
    r"|\bissues?\s+\d+"                    # issue 12, issues 3 and 4, (issue 13)
    r"|\bfloors?\s+\(issue"                # floor (issue ...
    r"|\bthis\s+VM\b",                     # this VM: name the CPU
    re.IGNORECASE)


def tracked_text_files():
    """-> the repository's tracked files that are text (no NUL byte in the first 8 KB, UTF-8)."""
    listing = subprocess.run(["git", "-C", ROOT, "ls-files", "-z"], capture_output=True, text=True)
    if listing.returncode != 0:
        pytest.skip(f"not a git checkout: {listing.stderr.strip()}")
    names = listing.stdout.split("\0")
    for name in filter(None, names):
        path = os.path.join(ROOT, name)
        if name == THIS or not os.path.isfile(path):     # a file deleted in the work tree is not there to read
            continue
        with open(path, "rb") as f:
            data = f.read()
        if b"\0" in data[:8192]:
            continue
        try:
            yield name, data.decode("utf-8")
        except UnicodeDecodeError:
            continue


def process_words(text):
    """-> [(line number, the words found, the line)] for one file's text."""
    return [(i, m.group(0), line.strip()) for i, line in enumerate(text.split("\n"), 1)
            for m in PROCESS_WORDS.finditer(line)]


@pytest.mark.parametrize("words", ["session 11", "Session 9", "sessions 10-11", "issue 12", "issues 3 and 4",
                                   "(issue 13)", "this VM", "floor (issue", "This VM's speed",
                                   "before this session"])
def test_process_words_are_caught(words):
    assert process_words(f"Gemma 3 prefill 1.7x ({words}).")


@pytest.mark.parametrize("prose", ["loaded once per test session", "cached for the session", "the issue is",
                                   "GitHub issue #123", "upstream PR #4567", "have found issue. Hear me",
                                   "a VM's vCPU", "sessionless 3"])
def test_ordinary_prose_passes(prose):
    assert not process_words(prose)


def test_no_tracked_file_speaks_of_the_projects_process():
    hits = [f"{name}:{i}: '{words}' in: {line[:140]}"
            for name, text in tracked_text_files() for i, words, line in process_words(text)]
    assert not hits, ("name the date, the commit and the CPU instead of the project's process words:\n"
                      + "\n".join(hits))
