"""
What a run is given, before anything is built: the token stream, the options resolved against the config, the
machine and the number of ranks (train_gpt.py --check says how they were read), and what theory predicts one
rank will hold. train_gpt.py trains on them; launches.py checks each run with them before launching it.
"""
import argparse
import functools
import os
import sysconfig
from pathlib import Path
from typing import Any

import numpy as np
import torch

from zero3bench import config_checks, fsdp2, hf, machine, options, timeline
from zero3bench.accounting.memory import Counts, MemoryTerms, Seat, missing, offload_of, rank_memory, telling_ranks
from zero3bench.accounting.shapes import DEFAULT_MODEL, PRESETS, ModelShape
from zero3bench.formatting import size


@functools.cache
def chosen(model: str) -> tuple[ModelShape, Any]:
    """The model that --model names: its shape, and transformers' config for a Hugging Face model (else None), read
    once per process (hf.py)."""
    path = hf.config_path(model)
    if path is None:
        return PRESETS[model], None
    config = hf.transformers_config(hf.read_config(path), path)
    return hf.shape_of(config), config


def shape_for(run: options.Run) -> ModelShape:
    """The run's model's shape, a Hugging Face model's with what it keeps for backward counted at the run's
    sequence, dtype and device (hf.counted_at): what its record carries and its prediction reads."""
    return counted(run.model, run.seq, run.dtype, torch.cuda.is_available())


@functools.cache
def counted(model: str, seq: int, dtype: str, on_gpu: bool) -> ModelShape:
    shape, config = chosen(model)
    return shape if config is None else hf.counted_at(config, shape, seq, dtype, on_gpu)


def check_token_file(path: Path) -> None:
    if not path.is_file():
        raise options.BadInput(f"--data {path}: {'not a file' if path.exists() else 'no such file'}")
    if not os.access(path, os.R_OK):
        raise options.BadInput(f"--data {path}: cannot be read: permission denied")
    if path.suffix != ".npy" and path.stat().st_size % 2:
        raise options.BadInput(f"--data {path}: not a flat uint16 token file (odd size)")


UINT16_IDS = 1 << 16  # the ids that a nanoGPT .bin (uint16) can hold


def token_file(path: Path, vocab: int) -> np.ndarray:
    """A .npy of unsigned integers in one dimension (numpy's own layout, which says its type), or a nanoGPT .bin."""
    check_token_file(path)
    if path.suffix == ".npy":
        try:
            tokens = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError) as e:
            raise options.BadInput(f"--data {path}: not a .npy array ({str(e).splitlines()[0]})") from None
        if tokens.ndim != 1 or tokens.dtype.kind != "u":
            raise options.BadInput(f"--data {path}: a token file is one dimension of unsigned integers, not "
                                   f"{tokens.ndim}-D {tokens.dtype}")
        return tokens
    if vocab > UINT16_IDS:
        raise options.BadInput(f"--data {path}: a uint16 .bin cannot hold ids of {UINT16_IDS:,} or more, and the "
                               f"model's vocabulary has {vocab:,}: save the tokens as a uint32 .npy (numpy.save)")
    return np.memmap(path, dtype=np.uint16, mode="r") if path.stat().st_size else np.zeros(0, np.uint16)


def load_tokens(path: Path | None, vocab: int, seq: int) -> np.ndarray:
    """The token stream: a token file (token_file), or else the bytes of Python's own sources, real text that every
    Python installation ships."""
    if path is None:
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        tokens = np.frombuffer(b"".join(f.read_bytes() for f in sorted(stdlib.glob("*.py"))), dtype=np.uint8)
    else:
        tokens = token_file(path, vocab)
    if len(tokens) < seq + 1:
        raise options.BadInput(f"the data has {len(tokens)} tokens, fewer than one row of {seq} + 1")
    # the first 16M tokens only: a corpus can be many GB; a stray id further on fails in the embedding
    if int(tokens[: 1 << 24].max()) >= vocab:
        where = f"--data {path}" if path else "Python's sources (bytes), the default data,"
        raise options.BadInput(f"{where}: token ids reach {int(tokens[: 1 << 24].max())}, outside the "
                               f"vocabulary of {vocab}")
    return tokens


def resolve(args: argparse.Namespace) -> tuple[dict[str, Any], options.Run, np.ndarray, str]:
    """Check every input and fill in what depends on the machine, the config and the number of ranks. Returns
    the DeepSpeed config, the run (options.Run), the tokens and one line that says how the inputs were read."""
    on_gpu = torch.cuda.is_available()
    model = args.model or (DEFAULT_MODEL if on_gpu else "tiny")
    shape, hf_config = chosen(model)
    if hf_config is not None:
        hf.check_checkpointing(hf_config, args.checkpoint, model)
    host = {"on_gpu": on_gpu, "bf16_ok": on_gpu and torch.cuda.is_bf16_supported(),
            "known_optimizer": config_checks.known_optimizer, "fsdp2_missing": fsdp2.missing()}
    world = args.check or int(os.environ["WORLD_SIZE"])
    config, where = config_checks.read_config(args.config), f" {args.config}"
    config, autos = config_checks.from_other_tools(config, shape.d_model, where)
    config, run, how = options.resolve(args, config, model, (shape.context, shape.lr), world, host)
    config_checks.refuse_what_the_build_would(config_checks.deepspeed_config(config, run.micro_batch, where), where)
    refused = timeline.refusal(run, on_gpu, torch.__version__)
    if refused:
        raise options.BadInput(refused)
    return config, run, load_tokens(args.data, shape.vocab, run.seq), how + autos


def predicted_memory(run: options.Run, config: dict[str, Any], world: int) -> MemoryTerms:
    """What theory says one rank of world will hold (memory.rank_memory, the formula of plan.py and of each
    RESULT's predicted_peak_bytes), before anything is built, at the rank whose peak is the most (at DeepSpeed's
    stages 1 and 2 each rank keeps other gradients): a config's Adam is DeepSpeed's own, and the ranks on this host
    beyond its GPUs rehearse on them, as train_gpt.init_distributed places them."""
    shape, section, on_gpu = shape_for(run), config.get("optimizer", {}), torch.cuda.is_available()
    deepspeed_adam = (str(section.get("type", "")).lower() in ("adam", "adamw")
                      and not section.get("params", {}).get("torch_adam"))
    rehearsed = on_gpu and machine.local_ranks(world) > torch.cuda.device_count()
    ranks = telling_ranks(run.stage, run.engine, world, shape.params, shape, offload_of(run))
    return max((rank_memory(run, shape, Counts.of_shape(shape), config.get("zero_optimization", {}),
                            Seat(world, rank, on_gpu, rehearsed, deepspeed_adam)) for rank in ranks),
               key=lambda m: m.held if m.peak is None else m.peak)  # a peak not predicted, at no rank


def prediction_line(run: options.Run, config: dict[str, Any], world: int) -> str:
    m = predicted_memory(run, config, world)
    runtime = "" if torch.cuda.is_available() else ", and a CPU process's runtime besides"
    if m.peak is None:
        lacking = missing(shape_for(run), run.dtype, run.seq, torch.cuda.is_available())
        return (f"predicted per rank at {world} rank(s): model states {size(m.states)}; activations and peak not "
                f"predicted: {lacking}")
    return (f"predicted per rank at {world} rank(s): model states {size(m.states)}, activations "
            f"{size(m.activations)}, peak {size(m.peak)}{runtime}")
