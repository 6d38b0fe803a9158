"""What the GPU machine has: python, torch/CUDA, the GPU, and the packages the checks may use.

python benchmarks/gpu/env.py OUT.json
"""

import importlib.metadata as md
import json
import platform
import sys

import torch

names = [
    "torch",
    "transformers",
    "accelerate",
    "tokenizers",
    "peft",
    "deepspeed",
    "vllm",
    "flash-attn",
    "flash_attn",
    "math-verify",
    "fastapi",
    "uvicorn",
]
info = {
    "python": sys.version.split()[0],
    "platform": platform.platform(),
    "cuda_available": torch.cuda.is_available(),
    "torch_cuda": torch.version.cuda,
    "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    "bf16_supported": torch.cuda.is_available() and torch.cuda.is_bf16_supported(),
    "packages": {},
}
for n in names:
    try:
        info["packages"][n] = md.version(n)
    except md.PackageNotFoundError:
        info["packages"][n] = None
print(json.dumps(info, indent=2))
if len(sys.argv) > 1:
    open(sys.argv[1], "w").write(json.dumps(info, indent=2) + "\n")
