"""Re-draws a transformers model's weights with a large spread (tests/engines/test_hf_dirs.py's
docstring says why)."""
import torch


def randomize(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "ln_" in name:
                p.copy_(0.5 + torch.rand(p.shape, generator=g) if name.endswith("weight") else
                        0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_((0.25 if p.ndim == 2 else 0.1) * torch.randn(p.shape, generator=g))
    return model.eval()


def tiny_llama_dir(d, seed=0, n_layer=3):
    """A small random Llama (grouped-query attention) with a trained byte-level BPE tokenizer of 300 tokens (BOS
    <s> = 0), written by transformers into directory d, that ffnlab, TransformerLens and SAELens all read.
    Weights N(0, 1/fan_in), big enough that patches and splices matter."""
    import json

    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    corpus = ["the quick brown fox jumps over the lazy dog", "hello world, hello tokenizer"] * 20
    tk.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tk.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    cfg = transformers.LlamaConfig(vocab_size=tk.get_vocab_size(), hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=n_layer, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=64, bos_token_id=0, eos_token_id=1)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2:
                p.normal_(0.0, 1.0 / p.shape[1] ** 0.5)
    model.save_pretrained(d, safe_serialization=True)
    return d
