"""Run ffnlab CLI commands one after another in this process, under an address-space limit, and
report each outcome as one JSON line. Used by tests/reference/fuzz.py (the parent), which kills this process
when a case runs past its time and starts a new one for the cases after it.

    python tests/reference/fuzz_driver.py CASES.json LIMIT_BYTES
      -> on stdout, per case:  START i   then   RESULT {"i", "rc", "stdout", "stderr", "exception", "seconds"}

One process for many cases: the import of numpy/tokenizers/ffnlab (~2 s) dominates a tiny model's
load and run (~0.1 s), and the CLI's main() is what `ffnlab` itself calls.
"""
import contextlib
import io
import json
import resource
import sys
import time
import traceback


def main():
    cases_file, limit = sys.argv[1], int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    with open(cases_file) as f:
        cases = json.load(f)
    from ffnlab.cli.main import main as cli

    proto = sys.__stdout__
    for i, case in enumerate(cases):
        proto.write(f"START {i}\n")
        proto.flush()
        out, err = io.StringIO(), io.StringIO()
        res = {"i": i, "rc": None, "exception": None}
        t0 = time.perf_counter()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                res["rc"] = cli(case["argv"])
        except SystemExit as e:                 # argparse
            res["rc"] = e.code
        except BaseException:                   # anything main() let through is a traceback in the CLI
            res["exception"] = traceback.format_exc()[-3000:]
        res.update(stdout=out.getvalue()[-500:], stderr=err.getvalue()[-3000:], seconds=time.perf_counter() - t0)
        proto.write("RESULT " + json.dumps(res) + "\n")
        proto.flush()


if __name__ == "__main__":
    main()
