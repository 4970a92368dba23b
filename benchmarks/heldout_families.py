"""
Hugging Face families that the accounting was not written for, as tiny configs (2 layers, width 64, a vocabulary
of 512: transformers' own defaults for the family, cut down), each through `bash run.sh --model CONFIG` on this
machine's ranks. Prints each run's (c) and verdict lines; the configs and results folders stay in OUT_DIR.

    python3 benchmarks/heldout_families.py OUT_DIR [FAMILY[:SEED] ...]
"""
import json
import os
import subprocess
import sys
from pathlib import Path

SMALL = {"num_hidden_layers": 2, "n_layer": 2, "num_layers": 2, "hidden_size": 64, "n_embd": 64, "d_model": 64,
         "num_attention_heads": 4, "n_head": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 512,
         "head_dim": 16, "n_inner": 128, "ffn_dim": 128, "num_local_experts": 2, "num_experts": 2,
         "moe_intermediate_size": 64, "num_experts_per_tok": 1, "pad_token_id": 0, "bos_token_id": 1,
         "eos_token_id": 2}
# a config of each family beyond SMALL's cuts: (family, its own fields)
RUNS = {"gpt2": ("gpt2", {}), "mixtral": ("mixtral", {}), "bloom": ("bloom", {}), "qwen3": ("qwen3", {}),
        "gemma2": ("gemma2", {}), "phi3": ("phi3", {}),
        # transformers' default shared expert (5632 wide) left at width 64, and one of sane sizes
        "qwen2_moe_wide": ("qwen2_moe", {}),
        "qwen2_moe": ("qwen2_moe", {"shared_expert_intermediate_size": 128, "num_experts": 4,
                                    "num_experts_per_tok": 2})}
DEFAULT = ["gpt2", "gpt2:1", "gpt2:2", "mixtral", "bloom", "qwen3", "gemma2", "phi3", "qwen2_moe_wide", "qwen2_moe"]


def tiny_config(family: str, own: dict) -> dict:
    import transformers
    d = transformers.AutoConfig.for_model(family).to_dict()
    d.update({k: v for k, v in SMALL.items() if k in d}, **own)
    for key in ("layer_types", "attention_layers"):
        if isinstance(d.get(key), list):
            d[key] = d[key][:d.get("num_hidden_layers", 2)]
    return {k: v for k, v in d.items() if k not in ("transformers_version", "architectures", "_name_or_path")}


def main() -> int:
    out, *runs = sys.argv[1:]
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    for run in runs or DEFAULT:
        name, _, seed = run.partition(":")
        config = folder / f"{name}.json"
        config.write_text(json.dumps(tiny_config(*RUNS[name]), indent=1))
        done = subprocess.run(["bash", "run.sh", "--model", str(config), "--seed", seed or "0"],
                              env={**os.environ, "RESULTS": str(folder / "results")}, capture_output=True, text=True)
        lines = [line for line in done.stdout.splitlines() if "(c)" in line or line.startswith("VERDICT")]
        print(f"== {run}: exit {done.returncode}", *lines, sep="\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
