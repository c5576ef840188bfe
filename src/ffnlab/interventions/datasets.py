"""Prompt datasets as work units: one unit is one line of a `--prompts FILE.jsonl`, run on its own:
  causal-trace  {"prompt", "subject", "target"} (target optional)    interventions/causal_trace.py
  patch         {"clean", "corrupt", "target", "foil"}               interventions/patching.py

The line is parsed on the worker, so a bad line (not JSON, a subject that is not in the prompt, a
target of two tokens) is that unit's failure, reported with its line number; the other prompts
complete. The average is ROME's "average indirect effect" (Meng et al. 2022, figure 2): prompts
differ in length, so each prompt's positions fall into six groups -- first subject token, middle
subject tokens, last subject token, first token after the subject, further tokens, last token --
and the indirect effect (restored p - corrupted p) is averaged within a group, then over prompts.
For patching, the "subject" is the span of positions where the clean and corrupt ids differ, and
the effect averaged is the restored fraction of the logit difference.
"""
import json

import numpy as np

from ..errors import DataError
from ..runtime.executor import Unit

GROUPS = ["first subject token", "middle subject tokens", "last subject token", "first subsequent token",
          "further tokens", "last token"]


def read_prompt_lines(path):
    """FILE.jsonl -> [(line number, text)] of its non-empty lines (parsed later, in the units)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = [(i + 1, line.strip()) for i, line in enumerate(f) if line.strip()]
    except FileNotFoundError:
        raise DataError(f"--prompts {path}: no such file") from None
    except UnicodeDecodeError:
        raise DataError(f"--prompts {path}: not UTF-8 text") from None
    if not lines:
        raise DataError(f"--prompts {path}: no prompt lines")
    return lines


def prompt_units(lines):
    return [Unit(f"line-{n:06d}", {"line": n, "text": text}) for n, text in lines]


def parse_line(path, n, text):
    """-> (prompt, subject, target or None), or DataError naming the file and the line."""
    try:
        d = json.loads(text)
    except ValueError as e:
        raise DataError(f"{path} line {n}: not JSON ({e})") from None
    if not isinstance(d, dict) or not isinstance(d.get("prompt"), str) or not isinstance(d.get("subject"), str):
        raise DataError(f"{path} line {n}: expected {{\"prompt\": ..., \"subject\": ..., \"target\": ...}}")
    target = d.get("target")
    if target is not None and not isinstance(target, str):
        raise DataError(f"{path} line {n}: \"target\" must be a string")
    return d["prompt"], d["subject"], target


def parse_patch_line(path, n, text):
    """-> (clean, corrupt, target, foil), or DataError naming the file and the line."""
    try:
        d = json.loads(text)
    except ValueError as e:
        raise DataError(f"{path} line {n}: not JSON ({e})") from None
    keys = ("clean", "corrupt", "target", "foil")
    if not isinstance(d, dict) or not all(isinstance(d.get(k), str) for k in keys):
        raise DataError(f"{path} line {n}: expected {{\"clean\": ..., \"corrupt\": ..., \"target\": ..., "
                        f"\"foil\": ...}} (four strings)")
    return tuple(d[k] for k in keys)


def differing_span(clean, corrupt):
    """-> (first, last) positions where two id sequences of one length differ."""
    diff = np.flatnonzero(np.asarray(clean) != np.asarray(corrupt))
    return int(diff[0]), int(diff[-1])


def patch_unit(model, params, payload):
    """One line -> its patching result, as `ffnlab patch --json` prints it, with the corrupted span."""
    from .common import one_token, prompt_ids, token_strings
    from .patching import patch
    where = f"{params['path']} line {payload['line']}"
    clean_text, corrupt_text, target_text, foil_text = parse_patch_line(params["path"], payload["line"],
                                                                        payload["text"])
    try:
        clean, corrupt = prompt_ids(model, clean_text), prompt_ids(model, corrupt_text)
        target, foil = one_token(model, target_text, "target"), one_token(model, foil_text, "foil")
        if len(clean) == len(corrupt) and list(clean) == list(corrupt):
            raise DataError("clean and corrupt give the same tokens: nothing is corrupted")
        r = patch(model, clean, corrupt, target, foil, params["node"])
    except Exception as e:                               # a UsageError of a flag's wording: name the line instead
        raise DataError(f"{where}: {e}") from None
    return {"line": payload["line"], "node": r["node"], "tokens": token_strings(model, clean),
            "corrupt_tokens": token_strings(model, corrupt), "target": model.tokenizer.decode([target]),
            "foil": model.tokenizer.decode([foil]), "subject": list(differing_span(clean, corrupt)),
            "effect": r["effect"], "clean": r["clean"], "corrupt": r["corrupt"]}


def causal_trace_unit(model, params, payload):
    """One prompt line -> its causal trace, as `ffnlab causal-trace --json` prints it."""
    from .causal_trace import causal_trace, subject_range
    from .common import one_token, prompt_ids, token_strings
    where = f"{params['path']} line {payload['line']}"
    prompt, subject, target = parse_line(params["path"], payload["line"], payload["text"])
    try:
        ids = prompt_ids(model, prompt)
        tokens = token_strings(model, ids)
        first, last = subject_range(tokens, prompt, subject)
        target_id = one_token(model, target, "target") if target is not None else None
    except DataError:
        raise
    except Exception as e:                               # a UsageError of a flag's wording: name the line instead
        raise DataError(f"{where}: {e}") from None
    r = causal_trace(model, ids, first, last, target_id, params["noise"], params["samples"], params["window"],
                     params["seed"])
    return {"line": payload["line"], "prompt": prompt, "tokens": tokens, "subject": [first, last],
            "target": model.tokenizer.decode([r["target_id"]]), "target_id": r["target_id"], "clean_p": r["clean_p"],
            "corrupt_p": r["corrupt_p"], "hidden": r["hidden"], "mlp": r["mlp"], "attn": r["attn"]}


def position_groups(T, first, last):
    """-> [T] group index (GROUPS) of each position of a prompt with subject tokens first..last."""
    g = np.full(T, 4)                                    # further tokens
    g[first + 1:last] = 1
    g[first], g[last] = 0, 2                             # a one-token subject is its first and its last: last wins
    if last + 1 < T:
        g[last + 1] = 3
    g[T - 1] = 5
    return g


def average_by_group(results, kind, baseline):
    """[per-prompt result] in unit order -> [n_layer][6]: for each position group (GROUPS), the mean over
    prompts of each prompt's mean of (result[kind] - baseline(result)) over its positions in the group
    (NaN where no prompt has such a position)."""
    total, count = None, None
    for r in results:
        ie = np.asarray(r[kind]) - baseline(r)                           # [n_layer, T]
        g = position_groups(ie.shape[1], *r["subject"])
        per = np.full((ie.shape[0], len(GROUPS)), np.nan)
        for k in range(len(GROUPS)):
            if np.any(g == k):
                per[:, k] = ie[:, g == k].mean(axis=1)
        has = ~np.isnan(per)
        total = np.where(has, per, 0.0) + (0.0 if total is None else total)
        count = has.astype(int) + (0 if count is None else count)
    with np.errstate(invalid="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan).tolist()


def average_indirect_effect(results):
    """Causal traces -> {kind: [n_layer][6] average indirect effect (restored p - corrupted p)}, the prompts
    counted and the group names."""
    out = {kind: average_by_group(results, kind, lambda r: r["corrupt_p"]) for kind in ("hidden", "mlp", "attn")}
    out["prompts"] = len(results)
    out["groups"] = GROUPS
    return out


def average_patch_effect(results):
    """Patching results -> {"effect": [n_layer][6] mean restored fraction per group of positions, where the
    corrupted span plays the subject}, the prompts counted and the group names."""
    return {"effect": average_by_group(results, "effect", lambda r: 0.0), "prompts": len(results), "groups": GROUPS}
