"""The fuzz harness: run many malformed model files through the CLI and check one property.

    results = run_cases(cases, tmp_path)        # cases: [{"name", "argv"}]
    assert_clean(cases, results)

Property: each case ends in a clean one-line error -- exit code 1, one stderr line
"ffnlab CMD: error: ..." (after at most the command's own "ffnlab CMD: ..." notices), no
traceback -- or in a normal run (exit code 0). Never a traceback, a hang
(no result within CASE_SECONDS) or unbounded memory (the driver runs under RLIMIT_AS = LIMIT_BYTES,
so a runaway allocation surfaces as a MemoryError traceback, which fails the property).

Cases run in batches inside tests/reference/fuzz_driver.py; when one hangs or kills its process, the parent
records it and restarts the driver on the cases after it.
"""
import json
import os
import select
import subprocess
import sys
import time

DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fuzz_driver.py")
LIMIT_BYTES = 4 << 30
CASE_SECONDS = 30.0
STARTUP_SECONDS = 60.0


def run_cases(cases, tmp_dir, case_seconds=CASE_SECONDS):
    """-> {case index: result dict} for every case (hangs and crashes included)."""
    results, todo = {}, list(range(len(cases)))
    batch_no = 0
    while todo:
        batch_no += 1
        path = os.path.join(str(tmp_dir), f"fuzz-batch-{batch_no}.json")
        with open(path, "w") as f:
            json.dump([cases[i] for i in todo], f)
        done = _run_batch(path, todo, results, case_seconds)
        todo = todo[done:]
    return results


def _run_batch(path, todo, results, case_seconds):
    """Run one driver on todo; -> how many of todo got a verdict."""
    env = {**os.environ, "PYTHONWARNINGS": "default", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen([sys.executable, DRIVER, path, str(LIMIT_BYTES)], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, env=env)
    fd, buf, current = p.stdout.fileno(), b"", None
    deadline = time.monotonic() + STARTUP_SECONDS
    try:
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([fd], [], [], max(left, 0))
            if not ready:                                         # the current case hangs
                p.kill()
                p.wait()
                if current is None:
                    raise RuntimeError("the fuzz driver did not start")
                results[todo[current]] = {"hang": True}
                return current + 1
            chunk = os.read(fd, 1 << 16)
            if not chunk:                                         # the driver died (or finished)
                rc = p.wait()
                if current is not None and todo[current] not in results:
                    results[todo[current]] = {"crash": rc}
                    return current + 1
                return len(todo) if current is None or current + 1 == len(todo) else current + 1
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                if line.startswith(b"START "):
                    current = int(line[6:])
                    deadline = time.monotonic() + case_seconds
                elif line.startswith(b"RESULT "):
                    res = json.loads(line[7:])
                    results[todo[res["i"]]] = res
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def verdict(case, res):
    """None when the case satisfies the property, else what went wrong."""
    if res is None:
        return "no result"
    if res.get("hang"):
        return f"hang (no result in {CASE_SECONDS:g} s)"
    if "crash" in res:
        return f"process died with exit code {res['crash']}"
    if res.get("exception"):
        return "traceback: " + res["exception"].strip().splitlines()[-1][:300]
    lines = [ln for ln in res["stderr"].splitlines() if ln.strip()]
    if res["rc"] == 0:
        return None
    cmd = case["argv"][0]
    # one error line, last; before it only the command's own one-line notices (e.g. a template fallback)
    if res["rc"] == 1 and lines and lines[-1].startswith(f"ffnlab {cmd}: error: ") \
            and all(ln.startswith(f"ffnlab {cmd}: ") and ": error: " not in ln for ln in lines[:-1]) \
            and not any("Traceback" in ln for ln in lines):
        return None
    return f"exit code {res['rc']}, stderr {lines[:4]}"


def assert_clean(cases, results, min_errors=0):
    bad = [(c["name"], verdict(c, results.get(i))) for i, c in enumerate(cases)]
    bad = [(n, v) for n, v in bad if v]
    n_err = sum(1 for r in results.values() if r.get("rc") == 1)
    assert not bad, f"{len(bad)} of {len(cases)} cases not clean:\n" + "\n".join(f"  {n}: {v}" for n, v in bad[:30])
    assert n_err >= min_errors, f"only {n_err} of {len(cases)} cases were refused (the mutations stopped biting?)"
    return n_err
