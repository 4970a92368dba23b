"""
The same GPT trained without DeepSpeed, to put its numbers beside plain PyTorch and PyTorch FSDP2:

    python benchmarks/baselines.py --mode plain --micro-batch 16
    torchrun --nproc_per_node 1 benchmarks/baselines.py --mode fsdp2 --micro-batch 16

Same model, data, learning-rate warm-up, clipping and FLOP count as train_gpt.py; fp32 weights with bf16
autocast (plain) or bf16 compute with fp32 reduction (FSDP2), and torch's fused AdamW. Prints one
`BASELINE {json}`.
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from zero3bench import inputs, machine  # noqa: E402
import train_gpt  # noqa: E402


def build(mode, model_name, device, checkpoint):
    torch.manual_seed(0)
    with torch.device(device):
        model = train_gpt.GPT(train_gpt.PRESETS[model_name], checkpoint=checkpoint)
    if mode == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in model.blocks:
            fully_shard(block, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
    return model


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["plain", "fsdp2"], required=True)
    p.add_argument("--model", default="1.3b", choices=train_gpt.PRESETS)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--checkpoint", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--warmup", type=int, default=2)
    args = p.parse_args()
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    torch.cuda.set_device(device)
    if args.mode == "fsdp2":
        dist.init_process_group("nccl" if world <= torch.cuda.device_count() else "gloo")
    shape = train_gpt.PRESETS[args.model]
    seq, args.lr = shape.context, shape.lr
    model = build(args.mode, args.model, device, args.checkpoint)
    params_total = sum(p.numel() for p in model.parameters())  # an FSDP2 DTensor's numel is the global size
    opt = torch.optim.AdamW(model.parameters(), lr=0.0, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    tokens = inputs.load_tokens(None, shape.vocab, seq)
    times, losses = [], []
    for step in range(1, args.steps + 1):
        x, y = train_gpt.get_batch(tokens, 0, step, rank, args.micro_batch, world, seq, device)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.mode == "plain"):
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for group in opt.param_groups:
            group["lr"] = train_gpt.learning_rate(step, args)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    step_time = sorted(times[1:])[len(times[1:]) // 2]
    tokens_per_s = world * args.micro_batch * seq / step_time
    tflops = model.flops_per_token(params_total, seq) * tokens_per_s / world / 1e12
    peak = machine.peak_tflops(device, "bf16")
    result = {"mode": args.mode, "model": args.model, "world_size": world, "micro_batch": args.micro_batch,
              "checkpoint": args.checkpoint, "params_total": params_total, "losses": losses,
              "step_time_s": step_time, "tokens_per_s": tokens_per_s, "tflops_per_gpu": tflops,
              "mfu": tflops / peak if peak else None, "peak_mem_bytes": torch.cuda.max_memory_allocated(device),
              "peak_reserved_bytes": torch.cuda.max_memory_reserved(device), "rank": rank}
    print("BASELINE " + json.dumps(result), flush=True)
    if args.mode == "fsdp2":
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
