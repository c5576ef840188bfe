"""LoRA fine-tuning speed: one training step (forward, backward, AdamW on the adapters) of ffnlab
against PEFT + torch on the same SmolLM2-135M-shaped model, float32, one thread each.

    python3 bench/bench_lora.py [--targets q,v all] [--batch 4 --seq-len 24] [--repeats 5]

Both sides get random weights of SmolLM2-135M's shapes (d_model 576, d_ff 1536, 30 layers, 9/3
heads, vocabulary 49,152, tied embeddings): the arithmetic is the same as the real model's, and
no HF copy of the GGUF is needed. ffnlab also runs the real Q4_1 GGUF (its matrices stay quantized;
dx goes through dequantized row tiles). Prints tokens/s (median of --repeats steps after one warm-up)
and the ratio to PEFT's.
"""
import argparse
import os
import time

import numpy as np

from machine import cpu_model


def median_step(step, repeats):
    step()                                              # warm-up: kernels compiled, buffers allocated
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def ffnlab_step(params, cfg, targets, x, y, r):
    from ffnlab.model import Model
    from ffnlab.training.finetune import loss_and_grads
    from ffnlab.training.lora import attach, init_adapters, target_tensors
    from ffnlab.training.optim import AdamW, clip_grad_norm
    ad = init_adapters(params, cfg, target_tensors(cfg, targets), r)
    p = attach(params, ad, 2.0, freeze=True)
    opt = AdamW(ad, 0.0, (0.9, 0.999))

    def step():
        _, g = loss_and_grads(Model(cfg, p), x, y, ad)
        clip_grad_norm(g, 1.0)
        opt.step(ad, g, 1e-3)
    return step


def peft_step(targets, x, y, r):
    import peft
    import torch
    import transformers
    names = {"q,v": ["q_proj", "v_proj"], "attn": ["q_proj", "k_proj", "v_proj", "o_proj"],
             "mlp": ["gate_proj", "up_proj", "down_proj"],
             "all": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}[targets]
    cfg = transformers.LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                   num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = peft.get_peft_model(transformers.LlamaForCausalLM(cfg), peft.LoraConfig(r=r, lora_alpha=2 * r,
                                                                                     target_modules=names))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3, weight_decay=0.0)
    xt, yt = torch.tensor(x), torch.tensor(y)

    def step():
        logits = model(xt).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), yt.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        opt.step()
        opt.zero_grad()
    return step


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--targets", nargs="+", default=["q,v", "all"])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=24)
    ap.add_argument("--r", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    torch.set_num_threads(1)
    import ffnlab
    from ffnlab.formats.installed import model_path
    from ffnlab.model import Model
    from ffnlab.threads import set_threads
    set_threads(1)
    gguf = ffnlab.load(model_path("smollm2"), progress=False)
    rand = Model.random(gguf.config, seed=0)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 49152, (a.batch, a.seq_len))
    y = rng.integers(0, 49152, (a.batch, a.seq_len))
    tokens = a.batch * a.seq_len
    print(f"{cpu_model()}, load average {os.getloadavg()[0]:.1f}; one thread each; batch {a.batch} x {a.seq_len} "
          f"tokens, r={a.r}; median of {a.repeats} steps")
    print("| targets | PEFT + torch tok/s | ffnlab float32 tok/s | ratio | ffnlab on the Q4_1 GGUF tok/s | ratio |")
    print("|---|---:|---:|---:|---:|---:|")
    for t in a.targets:
        ref = tokens / median_step(peft_step(t, x, y, a.r), a.repeats)
        f32 = tokens / median_step(ffnlab_step(rand.params, rand.config, t, x, y, a.r), a.repeats)
        q41 = tokens / median_step(ffnlab_step(gguf.params, gguf.config, t, x, y, a.r), a.repeats)
        print(f"| {t} | {ref:.0f} | {f32:.0f} | {f32 / ref:.2f}x | {q41:.0f} | {q41 / ref:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
