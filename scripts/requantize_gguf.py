"""A second GGUF of the same model, for `features eval --compare-model` (the quantization gap):
llama.cpp's own quantizer (llama-cpp-python's llama_model_quantize) applied to a quantized file.

    python3 scripts/requantize_gguf.py IN.gguf OUT.gguf [--type Q3_K_M] [--threads 2]

allow_requantize is set, so the input may itself be quantized (the published SmolLM2 and Gemma 3
files are Q4_1 and Q4_K_M): the result is that file's weights dequantized and quantized again by
the recipe of --type, the way a user would make a smaller file from the one they have. Where a
matrix's row length is not a multiple of a K-quant's 256, llama.cpp falls back to another type for
it and prints which. A verification tool: it needs the engines extra (llama-cpp-python).
"""
import argparse
import sys
from pathlib import Path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--type", default="Q3_K_M", help="llama.cpp's file type recipe (LLAMA_FTYPE_MOSTLY_<TYPE>)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    try:
        import llama_cpp                     # the engines extra, not a dependency of ffnlab
    except ImportError:
        sys.exit("requantize_gguf.py: llama-cpp-python is not installed (pip install -e '.[engines]')")
    ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{args.type.upper()}", None)
    if ftype is None:
        sys.exit(f"requantize_gguf.py: --type {args.type}: llama.cpp has no file type LLAMA_FTYPE_MOSTLY_{args.type.upper()}")
    if not args.src.is_file():
        sys.exit(f"requantize_gguf.py: {args.src}: no such file")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.nthread, params.allow_requantize = ftype, args.threads, True
    rc = llama_cpp.llama_model_quantize(str(args.src).encode(), str(args.out).encode(), params)
    if rc != 0:
        sys.exit(f"requantize_gguf.py: llama_model_quantize returned {rc} for {args.src}")
    print(f"{args.out}: {args.src.name} requantized as {args.type.upper()}, {args.out.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
