"""config.json fields shared by the decoder families' lists (record.HFFields)."""
from .record import Refuse

# fields every transformers 5 decoder config carries that cannot change the logits
COMMON_IRRELEVANT = {
    "_name_or_path": "a label", "architectures": "a label", "transformers_version": "a label",
    "model_type": "a label (decides the family, read first)",
    "dtype": "the storage dtype (ffnlab computes in float32)",
    "attention_dropout": "dropout, zero at inference",
    "initializer_range": "random init only",
    "use_cache": "KV cache on/off: the same logits",
    "bos_token_id": "tokenizer", "eos_token_id": "tokenizer", "pad_token_id": "tokenizer",
    "output_attentions": "an output option", "output_hidden_states": "an output option",
    "return_dict": "an output option", "chunk_size_feed_forward": "memory chunking, same math",
    "is_encoder_decoder": "false for these decoders", "id2label": "classification heads only",
    "label2id": "classification heads only", "problem_type": "classification heads only",
}

# fields formats/hf_config.py's _decoder reads for every RMSNorm/RoPE decoder
COMMON_USED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
               "intermediate_size", "hidden_act", "rms_norm_eps", "rope_parameters", "vocab_size",
               "max_position_embeddings", "tie_word_embeddings")


def _partial_rotary_ok(v):
    return v is None or v == 1


PARTIAL_ROTARY = Refuse(_partial_rotary_ok, 0.5, "rotary on part of each head is not implemented for this family")

# the Llama block's tensors in HF form (model.layers.L.*) -> GGUF names (blk.L.*)
LLAMA_ATTN_MLP = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
LLAMA_BLOCK = {**LLAMA_ATTN_MLP, "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
LLAMA_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
# llama.cpp's Llama-shaped graphs: RMSNorm, RoPE, a SwiGLU MLP without biases
SWIGLU = dict(norm="rmsnorm", ffn="swiglu", ffn_bias=False, attn_out_bias=False, positions="rope")
# transformers' Llama-shaped classes
HF_BASE = dict(norm="rmsnorm", ffn_bias=False, positions="rope")
