"""
What run.sh launches, worked out before anything starts, in one process: every input is checked here as
`train_gpt.py --check` would check it, and each run comes out as one tab-separated line for run.sh:

    RUN <ranks> <log name> <train_gpt.py arguments, shell-quoted>
    NOTE <a line for the terminal>
    ENV <variable> <value>   (for every run and the report: a cache moved off a home folder that cannot be written,
                              and RUN_SIZED_FOR, the memory that a rehearsal was sized for, as JSON)

    python3 -m zero3bench.launches RANKS STAGES PEER [train_gpt.py options ...]    # RANKS "" means every GPU

A stage is a number or the rest of a config's name (3_offload is ds_config_stage3_offload.json); the peer
(fsdp2) runs last, on stage 3's config. With one GPU and no RANKS, up to REHEARSED_RANKS ranks rehearse on it
(one rank has nothing to shard across), as many as each run's predicted peak lets fit its free memory; the default
model steps down to a smaller preset where not even 2 fit. Bad input: one line on stderr, exit 2.
"""
import json
import os
import shlex
import sys
from dataclasses import dataclass, replace
from typing import Any, NoReturn

import torch

from zero3bench import fsdp2, inputs, machine, options, stages
from zero3bench.accounting.shapes import DEFAULT_MODEL, PRESETS, smaller_presets
from zero3bench.formatting import size

# The acceptance check for memory is stated at 4 GPUs: stage 3 "about 3-4x lower per GPU" than stage 0.
REHEARSED_RANKS = 4
CPU_PROCESSES = 2  # without GPUs: two gloo ranks, the fewest that have something to shard across
# What a rank holds on a GPU beyond its predicted peak. At the out-of-memory of 4 stage-0 ranks of the 1.3b model on an
# 80 GB H100 (torch 2.11, CUDA 13), each rank's "non-PyTorch memory", its CUDA context, was 0.66 to 0.67 GiB, and
# PyTorch's allocator held 0.10 to 0.11 GiB reserved but unallocated (benchmarks/logs/h100/1-first-run)
CONTEXT_BYTES = 700 * 2**20
RESERVE_BYTES = 300 * 2**20


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


@dataclass(frozen=True)
class Need:
    """What one rank of a run needs of its GPU: the predicted peak (inputs.predicted_memory; the model states where
    the peak is not predicted), its CUDA context and the allocator's reserve."""
    run: str  # the run's log name
    ranks: int
    held: float  # the predicted peak, or the model states
    peak_predicted: bool

    @property
    def bytes(self) -> float:
        return self.held + CONTEXT_BYTES + RESERVE_BYTES

    def fits(self, free: float) -> bool:
        return self.ranks * self.bytes <= free

    def words(self) -> str:
        what = "predicted peak" if self.peak_predicted else "model states (its peak is not predicted)"
        return (f"{size(self.bytes)} ({self.run}'s {what} {size(self.held)}, the CUDA context and the allocator's "
                "reserve)")

    def total(self) -> str:
        return (f"{self.ranks} would need {self.ranks} x {size(self.bytes)} = {size(self.ranks * self.bytes)} "
                f"({self.run})")


def need(name: str, argv: list[str], ranks: int) -> Need:
    """What one rank needs of the GPU in the run name (a stage, or the peer) of ranks, on this machine."""
    run, config = checked([*config_args(name), *argv], ranks)
    m = inputs.predicted_memory(run, config, ranks)
    held = m.peak if m.peak is not None else m.states
    return Need(("" if name == "fsdp2" else "stage") + name, ranks, held, m.peak is not None)


def largest(needs: list[Need]) -> Need:
    return max(needs, key=lambda n: n.bytes)


def with_model(argv: list[str], model: str) -> list[str]:
    return argv if given_model(argv) else [*argv, "--model", model]


def given_model(argv: list[str]) -> str | None:
    return options.parse_args([*argv, "--check", "1"], PRESETS).model


def most_needed(model: str, names: list[str], argv: list[str], n: int) -> Need:
    """The largest need among the runs names of model at n ranks."""
    return largest([need(name, with_model(argv, model), n) for name in names])


def fitting(model: str, names: list[str], argv: list[str], free: float) -> tuple[int, Need] | None:
    """The most ranks, REHEARSED_RANKS down to 2, at which each run of model fits free bytes, with its largest need
    there; None where not even 2 do."""
    for n in range(REHEARSED_RANKS, 1, -1):
        if (most := most_needed(model, names, argv, n)).fits(free):
            return n, most
    return None


@dataclass(frozen=True)
class Rehearsal:
    """How run.sh rehearses on one GPU: ranks, the model, why, and the memory it was sized for (summary.json)."""
    ranks: int
    model: str
    free_bytes: int
    device: str
    need: Need
    why: str

    def note(self) -> str:
        ranks = (f"{self.ranks} ranks of the {self.model} model rehearse on it over gloo, each needing up to"
                 if self.ranks > 1 else f"1 rank of the {self.model} model trains on it, needing up to")
        return (f"one GPU ({self.device}, {size(self.free_bytes)} free): {ranks} {self.need.words()}; {self.why}. "
                "Each rank's memory is real, its speed is not (--ranks 1 runs one rank)")

    def record(self) -> dict[str, Any]:
        return {"device": self.device, "free_bytes": self.free_bytes, "ranks": self.ranks, "model": self.model,
                "run": self.need.run, "need_bytes": self.need.bytes, "peak_predicted": self.need.peak_predicted,
                "why": self.why}


def rehearsal(names: list[str], argv: list[str]) -> Rehearsal:
    """On one GPU: the most ranks, up to REHEARSED_RANKS, at which each of the runs names fits the GPU's free memory,
    and the model: the one given, else the default wherever it fits 2 ranks, else the largest preset that does."""
    free, device, given = torch.cuda.mem_get_info()[0], torch.cuda.get_device_name(0), given_model(argv)
    for model in [given] if given else [DEFAULT_MODEL, *smaller_presets(DEFAULT_MODEL)]:
        if fit := fitting(model, names, argv, free):
            n, most = fit
            why = [f"{REHEARSED_RANKS} ranks, as the acceptance check asks" if n == REHEARSED_RANKS
                   else most_needed(model, names, argv, n + 1).total()]
            if model != (given or DEFAULT_MODEL):
                default = most_needed(DEFAULT_MODEL, names, argv, 2).total()
                why.insert(0, f"the {DEFAULT_MODEL} model fits no 2 ranks ({default}), and {model} is the largest "
                              "preset that does")
            return Rehearsal(n, model, free, device, most, "; ".join(why))
    return only_stage3(given, names, argv, free, device)


def only_stage3(model: str, names: list[str], argv: list[str], free: int, device: str) -> Rehearsal:
    """Where no number of ranks fits each run of the model given: the most at which stage 3 alone fits, so that it
    shows its sharding and the runs that do not fit show their out-of-memory as a result; else 1 rank."""
    zero3 = str(stages.ZERO3)
    for n in range(REHEARSED_RANKS, 1, -1):
        if (three := need(zero3, argv, n)).fits(free):
            return Rehearsal(n, model, free, device, three, f"stage 3 fits, but not every run: "
                             f"{most_needed(model, names, argv, n).total()}: expect an out-of-memory")
    one = need(zero3, argv, 1)
    worse = "" if one.fits(free) else (": not even 1 fits, so expect an out-of-memory; a smaller --model, or the "
                                       "optimizer offloaded (--stages \"0 3_offload\"), may fit")
    return Rehearsal(1, model, free, device, one, f"not even 2 ranks of stage 3 fit: {need(zero3, argv, 2).total()}"
                     + worse)


def overfull(n: int, name: str, argv: list[str]) -> str | None:
    """A note where n ranks of a run that the user sized (--ranks) are predicted not to fit this host's GPUs."""
    gpus = torch.cuda.device_count()
    if not gpus or os.environ.get("HOSTFILE"):
        return None
    free, want = torch.cuda.mem_get_info()[0], need(name, argv, n)
    per_gpu = replace(want, ranks=-(-n // gpus))
    if per_gpu.fits(free):
        return None
    return (f"{per_gpu.ranks} rank(s) a GPU need {size(per_gpu.ranks * per_gpu.bytes)} of its {size(free)} free, "
            f"{per_gpu.words()} each: expect an out-of-memory (bash run.sh without --ranks sizes a rehearsal to fit)")


def plan(ranks: str, stage_names: str, peer: str,
         argv: list[str]) -> tuple[list[tuple[int, str, list[str]]], list[str], dict[str, str]]:
    """[(ranks, log name, train_gpt.py arguments)] in run order, the notes for the terminal, and the variables for
    every run and the report (the rehearsal's sizing, RUN_SIZED_FOR)."""
    notes, counts, variables = [], [int(n) for n in ranks.split()], {}
    if any(n > options.MAX_RANKS for n in counts):
        bad(f"--ranks takes at most {options.MAX_RANKS:,} ranks a run, not {max(counts)}")
    if peer and fsdp2.missing():  # the rest of the run goes on without its peer
        notes.append(f"--peer {peer} skipped: {fsdp2.missing()}")
        peer = ""
    names = [*stage_names.split(), *([peer] if peer else [])]
    for name in names:
        config_args(name)  # a stage without a config ends here, before any GPU is asked
    if not counts:
        gpus = torch.cuda.device_count()
        counts = [gpus or CPU_PROCESSES] if gpus != 1 else []
        if not counts:
            chosen = rehearsal(names, argv)
            counts, argv, variables = [chosen.ranks], with_model(argv, chosen.model), {
                "RUN_SIZED_FOR": json.dumps(chosen.record())}
            notes.append(chosen.note())
    runs = [(n, ("" if name == peer else "stage") + name + ("" if len(counts) == 1 else f"_{n}ranks"),
             [*config_args(name), *argv]) for n in counts for name in names]
    if not variables:  # ranks that the user or the GPUs set: said where they will not fit
        notes += [f"{log}: {warn}" for (n, log, _), name in zip(runs, names * len(counts))
                  if (warn := overfull(n, name, argv))]
    doubled = sorted({name for _, name, _ in runs if [r[1] for r in runs].count(name) > 1})
    if doubled:  # each run's log is its name's: a second would write into the first's
        bad(f"{' '.join(doubled)} would run twice; name each stage and number of ranks once")
    for n, name, run_argv in runs:
        notes.append(f"{name}: {inputs.prediction_line(*checked(run_argv, n), n)}")
    return runs, notes, variables


def main(argv: list[str]) -> None:
    ranks, stage_names, peer, *rest = argv
    runs, notes, variables = plan(ranks, stage_names, peer, rest)
    moved = machine.fall_back_caches()
    if moved:
        notes.append(f"cannot write {', '.join(map(str, moved.values()))}; instead "
                     + ", ".join(f"{variable}={os.environ[variable]}" for variable in moved))
    variables.update({variable: os.environ[variable] for variable in moved})
    lines = [f"NOTE\t{note}" for note in notes] + [f"ENV\t{name}\t{value}" for name, value in variables.items()]
    lines += [f"RUN\t{n}\t{name}\t{shlex.join(run_argv)}" for n, name, run_argv in runs]
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1:])
