"""GPT-NeoX / Pythia: parallel residual (use_parallel_residual), partial rotary (rotary_pct),
LayerNorm with bias, one query_key_value with biases whose rows are per head [n_head, 3, head_dim]
(reordered to [q; k; v] on the way in), an exact-GELU MLP with biases, untied embed_out."""
from .record import Family, HFFields, HFTensors

FAMILY = Family(
    arch="gptneox", hf_types=("gpt_neox",), activation="gelu", dense_ffn=True, layernorm=True,
    gguf_keys={"parallel_residual": ("use_parallel_residual", ...)},
    hf_tensors=HFTensors(
        top={"gpt_neox.embed_in.weight": "token_embd.weight", "gpt_neox.final_layer_norm.weight": "output_norm.weight",
             "gpt_neox.final_layer_norm.bias": "output_norm.bias", "embed_out.weight": "output.weight"},
        block={"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
               "attention.query_key_value": "attn_qkv", "attention.dense": "attn_output",
               "mlp.dense_h_to_4h": "ffn_up", "mlp.dense_4h_to_h": "ffn_down"},
        layers=r"gpt_neox\.layers"),
    hf_fields={"gpt_neox": HFFields(
        "GPTNeoXConfig", ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
                          "layer_norm_eps", "rope_parameters", "vocab_size", "max_position_embeddings",
                          "tie_word_embeddings", "use_parallel_residual", "attention_bias"),
        {"hidden_dropout": "dropout, zero at inference",
         "classifier_dropout": "the sequence-classification head only",
         "is_decoder": "GPTNeoXAttention is causal whatever it says (is_causal = True)"})},
    hf_export={"gpt_neox": ("GPTNeoXForCausalLM", dict(
        norm="layernorm", ffn_bias=True, pre_norm=True, post_attn_norm=False, post_ffn_norm=False, qk_norm=False,
        embed_scale=False, attn_scale=0.0, attn_softcap=0.0, final_logit_softcap=0.0, sliding_window=0,
        rope_freq_factors=(), rope_pairing="neox"), ())},
    hf_hooks="neox")
