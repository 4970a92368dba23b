"""
What the layers above the blocks hold at their most in backward (issue 33): model.py's GPT.loss (the final LayerNorm,
the tied output layer and the chunked fp32 cross-entropy) on one CUDA device, its weights frozen, so that only its
input's gradient is made, as the blocks' backward starts with. For each case, the most allocated over what the GPU held
before the input was made, as one JSON line, beside memory.output_layer_bytes.
    python3 benchmarks/output_layer_probe.py > OUT/output_layer.jsonl
"""
import dataclasses
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import model  # noqa: E402
from zero3bench.accounting import memory, predict, shapes  # noqa: E402

# (preset, micro batch, dtype): 350m and 1.3b (d_model 1024 and 2048), 1024 tokens a row
CASES = [(preset, micro_batch, dtype) for preset in ("350m", "1.3b") for micro_batch in (1, 2, 16)
         for dtype in ("bf16", "fp32")]
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def measured_bytes(preset: str, micro_batch: int, dtype: str) -> int:
    shape = dataclasses.replace(shapes.PRESETS[preset], layers=1)
    gpt = model.GPT(shape).to("cuda", DTYPES[dtype]).requires_grad_(False)
    targets = torch.randint(0, shape.vocab, (micro_batch, shape.context), device="cuda")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    x = torch.randn(micro_batch, shape.context, shape.d_model, device="cuda", dtype=DTYPES[dtype], requires_grad=True)
    gpt.loss(x, targets).backward()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def main() -> None:
    measured_bytes(*CASES[0])  # cuBLAS makes its workspace at the first matmul: not the output layer's
    for preset, micro_batch, dtype in CASES:
        shape = shapes.PRESETS[preset]
        tokens = micro_batch * shape.context
        print(json.dumps({"preset": preset, "micro_batch": micro_batch, "dtype": dtype, "tokens": tokens,
                          "d_model": shape.d_model, "padded_vocab": shape.padded_vocab, "chunk": shapes.LOSS_CHUNK,
                          "measured_bytes": measured_bytes(preset, micro_batch, dtype),
                          "predicted_bytes": memory.output_layer_bytes(shape, predict.WIDTH[dtype], tokens,
                                                                        shapes.LOSS_CHUNK)}), flush=True)


if __name__ == "__main__":
    main()
