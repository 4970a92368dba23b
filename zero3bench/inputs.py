"""
What a run is given, before anything is built: the token stream, the options resolved against the config, the
machine and the number of ranks (train_gpt.py --check says how they were read), and what theory predicts one
rank will hold. train_gpt.py trains on them; launches.py checks each run with them before launching it.
"""
import argparse
import os
import sysconfig
from pathlib import Path
from typing import Any

import numpy as np
import torch

from zero3bench import config_checks, fsdp2, machine, options
from zero3bench.accounting import moments, predict
from zero3bench.accounting.shapes import DEFAULT_MODEL, LOSS_CHUNK, PRESETS
from zero3bench.formatting import size


def load_tokens(path: Path | None, vocab: int, seq: int) -> np.ndarray:
    """The token stream: a nanoGPT .bin file (flat uint16), or else the bytes of Python's own sources, real
    text that every Python installation ships."""
    if path is None:
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        tokens = np.frombuffer(b"".join(f.read_bytes() for f in sorted(stdlib.glob("*.py"))), dtype=np.uint8)
    else:
        options.check_token_file(path)
        tokens = np.memmap(path, dtype=np.uint16, mode="r") if path.stat().st_size else np.zeros(0, np.uint16)
    if len(tokens) < seq + 1:
        raise options.BadInput(f"the data has {len(tokens)} tokens, fewer than one row of {seq} + 1")
    # the first 16M tokens only: a corpus can be many GB; a stray id further on fails in the embedding
    if path is not None and int(tokens[: 1 << 24].max()) >= vocab:
        raise options.BadInput(f"--data {path}: token ids reach {int(tokens[: 1 << 24].max())}, outside the "
                               f"vocabulary of {vocab}")
    return tokens


def resolve(args: argparse.Namespace) -> tuple[dict[str, Any], options.Run, np.ndarray, str]:
    """Check every input and fill in what depends on the machine, the config and the number of ranks. Returns
    the DeepSpeed config, the run (options.Run), the tokens and one line that says how the inputs were read."""
    on_gpu = torch.cuda.is_available()
    model = args.model or (DEFAULT_MODEL if on_gpu else "tiny")
    shape = PRESETS[model]
    host = {"on_gpu": on_gpu, "bf16_ok": on_gpu and torch.cuda.is_bf16_supported(),
            "known_optimizer": config_checks.known_optimizer, "fsdp2_missing": fsdp2.missing()}
    world = args.check or int(os.environ["WORLD_SIZE"])
    config, where = options.read_config(args.config), f" {args.config}"
    config, autos = config_checks.from_other_tools(config, shape.d_model, where)
    config, run, how = options.resolve(args, config, model, (shape.context, shape.lr), world, host)
    config_checks.refuse_what_the_build_would(config_checks.deepspeed_config(config, run.micro_batch, where), where)
    return config, run, load_tokens(args.data, shape.vocab, run.seq), how + autos


def predicted_memory(run: options.Run, config: dict[str, Any], world: int) -> dict[str, Any]:
    """What theory says one rank of world will hold (predict.rank_memory, the formula that plan.py and each
    RESULT's predicted_peak_bytes use), before anything is built, at the rank whose peak is the most (at
    DeepSpeed's stages 1 and 2 each rank keeps other gradients): a config's Adam is DeepSpeed's own, and the ranks
    on this host beyond its GPUs rehearse on them, as train_gpt.init_distributed places them."""
    shape, section = PRESETS[run.model], config.get("optimizer", {})
    deepspeed_adam = (str(section.get("type", "")).lower() in ("adam", "adamw")
                      and not section.get("params", {}).get("torch_adam"))
    rehearsed = torch.cuda.is_available() and machine.local_ranks(world) > torch.cuda.device_count()
    return max((predict.rank_memory(run.stage, run.engine, run.dtype, world, shape.params,
                                    config.get("zero_optimization", {}), shape, micro_batch=run.micro_batch,
                                    seq=run.seq, checkpoint=run.checkpoint, loss_chunk=LOSS_CHUNK, offload=run.offload,
                                    flash=predict.uses_flash(torch.cuda.is_available(), run.dtype),
                                    on_gpu=torch.cuda.is_available(), deepspeed_adam=deepspeed_adam,
                                    rehearsed=rehearsed, rank=rank)
                for rank in moments.telling_ranks(run.stage, run.engine, world, shape.params, shape, run.offload)),
               key=lambda m: m["peak"])


def prediction_line(run: options.Run, config: dict[str, Any], world: int) -> str:
    m = predicted_memory(run, config, world)
    runtime = "" if torch.cuda.is_available() else ", and a CPU process's runtime besides"
    return (f"predicted per rank at {world} rank(s): model states {size(m['states'])}, activations "
            f"{size(m['activations'])}, peak {size(m['peak'])}{runtime}")
