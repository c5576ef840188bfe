"""The families that exist only as mixtures of experts (Mixtral is Llama's arch: families/llama.py).
Their config fields, expert tensors and llama.cpp rules are formats/hf_moe.py's and gguf_moe.py's."""
from .llama import LLAMA_SHAPED
from .record import Family

QWEN2MOE = Family(arch="qwen2moe", hf_types=("qwen2_moe",), hf_tensors=LLAMA_SHAPED, hf_hooks="")
QWEN3MOE = Family(arch="qwen3moe", hf_types=("qwen3_moe",), hf_tensors=LLAMA_SHAPED, hf_hooks="")
OLMOE = Family(arch="olmoe", hf_types=("olmoe",), hf_tensors=LLAMA_SHAPED, hf_hooks="")
