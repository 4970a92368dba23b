"""python3 tests/weights_alike.py CONFIG ...: each Hugging Face config built as train_gpt.py builds it, from seed 0 in
bf16, at stage 0 and at stage 3 with every weight partitioned, in one process on the CPU; prints one line per config:
"NAME: alike" where every weight holds the same values, else "NAME: differ: " and the weights that do not. Verdict (a)
compares the two builds' checksums; this names the tensors (tests/test_hf.py)."""
import json
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from zero3bench import hf, machine  # noqa: E402


def weights(config, zero3: dict | None) -> dict[str, torch.Tensor]:
    import deepspeed
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)  # as train_gpt.build_model: zero.Init creates this dtype too
    model, _kept = hf.build(config, torch.bfloat16, zero3, torch.device("cpu"), checkpoint=False)
    torch.set_default_dtype(torch.float32)
    params = dict(model.named_parameters())
    with deepspeed.zero.GatheredParameters([p for p in params.values() if hasattr(p, "ds_numel")]):
        return {name: p.detach().clone() for name, p in params.items()}


def main() -> None:
    import deepspeed
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(machine.free_port()))
    deepspeed.init_distributed("gloo")
    zero3 = json.loads((ROOT / "ds_config_stage3.json").read_text())
    zero3["zero_optimization"]["stage3_param_persistence_threshold"] = 0  # a child's weight partitioned, however small
    for name in sys.argv[1:]:
        path = Path(name)
        config = hf.transformers_config(hf.read_config(path), path)
        dense, sharded = weights(config, None), weights(config, zero3)
        differ = [n for n in dense if not torch.equal(dense[n], sharded[n])]
        print(f"{path.stem}: {'differ: ' + ' '.join(differ) if differ else 'alike'}", flush=True)


if __name__ == "__main__":
    main()
