"""An experiment's TOML file -> a checked Experiment. One file per claim, in experiments/.

    [experiment]   name, claim (quoted), kind = "train" | "compression" | "lora", data, seeds,
                   baseline (a variant name), compare = [["relu-x4", "gelu-x4"], ...]
    [model]        ModelConfig fields every variant shares (the Llama block of `ffnlab ablate`)
    [train]        TrainSettings fields every run shares (steps, batch, seq_len, lr, ...)
    [[variant]]    name, ffn, mult (d_ff = mult * d_model) or d_ff, match_params, ffn_bias, mlp_dropout
    [compression]  kind "compression": base, keeps, methods, recovery_steps, ..., smollm2 = {...}
                   (smollm2.recovery = {...}: a LoRA recovery fine-tune of each cut; a file with no
                   [[variant]] and no base runs the SmolLM2 half only)
    [lora]         kind "lora": base (a variant) or model (an installed model: smollm2), data,
                   data_chars, targets, ranks, train_tokens, finetune settings
    [quick]        overrides for --quick (a CI-sized grid): seeds, and [quick.train], [quick.<section>]

A bad field is one UsageError line naming the file and the field: `experiments/width.toml:
train.steps: expected a positive integer, got -3`.
"""
import copy
import os
import tomllib
from dataclasses import dataclass, field, fields

from ..config import ConfigError, ModelConfig
from ..errors import UsageError
from ..training.presets import default_d_ff
from ..training.trainer import TrainSettings

KINDS = ("train", "compression", "lora")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
EXPERIMENTS = os.path.join(ROOT, "experiments")

# the block every variant uses unless [model] says otherwise: `ffnlab ablate`'s
BASE_MODEL = dict(arch="llama", n_layer=2, d_model=64, n_head=4, norm="rmsnorm", positions="rope",
                  vocab_size=256, n_ctx=64, tie_embeddings=False)
VARIANT_FIELDS = {"name": str, "ffn": str, "mult": float, "d_ff": int, "match_params": bool,
                  "ffn_bias": bool, "mlp_dropout": float}
COMPRESSION_FIELDS = {"base": str, "keeps": list, "methods": list, "recovery_steps": int, "recovery_lr": float,
                      "recovery_warmup": int, "calib_windows": int, "references": list, "smollm2": dict}
LORA_FIELDS = {"base": str, "model": str, "data": str, "data_chars": int, "targets": list, "ranks": list,
               "train_tokens": list, "settings": dict}
RECOVERY_FIELDS = {"data": str, "data_chars": int, "targets": str, "r": int, "alpha": float, "seeds": int,
                   "methods": list, "settings": dict}
PRUNE_METHODS = ("activation", "naive")


@dataclass
class Variant:
    name: str
    config: ModelConfig
    mlp_dropout: float = 0.0


@dataclass
class Experiment:
    name: str
    path: str                   # the TOML file
    claim: str
    kind: str
    data: str                   # absolute path of the training text
    seeds: int
    variants: list              # [Variant]
    settings: TrainSettings     # shared by every training run
    baseline: str = ""
    compare: list = field(default_factory=list)      # [(a, b)]: a - b by seed
    compression: dict = field(default_factory=dict)
    lora: dict = field(default_factory=dict)
    quick: bool = False

    def variant(self, name):
        return next(v for v in self.variants if v.name == name)


def find(name):
    """NAME (a file experiments/NAME.toml) or a path to a .toml file -> its path."""
    if name.endswith(".toml") or os.sep in name:
        path = name
    else:
        path = os.path.join(EXPERIMENTS, f"{name}.toml")
    if not os.path.isfile(path):
        have = sorted(f[:-5] for f in os.listdir(EXPERIMENTS) if f.endswith(".toml")) if os.path.isdir(EXPERIMENTS) else []
        raise UsageError(f"no experiment {name!r} ({path} does not exist); experiments: {', '.join(have) or 'none'}")
    return path


def names():
    return sorted(f[:-5] for f in os.listdir(EXPERIMENTS) if f.endswith(".toml"))


def same_claim(name):
    """NAME of experiments/ -> (its claim, the experiments that test it: the same experiment.claim, e.g. one
    claim's model sizes and token budgets)"""
    claim = load(name, check_data=False).claim
    return claim, [n for n in names() if load(n, check_data=False).claim == claim]


class _Fields:
    """Reads one table, naming file and field in every error."""

    def __init__(self, path, table, prefix):
        self.path, self.table, self.prefix = path, table, prefix

    def fail(self, key, what, got):
        raise UsageError(f"{_rel(self.path)}: {self.prefix}{key}: expected {what}, got {got!r:.60}")

    def get(self, key, kind, default=None, required=False):
        if key not in self.table:
            if required:
                raise UsageError(f"{_rel(self.path)}: {self.prefix}{key}: missing (required)")
            return copy.deepcopy(default)
        v = self.table[key]
        ok = isinstance(v, kind) and not (kind in (int, float) and isinstance(v, bool))
        if kind is float and isinstance(v, int) and not isinstance(v, bool):
            v, ok = float(v), True
        if not ok:
            self.fail(key, {str: "a string", int: "an integer", float: "a number", bool: "true or false",
                            list: "a list", dict: "a table"}[kind], v)
        return v

    def variant_name(self, key, names, required=False):
        """a field naming one of the variants ("" when it is optional and not given)"""
        v = self.get(key, str, "", required)
        if (v or required) and v not in names:
            self.fail(key, f"a variant name ({', '.join(names)})", v)
        return v

    def unknown(self, known):
        extra = sorted(set(self.table) - set(known))
        if extra:
            raise UsageError(f"{_rel(self.path)}: {self.prefix}{extra[0]}: unknown field "
                             f"(known: {', '.join(sorted(known))})")


def _rel(path):
    p = os.path.abspath(path)
    return os.path.relpath(p, ROOT) if p.startswith(ROOT + os.sep) else path


def _merge(base, over):
    out = dict(base)
    for k, v in over.items():
        # an empty table replaces ([quick.compression] smollm2 = {}: none)
        out[k] = _merge(out[k], v) if v and isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load(name, quick=False, seeds=None, data=None, check_data=True) -> Experiment:
    """NAME or path -> Experiment; quick: apply [quick]; seeds, data: command-line overrides;
    check_data False: the training text need not exist here (--list)."""
    path = find(name)
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{_rel(path)}: not valid TOML ({e})") from None
    top = _Fields(path, doc, "")
    top.unknown({"experiment", "model", "train", "variant", "compression", "lora", "quick"})
    q = top.get("quick", dict, {}) if quick else {}
    if quick:
        _Fields(path, q, "quick.").unknown({"seeds", "train", "variants", "compression", "lora"})
        doc = _merge(doc, {k: v for k, v in q.items() if k in ("train", "compression", "lora")})
        top = _Fields(path, doc, "")
    exp = _Fields(path, top.get("experiment", dict, required=True), "experiment.")
    exp.unknown({"name", "claim", "kind", "data", "seeds", "baseline", "compare"})
    kind = exp.get("kind", str, "train")
    if kind not in KINDS:
        exp.fail("kind", f"one of {', '.join(KINDS)}", kind)
    data_path = data or exp.get("data", str, required=True)
    if not os.path.isabs(data_path):
        data_path = os.path.join(ROOT, data_path)
    if check_data and not os.path.isfile(data_path):
        raise UsageError(f"{_rel(path)}: experiment.data: {data_path}: no such file (give --data FILE)")
    n_seeds = seeds or _Fields(path, q, "quick.").get("seeds", int, None) or exp.get("seeds", int, 5)
    if n_seeds < 1:
        exp.fail("seeds", "a positive integer", n_seeds)

    settings = _settings(path, top.get("train", dict, {}))
    model = _Fields(path, top.get("model", dict, {}), "model.")
    model_fields = {f.name for f in fields(ModelConfig)}
    model.unknown(model_fields)
    base_model = {**BASE_MODEL, **model.table}
    variants = []
    tables = top.get("variant", list, [])
    keep = _Fields(path, q, "quick.").get("variants", list, None) if quick else None
    for i, t in enumerate(tables):
        if not isinstance(t, dict):
            top.fail(f"variant[{i}]", "a table", t)
        v = _variant(path, t, i, base_model)
        if keep is None or v.name in keep:
            variants.append(v)
    seen = set()
    for v in variants:
        if v.name in seen:
            raise UsageError(f"{_rel(path)}: variant {v.name!r}: the name is used twice")
        seen.add(v.name)
    names_ = [v.name for v in variants]
    baseline = exp.variant_name("baseline", names_)
    compare = []
    for i, pair in enumerate(exp.get("compare", list, [])):
        if quick and keep is not None and isinstance(pair, list) and not all(p in names_ for p in pair):
            continue                                  # a pair of variants --quick leaves out
        if not (isinstance(pair, list) and len(pair) == 2 and all(p in names_ for p in pair)):
            exp.fail(f"compare[{i}]", f"a pair of variant names ({', '.join(names_)})", pair)
        compare.append(tuple(pair))
    out = Experiment(name=exp.get("name", str, os.path.basename(path)[:-5]), path=os.path.abspath(path),
                     claim=exp.get("claim", str, required=True), kind=kind, data=os.path.abspath(data_path),
                     seeds=n_seeds, variants=variants, settings=settings, baseline=baseline, compare=compare,
                     quick=quick)
    if kind == "train" and not variants:
        raise UsageError(f"{_rel(path)}: variant: a train experiment needs at least one [[variant]]")
    if kind == "compression":
        out.compression = _compression(path, top.get("compression", dict, required=True), names_)
    if kind == "lora":
        out.lora = _lora(path, top.get("lora", dict, required=True), names_)
    return out


def _settings_table(path, table, where, cls, fixed, extra=None):
    """a table of `cls`'s fields (TrainSettings, FinetuneSettings), each read as its default's type;
    fixed: the fields the experiment sets itself"""
    t = _Fields(path, table, where + ".")
    known = {f.name: type(f.default) for f in fields(cls)} | (extra or {})
    t.unknown(set(known) - fixed)
    return {k: t.get(k, known[k]) for k in table}


def _validated(path, where, settings):
    """settings.validate(), its error naming the file and the table"""
    try:
        settings.validate()
    except UsageError as e:
        raise UsageError(f"{_rel(path)}: {where}: {e}") from None
    return settings


def _settings(path, table):
    given = _settings_table(path, table, "train", TrainSettings, {"seed", "schedule_steps"}, {"mlp_dropout": float})
    return _validated(path, "train", TrainSettings.from_dict({"eval_every": 50, "eval_batches": 8, "ckpt_every": 0,
                                                              **given}))


def _variant(path, t, i, base_model):
    f = _Fields(path, t, f"variant[{i}].")
    f.unknown(VARIANT_FIELDS)
    name = f.get("name", str, required=True)
    f.prefix = f"variant {name!r}: "
    ffn = f.get("ffn", str, required=True)
    d_model = base_model["d_model"]
    if "d_ff" in t:
        d_ff = f.get("d_ff", int)
    else:
        mult = f.get("mult", float, required=True)
        if mult <= 0:
            f.fail("mult", "a positive number", mult)
        d_ff = default_d_ff(d_model, ffn, mult, multiple_of=1) if f.get("match_params", bool, False) \
            else int(round(mult * d_model))
    dropout = f.get("mlp_dropout", float, 0.0)
    if not 0.0 <= dropout < 1.0:
        f.fail("mlp_dropout", "a number in [0, 1)", dropout)
    try:
        cfg = ModelConfig(**{**base_model, "ffn": ffn, "d_ff": d_ff, "ffn_bias": f.get("ffn_bias", bool, False)})
    except (ConfigError, TypeError) as e:
        raise UsageError(f"{_rel(path)}: variant {name!r}: {e}") from None
    if cfg.moe and dropout:
        f.fail("mlp_dropout", "0 for a mixture of experts", dropout)
    return Variant(name, cfg, dropout)


def _number_list(f, key, kind, lo=None, hi=None, default=None):
    v = f.get(key, list, default)
    ok = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v) and \
        (kind is float or all(isinstance(x, int) for x in v))
    if not ok or not v or (lo is not None and min(v) <= lo) or (hi is not None and max(v) > hi):
        f.fail(key, f"a non-empty list of {'integers' if kind is int else 'numbers'}"
                    + (f" in ({lo}, {hi}]" if lo is not None and hi is not None else ""), v)
    return [kind(x) for x in v]


def _compression(path, table, names_):
    f = _Fields(path, table, "compression.")
    f.unknown(COMPRESSION_FIELDS)
    refs = f.get("references", list, [])
    for r in refs:
        if r not in names_:
            f.fail("references", f"variant names ({', '.join(names_)})", refs)
    methods = f.get("methods", list, list(PRUNE_METHODS))
    if not methods or any(m not in PRUNE_METHODS for m in methods):
        f.fail("methods", f"a list of {', '.join(PRUNE_METHODS)}", methods)
    smol = f.get("smollm2", dict, {})
    if not names_ and not smol:
        f.fail("smollm2", "a table (a file without [[variant]] cuts SmolLM2 only)", smol)
    base = f.variant_name("base", names_, required=bool(names_))
    s = _Fields(path, smol, "compression.smollm2.")
    s.unknown({"model", "calib", "eval", "ctx", "calib_chunks", "eval_chunks", "keeps", "recovery"})
    smollm2 = {}
    if smol:
        smollm2 = {"model": s.get("model", str, "smollm2"), "calib": s.get("calib", str, required=True),
                   "eval": s.get("eval", str, required=True), "ctx": s.get("ctx", int, 256),
                   "calib_chunks": s.get("calib_chunks", int, 16), "eval_chunks": s.get("eval_chunks", int, 16),
                   "keeps": _number_list(s, "keeps", float, 0.0, 1.0, [0.75, 0.5])}
        for k in ("calib", "eval"):
            p = smollm2[k] if os.path.isabs(smollm2[k]) else os.path.join(ROOT, smollm2[k])
            if not os.path.isfile(p):
                s.fail(k, "an existing text file", smollm2[k])
            smollm2[k] = p
        rec = s.get("recovery", dict, {})
        if rec:
            smollm2["recovery"] = _recovery(path, rec)
    return {"base": base, "references": refs, "keeps": _number_list(f, "keeps", float, 0.0, 1.0, [0.75, 0.5]),
            "methods": methods, "recovery_steps": f.get("recovery_steps", int, 50),
            "recovery_lr": f.get("recovery_lr", float, 1e-3), "recovery_warmup": f.get("recovery_warmup", int, 5),
            "calib_windows": f.get("calib_windows", int, 32), "smollm2": smollm2}


def _text_file(f, key):
    p = f.get(key, str, required=True)
    p = p if os.path.isabs(p) else os.path.join(ROOT, p)
    if not os.path.isfile(p):
        f.fail(key, "an existing text file", p)
    return os.path.abspath(p)


def _chars(f):
    n = f.get("data_chars", int, 0)
    if n < 0:
        f.fail("data_chars", "0 (all of the file) or a positive number of characters", n)
    return n


def _recovery(path, table):
    """compression.smollm2.recovery: a LoRA fine-tune of every cut (and of the uncut model, the control)"""
    from ..training.finetune import FinetuneSettings
    f = _Fields(path, table, "compression.smollm2.recovery.")
    f.unknown(RECOVERY_FIELDS)
    methods = f.get("methods", list, list(PRUNE_METHODS))
    if not methods or any(m not in PRUNE_METHODS for m in methods):
        f.fail("methods", f"a list of {', '.join(PRUNE_METHODS)}", methods)
    seeds = f.get("seeds", int, 5)
    if seeds < 1:
        f.fail("seeds", "a positive integer", seeds)
    settings = _settings_table(path, f.get("settings", dict, {}), "compression.smollm2.recovery.settings",
                               FinetuneSettings, {"seed", "r", "alpha", "targets", "train_tokens", "schedule_steps"})
    r = f.get("r", int, 8)
    settings = {**settings, "targets": f.get("targets", str, "all"), "r": r, "alpha": f.get("alpha", float, 2.0 * r)}
    _validated(path, "compression.smollm2.recovery", FinetuneSettings.from_dict(settings))
    return {"data": _text_file(f, "data"), "data_chars": _chars(f), "seeds": seeds, "methods": methods,
            "settings": settings}


def _lora(path, table, names_):
    f = _Fields(path, table, "lora.")
    f.unknown(LORA_FIELDS)
    model = f.get("model", str, "")
    if model and "base" in table:
        f.fail("model", "either base (a variant) or model (an installed model), not both", model)
    base = "" if model else f.variant_name("base", names_, required=True)
    data = _text_file(f, "data")
    targets = f.get("targets", list, required=True)
    if not targets or not all(isinstance(t, str) for t in targets):
        f.fail("targets", "a list of target strings (\"q,v\", \"up,down\")", targets)
    from ..training.finetune import FinetuneSettings
    settings = _settings_table(path, f.get("settings", dict, {}), "lora.settings", FinetuneSettings,
                               {"seed", "r", "alpha", "targets", "train_tokens", "schedule_steps"})
    _validated(path, "lora.settings", FinetuneSettings.from_dict(settings))
    return {"base": base, "model": model, "data": data, "data_chars": _chars(f), "targets": targets,
            "ranks": _number_list(f, "ranks", int, 0, None, [2, 8]),
            "train_tokens": [int(x) for x in f.get("train_tokens", list, [0])], "settings": settings}
