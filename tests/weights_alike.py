"""python3 tests/weights_alike.py CONFIG ...: each Hugging Face config built by train_gpt.build_model from its own
inputs (its seed, its dtype, the project's configs), at stage 0 and at stage 3 with every weight partitioned, in one
process on the CPU; prints one line per config: "NAME: alike" where every weight holds the same values, else
"NAME: differ: " and the weights that do not. Verdict (a) compares the two builds' checksums; this names the tensors
(tests/test_hf.py)."""
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import train_gpt  # noqa: E402
from zero3bench import machine  # noqa: E402


def weights(path: Path, stage: str) -> dict[str, torch.Tensor]:
    import deepspeed
    args = train_gpt.options.parse_args(["--model", str(path), "--stage", stage], train_gpt.PRESETS)
    config, run, _, _ = train_gpt.resolve(args)
    config.get("zero_optimization", {})["stage3_param_persistence_threshold"] = 0  # a child's weight partitioned too
    model, _ = train_gpt.build_model(run, config, torch.device("cpu"))
    params = dict(model.named_parameters())
    with deepspeed.zero.GatheredParameters([p for p in params.values() if hasattr(p, "ds_numel")]):
        return {name: p.detach().clone() for name, p in params.items()}


def main() -> None:
    import deepspeed
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(machine.free_port()))
    deepspeed.init_distributed("gloo")
    for name in sys.argv[1:]:
        path = Path(name)
        dense, sharded = weights(path, "0"), weights(path, "3")
        differ = [n for n in dense if not torch.equal(dense[n], sharded[n])]
        print(f"{path.stem}: {'differ: ' + ' '.join(differ) if differ else 'alike'}", flush=True)


if __name__ == "__main__":
    main()
