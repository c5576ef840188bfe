"""`features eval`'s metrics against SAELens's own evaluation (sae_lens.evals.run_evals, in TransformerLens) of the
same SAE on the same HF model and the same token batches (tests/reference/features_saelens_evals.py).

The model is a small random Llama written by transformers; ffnlab reads the HF directory, TransformerLens converts
it with its own convert_llama_weights. The SAE reconstructs l_out-1 (TransformerLens: blocks.1.hook_resid_post):
a TopK dictionary of the activations' principal directions, both signs, so that it reconstructs part of the site.

Bounds: the two forwards differ from transformers' logits by at most d_ours and d_tl (measured here), so a
log-probability differs by at most 2 (d_ours + d_tl) = 2d, a mean CE by 2d, and a mean KL(clean || new), a sum
of p (lp_clean - lp_new) whose terms each move by 4d and whose weights p move by a factor exp(2d), by
4d + 2d KL. The scores (A - S) / (A - C) follow from their terms' bounds. The site's activations differ by float32
rounding (~d_model eps relative), so MSE and explained variance agree within 1e-5 relative; L0 and the dead and
dense fractions are counts and agree exactly unless a TopK selection flips on a near-tie.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import ffnlab  # noqa: E402
from ffnlab.evaluation.activations import ContextWindows  # noqa: E402
from ffnlab.features import saelens_io  # noqa: E402
from ffnlab.features.dictionary import DictConfig  # noqa: E402
from ffnlab.features.evaluate import evaluate_dictionary  # noqa: E402
from ffnlab.features.harvest import capture  # noqa: E402
from hf_dense_models import tiny_llama_dir  # noqa: E402
from saelens_env import run_driver  # noqa: E402

pytestmark = pytest.mark.slow

B, T, D_SAE, K = 8, 32, 128, 16
SITE, HOOK = "l_out-1", "blocks.1.hook_resid_post"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tiny_llama_dir(tmp_path_factory.mktemp("llama"))
    model = ffnlab.load(str(d), progress=False)
    rng = np.random.default_rng(0)
    vocab = model.config.vocab_size
    tokens = np.concatenate([np.zeros((B, 1), np.int64), rng.integers(2, vocab, (B, T - 1))], 1)   # BOS, then text
    np.save(d / "tokens.npy", tokens)
    got, logits = capture(model, tokens, (SITE,), copy=True)
    x = got[SITE][:, 1:].reshape(-1, got[SITE].shape[-1]).astype(np.float64)
    mean = x.mean(0)
    _, vecs = np.linalg.eigh(np.cov((x - mean).T))
    top = vecs[:, ::-1][:, :D_SAE // 2].T                                     # [D_SAE/2, d] principal directions
    cfg = DictConfig(kind="sae", act="topk", d_in=x.shape[1], d_sae=D_SAE, d_out=x.shape[1], k=K)
    W_dec = np.concatenate([top, -top]).astype(np.float32)                     # both signs: TopK keeps positives
    p = {"W_enc": np.ascontiguousarray(W_dec.T), "b_enc": np.zeros(D_SAE, np.float32), "W_dec": W_dec,
         "b_dec": mean.astype(np.float32)}
    sae_dir = d / "sae"
    sae_dir.mkdir()
    saelens_io.save(str(sae_dir), p, cfg, saelens_io.cfg_dict(cfg, SITE, SITE, "tiny-llama", {}))
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(d), attn_implementation="eager").eval()
    with torch.no_grad():
        hf_logits = hf(torch.from_numpy(tokens)).logits.numpy()
    windows = ContextWindows(list(tokens), [0] * B, [1] * B, 1)               # every position but BOS scored
    ours = {a: evaluate_dictionary(model, p, cfg, windows, SITE, SITE, 10 ** 9, B, ablation=a)
            for a in ("zero", "zero-after-first")}
    theirs = run_driver("features_saelens_evals.py", d, sae_dir, d / "tokens.npy", HOOK)
    return ours, theirs, float(np.abs(logits - hf_logits).max())


def test_transformer_lens_runs_the_model_transformers_runs(setup):
    _, theirs, d_ours = setup
    assert theirs["tl_vs_hf_logits"] <= 1e-5 * theirs["logit_scale"] * 10, theirs["tl_vs_hf_logits"]
    assert d_ours <= 1e-5 * theirs["logit_scale"] * 10, d_ours
    assert theirs["sae_class"] == "TopKSAE"


def bounds(setup):
    ours, theirs, d_ours = setup
    d = d_ours + theirs["tl_vs_hf_logits"]
    m = theirs["metrics"]
    ce = {"ce_clean": m["model_performance_preservation"]["ce_loss_without_sae"],
          "ce_spliced": m["model_performance_preservation"]["ce_loss_with_sae"],
          "ce_ablated": m["model_performance_preservation"]["ce_loss_with_ablation"]}
    kl = {"kl_spliced": m["model_behavior_preservation"]["kl_div_with_sae"],
          "kl_ablated": m["model_behavior_preservation"]["kl_div_with_ablation"]}
    return ours["zero"], m, ce, kl, 2 * d + 1e-6, {k: 4 * d + 2 * d * v + 1e-6 for k, v in kl.items()}


def score_bound(a, s, c, ea, es, ec):
    """|change of (a - s) / (a - c)| when a, s, c move by at most ea, es, ec (first order, and a 2x margin)"""
    den = abs(a - c)
    return 2 * ((ea + es) / den + abs(a - s) * (ea + ec) / den ** 2)


def test_ce_and_kl_terms_and_scores_equal_run_evals(setup):
    ours, m, ce, kl, e_ce, e_kl = bounds(setup)
    for k, v in ce.items():
        assert abs(ours[k] - v) <= e_ce, (k, ours[k], v, e_ce)
    for k, v in kl.items():
        assert abs(ours[k] - v) <= e_kl[k], (k, ours[k], v, e_kl[k])
    score = m["model_performance_preservation"]["ce_loss_score"]
    assert abs(ours["ce_loss_score"] - score) <= score_bound(ce["ce_ablated"], ce["ce_spliced"], ce["ce_clean"],
                                                             e_ce, e_ce, e_ce)
    kl_score = m["model_behavior_preservation"]["kl_div_score"]
    assert abs(ours["kl_score"] - kl_score) <= score_bound(kl["kl_ablated"], kl["kl_spliced"], 0.0,
                                                           e_kl["kl_ablated"], e_kl["kl_spliced"], 0.0)
    assert ce["ce_clean"] < ce["ce_spliced"] and abs(ce["ce_ablated"] - ce["ce_clean"]) > 0.1   # splices that matter


def test_the_bos_kept_ablation_is_another_measure(setup):
    """zero-after-first keeps BOS's value; run_evals zeroes it too. The difference is far above the bound, so the
    test above tells the two definitions apart."""
    ours, _, ce, _, e_ce, _ = bounds(setup)
    kept = setup[0]["zero-after-first"]
    assert kept["ce_clean"] == ours["ce_clean"] and kept["ce_spliced"] == ours["ce_spliced"]
    assert abs(kept["ce_ablated"] - ce["ce_ablated"]) > 100 * e_ce


def test_reconstruction_and_sparsity_equal_run_evals(setup):
    ours, m, *_ = bounds(setup)
    theirs = setup[1]
    rq, sp = m["reconstruction_quality"], m["sparsity"]
    assert 0.1 < ours["explained_variance"] < 0.99                          # a dictionary that does part of it
    assert abs(ours["mse"] - rq["mse"]) <= 1e-5 * rq["mse"]
    assert abs(ours["explained_variance"] - rq["explained_variance"]) <= 1e-5 * (1 + abs(rq["explained_variance"]))
    assert ours["l0"] == sp["l0"] == K
    assert ours["tokens"] == B * (T - 1)
    assert ours["dead_fraction"] == theirs["dead_fraction"] and ours["dense_fraction"] == theirs["dense_fraction"]
