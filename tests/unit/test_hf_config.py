"""config.json in transformers 5 form: rope_theta inside rope_parameters is read, for the loader
and the sizing tools alike (a default 10000 would shift every RoPE angle)."""
from ffnlab.formats.hf_config import config_from_hf

LLAMA = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
         "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 128}


def test_rope_theta_from_rope_parameters():
    cfg = config_from_hf({**LLAMA, "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}})
    assert cfg.rope_theta == 500000.0


def test_top_level_rope_theta_still_read():
    assert config_from_hf({**LLAMA, "rope_theta": 250000.0}).rope_theta == 250000.0
