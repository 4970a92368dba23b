"""
What run.sh launches, worked out before anything starts, in one process: every input is checked here as
`train_gpt.py --check` would check it, and each run comes out as one tab-separated line for run.sh:

    RUN <ranks> <log name> <train_gpt.py arguments, shell-quoted>
    NOTE <a line for the terminal>
    ENV <variable> <value>   (for every run and the report: a cache moved off a home folder that cannot be written)

    python3 -m zero3bench.launches RANKS STAGES PEER [train_gpt.py options ...]    # RANKS "" means every GPU

A stage is a number or the rest of a config's name (3_offload is ds_config_stage3_offload.json); the peer
(fsdp2) runs last, on stage 3's config. With one GPU and no RANKS, the ranks rehearse REHEARSED_RANKS on it:
one rank has nothing to shard across. Bad input: one line on stderr, exit 2.
"""
import os
import shlex
import sys
from typing import Any, NoReturn

import torch

from zero3bench import fsdp2, inputs, machine, options, stages
from zero3bench.accounting.shapes import PRESETS

# The acceptance check for memory is stated at 4 GPUs: stage 3 "about 3-4x lower per GPU" than stage 0.
REHEARSED_RANKS = 4
CPU_PROCESSES = 2  # without GPUs: two gloo ranks, the fewest that have something to shard across
CONTEXT_BYTES = 1 << 30  # what a process holds on a GPU outside PyTorch's allocator (CUDA context, NCCL), at most


def bad(msg: str) -> NoReturn:
    print(f"run.sh: error: {msg}", file=sys.stderr)
    sys.exit(options.EXIT["bad input"])


def config_args(stage: str) -> list[str]:
    """train_gpt.py's arguments that choose a stage's config (stages.config_path)."""
    if stage == "fsdp2":
        return ["--stage", str(stages.ZERO3), "--engine", "fsdp2"]
    if stages.config_path(stage).is_dir():  # as a container's bind mount of a file that was missing makes it
        bad(f"{stages.config_path(stage)} is a folder, not a config file")
    if not stages.config_path(stage).is_file():
        bad(f"no config for stage '{stage}'; there are: {' '.join(stages.config_names())}")
    config = stages.config_path(stage).relative_to(stages.ROOT)
    return ["--stage", stage] if stage.isdigit() else ["--config", str(config)]


def checked(argv: list[str], ranks: int) -> tuple[options.Run, dict[str, Any]]:
    """train_gpt.py's run (options.Run) and config, resolved for this many ranks; bad input ends here, as in
    train_gpt.py."""
    try:
        args = options.parse_args([*argv, "--check", str(ranks)], PRESETS)
        config, run, _, _ = inputs.resolve(args)
    except options.BadInput as e:
        options.fail(str(e))
    return run, config


def stage3_peak(run: options.Run, config: dict[str, Any], ranks: int) -> float:
    """The predicted peak of one stage-3 rank of ranks (inputs.predicted_memory) and the CUDA context."""
    return inputs.predicted_memory(run, config, ranks).peak + CONTEXT_BYTES


def rehearsal(argv: list[str]) -> tuple[int, str]:
    """On one GPU: the most ranks, up to REHEARSED_RANKS, whose stage-3 peaks fit its memory together."""
    run, config = checked([*config_args(str(stages.ZERO3)), *argv], REHEARSED_RANKS)
    memory = torch.cuda.get_device_properties(0).total_memory
    fits = [n for n in range(REHEARSED_RANKS, 1, -1) if n * stage3_peak(run, config, n) <= memory]
    n = fits[0] if fits else 1
    why = "" if n == REHEARSED_RANKS else (
        f", not {REHEARSED_RANKS}: {REHEARSED_RANKS} stage-3 ranks of the {run.model} model would need about "
        f"{REHEARSED_RANKS * stage3_peak(run, config, REHEARSED_RANKS) / 2**30:.0f} GiB of its "
        f"{memory / 2**30:.0f} GiB")
    return n, (f"one GPU: {n} ranks rehearse on it over gloo{why}, so that stage 3 has something to shard across; "
               "each rank's memory is real, its speed is not (--ranks 1 runs one rank)")


def plan(ranks: str, stage_names: str, peer: str,
         argv: list[str]) -> tuple[list[tuple[int, str, list[str]]], list[str]]:
    """[(ranks, log name, train_gpt.py arguments)] in run order, and the notes for the terminal."""
    notes, counts = [], [int(n) for n in ranks.split()]
    if any(n > options.MAX_RANKS for n in counts):
        bad(f"--ranks takes at most {options.MAX_RANKS:,} ranks a run, not {max(counts)}")
    if not counts:
        gpus = torch.cuda.device_count()
        counts = [gpus or CPU_PROCESSES] if gpus != 1 else []
        if not counts:
            n, note = rehearsal(argv)
            counts, notes = [n], [note]
    if peer and fsdp2.missing():  # the rest of the run goes on without its peer
        notes.append(f"--peer {peer} skipped: {fsdp2.missing()}")
        peer = ""
    names = [*stage_names.split(), *([peer] if peer else [])]
    runs = [(n, ("" if name == peer else "stage") + name + ("" if len(counts) == 1 else f"_{n}ranks"),
             [*config_args(name), *argv]) for n in counts for name in names]
    doubled = sorted({name for _, name, _ in runs if [r[1] for r in runs].count(name) > 1})
    if doubled:  # each run's log is its name's: a second would write into the first's
        bad(f"{' '.join(doubled)} would run twice; name each stage and number of ranks once")
    for n, name, run_argv in runs:
        notes.append(f"{name}: {inputs.prediction_line(*checked(run_argv, n), n)}")
    return runs, notes


def main(argv: list[str]) -> None:
    ranks, stage_names, peer, *rest = argv
    runs, notes = plan(ranks, stage_names, peer, rest)
    moved = machine.fall_back_caches()
    if moved:
        notes.append(f"cannot write {', '.join(map(str, moved.values()))}; instead "
                     + ", ".join(f"{variable}={os.environ[variable]}" for variable in moved))
    lines = [f"NOTE\t{note}" for note in notes] + [f"ENV\t{variable}\t{os.environ[variable]}" for variable in moved]
    lines += [f"RUN\t{n}\t{name}\t{shlex.join(run_argv)}" for n, name, run_argv in runs]
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1:])
