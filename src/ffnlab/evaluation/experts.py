"""Routing statistics of a mixture of experts over a text: which experts each layer's router picks.

The router's nodes are read through the hook (model/hooks.py) under llama.cpp's names:
ffn_moe_probs-L (softmax of the router logits, [T, E]) and ffn_moe_topk-L (the k chosen experts,
[T, k]). Per layer, over every token of the text:

  tokens per expert   how many top-k slots chose expert e (sums to k * tokens)
  load share          tokens per expert / (k * tokens); 1/E when perfectly balanced
  CV                  coefficient of variation of tokens per expert: std / mean (0: balanced)
  router entropy      mean over tokens of -sum_e p_e log p_e, in nats, and as a fraction of log E
  co-firing           how often experts i and j are chosen for the same token (pairs within top-k)
  top tokens          per expert, the token ids routed to it most often, with the share of that
                      token's occurrences that went there (as `ffnlab neurons` lists text per unit)
Windows stream one batch at a time (evaluation/activations.py), so memory stays bounded; they
overlap, and only tokens with at least --min-context tokens before them in their window are
counted (activations.context_windows: a window's first token is an attention sink, not text).
"""
import re
from dataclasses import dataclass, field

import numpy as np

from .activations import DEFAULT_MIN_CONTEXT, batches, context_windows


@dataclass
class LayerRouting:
    n_expert: int
    k: int
    vocab: int
    counts: np.ndarray = None            # [E] top-k slots per expert
    cofire: np.ndarray = None            # [E, E] tokens that chose both i and j
    by_token: np.ndarray = None          # [E, V] times token v was routed to expert e
    entropy_sum: float = 0.0
    n_tokens: int = 0
    token_totals: np.ndarray = field(default=None)   # [V] occurrences of each token

    def __post_init__(self):
        E, V = self.n_expert, self.vocab
        self.counts, self.cofire = np.zeros(E, np.int64), np.zeros((E, E), np.int64)
        self.by_token, self.token_totals = np.zeros((E, V), np.int64), np.zeros(V, np.int64)

    def update(self, probs, topk, ids):
        """probs [N, E], topk [N, k], ids [N] of one batch"""
        E = self.n_expert
        self.counts += np.bincount(topk.reshape(-1), minlength=E)
        onehot = np.zeros((len(topk), E), np.int64)                   # [N, E] 1 where chosen
        np.put_along_axis(onehot, topk.astype(np.intp), 1, -1)
        self.cofire += onehot.T @ onehot                              # [E, E] (diagonal: counts)
        np.add.at(self.by_token, (topk.reshape(-1), np.repeat(ids, self.k)), 1)
        self.token_totals += np.bincount(ids, minlength=self.vocab)
        with np.errstate(divide="ignore", invalid="ignore"):
            ent = -np.where(probs > 0, probs * np.log(probs), 0.0).sum(-1)
        self.entropy_sum += float(ent.sum())
        self.n_tokens += len(ids)


def route_batch(model, w, layers, keep=None):
    """w: [B, T] ids of one batch of windows -> each LayerRouting of `layers` updated with its routing.
    keep: [B * T] bool, the positions counted (those with enough context); None: all."""
    from ..tracing import Tracer

    pattern = re.compile(r"^ffn_moe_(probs|topk)-\d+$")
    seen = {}

    def take(n):
        name, il = n.name.rsplit("-", 1)
        seen[(name, int(il))] = n.array
        n.array = None
    model.forward(w, hooks=Tracer(filter=pattern, keep=True, on_node=take), last_only=True)
    flat = w.reshape(-1)
    keep = np.ones(len(flat), bool) if keep is None else keep
    for il, L in enumerate(layers):
        L.update(seen[("ffn_moe_probs", il)].reshape(len(flat), -1)[keep],
                 seen[("ffn_moe_topk", il)].reshape(len(flat), -1)[keep], flat[keep])


def scan_routing(model, text, ctx, batch, max_windows=-1, on_batch=None, min_context=DEFAULT_MIN_CONTEXT) -> list:
    """-> [LayerRouting] one per layer, over the text's overlapping windows of ctx tokens, counting
    the tokens with at least min_context tokens before them in their window."""
    cfg, tok = model.config, model.tokenizer
    ids = np.array(tok.encode(text, add_bos=False), dtype=np.int64)
    bos = tok.bos_id if tok.add_bos and tok.bos_id is not None else None
    cw = context_windows(ids, ctx, min_context, bos, max_windows)
    windows = cw.windows
    layers = [LayerRouting(cfg.n_expert, cfg.n_expert_used, cfg.vocab_size) for _ in range(cfg.n_layer)]
    done = 0
    for first, w in batches(windows, batch):
        _, scored = cw.positions(first, *w.shape)
        route_batch(model, w, layers, scored.reshape(-1))             # [B * T] rows with context
        done += len(w)
        if on_batch is not None:
            on_batch(done, len(windows))
    return layers


def layer_report(L: LayerRouting, tok, top=5, pairs=5) -> dict:
    E = L.n_expert
    share = L.counts / max(L.counts.sum(), 1)
    mean = L.counts.mean()
    co = L.cofire.copy().astype(float)
    np.fill_diagonal(co, 0)
    iu = np.triu_indices(E, 1)
    order = np.argsort(-co[iu], kind="stable")[:pairs]
    experts = []
    for e in range(E):
        best = np.argsort(-L.by_token[e], kind="stable")[:top]
        experts.append({"expert": e, "tokens": int(L.counts[e]), "share": float(share[e]),
                        "top_tokens": [{"id": int(v), "text": tok.decode([int(v)]) if tok else str(int(v)),
                                        "count": int(L.by_token[e, v]),
                                        "of_occurrences": float(L.by_token[e, v] / max(L.token_totals[v], 1))}
                                       for v in best if L.by_token[e, v] > 0]})
    ent = L.entropy_sum / max(L.n_tokens, 1)
    return {"n_tokens": L.n_tokens, "n_expert": E, "k": L.k,
            "cv": float(L.counts.std() / mean) if mean else 0.0,
            "router_entropy": ent, "router_entropy_frac": ent / np.log(E) if E > 1 else 0.0,
            "experts": experts,
            "cofire_top": [{"pair": [int(iu[0][i]), int(iu[1][i])], "tokens": int(co[iu][i]),
                            "frac_of_tokens": float(co[iu][i] / max(L.n_tokens, 1))} for i in order],
            "cofire": L.cofire.tolist()}
