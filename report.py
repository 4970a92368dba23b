"""
Reads the RESULT lines that train_gpt.py leaves in a run's logs, compares the ZeRO stages, and keeps a
record of the run:

    python report.py results/<timestamp>           # table, verdict
    python report.py --write results/<timestamp>   # and writes summary.json, summary.md, memory.png there
    python report.py --compare results/A results/B [--tolerance 5]   # what moved; exit 1 on a regression

The verdict exits 0 on PASS, 1 on FAIL, 5 when it is not observable (one rank), 2 on bad input. Only the
standard library is needed; matplotlib, if installed, draws the plot.
"""
import argparse
import json
import math
import os
import re
import signal
import sys
import time
from pathlib import Path

import options
from formatting import EXIT, SIGNALS, fmt, format_table, relative_error, gib, other_bytes, rank_table, signed_pct, size

# Stage 3's model states per rank, as a fraction of stage 0's, may exceed the predicted fraction (1/G,
# plus the persistent parameters) by this factor before (b) fails.
MEMORY_SLACK = 1.25
# Both runs of a comparison must agree on these, or they compare different things.
SAME_IN_BOTH = ("model", "world_size", "micro_batch", "seq", "dtype", "seed", "checkpoint", "compile", "max_mem_gib")
# The same settings, compiled or not: compiling must not change the losses (engine.compile raced on two H200s:
# BENCHMARKS.md, section 11). FSDP2 is set against the stage-3 runs that agree on these.
SAME_COMPILED_OR_NOT = tuple(key for key in SAME_IN_BOTH if key != "compile")
# (e) compares the losses of runs that agree on these.
SAME_TRAINING = SAME_COMPILED_OR_NOT + ("lr", "warmup")
# Both stages train the same model on the same data with the same recipe, so their losses differ only by
# rounding, at every step.
LOSS_RTOL = 0.01
# After the steps on one batch, the weights of the two stages, as weights_checksum sums them, differ only where
# bf16 rounds an update differently: by 7.6e-6 to 2.1e-4 on 2 CPU ranks (seeds 0-2); a planted 1% perturbation of
# one rank's shard moved them by far more, and the losses by only 0.17%.
WEIGHTS_RTOL = 1e-3
# The first step's loss is one forward pass over the same weights and batch: runs differ there only in the
# order of sums, at most 7.8e-5 apart over the 1.3b runs in benchmarks/, across versions of this code.
FIRST_LOSS_RTOL = 2e-4
# The original design expects stage 3's peak to be "about 3-4x lower with 4 GPUs" than stage 0's: 1/3 of it,
# 1/4 for the partitioned model states and 1/12 for what no stage partitions (activations, logits, buffers).
# At G ranks that is 1/G + 1/12 of stage 0's peak: a ratio of 1.7x at 2 ranks, 3.0x at 4, 4.8x at 8 in mixed
# precision. (In fp32, stage 3's model states are 1.25/G of stage 0's: it keeps an fp32 master copy too.)
UNPARTITIONED_SHARE = 1 / 12
# The loss must fall at each of the first steps, which train on the same rows, and never return to the first
# step's later on.
FALLING_STEPS = options.SAME_ROWS_STEPS
# The original design: "the loss falls from about 10 to below about 8 within the first steps" (1.3b model).
DESIGN_LOSS = {"model": "1.3b", "step": 3, "below": 8.0}


# -----------------------------------------------------------------------------
# reading the logs


def read_results(log):
    """The RESULT records of one log, one per rank that reported, by rank."""
    # the launcher may put a host name before the line
    records = [json.loads(line.partition("RESULT ")[2]) for line in Path(log).read_text(errors="replace").splitlines()
               if "RESULT {" in line]
    return sorted(records, key=lambda r: r["rank"])


def read_command(log):
    """The launch command that run.sh writes as a log's first line."""
    first = Path(log).read_text(errors="replace").partition("\n")[0]
    return first.partition("COMMAND ")[2] or None


def read_marks(log):
    """run.sh's marks in a log: when it launched the run and when the launcher ended, with its exit status."""
    marks = {}
    for line in Path(log).read_text(errors="replace").splitlines():
        word, _, rest = line.partition(" ")
        if word in ("LAUNCHED", "ENDED") and rest:
            marks[word.lower()] = float(rest.split()[0])
            if word == "ENDED":
                marks["status"] = int(rest.split()[1])
    return marks


# torchrun's account of the first rank that failed: its "Root Cause" block
ROOT_CAUSE = re.compile(r"Root Cause.*?host\s*:\s*(\S+).*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)


def dead_rank(log, records):
    """The rank that the launcher saw end first with a failure, by rank and host, and how it ended; None where
    the launcher says nothing of one (the deepspeed launcher does not say which rank), or where the first to
    end gave one of train_gpt.py's own statuses, which its record explains."""
    found = ROOT_CAUSE.search(Path(log).read_text(errors="replace"))
    if not found or int(found.group(3)) in [*EXIT.values(), *(128 + n for n in SIGNALS.values())]:
        return None
    host, rank, code = found.group(1), int(found.group(2)), int(found.group(3))
    if host == "localhost" and first(records, "env"):  # torchrun names a single node so
        host = first(records, "env")["host"]
    how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
    return f"rank {rank} on {host} ended first, {how} (the launcher's report)"


def natural(name):
    """Sort key that puts stage3_8ranks before stage3_16ranks."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def load_runs(folder):
    """{log name: records} for every log in a results folder, in run.sh's order (stage, then ranks)."""
    return {log.stem: read_results(log) for log in sorted(Path(folder).glob("*.log"), key=lambda p: natural(p.stem))}


# -----------------------------------------------------------------------------
# what each run says


def failed(records):
    return not records or any(r["oom"] or r["error"] for r in records)


def oom(records):
    return any(r["oom"] for r in records)


def worst(records, key):
    values = [r[key] for r in records if r.get(key) is not None]
    return max(values) if values else None


def first(records, key):
    return records[0].get(key) if records else None


def status(records):
    if not records:
        return "no result"
    if oom(records):
        return "OOM"
    if any(r["error"] and not r.get("interrupted_by") for r in records):
        return "error"
    if first(records, "interrupted_by"):
        return f"interrupted by {first(records, 'interrupted_by')} after {len(records[0]['steps'])} step(s)"
    if failed(records):
        return "error"
    if first(records, "diverged"):
        return f"diverged at step {len(records[0]['steps'])}"
    missing = records[0]["world_size"] - len(records)
    return f"ok, {missing} rank(s) missing" if missing else "ok"


# -----------------------------------------------------------------------------
# tables


def estimator(records):
    """DeepSpeed's estimate for the device; without GPUs, device and host are one memory, so both."""
    estimate = first(records, "deepspeed_estimate")
    if not estimate:
        return None
    # DeepSpeed estimates host memory per node, for all the node's ranks
    per_rank_host = estimate["host_per_node"] / first(records, "ranks_per_node")
    return estimate["device"] + (per_rank_host if first(records, "mem_kind") != "cuda" and offloads(records) else 0)


def comm(records, figure, kind):
    """Rank 0's bytes of one kind of collective per step, or the best bus bandwidth of any rank: a rank's NCCL
    kernel also times its wait for the others, so the rank that waited least comes closest to the link's.
    Logs from before it was measured lack it."""
    per_rank = [(r.get(figure) or {}).get(kind) for r in records]
    if figure == "busbw":
        return max(filter(None, per_rank), default=None)
    return per_rank[0] if per_rank else None


def gbps(value):
    return value / 1e9 if value else None


def offloads(records):
    return bool(records) and any((records[0].get("offload") or {}).values())


# The directions of a ratio, as words: what the second run's figure is when it is below the first's, and above.
SMALLER, FASTER, LOWER = ("less", "more"), ("slower", "faster"), ("lower", "higher")
# Below this share of the other run's figure, a figure is next to nothing, and a ratio against it means nothing.
NEAR_ZERO = 0.01


# the figures that --compare follows (TRACKED), named so that it finds their rows whatever their labels


def model_states(records):
    return worst(records, "model_state_bytes")


def peak_memory(records):
    return worst(records, "peak_mem_bytes") or None


def first_loss(records):
    return first(records, "first_loss")


def last_loss(records):
    return (first(records, "losses") or [None])[-1]


def tokens_per_s(records):
    return first(records, "tokens_per_s")


def mfu(records):
    return first(records, "mfu")


# the comparison's rows: label, the figure of one run, its format, the words of a ratio of two runs (None where a
# ratio means nothing), whether the row is left out when no run has the figure (offload only, GPUs only), and
# whether it is a speed, which CPU processes and rehearsals do not measure
COMPARISON = [
    ("ranks", lambda rs: first(rs, "world_size"), "d", None, False, False),
    ("partitioned tensors", lambda rs: worst(rs, "partitioned_tensors"), "d", None, False, False),
    ("param tensors", lambda rs: worst(rs, "param_tensors"), "d", None, False, False),
    ("local params", lambda rs: worst(rs, "local_param_elems"), ",", SMALLER, False, False),
    ("model states", model_states, "bytes", SMALLER, False, False),
    ("  ZeRO paper", lambda rs: worst(rs, "predicted_model_state_bytes"), "bytes", SMALLER, False, False),
    ("  error", lambda rs: relative_error(worst(rs, "model_state_bytes"), worst(rs, "predicted_model_state_bytes")),
     "+.1%", None, False, False),
    ("  DeepSpeed estimator", estimator, "bytes", SMALLER, False, False),
    ("  error", lambda rs: relative_error(worst(rs, "model_state_bytes"), estimator(rs)), "+.1%", None, False, False),
    ("host model states", lambda rs: worst(rs, "host_state_bytes") or None, "bytes", None, True, False),
    ("  ZeRO paper", lambda rs: worst(rs, "predicted_host_state_bytes") or None, "bytes", None, True, False),
    ("  error", lambda rs: relative_error(worst(rs, "host_state_bytes"), worst(rs, "predicted_host_state_bytes")),
     "+.1%", None, True, False),
    ("other tensors", other_bytes, "bytes", None, False, False),
    ("peak memory", peak_memory, "bytes", SMALLER, False, False),
    ("  estimated", lambda rs: worst(rs, "predicted_peak_bytes") if first(rs, "mem_kind") == "cuda" else None,
     "bytes", SMALLER, True, False),
    ("all-gather / step", lambda rs: comm(rs, "comm_bytes", "all_gather"), "bytes", SMALLER, True, False),
    ("reduce-scatter / step", lambda rs: comm(rs, "comm_bytes", "reduce_scatter"), "bytes", SMALLER, True, False),
    ("all-reduce / step", lambda rs: comm(rs, "comm_bytes", "all_reduce"), "bytes", SMALLER, True, False),
    ("  volume, x params", lambda rs: first(rs, "comm_volume"), ".2f", SMALLER, True, False),
    ("  ZeRO paper", lambda rs: first(rs, "paper_comm_volume") if first(rs, "comm_volume") is not None else None,
     "d", None, True, False),
    ("busbw all-gather GB/s", lambda rs: gbps(comm(rs, "busbw", "all_gather")), ",.0f", LOWER, True, False),
    ("busbw reduce-scatter GB/s", lambda rs: gbps(comm(rs, "busbw", "reduce_scatter")), ",.0f", LOWER, True, False),
    ("busbw all-reduce GB/s", lambda rs: gbps(comm(rs, "busbw", "all_reduce")), ",.0f", LOWER, True, False),
    ("  all-gather alone GB/s", lambda rs: gbps(first(rs, "link_busbw")), ",.0f", None, True, False),
    ("  NVLink GB/s", lambda rs: gbps(first(rs, "link_bytes_per_s")), ",.0f", None, True, False),
    ("first loss", first_loss, ".4f", None, False, False),
    ("last loss", last_loss, ".4f", None, False, False),
    ("step time s", lambda rs: first(rs, "step_time_s"), ".3f", FASTER[::-1], False, True),
    ("  timed from step", lambda rs: first(rs, "timed_from") if first(rs, "deepcompile") else None, "d", None, True,
     False),
    ("tokens/s", tokens_per_s, ",.0f", FASTER, False, True),
    ("MFU", mfu, ".1%", LOWER, False, True),
]


def ratio(before, after, words):
    """The second figure against the first, in the words of its row: "4.00x less", "2.86x slower"; nothing where
    either is missing or next to nothing beside the other."""
    if words is None or not before or not after or min(before, after) < NEAR_ZERO * max(before, after):
        return ""
    if max(before, after) / min(before, after) < 1.005:
        return "same"
    return f"{max(before, after) / min(before, after):.2f}x {words[after > before]}"


def speed_not_measured(runs):
    """Why speed means nothing in these runs, or None: CPU processes, or ranks that share a GPU."""
    records = [rs[0] for rs in runs.values() if rs]
    if any(r.get("mem_kind") != "cuda" for r in records):
        return "CPU processes"
    return "a rehearsal, ranks sharing a GPU" if any(r.get("rehearsal") for r in records) else None


def comparison_table(runs):
    """The runs side by side, per-rank figures taken from the rank that holds the most; with two runs, a last
    column gives the second against the first. Speeds are marked where they mean nothing."""
    names = list(runs)
    unmeasured = speed_not_measured(runs)
    rows = [("", *names, f"{names[1]} against {names[0]}" if len(names) == 2 else "")]
    for label, figure, spec, words, optional, speed in COMPARISON:
        values = [figure(runs[name]) for name in names]
        if optional and all(v is None for v in values):
            continue
        label += " *" if speed and unmeasured else ""
        rows.append((label, *(fmt(v, spec) for v in values), ratio(*values, words) if len(values) == 2 else ""))
    rows.append(("status", *(status(runs[name]) for name in names), ""))
    table = format_table(rows)
    return table + (f"\n* not a measure of speed: {unmeasured}" if unmeasured else "")


# -----------------------------------------------------------------------------
# verdict


def check_partitioning(dense, zero3):
    counted = [r for r in zero3 if r.get("partitioned_tensors") is not None]  # a rank that failed early counted nothing
    if not counted:
        return "FAIL", "stage 3 reported no partitioning"
    whole = all(r["partitioned_tensors"] == r["param_tensors"] > 0 and r["shard_check_ok"] for r in counted)
    # stage 0 may have run out of memory before it counted anything; what it did count must be nothing
    counted0 = [r["partitioned_tensors"] for r in dense if r.get("partitioned_tensors") is not None]
    detail = (f"stage 3 partitions {counted[0]['partitioned_tensors']}/{counted[0]['param_tensors']} tensors "
              f"(shards checked: {'ok' if all(r['shard_check_ok'] for r in counted) else 'WRONG SIZES'}), "
              f"stage 0 {counted0[0] if counted0 else 'failed before counting'}")
    same_weights = True
    if dense[0].get("weights_checksum") is not None and counted[0].get("weights_checksum") is not None:
        a, b = dense[0]["weights_checksum"], counted[0]["weights_checksum"]
        same_weights = math.isclose(a, b, rel_tol=1e-9)
        detail += f"; the shards hold {'exactly' if same_weights else 'NOT'} stage 0's initial weights (checksum)"
    else:
        detail += "; a run failed before its checksum, so the weights were not compared"
    if counted[0]["world_size"] == 1:
        detail += "; with 1 rank each shard is the whole tensor"
    return ("PASS" if whole and not any(counted0) and same_weights else "FAIL"), detail


def change(before, after):
    return f"{before / after:.2f}x less" if after <= before else f"{after / before:.2f}x more"


def check_memory(dense, zero3):
    if failed(zero3):
        return "FAIL", f"stage 3 did not finish: {status(zero3)}"
    if oom(dense):
        cap = zero3[0].get("max_mem_gib")
        return "PASS", ("stage 0 ran out of memory where stage 3 fit: only stage 3 trains this model on this hardware"
                        + (f", with memory capped at {cap} GiB per rank" if cap else ""))
    if failed(dense):
        return "FAIL", f"stage 0 did not finish: {status(dense)}"
    uncounted = [name for name, rs in (("stage 0", dense), ("stage 3", zero3)) if worst(rs, "model_state_bytes") is None]
    if uncounted:
        return "NOT OBSERVABLE", (f"{' and '.join(uncounted)} stopped before the last step, where the model states "
                                  "are counted")
    world = zero3[0]["world_size"]
    s0, s3 = worst(dense, "model_state_bytes"), worst(zero3, "model_state_bytes")
    p0, p3 = worst(dense, "peak_mem_bytes"), worst(zero3, "peak_mem_bytes")
    ideal = worst(dense, "predicted_model_state_bytes") / worst(zero3, "predicted_model_state_bytes")
    states_ok = s3 <= MEMORY_SLACK * s0 / ideal
    detail = (f"model states per rank {size(s0)} -> {size(s3)} ({change(s0, s3)}, predicted "
              f"{ideal:.2f}x less{'' if states_ok else ': MISSED'}); peak {size(p0)} -> {size(p3)} ({change(p0, p3)}")
    if world == 1:
        return "NOT OBSERVABLE", detail + "); with 1 rank there is nothing to shard across: rehearse N ranks " \
                                          "with `bash run.sh --ranks 4`"
    if zero3[0]["mem_kind"] != "cuda":
        return ("PASS" if states_ok else "FAIL"), detail + "; a CPU process's peak is mostly its runtime, not judged)"
    expected = 1 / (1 / ideal + UNPARTITIONED_SHARE)
    peak_ok = p0 / p3 >= expected
    detail += (f", expected at least {expected:.2f}x{'' if peak_ok else ': MISSED'}: the original design's 3x at 4 "
               f"ranks, as stage 3's share of the model states, 1/{ideal:.2f}, plus {UNPARTITIONED_SHARE:.3f})")
    return ("PASS" if states_ok and peak_ok else "FAIL"), detail


def loss_falls(losses):
    """Falls at each of the first FALLING_STEPS steps, which train on the same rows, and no later step, on fresh
    rows, comes back to the first step's loss."""
    early = losses[:FALLING_STEPS]
    return (all(map(math.isfinite, losses)) and all(b < a for a, b in zip(early, early[1:]))
            and all(x < losses[0] for x in losses[FALLING_STEPS:]))


def largest_gap(a, b):
    """The largest relative difference between two runs' losses, step by step; infinite where a loss is not
    finite (max() would pass over a NaN)."""
    gaps = [abs(x - y) / abs(x) for x, y in zip(a, b)]
    return max(gaps) if all(map(math.isfinite, gaps)) else math.inf


def loss_gaps(a, b):
    """How far run b's losses are from run a's: at step 1, at any step, and whether both are within bounds."""
    step1, anywhere = largest_gap(a["losses"][:1], b["losses"][:1]), largest_gap(a["losses"], b["losses"])
    return step1, anywhere, step1 <= FIRST_LOSS_RTOL and anywhere <= LOSS_RTOL


def parity(dense, zero3):
    """How far stage 3 is from stage 0: its losses at every step, and its weights after the steps on one batch
    (a checksum, which a fault too small to move the loss past LOSS_RTOL still moves); and what differs."""
    gap = largest_gap(dense["losses"], zero3["losses"])
    text = f"; the stages agree to {gap:.2%} at every step (at most {LOSS_RTOL:.0%})"
    differ = [f"the stages DIFFER by {gap:.2%}"] if gap > LOSS_RTOL else []
    a, b = dense.get("trained_checksum"), zero3.get("trained_checksum")
    if a and b:
        apart = abs(a - b) / abs(a)
        text += f", and their weights after step {FALLING_STEPS} to {apart:.3%} (at most {WEIGHTS_RTOL:.1%})"
        differ += [f"the weights DIFFER by {apart:.3%}"] if apart > WEIGHTS_RTOL else []
    return text, differ


def check_loss(dense, zero3):
    if failed(zero3):
        return "FAIL", f"stage 3 did not finish: {status(zero3)}"
    finished = {"stage 3": zero3} if failed(dense) else {"stage 0": dense, "stage 3": zero3}
    misses = [f"{name} does not fall as it should" for name, rs in finished.items() if not loss_falls(rs[0]["losses"])]
    detail = "; ".join(f"{name} {' -> '.join(f'{x:.3f}' for x in rs[0]['losses'])}" for name, rs in finished.items())
    if len(finished) == 2:
        text, differ = parity(dense[0], zero3[0])
        detail, misses = detail + text, misses + differ
    design = DESIGN_LOSS
    steps = min(len(rs[0]["losses"] or []) for rs in finished.values())
    if steps < FALLING_STEPS and not misses:
        return "NOT OBSERVABLE", detail + (f"; {steps} step(s) ran, and (c) judges the first {FALLING_STEPS}: "
                                           f"give --steps {FALLING_STEPS} or more")
    if zero3[0]["model"] == design["model"] and len(zero3[0]["losses"]) >= design["step"]:
        late = {name: rs[0]["losses"][design["step"] - 1] for name, rs in finished.items()}
        detail += f"; below {design['below']:g} by step {design['step']}, as the original design expects"
        misses += [f"{name} is at {x:.3f} at step {design['step']}" for name, x in late.items()
                   if not x < design["below"]]
    return ("FAIL" if misses else "PASS"), detail + ("; MISSED: " + ", ".join(misses) if misses else "")


def plain(records):
    """A DeepSpeed run without offload: what (a) to (c) and the FSDP2 lines compare."""
    return not offloads(records) and not peer(records)


def pairs(runs):
    """{world size: (stage-0 records, stage-3 records)}, at each world size the first run of each stage in
    reference_rank's order (a stage's own config before its variants), the stage-3 run compiled as stage 0's
    is or not: compiling changes the peak that (b) compares."""
    found = {}
    for records in sorted((rs for rs in runs.values() if rs), key=lambda rs: reference_rank(rs[0])):
        if records[0]["stage"] in (0, 3) and plain(records):
            dense, zero3 = found.setdefault(records[0]["world_size"], ([], []))
            if records[0]["stage"] == 0 and not dense:
                dense.extend(records)
            elif records[0]["stage"] == 3 and not zero3 and (not dense or same_compile(dense, records)):
                zero3.extend(records)
    return found


def same_compile(a, b):
    return bool(a[0].get("compile")) == bool(b[0].get("compile"))


def check_pair(dense, zero3):
    """[(criterion, status, detail)] for one stage-0 run against one stage-3 run."""
    if not dense or not zero3:  # a run that crashed without a result fails (d) instead
        return [("(a) to (c)", "NOT OBSERVABLE", f"no plain stage-{0 if not dense else 3} run with this number of "
                                                 "ranks; the criteria compare the two")]
    differ = [key for key in SAME_IN_BOTH if dense[0].get(key) != zero3[0].get(key)]
    if differ:
        return [("the two runs are comparable", "FAIL", "they differ in " + ", ".join(differ))]
    return [("(a) stage 3 partitions every parameter tensor, stage 0 none", *check_partitioning(dense, zero3)),
            ("(b) stage 3 holds far less per rank than stage 0", *check_memory(dense, zero3)),
            (f"(c) the loss of one batch falls at each of the first {FALLING_STEPS} steps, alike at both stages",
             *check_loss(dense, zero3))]


def check_promises(runs):
    """(d): every run finished, or ran out of memory (a result too), and its ranks hold the share of
    parameters, gradients and optimizer states that their stage promises (record.add_shares)."""
    held, broken = [], []
    for name, rs in runs.items():
        if oom(rs):
            held.append(f"{name} out of memory")
        elif failed(rs):
            broken.append(f"{name} {status(rs)}")
        elif all(r.get("partition_check_ok") is not None for r in rs):
            held.append(f"{name} " + "/".join(f"{v:.0%}" for v in rs[0]["held_fraction"].values()))
            if not all(r["partition_check_ok"] for r in rs):
                broken.append(f"{name} not as promised")
    if not broken and not any(r.get("partition_check_ok") is not None for rs in runs.values() for r in rs):
        return None  # logs from before the shares were measured
    detail = "share held of params/grads/optimizer states: " + ", ".join(held)
    return ("FAIL" if broken else "PASS"), detail + ("; FAILED: " + ", ".join(broken) if broken else "")


def reference_rank(r):
    """Stage 0 first; then an eager run before a compiled one, a stage's own config before variants of it, and
    DeepSpeed before its peer."""
    return (r["stage"] != 0, bool(r.get("compile")), not str(r["config"]).endswith(f"ds_config_stage{r['stage']}.json"),
            r.get("engine", "deepspeed") != "deepspeed")


def check_same_training(runs):
    """(e): every finished run trains the same model as the reference among the runs with its settings
    (reference_rank's first): the same first-step loss within FIRST_LOSS_RTOL, and the same losses within
    LOSS_RTOL at every step. Settings that race show here: DeepSpeed's fast sharding for leaf modules on two
    H200s moved the first loss by up to 0.9% and later ones by up to 67%."""
    finished = sorted(((name, rs[0]) for name, rs in runs.items() if not failed(rs)),
                      key=lambda item: reference_rank(item[1]))
    references, compared, differ = {}, [], []
    for name, r in finished:
        reference, ref = references.setdefault(tuple(r.get(key) for key in SAME_TRAINING), (name, r))
        if ref is r:
            continue
        step1, anywhere, same = loss_gaps(ref, r)
        compared.append(f"{name} {step1:.3%} at step 1 and {anywhere:.2%} at most from {reference}")
        differ += [] if same else [f"{name} and {reference} DIFFER"]
    if not compared:
        return None
    detail = (f"losses against the reference (at most {FIRST_LOSS_RTOL:.3%} apart at step 1, {LOSS_RTOL:.0%} at any "
              "step): " + ", ".join(compared))
    return ("FAIL" if differ else "PASS"), detail + ("; MISSED: " + ", ".join(differ) if differ else "")


def peer(records):
    """A run of FSDP2, ZeRO-3's peer, rather than of DeepSpeed; logs from before it ran have no engine."""
    return records[0].get("engine", "deepspeed") != "deepspeed"


def stage3_runs(runs, peer_run):
    """{name: records} of DeepSpeed's stage-3 runs without offload with the peer's settings (compiled or not), in
    reference_rank's order: the stage's own config first, then its variants (DeepCompile, ...)."""
    found = [(name, rs) for name, rs in runs.items() if rs and rs[0]["stage"] == 3 and plain(rs)
             and all(rs[0].get(key) == peer_run.get(key) for key in SAME_COMPILED_OR_NOT)]
    return dict(sorted(found, key=lambda item: reference_rank(item[1][0])))


def peer_lines(runs):
    """Each stage-3 run against FSDP2 with the same settings: speed, peak memory, communication, losses."""
    lines = []
    for name, rs in runs.items():
        if not rs or not peer(rs):
            continue
        for name3, zero3 in (stage3_runs(runs, rs[0]) or {"stage3": None}).items():
            label = "stage 3" if name3 == "stage3" else name3
            lines.append(f"{label} against {name}: " + peer_line(zero3, label, rs, name))
    return lines


def peer_line(zero3, label, rs, name):
    if failed(rs) or not zero3 or failed(zero3):
        return f"{name} {status(rs)}, {label} {status(zero3) if zero3 else 'not run'}"
    a, b = zero3[0], rs[0]
    volume = (f", communication {a['comm_volume']:.2f} against {b['comm_volume']:.2f} x the parameters per step"
              if a.get("comm_volume") and b.get("comm_volume") else "")
    step1, anywhere, same = loss_gaps(a, b)
    losses = (f"the losses agree to {anywhere:.2%} at every step" if same else
              f"the losses DIFFER, by {step1:.3%} at step 1 and up to {anywhere:.2%}: the two do not train the "
              "same model")
    unmeasured = speed_not_measured({label: zero3, name: rs})
    speed = (f"speed not compared ({unmeasured})" if unmeasured else
             f"{ratio(b['tokens_per_s'], a['tokens_per_s'], FASTER)} in tokens/s" if a.get("tokens_per_s")
             else "not timed")
    return (f"{speed}, peak memory {size(worst(zero3, 'peak_mem_bytes'))} against {size(worst(rs, 'peak_mem_bytes'))}"
            f"{volume}; " + losses)


def compile_lines(runs):
    """What DeepCompile cost, and what its figures leave out."""
    lines = []
    for name, rs in runs.items():
        if failed(rs) or not rs[0].get("deepcompile"):  # a failed run's status is in the table
            continue
        timed_from = rs[0]["timed_from"]
        took = " and ".join(f"{s['time_s']:.0f} s at step {s['step']}" for s in rs[0]["steps"]
                            if s["step"] in (1, timed_from - 1))
        lines.append(f"{name}: DeepCompile compiled, taking {took}; its speed is timed from step {timed_from} on; "
                     "its collectives run inside its compiled graph, where the communication count does not see them")
    return lines


def offload_memory(records):
    """Where an offload run's memory went, per rank: the GPU's and the host's."""
    if records[0]["mem_kind"] != "cuda":
        return "without GPUs, device and host are one memory"
    rss = worst(records, "host_peak_rss_bytes")  # logs from before it was recorded lack it
    return (f"per rank, GPU model states {size(worst(records, 'model_state_bytes'))}, GPU peak "
            f"{size(worst(records, 'peak_mem_bytes'))}; host (CPU) model states "
            f"{size(worst(records, 'host_state_bytes'))}, other host tensors "
            f"{size(other_bytes(records, 'host_state_breakdown'))}" + (f", host peak RSS {size(rss)}" if rss else ""))


def offload_lines(runs):
    """What each offload run costs against stage 3 without offload, at the same number of ranks."""
    lines, stage3 = [], {world: zero3 for world, (_, zero3) in pairs(runs).items()}
    for name, rs in runs.items():
        if not offloads(rs):
            continue
        if failed(rs):
            lines.append(f"offload {name}: {status(rs)}")
            continue
        zero3 = stage3.get(rs[0]["world_size"])
        cost = f"{rs[0]['step_time_s'] / zero3[0]['step_time_s']:.2f}x the step time of stage 3" \
            if zero3 and not failed(zero3) else "no stage-3 run to compare"
        lines.append(f"offload {name}: {cost}; {offload_memory(rs)}")
    return lines


def verdict(runs):
    """{scope: [(criterion, status, detail)]}, one scope per number of ranks with a stage-0 and a stage-3 run,
    and one for all runs; and the overall status: FAIL if any check fails, PASS if some number of ranks
    passes (a) to (c), NOT OBSERVABLE otherwise (one rank, or no stage-0 and stage-3 pair)."""
    checks = {f"{world} rank(s)": check_pair(*pair) for world, pair in sorted(pairs(runs).items())}
    promises, same = check_promises(runs), check_same_training(runs)
    checks["all runs"] = ([("(d) every run holds what its stage promises", *promises)] if promises else []) + (
        [("(e) every run trains the same model", *same)] if same else [])
    if not any(pairs(runs).values()):
        checks["all runs"].append(("(a) to (c)", "NOT OBSERVABLE", "no stage-0 and plain stage-3 runs with the same "
                                                                  "number of ranks; the criteria compare the two"))
    checks = {scope: rows for scope, rows in checks.items() if rows}
    states = {state for rows in checks.values() for _, state, _ in rows}
    if "FAIL" in states:
        return checks, "FAIL"
    passed = any(all(s == "PASS" for _, s, _ in rows) for scope, rows in checks.items() if scope != "all runs")
    return checks, "PASS" if passed else "NOT OBSERVABLE"


def verdict_lines(checks):
    lines = []
    for scope, rows in checks.items():
        if len(checks) > 2:  # several numbers of ranks
            lines.append(f"{scope}:")
        lines += [f"{state:>14}  {name}: {detail}" for name, state, detail in rows]
    return lines


# -----------------------------------------------------------------------------
# the record of a run: summary.json, summary.md, memory.png


def run_environment(runs):
    """The software and machines of a run, from the ranks' records: the GPUs it used or, without GPUs, its CPU
    processes (which the records count as their "gpus", the devices that share the work)."""
    records = [r for rs in runs.values() for r in rs if r.get("env")]
    if not records:
        return {}
    env = {k: v for k, v in records[0]["env"].items() if k != "host"}
    env["hosts"] = sorted({r["env"]["host"] for r in records})
    if records[0]["mem_kind"] == "cuda":
        env["gpus"] = max(r["gpus"] for r in records)
    else:
        env.update(device="CPU processes", processes=max(r["world_size"] for r in records))
    return env


def span(start, end):
    return round(end - start, 2) if start and end else None


def run_timing(log, records):
    """Where one run's time went, in seconds, from run.sh's marks in its log and rank 0's clock."""
    marks, t = read_marks(log), (first(records, "timing") or {})
    parts = {"launch_and_imports_s": span(marks.get("launched"), t.get("imported")),
             "engine_start_s": span(t.get("imported"), t.get("engine_ready")),
             "steps_s": span(t.get("engine_ready"), t.get("trained")),
             "probes_s": span(t.get("trained"), t.get("probed")),
             "teardown_s": span(t.get("probed"), marks.get("ended")),
             "total_s": span(marks.get("launched"), marks.get("ended"))}
    return {k: v for k, v in parts.items() if v is not None}


def timing(folder, runs, verdict_at):
    """Where the time went from run.sh's start (RUN_STARTED) to the verdict: the input checks, each run, and
    the report; total_s is the whole."""
    marks = [read_marks(Path(folder) / f"{name}.log") for name in runs]
    started = float(os.environ.get("RUN_STARTED") or 0) or None
    launched = min((m["launched"] for m in marks if "launched" in m), default=None)
    ended = max((m["ended"] for m in marks if "ended" in m), default=None)
    return {"checks_s": span(started, launched),
            "runs": {name: run_timing(Path(folder) / f"{name}.log", rs) for name, rs in runs.items()},
            "report_s": span(ended, verdict_at), "total_s": span(started, verdict_at)}


def summary(folder, runs, checks, overall, verdict_at):
    return {
        "folder": str(folder),
        "command": os.environ.get("RUN_COMMAND"),
        "commands": {name: read_command(Path(folder) / f"{name}.log") for name in runs},
        "environment": run_environment(runs),
        "verdict": overall,
        "checks": {scope: [{"criterion": n, "status": s, "detail": d} for n, s, d in rows]
                   for scope, rows in checks.items()},
        "timing": timing(folder, runs, verdict_at),
        "results": runs,
    }


def without_nan(value):
    """JSON has no NaN or infinity (a diverged loss); write null instead."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: without_nan(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_nan(v) for v in value]
    return value


def summary_markdown(record, runs, checks):
    env = record["environment"]
    command = record["command"] or f"python3 report.py {record['folder']}"
    lines = [f"# ZeRO benchmark: {record['verdict']}", "", f"`{command}`", ""]
    if env:
        lines += ["| | |", "|---|---|"] + [f"| {k} | {', '.join(map(str, v)) if isinstance(v, list) else v} |"
                                            for k, v in env.items()] + [""]
    lines += ["## Commands", ""] + [f"- {name}: `{cmd}`" for name, cmd in record["commands"].items() if cmd] + [""]
    lines += ["## Comparison", "", "```", comparison_table(runs), "```", ""]
    lines += [line + "\n" for line in compile_lines(runs) + peer_lines(runs)]  # a paragraph each
    lines += ["## Verdict", "", "```", *verdict_lines(checks), "```", ""]
    for name, records in runs.items():
        if records:
            lines += [f"## {name}: each rank", "", "```", rank_table(records), "```", ""]
    return "\n".join(lines)


def draw_per_rank(ax, runs):
    """Bars per run and rank: the measured peak, the measured model states, the predicted ones, and the
    host's model states with offload. Returns the number of series."""
    bars = [(f"{name}, rank {r['rank']}" + (" (OOM)" if r["oom"] else " (failed)" if r["error"] else ""), r)
            for name, records in runs.items() for r in records]
    series = [("measured peak", "peak_mem_bytes"), ("measured model states", "model_state_bytes"),
              ("predicted model states", "predicted_model_state_bytes")]
    if any(r.get("host_state_bytes") for _, r in bars):
        series.append(("measured host (CPU) model states", "host_state_bytes"))
    height = 0.8 / len(series)
    for i, (label, key) in enumerate(series):
        ax.barh([y + (i - (len(series) - 1) / 2) * height for y in range(len(bars))],
                [gib(r.get(key) or 0) for _, r in bars], height, label=label)
    ax.set_yticks(range(len(bars)), [label for label, _ in bars], fontsize=8)
    ax.invert_yaxis()
    values = [gib(r[k]) for _, r in bars for k in ("peak_mem_bytes", "model_state_bytes") if r.get(k)]
    if values and max(values) > 100 * min(values):  # a toy model's states beside a process's runtime
        ax.set_xscale("log")
    ax.set_xlabel("GiB per rank")
    ax.set_title("Memory per rank")
    return len(series)


def draw_scaling(ax, worlds):
    """Lines against the number of ranks G: the most any rank holds of model states at stages 0 and 3 and,
    on GPUs, both stages' peaks, beside the ideal: stage 0's model states over G."""
    sizes = sorted(worlds)
    dense_at = {g: dense for g, (dense, _) in worlds.items()}
    zero3_at = {g: zero3 for g, (_, zero3) in worlds.items()}
    base = next(filter(None, (worst(dense_at[g], "model_state_bytes") for g in sizes)), None)
    if base:
        ax.plot(sizes, [gib(base) / g for g in sizes], ":", color="gray", linewidth=3,
                label="ideal: stage 0 model states / G")
    lines = [("stage 0 model states", dense_at, "model_state_bytes", "s--"),
             ("stage 3 model states", zero3_at, "model_state_bytes", "o--")]
    if first(zero3_at[sizes[-1]], "mem_kind") == "cuda":  # a CPU's peak RSS is mostly the runtime
        lines += [("stage 0 peak", dense_at, "peak_mem_bytes", "s-"),
                  ("stage 3 peak", zero3_at, "peak_mem_bytes", "o-")]
    for label, run_at, key, style in lines:
        points = [(g, gib(worst(run_at[g], key))) for g in sizes if worst(run_at[g], key)]
        if points:
            ax.plot(*zip(*points), style, label=label)
    for g in sizes:
        if oom(dense_at[g]):
            ax.annotate("stage 0: OOM", (g, gib(base or 0)), ha="right", va="bottom", color="red", fontsize=9)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(g) for g in sizes])
    ax.set_xlabel("ranks (G)")
    ax.set_ylabel("GiB per rank (the most any rank holds)")
    ax.set_title("Memory per rank against the number of ranks")
    ax.legend(fontsize=8)


def plot(folder, runs):
    """memory.png: memory per run and rank; with several numbers of ranks, also memory against the number
    of ranks. Returns whether it was drawn."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("memory.png skipped: matplotlib is not installed (pip install matplotlib)")
        return False
    worlds = pairs(runs)
    rows = sum(len(records) for records in runs.values())
    fig, axes = plt.subplots(1, 2 if len(worlds) > 1 else 1, squeeze=False,
                             figsize=(15 if len(worlds) > 1 else 9, max(4.0, 1.5 + 0.32 * rows)))
    series = draw_per_rank(axes[0][0], runs)
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="lower left", ncol=series, fontsize=9)
    if len(worlds) > 1:
        draw_scaling(axes[0][1], worlds)
    fig.tight_layout(rect=(0, 0.04 + 0.4 / fig.get_figheight(), 1, 1))  # room for the legend below
    fig.savefig(Path(folder) / "memory.png", dpi=110)
    plt.close(fig)
    return True


def write_record(folder, runs, checks, overall, verdict_at):
    """summary.json, summary.md and memory.png in the folder; returns the names of the files written."""
    record = summary(folder, runs, checks, overall, verdict_at)
    Path(folder, "summary.json").write_text(json.dumps(without_nan(record), indent=1, allow_nan=False))
    Path(folder, "summary.md").write_text(summary_markdown(record, runs, checks))
    return ["summary.json", "summary.md"] + (["memory.png"] if plot(folder, runs) else [])


def results_line(folder, written):
    """The last line: the folder, and the files of its record that this report wrote, with report.txt where run.sh
    (which sets RUN_COMMAND) tees this output into it."""
    files = (["report.txt"] if os.environ.get("RUN_COMMAND") else []) + written
    return f"results: {folder}" + (f" ({', '.join(files)})" if files else "")


# -----------------------------------------------------------------------------
# comparing two runs


# the figures that --compare follows, by the function that reads each (not by its row's label, which may change),
# and what a regression is: a rise or a fall (none for losses)
TRACKED = {model_states: "rise", peak_memory: "rise", first_loss: None, last_loss: None, tokens_per_s: "fall",
           mfu: "fall"}


def tracked_rows():
    """The COMPARISON rows of the TRACKED figures, each with what a regression is; a tracked figure without a row
    stops here rather than drop out of --compare unseen."""
    rows = {row[1]: row for row in COMPARISON}
    return [(rows[figure], bad) for figure, bad in TRACKED.items()]


def steps_trained(record):
    """The steps a run was to train; logs from before steps_planned was recorded give the steps that ran."""
    return record.get("steps_planned") or len(record["steps"])


def settings(record):
    """What two runs of one name must agree on to measure the same thing: SAME_IN_BOTH, the GPUs, and the steps,
    which move the last loss and the steps that speed is timed over."""
    return {**{key: record.get(key) for key in (*SAME_IN_BOTH, "gpus")}, "steps": steps_trained(record)}


def compare_run(name, a, b, tolerance):
    """One run in folders A and B: its table rows, and its regressions."""
    rows, regressed = [], []
    if status(a).startswith("ok") and not status(b).startswith("ok"):
        regressed.append(f"{name} no longer finishes ({status(b)})")
    differ = [key for key, value in settings(a[0]).items() if settings(b[0])[key] != value] if a and b else []
    if differ:
        regressed.append(f"{name} measured something else: it differs in {', '.join(differ)}")
    for (label, get, spec, *_), bad in tracked_rows():
        before, after = get(a), get(b)
        if not before or after is None:
            continue
        moved = after / before - 1
        worse = bad == "rise" and moved > tolerance / 100 or bad == "fall" and moved < -tolerance / 100
        if worse:
            regressed.append(f"{name} {label} {signed_pct(moved)}")
        rows.append((name, label, fmt(before, spec), fmt(after, spec), signed_pct(moved),
                     "REGRESSED" if worse else ""))
    return rows, regressed


def compare(a, b, tolerance):
    """Print what moved between two results folders, run by run; return 1 if memory or speed regressed
    by more than tolerance percent, a run of A is missing from B or no longer finishes, or a run measured
    something else (another model, batch, dtype, number of ranks, GPUs or steps), else 0."""
    runs_a, runs_b = load_runs(a), load_runs(b)
    rows, regressed = [("run", "figure", "A", "B", "change", "")], []
    regressed += [f"{name} is missing from B" for name in runs_a if name not in runs_b]
    for name in [n for n in runs_a if n in runs_b]:
        run_rows, run_regressed = compare_run(name, runs_a[name], runs_b[name], tolerance)
        rows, regressed = rows + run_rows, regressed + run_regressed
    print(format_table(rows))
    new = [name for name in runs_b if name not in runs_a]
    if new:
        print(f"\nin B only: {', '.join(new)}")
    print(f"\n{len(regressed)} regression(s) beyond {tolerance}%" + (": " + "; ".join(regressed) if regressed else ""))
    return 1 if regressed else 0


# -----------------------------------------------------------------------------
# main


def main(argv=None):
    p = argparse.ArgumentParser(description="Compare the ZeRO stages of a run, or compare two runs.")
    p.add_argument("folder", nargs="?", type=Path, help="a results folder of run.sh")
    p.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"), help="two results folders, A before B")
    p.add_argument("--tolerance", type=float, default=5.0, help="percent a figure may worsen in --compare (default 5)")
    p.add_argument("--write", action="store_true", help="write summary.json, summary.md and memory.png into the "
                   "folder (run.sh does, into its own); without it, reading a folder changes nothing")
    args = p.parse_args(argv)
    if args.folder and os.environ.get("RUN_SIGNAL") and not any(args.folder.glob("*.log")):
        name = signal.Signals(int(os.environ["RUN_SIGNAL"])).name
        print(f"VERDICT: INTERRUPTED by {name}: no run started\nresults: {args.folder}")
        return 128 + int(os.environ["RUN_SIGNAL"])
    for folder in args.compare or [args.folder]:
        if folder is None or not folder.is_dir() or not any(folder.glob("*.log")):
            print(f"report.py: error: {folder} is not a results folder with logs", file=sys.stderr)
            return EXIT["bad input"]
    if args.compare:
        return compare(*args.compare, args.tolerance)
    runs = load_runs(args.folder)
    print(comparison_table(runs))
    if any(r.get("rehearsal") for rs in runs.values() for r in rs):
        print("\nREHEARSAL: several ranks shared each GPU over gloo; per-rank memory is real, speed is not.")
    checks, overall = verdict(runs)
    deaths = [f"{name}: {dead}" for name, rs in runs.items() if (dead := dead_rank(args.folder / f"{name}.log", rs))]
    stopped_by = interruption(runs, deaths)
    print("", *offload_lines(runs), *compile_lines(runs), *peer_lines(runs), *deaths, *verdict_lines(checks), sep="\n")
    if stopped_by:
        overall = "INTERRUPTED"
        print(f"\nVERDICT: INTERRUPTED by {stopped_by}: " + "; ".join(progress_lines(runs)))
    else:
        print(f"\nVERDICT: {overall}")
    written = write_record(args.folder, runs, checks, overall, time.time()) if args.write else []
    print(results_line(args.folder, written))
    return 128 + SIGNALS.get(stopped_by, SIGNALS["SIGTERM"]) if stopped_by else EXIT[overall]


def interruption(runs, deaths):
    """The signal that interrupted the run, as run.sh (RUN_SIGNAL, a number) or a rank tells it; else None. A
    rank that died is a failure, not an interruption, though the launcher then stops its peers with SIGTERM."""
    number = os.environ.get("RUN_SIGNAL")
    if number or os.environ.get("RUN_COMMAND"):  # run.sh knows whether it was signalled
        return signal.Signals(int(number)).name if number else None
    records = [r for rs in runs.values() for r in rs]
    if deaths or any(r["oom"] or r["error"] and not r.get("interrupted_by") for r in records):
        return None
    return next((r["interrupted_by"] for r in records if r.get("interrupted_by")), None)


def progress_lines(runs):
    """How far each run got, and which runs never started (RUN_SKIPPED, from run.sh)."""
    lines = [f"{name} {len(rs[0]['steps'])} of {rs[0].get('steps_planned', '?')} steps" if rs else f"{name} no result"
             for name, rs in runs.items()]
    skipped = os.environ.get("RUN_SKIPPED", "").split()
    return lines + ([f"not started: {' '.join(skipped)}"] if skipped else [])


if __name__ == "__main__":
    sys.exit(main())
