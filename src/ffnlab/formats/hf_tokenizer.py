"""An HF directory's tokenizer: tokenizer.json + tokenizer_config.json -> Tokenizer, with BOS/EOS as
transformers adds them.

transformers (5.x: PreTrainedTokenizerBase.from_pretrained, TokenizersBackend.__init__) lets
tokenizer.json decide what encode() adds:
  - its post_processor, when there is one: Llama 2/3's TemplateProcessing adds <s> /
    <|begin_of_text|>, GPT-2's ByteLevel adds nothing;
  - no post_processor: nothing (update_post_processor with add_bos_token = add_eos_token = False).
add_bos_token / add_eos_token in tokenizer_config.json are dropped from the init arguments whenever
tokenizer.json exists (transformers 4's LlamaTokenizerFast still honoured them), so they are only
type-checked here. The architecture plays no part: a Llama model whose tokenizer adds no BOS gets none.
Every field read is type-checked; token ids must lie in the vocabulary.
"""
import os

from ..errors import ModelFileError
from .jsonfile import MAX_JSON_BYTES, field, read_json_object
from .tokenizer import Tokenizer


def tokenizer_from_hf(path, config: dict):
    """path: an HF directory; config: its parsed config.json -> Tokenizer, or None without tokenizer.json."""
    from tokenizers import Tokenizer as HFTokenizer

    f = os.path.join(path, "tokenizer.json")
    if not os.path.lexists(f):
        return None
    tk = read_tokenizer_json(f)
    tcf = os.path.join(path, "tokenizer_config.json")
    tc = read_json_object(tcf, "tokenizer config", 64 << 20) if os.path.lexists(tcf) else {}
    post = _post_processor_specials(tk, f)
    tk.post_processor = None                     # what it adds is recorded below; encode() adds it
    vocab = tk.get_vocab_size(with_added_tokens=True)

    def token_id(key):
        v = field(tc, key, (str, dict), tcf, None, error=ModelFileError)
        if isinstance(v, dict):
            v = field(v, "content", str, f"{tcf}: {key}", None, error=ModelFileError)
        return tk.token_to_id(v) if v is not None else None

    def config_id(key):
        v = config.get(key)
        if isinstance(v, list) and v:            # several EOS ids: the first is the EOS token
            v = v[0]
        if v is None:
            return None
        if type(v) is not int or not 0 <= v < vocab:
            raise ModelFileError(f"{path}/config.json: field '{key}' must be a token id in [0, {vocab}), found {v!r:.40}")
        return v

    bos = token_id("bos_token")
    bos = bos if bos is not None else config_id("bos_token_id")
    eos = token_id("eos_token")
    eos = eos if eos is not None else config_id("eos_token_id")
    for key in ("add_bos_token", "add_eos_token"):           # read by transformers 4 only; checked anyway
        field(tc, key, bool, tcf, False, error=ModelFileError)
    prefix, suffix = post
    add_bos, add_eos = bool(prefix), bool(suffix)
    bos = prefix[0] if prefix else bos           # the post-processor's token is the one transformers adds
    if suffix and suffix[0] != eos:
        raise ModelFileError(f"{f}: post_processor appends token {suffix[0]}, not the EOS token {eos}; "
                             f"ffnlab appends only the EOS token")
    return Tokenizer(tk, bos_id=bos, eos_id=eos, add_bos=add_bos, add_eos=add_eos,
                     chat_template=_chat_template(tc, tcf), template_source=f"{tcf}: chat_template")


def read_tokenizer_json(f):
    """tokenizer.json -> tokenizers.Tokenizer, its BPE model checked first (check_bpe_model)."""
    import json

    from tokenizers import Tokenizer as HFTokenizer

    d = read_json_object(f, "tokenizer", MAX_JSON_BYTES)
    check_bpe_model(d.get("model"), f)
    try:
        return HFTokenizer.from_str(json.dumps(d))
    except Exception as e:                       # the tokenizers library raises a plain Exception
        raise ModelFileError(f"{f}: unreadable tokenizer ({str(e)[:200]})") from None


def check_bpe_model(model, f):
    """A BPE model whose merges name tokens outside its vocabulary makes the tokenizers library
    panic in Rust (a backtrace on stderr, an exception Python's `except Exception` misses), so the
    merges are checked here: "A B" (or [A, B]) with A, B and the merged token in the vocabulary."""
    if not isinstance(model, dict) or model.get("type", "BPE") != "BPE" or "merges" not in model:
        return
    vocab, merges = model.get("vocab"), model.get("merges")
    if not isinstance(vocab, dict) or not all(isinstance(i, int) and not isinstance(i, bool) for i in vocab.values()):
        raise ModelFileError(f"{f}: model.vocab must map tokens to integer ids")
    if not isinstance(merges, list):
        raise ModelFileError(f"{f}: model.merges must be a list")
    prefix = model.get("continuing_subword_prefix") or ""
    for i, m in enumerate(merges):
        pair = m.split(" ") if isinstance(m, str) else m
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) and p for p in pair)):
            raise ModelFileError(f"{f}: model.merges[{i}] = {str(m)[:40]!r} is not a pair of tokens")
        a, b = pair
        merged = a + (b[len(prefix):] if prefix and b.startswith(prefix) else b)
        if a not in vocab or b not in vocab or merged not in vocab:
            raise ModelFileError(f"{f}: model.merges[{i}] = {str(m)[:40]!r}: {a!r}, {b!r} and {merged!r} must all "
                                 f"be in model.vocab")


def _chat_template(tc, tcf):
    """A string, or transformers' list of named templates (the one named 'default')."""
    t = tc.get("chat_template")
    if t is None or isinstance(t, str):
        return t
    if isinstance(t, list) and all(isinstance(x, dict) for x in t):
        named = {x.get("name"): x.get("template") for x in t}
        if isinstance(named.get("default"), str):
            return named["default"]
    raise ModelFileError(f"{tcf}: field 'chat_template' must be a string or a list of "
                         f"{{name, template}} with a 'default', found {str(t)[:60]}")


def _post_processor_specials(tk, path) -> tuple[list, list]:
    """The token ids tokenizer.json's post_processor puts before and after one sequence."""
    import json

    spec = json.loads(tk.to_str()).get("post_processor")

    def walk(p):
        if p is None:
            return [], []
        kind = p.get("type")
        if kind == "ByteLevel":                  # trims offsets only
            return [], []
        if kind == "Sequence":
            pre, post = [], []
            for q in p.get("processors", []):
                a, b = walk(q)
                pre, post = pre + a, post + b
            return pre, post
        if kind == "TemplateProcessing":
            specials = p.get("special_tokens", {})
            pre, post, seen = [], [], False
            for item in p.get("single", []):
                if "Sequence" in item:
                    seen = True
                elif "SpecialToken" in item:
                    ids = specials.get(item["SpecialToken"]["id"], {}).get("ids", [])
                    (post if seen else pre).extend(ids)
            return pre, post
        if kind in ("BertProcessing", "RobertaProcessing"):
            return [p["cls"][1]], [p["sep"][1]]
        raise ModelFileError(f"{path}: post_processor type {kind!r} is not supported")

    pre, post = walk(spec)
    if len(pre) > 1 or len(post) > 1:
        raise ModelFileError(f"{path}: post_processor adds {len(pre)} token(s) before and {len(post)} after the "
                             f"text; ffnlab adds at most one BOS and one EOS")
    vocab = tk.get_vocab_size(with_added_tokens=True)
    for i in pre + post:
        if type(i) is not int or not 0 <= i < vocab:
            raise ModelFileError(f"{path}: post_processor adds token id {i!r}, outside the vocabulary of {vocab}")
    return pre, post


def tokenizer_json(tok: Tokenizer):
    """The tokenizers.Tokenizer to save as tokenizer.json for tok: a copy whose post_processor adds
    BOS/EOS as tok.encode does, since that is what transformers reads (not add_bos_token)."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import processors

    tk = HFTokenizer.from_str(tok.tk.to_str())
    bos = tok.tk.id_to_token(tok.bos_id) if tok.add_bos and tok.bos_id is not None else None
    eos = tok.tk.id_to_token(tok.eos_id) if tok.add_eos and tok.eos_id is not None else None
    if bos is None and eos is None:
        tk.post_processor = None
        return tk
    single = " ".join(([f"{bos}:0"] if bos else []) + ["$A:0"] + ([f"{eos}:0"] if eos else []))
    pair = single + " " + " ".join(([f"{bos}:1"] if bos else []) + ["$B:1"] + ([f"{eos}:1"] if eos else []))
    specials = [(t, i) for t, i in ((bos, tok.bos_id), (eos, tok.eos_id)) if t]
    tk.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)
    return tk
