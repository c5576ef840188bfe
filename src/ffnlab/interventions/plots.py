"""Pictures of the interventions (matplotlib, Agg backend): layers down, token positions across."""
import textwrap

import numpy as np

from ..pictures import pyplot as _plt


def _labels(tokens, marked=()):
    """Axis labels as every view shows tokens (token_text.visible: ␣ for a space, ↵ for a newline)."""
    from ..token_text import visible
    return [visible(t) + ("*" if i in marked else "") for i, t in enumerate(tokens)]


def patch_heatmap(path, result, tokens, title):
    """effect [n_layer][T] as a diverging heat map, one column per token."""
    plt = _plt()
    e = np.asarray(result["effect"])                                     # [n_layer, T]
    lim = max(1.0, float(np.abs(e).max()))
    L, T = e.shape
    fig, ax = plt.subplots(figsize=(max(6.0, 2.2 + 0.55 * T), max(3.2, 1.6 + 0.22 * L)))
    im = ax.imshow(e, cmap="RdBu", vmin=-lim, vmax=lim, aspect="auto", interpolation="nearest")
    ax.set_xticks(range(e.shape[1]), _labels(tokens), rotation=60, ha="right", fontsize=8)
    step = max(1, L // 16)                                            # integer layer ticks, <= 16 labels
    ax.set_yticks(range(0, L, step))
    ax.set_ylabel("layer")
    ax.set_title("\n".join(textwrap.wrap(title, 70)), fontsize=9)
    fig.colorbar(im, ax=ax, label="restored fraction\nof the logit difference")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def causal_trace_figure(path, result, window, title=""):
    """ROME's figure: three panels (hidden state, MLP window, attention window), p(target) per restored
    layer and position; subject tokens marked with *; title: the model and the prompt."""
    plt = _plt()
    first, last = result["subject"]
    labels = _labels(result["tokens"], range(first, last + 1))
    panels = [("hidden", "Purples", "single restored layer"), ("mlp", "Greens", f"center of {window} restored MLP layers"),
              ("attn", "Reds", f"center of {window} restored attention layers")]
    T = len(labels)
    fig, axes = plt.subplots(1, 3, figsize=(13, 1.2 + 0.32 * T))
    for ax, (kind, cmap, xlabel) in zip(axes, panels):
        d = np.asarray(result[kind]).T                                    # [T, n_layer]: tokens down
        im = ax.pcolor(d, cmap=cmap, vmin=result["corrupt_p"])
        ax.invert_yaxis()
        ax.set_yticks(np.arange(T) + 0.5, labels, fontsize=8)
        L = d.shape[1]
        step = max(1, L // 12)                                        # a tick on each cell's centre, <= 12 labels
        ax.set_xticks(np.arange(0, L, step) + 0.5, [str(i) for i in range(0, L, step)], fontsize=8)
        ax.set_xlabel(xlabel)
        ax.set_title(f"restoring {'state' if kind == 'hidden' else kind.upper() if kind == 'mlp' else 'attention'} "
                     "after corrupted input", fontsize=9)
        fig.colorbar(im, ax=ax).ax.set_title(f"p({result['target']!r})", fontsize=8)
    if title:
        fig.suptitle("\n".join(textwrap.wrap(f"{title}; target {result['target']!r}", 140)), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
