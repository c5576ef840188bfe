"""Picture and page outputs (PNG through matplotlib, self-contained HTML): checked before the work.

A command that computes for a minute and only then finds it cannot write its picture has wasted
the minute and, worse, lost the table it computed. So every command with a --png/--html/--out
option calls check_png / check_page on it before loading a model, prints its text result, and
writes the files last (written() turns a failed write into one line).

matplotlib is a dependency of ffnlab (pyproject.toml); the import check still stands because a
broken or partial install is the usual way it goes missing.
"""
import contextlib
import os

from .errors import UsageError


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed), or one line saying what is missing."""
    try:
        import matplotlib
    except ImportError:
        raise UsageError("writing a PNG needs matplotlib, which ffnlab's install brings: pip install matplotlib "
                         "(--json needs nothing)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def model_label(model):
    """The model's file or folder name, for a picture's title (the full path is in the JSON)."""
    return os.path.basename(os.path.normpath(str(model.source))) if model.source else "model"


def check_writable(path, flag):
    """path's folder exists and accepts a new file; path is not a folder."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise UsageError(f"{flag} {path}: is a folder; give a file name")
    if not os.path.isdir(folder):
        raise UsageError(f"{flag} {path}: no folder {folder}")
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise UsageError(f"{flag} {path}: cannot write there (permission denied)")


def check_folder(path, flag):
    """path is a folder that exists or can be made (its nearest existing parent is writable)."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"{flag} {path}: is a file, not a folder")
    parent = os.path.abspath(path)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):                      # a/b/c where a is a file: makedirs would fail after the work
        raise UsageError(f"{flag} {path}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"{flag} {path}: cannot write there (permission denied)")


def check_png(path, flag):
    """Before the work: a PNG can be written to path (folder writable, matplotlib importable)."""
    if path is not None:
        check_writable(path, flag)
        pyplot()


def check_page(path, flag):
    """Before the work: an HTML page can be written to path."""
    if path is not None:
        check_writable(path, flag)


@contextlib.contextmanager
def written(path, flag):
    """Wraps the writing of one file: an OSError (disk full, folder removed meanwhile) is one line."""
    try:
        yield
    except OSError as e:
        raise UsageError(f"{flag} {path}: could not write it ({e.strerror or e})") from None
