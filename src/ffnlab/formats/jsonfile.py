"""Reading the small JSON files that sit beside the weights, and checking their fields' types.

    d = read_json_object(path, "HF config")     # a dict, or ModelFileError naming the file
    n = field(d, "hidden_size", int, path)      # typed: a string, list, null or bool where an int belongs fails

Every failure is one ModelFileError (or ConfigError) line naming the file and the field: a FIFO or
a directory where a file belongs, a file too large to be what it claims, invalid UTF-8 or JSON, a
5,000-digit integer (Python refuses to convert it), nesting deep enough to exhaust the parser.
"""
import json
import math
import os
import stat

from ..config import ConfigError
from ..errors import ModelFileError

MAX_JSON_BYTES = 1 << 30        # tokenizer.json files of real models are tens of MB
_KIND = {int: "an integer", float: "a number", bool: "true or false", str: "a string", dict: "an object",
         list: "a list"}


def check_regular_file(path, what="file"):
    """A regular file (not a FIFO, device or directory, which would block or fail on read) -> its size."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise ModelFileError(f"{path}: cannot read the {what} ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise ModelFileError(f"{path}: the {what} is not a regular file")
    return st.st_size


def read_json(path, what="JSON file", max_bytes=MAX_JSON_BYTES):
    """-> the parsed JSON value of a regular file of at most max_bytes."""
    size = check_regular_file(path, what)
    if size > max_bytes:
        raise ModelFileError(f"{path}: the {what} has {size} bytes, more than the {max_bytes} such a file can need")
    try:
        with open(path, "rb") as f:
            return json.loads(f.read().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ModelFileError(f"{path}: the {what} is not UTF-8 ({e.reason} at byte {e.start})") from None
    except RecursionError:
        raise ModelFileError(f"{path}: the {what} is nested too deeply to parse") from None
    except ValueError as e:                              # JSONDecodeError, or an integer of > 4300 digits
        raise ModelFileError(f"{path}: the {what} is not valid JSON ({str(e)[:120]})") from None
    except OSError as e:
        raise ModelFileError(f"{path}: cannot read the {what} ({e.strerror})") from None


def read_json_object(path, what="JSON file", max_bytes=MAX_JSON_BYTES) -> dict:
    d = read_json(path, what, max_bytes)
    if not isinstance(d, dict):
        raise ModelFileError(f"{path}: the {what} must be a JSON object, found {type(d).__name__}")
    return d


def field(d, key, kind, path, default=..., lo=None, hi=None, error=ConfigError):
    """d[key] checked to be of `kind` (int, float, bool, str, dict, list; a tuple for several) and, for
    numbers, finite and within [lo, hi]. Missing or null -> default (missing without one: an error)."""
    v = d.get(key)
    if v is None:
        if default is ...:
            raise error(f"{path}: missing field '{key}'")
        return default
    kinds = kind if isinstance(kind, tuple) else (kind,)
    ok = any(isinstance(v, k) and not (k in (int, float) and isinstance(v, bool)) for k in kinds)
    if float in kinds and isinstance(v, int) and not isinstance(v, bool):
        ok, v = True, float(v) if int not in kinds else v
    if not ok:
        want = " or ".join(_KIND[k] for k in kinds)
        raise error(f"{path}: field '{key}' must be {want}, found {json.dumps(v)[:60]}")
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        if isinstance(v, float) and not math.isfinite(v):
            raise error(f"{path}: field '{key}' must be finite, found {v}")
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise error(f"{path}: field '{key}' = {v} is outside [{lo}, {hi}]")
    return v
