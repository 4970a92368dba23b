"""Many run.sh runs in one device call, side by side on one H200 within its memory: each job starts once the GiB
that the running ones may take, with its own, fit under BUDGET_GIB, and only if its time still fits before the
deadline. Runs that share the GPU share its time too: their memory per rank, losses and verdicts are real, their
speeds are not (the jobs marked alone run with nothing beside them, for their step times).

    python3 benchmarks/h200_batch.py OUT_DIR DEADLINE_S BATCH ...

Each job's output is OUT_DIR/NAME.txt (with its time), its results folder OUT_DIR/results/NAME; the last lines
printed say each job's exit status and seconds, and which jobs did not start."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

GRACE_S = 30  # past the deadline, before a job that outran its estimate is stopped
BUDGET_GIB = 128  # of the H200's 139: the CUDA contexts of up to a dozen ranks, and some slack for the estimates

# name: (the largest GiB that all its ranks hold together at one time, seconds alone, run.sh's arguments); the GiB
# from memory.rank_memory's peaks per rank (stage 0 of the 1.3b model: 24.5 GiB a rank), rounded up
BATCHES = {
    "verdict": {  # issue 31's matrix: each row a stage-0/stage-3 pair at the same ranks
        "fp16_rehearsal": (100, 170, "--dtype fp16"),  # the seconds as measured in the first call
        "model_2.7b": (100, 150, "--ranks 2 --model 2.7b"),  # 49.65 GiB a rank at stage 0
        "mb8_no_checkpoint": (72, 180, "--ranks 2 --micro-batch 8 --no-checkpoint"),
        "offload": (52, 240, '--ranks 2 --stages "0 3 3_offload"'),
        "original_design": (56, 240, '--ranks 2 --stages "0_original 3_original"'),
        "fp32_350m_ranks2": (16, 120, "--ranks 2 --dtype fp32 --model 350m"),
        "model_350m": (10, 100, "--ranks 2 --model 350m"),
    },
    "peaks": {  # issue 33's matrix beyond the verdict's: every RESULT records its predicted peak
        # (stage 0 at 1, 2 and 4 ranks, and fp16 at 2, are the test suite's GPU launches)
        "s12_r1": (30, 120, '--ranks 1 --stages "1 2"'),
        "s12_r4": (40, 200, '--ranks 4 --stages "1 2"'),
        "s3_r1": (28, 150, '--ranks 1 --stages "3 3_offload" --peer fsdp2'),
        "mb16_no_checkpoint": (50, 120, '--ranks 1 --stages "0 3" --micro-batch 16 --no-checkpoint'),
        "mb1_checkpoint": (28, 100, '--ranks 1 --stages "0 3" --micro-batch 1'),
        "r8": (64, 300, '--ranks 8 --stages "1 2 3"'),
        "tiny": (8, 100, '--ranks "1 2" --stages "0 1 2 3" --model tiny'),
        "compile": (28, 150, '--ranks 1 --stages "0 3" --peer fsdp2 --compile'),
    },
    "probe": {  # fp16 started at a loss scale of 2^12 and 2^8 (ds_config_stage{0,3}_p{12,8}.json, made by the
                # device call), where issue 31's trial overflowed at stage 3 from DeepSpeed's 2^16; the 2.7b model
                # at two rates below its preset's 4e-6, at which its loss rose at step 2
        "fp16_p12_r2": (52, 120, '--ranks 2 --dtype fp16 --stages "0_p12 3_p12"'),
        "fp16_p8_r2": (52, 120, '--ranks 2 --dtype fp16 --stages "0_p8 3_p8"'),
        "lr2e-6_2.7b": (50, 60, "--ranks 1 --model 2.7b --stages 0 --lr 2e-6"),
        "lr3e-6_2.7b": (50, 60, "--ranks 1 --model 2.7b --stages 0 --lr 3e-6"),
    },
    "steady": {  # issue 33's calibration: the same setup at 10 and at 30 steps, alone on the GPU
        "steady10": (30, 60, "--ranks 1 --stages 0 --steps 10 alone"),
        "steady30": (30, 70, "--ranks 1 --stages 0 --steps 30 alone"),
    },
    "s12_no_checkpoint": {  # stages 1 and 2 without checkpointing, predicted before they ran: 14.75 GiB at 2 ranks
        # (both), 9.71 and 9.89 at 4, where the committed 4-rank runs, older than the zero section's record, peaked 10.35
        "s12_r4_nock": (44, 220, '--ranks 4 --stages "1 2" --no-checkpoint'),
        "s12_r2_nock": (34, 160, '--ranks 2 --stages "1 2" --no-checkpoint'),
    },
    "s12_held_out": {  # stages 1 and 2 where predict.whole_tensor_grad_elems was not checked: fp32, fp16, 350m on 3
        # and 8 ranks, 2.7b; predicted peaks per rank: 5.54 GiB, 14.75, 3.02, 2.06, 18.66 (stage 1, the larger)
        "s12_fp32_350m_r2": (14, 120, '--ranks 2 --stages "1 2" --dtype fp32 --model 350m'),
        "s12_350m_r3": (12, 120, '--ranks 3 --stages "1 2" --model 350m'),
        "s12_350m_r8_mb1": (24, 200, '--ranks 8 --stages "1 2" --model 350m --micro-batch 1'),
        "s12_2.7b_r4": (80, 200, '--ranks 4 --stages "1 2" --model 2.7b'),
        "s12_fp16_r2": (34, 160, '--ranks 2 --stages "1 2" --dtype fp16'),
    },
    "s1_held_out": {  # stage 1's reduction (predict.stage1_reduction_elems, 32-s12) on settings it was not read off,
        # predicted per rank before they ran: 14.98 GiB on rank 0 and 14.48 on the others; 4.69; 1.755; 2.17
        "s1_fp32_r4": (60, 240, '--ranks 4 --stages 1 --dtype fp32'),
        "s1_760m_r6": (32, 200, '--ranks 6 --stages 1 --model 760m'),
        "s1_fp32_125m_r5": (12, 150, '--ranks 5 --stages 1 --dtype fp32 --model 125m'),
        "s1_350m_r8_mb1": (24, 150, '--ranks 8 --stages 1 --model 350m --micro-batch 1'),
    },
    "steady_mb": {  # the same at micro batches that keep the GPU busy (0.40 s a step at 16, 30-steady), in two orders
        "steady10_mb16": (60, 45, "--ranks 1 --stages 0 --steps 10 --micro-batch 16 alone"),
        "steady30_mb16": (60, 55, "--ranks 1 --stages 0 --steps 30 --micro-batch 16 alone"),
        "steady30_mb16b": (60, 55, "--ranks 1 --stages 0 --steps 30 --micro-batch 16 alone"),
        "steady10_mb16b": (60, 45, "--ranks 1 --stages 0 --steps 10 --micro-batch 16 alone"),
        "steady10_mb8": (45, 40, "--ranks 1 --stages 0 --steps 10 --micro-batch 8 alone"),
        "steady30_mb8": (45, 50, "--ranks 1 --stages 0 --steps 30 --micro-batch 8 alone"),
    },
}
# what the first call of the verdict and peak batches left unrun, after the fp16 fix (31a6fe3)
BATCHES["rest"] = {name: {**BATCHES["verdict"], **BATCHES["peaks"]}[name] for name in (
    "fp16_rehearsal", "s3_r1", "model_2.7b", "compile", "offload", "original_design", "mb8_no_checkpoint")}
# the 2.7b model's rate, at stage 3 alone (stage 0 agreed with it to 0.09% at 3e-6, 2 ranks, where it rose at step
# 3: 11.322, 7.773, 8.059); and stage 3 offloaded where the embedding's gradient is its peak, on runs that the
# offload term (predict.offloaded_grad_bytes) was not fitted to
BATCHES["probe2"] = {
    "lr2.5e-6_2.7b_r2": (46, 100, "--ranks 2 --model 2.7b --stages 3 --lr 2.5e-6"),
    "lr3.5e-6_2.7b_r2": (46, 100, "--ranks 2 --model 2.7b --stages 3 --lr 3.5e-6"),
    "lr2.5e-6_2.7b_r1": (42, 70, "--ranks 1 --model 2.7b --stages 3 --lr 2.5e-6"),
    "lr3.5e-6_2.7b_r1": (42, 70, "--ranks 1 --model 2.7b --stages 3 --lr 3.5e-6"),
    "offload_mb1": (6, 60, "--ranks 1 --stages 3_offload --micro-batch 1"),
    "offload_350m": (4, 60, "--ranks 1 --stages 3_offload --model 350m"),
}
# what no call had run by 597284a, in the order of their issues (31's matrix, then 33's): the rest of a device call
# that ran the test suite first, then one of its own
BATCHES["unrun"] = {name: {**BATCHES["verdict"], **BATCHES["peaks"]}[name] for name in (
    "model_2.7b", "s3_r1", "mb8_no_checkpoint", "offload", "original_design", "compile", "r8")}
# what was still unrun after the call of 27-suite-matrix/1-batch (which ran s3_r1)
BATCHES["last"] = {name: job for name, job in BATCHES["unrun"].items() if name != "s3_r1"}
BATCHES["r8"] = {"r8": BATCHES["peaks"]["r8"]}
# runs that issue 33's terms for 28-suite-matrix's misses (stage 2 on 8 ranks, offload on 2, the original design)
# were not fitted to: the same settings at other numbers of ranks
BATCHES["held"] = {
    "s12_r4": (40, 200, '--ranks 4 --stages "1 2"'),
    "s2_r2": (30, 120, "--ranks 2 --stages 2"),
    "original3_r4": (36, 200, "--ranks 4 --stages 3_original"),
    "offload_r4": (16, 200, "--ranks 4 --stages 3_offload"),
}

# runs that moments.prefetch_bytes (issue 33, 29-live) was not fitted to: the 2.7b model offloaded, where a prefetch
# gathers two thirds of a block; 350m offloaded, where it gathers four blocks; ds_config_stage3.json with DeepSpeed's
# default cap of 1e9 (3_live1e9, made by write_capped_config) on 4 ranks
BATCHES["prefetch"] = {
    "offload_2.7b_r2": (40, 240, "--ranks 2 --model 2.7b --stages 3_offload alone"),  # alone: 70 GB of host memory
    "offload_350m_r2": (8, 120, "--ranks 2 --model 350m --stages 3_offload"),
    "live1e9_r4": (52, 180, "--ranks 4 --stages 3_live1e9"),
}

# the host's peak resident set (accounting/host.py, fitted on 1.3b offloaded on one rank) on a model it was not:
# 57.2 GB predicted before the run
BATCHES["host"] = {"offload_2.7b_r1": (20, 240, "--ranks 1 --model 2.7b --stages 3_offload")}


def launch(out: Path, name: str, args: str, limit_s: float) -> subprocess.Popen:
    """run.sh ARGS, stopped by SIGTERM (which run.sh reports as an interruption) after limit_s."""
    (out / "results" / name).mkdir(parents=True, exist_ok=True)
    command = f"{{ time timeout {limit_s:.0f} bash run.sh {args}; }} > {out / name}.txt 2>&1"
    return subprocess.Popen(["bash", "-c", command], cwd=ROOT, env={**os.environ, "RESULTS": str(out / "results" / name)})


def write_original_configs() -> None:
    """benchmarks/original_design.json as run.sh's stages 0_original and 3_original (fp16, lr 1e-4, train batch 8)."""
    for stage in (0, 3):
        config = json.loads((ROOT / "benchmarks" / "original_design.json").read_text())
        config.setdefault("zero_optimization", {})["stage"] = stage
        (ROOT / f"ds_config_stage{stage}_original.json").write_text(json.dumps(config, indent=2))


def write_capped_config(source: str | Path, live: float, target: str | Path) -> None:
    """A config with its stage3_max_live_parameters set: the prefetch's cap ahead of backward (issue 33, 29-live)."""
    config = json.loads(Path(source).read_text())
    config["zero_optimization"]["stage3_max_live_parameters"] = live
    Path(target).write_text(json.dumps(config, indent=2))


def run_batches(out: Path, deadline_s: float, jobs: dict) -> None:
    start = time.monotonic()
    waiting, running, done = dict(jobs), {}, {}
    while waiting or running:
        for name, (proc, gib, began) in list(running.items()):
            if proc.poll() is not None:
                done[name] = (proc.returncode, round(time.monotonic() - began))
                del running[name]
        alone = any(jobs[n][2].endswith("alone") for n in running)
        for name, (gib, seconds, args) in list(waiting.items()):
            solo = args.endswith("alone")
            held = sum(g for _, g, _ in running.values())
            if alone or (solo and running) or held + gib > BUDGET_GIB:
                if solo:
                    break  # the jobs after one that runs alone wait for it, in order
                continue
            if time.monotonic() - start + seconds > deadline_s:
                continue
            limit_s = deadline_s + GRACE_S - (time.monotonic() - start)
            running[name] = (launch(out, name, args.removesuffix(" alone"), limit_s), gib, time.monotonic())
            del waiting[name]
            alone = solo
            print(f"[{time.monotonic() - start:5.0f}s] started {name}", flush=True)
        if waiting and not running and all(time.monotonic() - start + s > deadline_s for _, s, _ in waiting.values()):
            break
        time.sleep(1)
    for name, (status, seconds) in done.items():
        print(f"{name}: exit {status} in {seconds} s")
    for name in waiting:
        print(f"{name}: not started (no time left)")


if __name__ == "__main__":
    out_dir, deadline = Path(sys.argv[1]), float(sys.argv[2])
    out_dir.mkdir(parents=True, exist_ok=True)
    write_original_configs()
    write_capped_config(ROOT / "ds_config_stage3.json", 1e9, ROOT / "ds_config_stage3_live1e9.json")  # 3_live1e9
    run_batches(out_dir, deadline, {name: job for batch in sys.argv[3:] for name, job in BATCHES[batch].items()})
