"""SAELens's own evaluation (sae_lens.evals.run_evals) of a dictionary on an HF Llama-family model, run in
TransformerLens: the other side of tests/engines/test_features_evals_vs_saelens.py and of the SmolLM2 figure
in docs/features.md. Run by an interpreter where sae_lens imports (scripts/install.sh --test makes its venv).
Prints one JSON object.

    python features_saelens_evals.py MODEL_DIR SAE_DIR TOKENS.npy HOOK_NAME

MODEL_DIR  an HF directory (LlamaForCausalLM: written by transformers, or by `ffnlab export --to hf`)
SAE_DIR    a dictionary in SAELens's format (cfg.json + sae_weights.safetensors), as `features train` writes it
TOKENS     [B, T] int64 token batches, BOS first, fed to both sides as they are
HOOK_NAME  TransformerLens's name of the site (blocks.L.hook_resid_post for ffnlab's l_out-L)

The model: TransformerLens's HookedTransformer built from the HF config and converted with its own
convert_llama_weights (no folding or centring, so its activations are the HF model's). The store: the token
batches, handed out in order as SAELens's ActivationsStore.get_batch_tokens does and reset between the two
metric passes as run_evals resets it. BOS (the tokenizer's special token) is the one excluded token.
"""
import json
import sys

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformer_lens import HookedTransformer, HookedTransformerConfig
from transformer_lens.pretrained.weight_conversions import convert_llama_weights

from sae_lens import SAE
from sae_lens.evals import EvalConfig, run_evals
from sae_lens.training.activation_scaler import ActivationScaler


class Batches:
    """The part of ActivationsStore that run_evals uses: fixed token batches, in order."""

    def __init__(self, tokens):
        self.tokens, self.at = tokens, 0
        self.store_batch_size_prompts, self.context_size = tokens.shape

    def get_batch_tokens(self, n):
        out = self.tokens[self.at:self.at + n]
        self.at += n
        return out

    def reset_input_dataset(self):
        self.at = 0


def hooked_llama(model_dir):
    hf_cfg = AutoConfig.from_pretrained(model_dir)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32, attn_implementation="eager")
    d_head = getattr(hf_cfg, "head_dim", None) or hf_cfg.hidden_size // hf_cfg.num_attention_heads
    rope = getattr(hf_cfg, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(hf_cfg, "rope_theta", 10000.0))
    cfg = HookedTransformerConfig(
        d_model=hf_cfg.hidden_size, n_layers=hf_cfg.num_hidden_layers, n_heads=hf_cfg.num_attention_heads,
        n_key_value_heads=hf_cfg.num_key_value_heads, d_head=d_head, d_mlp=hf_cfg.intermediate_size,
        d_vocab=hf_cfg.vocab_size, n_ctx=min(hf_cfg.max_position_embeddings, 2048), act_fn="silu",
        normalization_type="RMS", eps=hf_cfg.rms_norm_eps, positional_embedding_type="rotary", rotary_dim=d_head,
        rotary_base=theta, rotary_adjacent_pairs=False, gated_mlp=True, final_rms=True,
        original_architecture="LlamaForCausalLM", dtype=torch.float32, default_prepend_bos=False)
    model = HookedTransformer(cfg, tokenizer=AutoTokenizer.from_pretrained(model_dir))
    model.load_and_process_state_dict(convert_llama_weights(hf, cfg), fold_ln=False, center_writing_weights=False,
                                      center_unembed=False, fold_value_biases=False,
                                      refactor_factored_attn_matrices=False)
    return hf, model.eval()


def main():
    model_dir, sae_dir, tokens_path, hook_name = sys.argv[1:5]
    torch.set_grad_enabled(False)
    tokens = torch.from_numpy(np.load(tokens_path))
    hf, model = hooked_llama(model_dir)
    hf_logits = hf(tokens).logits
    tl_logits = model(tokens)
    sae = SAE.load_from_disk(sae_dir)
    sae.cfg.metadata.hook_name = hook_name
    bos = int(tokens[0, 0])
    metrics, feature_metrics = run_evals(
        sae, Batches(tokens), model, ActivationScaler(),
        EvalConfig(batch_size_prompts=tokens.shape[0], n_eval_reconstruction_batches=1, compute_kl=True,
                   compute_ce_loss=True, n_eval_sparsity_variance_batches=1, compute_sparsity_metrics=True,
                   compute_variance_metrics=True, compute_featurewise_density_statistics=True),
        exclude_special_tokens=[bos])
    density = np.array(feature_metrics["feature_density"])
    print(json.dumps({"metrics": metrics, "tl_vs_hf_logits": float((tl_logits - hf_logits).abs().max()),
                      "logit_scale": float(hf_logits.abs().max()),
                      "dead_fraction": float((density == 0).mean()), "dense_fraction": float((density > 0.1).mean()),
                      "sae_class": type(sae).__name__}))


if __name__ == "__main__":
    main()
