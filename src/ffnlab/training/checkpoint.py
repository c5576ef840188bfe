"""Writing checkpoints so that a crash at any instant leaves a usable one.

Every file is written atomically: bytes go to a temp file in the same directory, which is
fsync'ed, renamed over the target with os.replace (atomic on POSIX), and the directory is
fsync'ed so the rename itself survives a power cut. A reader sees the old file or the new one,
never half of one.

A set of files is not atomic, though, so the resume state has one commit record:
  state-NNNNNN.safetensors   weights + AdamW moments at step N   (written first)
  model.safetensors          the same weights, for `ffnlab run` / export
  trainer.json               step N, RNG state, optimizer scalars, loss history and the name
                             of its state file  (written last: the commit)
Resuming reads trainer.json and then only the state file it names, so a crash between any
two writes resumes from the previous commit. Old state files are deleted after the commit.

The file layout for inference (ffnlab.json, model.safetensors, tokenizer.json) is read by
formats/checkpoint.py.
"""
from __future__ import annotations

import fnmatch
import glob
import json
import os
import re
import signal

import numpy as np

from ..errors import ModelFileError, UsageError
from ..formats.checkpoint import FORMAT, META_FILE, TOKENIZER_FILE, VERSION, WEIGHTS_FILE
from ..formats.jsonfile import field, read_json_object

TRAINER_FILE = "trainer.json"

# Test hook: "PATTERN:K" kills this process with SIGKILL on the K-th write of a file whose name
# matches PATTERN (fnmatch), after its temp file is complete and before the rename -- the worst
# moment for a crash. Tests use it; nothing else sets it.
KILL_HOOK_ENV = "FFNLAB_TEST_KILL_BEFORE_RENAME"
_writes: dict = {}


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path, data: bytes):
    """Write bytes to path so that path is always either the old or the new content."""
    def write(tmp):
        with open(tmp, "wb") as f:
            f.write(data)
    _atomic(path, write)


def atomic_write_safetensors(path, arrays: dict, meta: dict | None = None):
    """arrays as a safetensors file at path, atomically (as atomic_write), written by safetensors from the
    arrays themselves: one copy of each tensor in memory at a time (safetensors.numpy.save's bytes hold two)"""
    from safetensors.numpy import save_file
    _atomic(path, lambda tmp: save_file({n: np.ascontiguousarray(a) for n, a in arrays.items()}, tmp, metadata=meta))


def _atomic(path, write):
    """write(tmp) makes the new content in a temporary file beside path; it is synced, then renamed onto path"""
    d = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(d, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    try:
        write(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        _maybe_die(os.path.basename(path))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(d)


def _maybe_die(name):
    hook = os.environ.get(KILL_HOOK_ENV)
    if not hook:
        return
    pattern, k = hook.rsplit(":", 1)
    if fnmatch.fnmatch(name, pattern):
        _writes[pattern] = _writes.get(pattern, 0) + 1
        if _writes[pattern] == int(k):
            os.kill(os.getpid(), signal.SIGKILL)


def atomic_write_json(path, obj):
    atomic_write(path, (json.dumps(obj, indent=1) + "\n").encode("utf-8"))


def check_writable(out):
    """Create OUT (and parents) or fail with one line naming it."""
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--out {out}: cannot create the directory ({e.strerror})") from None
    if not os.path.isdir(out):
        raise UsageError(f"--out {out}: exists and is not a directory")
    probe = os.path.join(out, f".write-test-{os.getpid()}")
    try:
        with open(probe, "wb") as f:
            f.write(b"ok")
        os.unlink(probe)
    except OSError as e:
        raise UsageError(f"--out {out}: directory is not writable ({e.strerror})") from None


def write_model_files(out, cfg, tok, tok_meta, extra: dict | None = None):
    """ffnlab.json and tokenizer.json: written once, when training starts."""
    meta = {"format": FORMAT, "version": VERSION, "config": cfg.to_dict(), "tokenizer": tok_meta, **(extra or {})}
    atomic_write(os.path.join(out, TOKENIZER_FILE), tok.tk.to_str().encode("utf-8"))
    atomic_write_json(os.path.join(out, META_FILE), meta)


def save_state(out, step, params, opt, rng, trainer: dict):
    """Commit the resume state of `step` (see the module docstring for the write order)."""
    state_name = f"state-{step:06d}.safetensors"
    atomic_write_safetensors(os.path.join(out, state_name), {**params, **opt.state_arrays()}, {"step": str(step)})
    atomic_write_safetensors(os.path.join(out, WEIGHTS_FILE), params, {"step": str(step)})
    record = {"step": step, "state_file": state_name, "rng": rng.bit_generator.state,
              "optimizer": opt.state_scalars(), **trainer}
    atomic_write_json(os.path.join(out, TRAINER_FILE), record)
    remove_old_states(out, state_name)


def remove_old_states(out, keep):
    """After a commit: the state files before it, and temp files a killed writer left."""
    for old in glob.glob(os.path.join(out, "state-*.safetensors")):
        if os.path.basename(old) != keep:
            os.unlink(old)
    for tmp in glob.glob(os.path.join(out, ".*.tmp-*")):
        os.unlink(tmp)


STATE_FILE_RE = re.compile(r"state-\d{6,}\.safetensors")


def read_trainer(out) -> dict | None:
    """The last committed trainer record, checked field by field, or None when OUT has none."""
    f = os.path.join(out, TRAINER_FILE)
    if not os.path.lexists(f):
        return None
    rec = read_json_object(f, "trainer record", 256 << 20)

    def need(key, kind, **kw):
        return field(rec, key, kind, f, error=ModelFileError, **kw)

    need("step", int, lo=0)
    need("train_seconds", float, lo=0)
    need("rng", dict)
    field(need("optimizer", dict), "t", int, f"{f}: optimizer", error=ModelFileError, lo=0)
    history = need("history", dict)
    for key in ("train", "grad_norm", "eval"):
        field(history, key, list, f"{f}: history", error=ModelFileError)
    # the state file is a bare name inside OUT: a path, or '..', would read another file
    if not STATE_FILE_RE.fullmatch(need("state_file", str)):
        raise ModelFileError(f"{f}: field 'state_file' must name a state-NNNNNN.safetensors file inside "
                             f"{out}, found {rec['state_file'][:80]!r}")
    return rec


def read_resume_meta(out) -> dict:
    """ffnlab.json of a checkpoint being resumed: its config and its training settings, checked."""
    from ..formats.checkpoint import read_meta
    meta = read_meta(out)
    f = os.path.join(out, META_FILE)
    field(meta, "config", dict, f, error=ModelFileError)
    field(meta, "tokenizer", dict, f, error=ModelFileError)
    train = field(meta, "train", dict, f, error=ModelFileError)
    settings = field(train, "settings", dict, f"{f}: train", error=ModelFileError)
    data = field(train, "data", dict, f"{f}: train", {}, error=ModelFileError)
    field(data, "path", str, f"{f}: train.data", None, error=ModelFileError)
    from dataclasses import fields as dc_fields

    from .settings import TrainSettings
    for fl in dc_fields(TrainSettings):                   # each saved setting has its field's type
        field(settings, fl.name, type(fl.default), f"{f}: train.settings", None, error=ModelFileError)
    return meta


def load_state(out, record, params, opt, rng):
    """Restore weights, AdamW moments and the batch RNG from a committed record (in place). Every
    array is checked against the model being resumed before anything is replaced."""
    from ..formats.safetensors_io import read_tensors, safetensors_index

    f = os.path.join(out, record["state_file"])
    if not os.path.lexists(f):
        raise ModelFileError(f"{os.path.join(out, TRAINER_FILE)}: its state file {record['state_file']} is missing")
    index = safetensors_index([f])
    want = {**{n: a.shape for n, a in params.items()},
            **{f"adam.{k}.{n}": a.shape for n, a in params.items() for k in ("m", "v")}}
    for name, shape in want.items():
        if name not in index:
            raise ModelFileError(f"{f}: tensor {name} is missing (a state file of another model?)")
        if tuple(index[name].shape) != tuple(shape):
            raise ModelFileError(f"{f}: tensor {name} has shape {list(index[name].shape)}, the model being "
                                 f"resumed has {list(shape)}")
    extra = sorted(set(index) - set(want))
    if extra:
        raise ModelFileError(f"{f}: tensor {extra[0]} is not part of the model being resumed (a state file of "
                             f"another model?)")
    arrays = {e.name: a for e, a in read_tensors(index[n] for n in want)}
    probe = np.random.default_rng()
    try:
        probe.bit_generator.state = record["rng"]
    except (TypeError, ValueError, KeyError) as e:
        raise ModelFileError(f"{os.path.join(out, TRAINER_FILE)}: field 'rng' is not a {type(probe.bit_generator).__name__} "
                             f"state ({e})") from None
    for n in params:
        params[n] = np.array(arrays[n], dtype=params[n].dtype)
    opt.load_state(arrays, record["optimizer"])
    rng.bit_generator.state = record["rng"]


def save_model(out, cfg, params, tok, tok_meta):
    """A checkpoint without trainer state (for `ffnlab run` and export): ffnlab.json,
    tokenizer.json and model.safetensors."""
    check_writable(out)
    write_model_files(out, cfg, tok, tok_meta)
    atomic_write_safetensors(os.path.join(out, WEIGHTS_FILE), params)
