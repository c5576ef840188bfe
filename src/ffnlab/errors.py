"""One exception family per kind of bad input. The CLI prints str(err) as one line and exits 1.

Messages name the file / tensor / field, what was expected and what was found.
"""


class FfnlabError(Exception):
    """Base class: anything the user can fix (a file, a flag, a field)."""


class ModelFileError(FfnlabError):
    """A model file or directory that cannot be read: missing, corrupt, truncated, unsupported."""


class DataError(FfnlabError):
    """A data/text file that cannot be used (empty, not UTF-8, too small)."""


class UsageError(FfnlabError):
    """A flag or argument with a value that makes no sense."""
