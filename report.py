"""
Reads the RESULT lines that train_gpt.py leaves in a run's logs and compares the ZeRO stages:
one table and a verdict on the benchmark's three criteria.

    python report.py results/<timestamp>      # exit 0 on PASS, 1 on FAIL, 3 when not observable

Needs only the standard library, so it runs anywhere the logs are.
"""
import json
import math
import sys
from pathlib import Path

# Stage 3's model states per rank, as a fraction of stage 0's, may exceed the predicted fraction (1/G,
# plus the persistent parameters) by this factor before (b) fails.
MEMORY_SLACK = 1.25
# Both runs of a comparison must agree on these, or they compare different things.
SAME_IN_BOTH = ("model", "world_size", "micro_batch", "seq", "dtype", "seed")
# Both stages start from the same weights and data, so their first losses differ only by rounding.
FIRST_LOSS_RTOL = 0.01


def gib(nbytes):
    return nbytes / 2**30


def size(nbytes):
    """Bytes in GiB, or in MiB below one GiB, so that a toy model's figures still show."""
    return f"{gib(nbytes):.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def pct(x):
    return "n/a" if x is None else f"{100 * x:.1f}%"


def signed_pct(x):
    return f"{100 * x:+.1f}%"


def read_results(log):
    """The RESULT records of one log, one per rank that reported, by rank."""
    # the launcher may put a host name before the line
    records = [json.loads(line.partition("RESULT ")[2]) for line in Path(log).read_text(errors="replace").splitlines()
               if "RESULT {" in line]
    return sorted(records, key=lambda r: r["rank"])


def load_runs(folder):
    """{log name: records} for every log in a results folder, in the order the runs were made."""
    logs = sorted(Path(folder).glob("*.log"), key=lambda p: p.stat().st_mtime)
    return {log.stem: read_results(log) for log in logs}


# -----------------------------------------------------------------------------
# what each run says


def failed(records):
    return not records or any(r["oom"] or r["error"] for r in records)


def oom(records):
    return any(r["oom"] for r in records)


def worst(records, key):
    values = [r[key] for r in records if r.get(key) is not None]
    return max(values) if values else None


def status(records):
    if not records:
        return "no result"
    if oom(records):
        return "OOM"
    if failed(records):
        return "error"
    missing = records[0]["world_size"] - len(records)
    return f"ok, {missing} rank(s) missing" if missing else "ok"


# -----------------------------------------------------------------------------
# tables


def format_table(rows):
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def fmt(value, spec):
    """A figure, or '-' where nothing was measured; spec 'bytes' gives GiB or MiB."""
    if value is None:
        return "-"
    return size(value) if spec == "bytes" else format(value, spec)


def rank_table(records):
    """One row per rank of one run: what it partitioned and what it holds."""
    rows = [("rank", "partitioned/total", "local elems", "model states", "predicted", "diff", "other tensors",
             "peak", "status")]
    for r in records:
        measured, predicted = r.get("model_state_bytes"), r.get("predicted_model_state_bytes")
        rows.append((r["rank"], f"{r.get('partitioned_tensors', '-')}/{r.get('param_tensors', '-')}",
                     fmt(r.get("local_param_elems"), ","), fmt(measured or None, "bytes"),
                     fmt(predicted or None, "bytes"),
                     signed_pct(measured / predicted - 1) if measured and predicted else "-",
                     fmt(other_bytes([r]), "bytes"), fmt(r["peak_mem_bytes"] or None, "bytes"),
                     "OOM" if r["oom"] else "error" if r["error"] else "ok"))
    return format_table(rows)


def first(records, key):
    return records[0].get(key) if records else None


def other_bytes(records):
    return max((r["model_state_breakdown"]["other"] for r in records if "model_state_breakdown" in r), default=None)


# the comparison's rows: label, the figure of one run, its format, and whether a ratio of two runs means anything
COMPARISON = [
    ("ranks", lambda rs: first(rs, "world_size"), "d", False),
    ("partitioned tensors", lambda rs: worst(rs, "partitioned_tensors"), "d", False),
    ("param tensors", lambda rs: worst(rs, "param_tensors"), "d", False),
    ("local params", lambda rs: worst(rs, "local_param_elems"), ",", True),
    ("model states", lambda rs: worst(rs, "model_state_bytes"), "bytes", True),
    ("predicted", lambda rs: worst(rs, "predicted_model_state_bytes"), "bytes", True),
    ("other tensors", other_bytes, "bytes", False),
    ("peak memory", lambda rs: worst(rs, "peak_mem_bytes") or None, "bytes", True),
    ("first loss", lambda rs: first(rs, "first_loss"), ".4f", False),
    ("last loss", lambda rs: (first(rs, "losses") or [None])[-1], ".4f", False),
    ("tokens/s", lambda rs: first(rs, "tokens_per_s"), ",.0f", True),
    ("MFU", lambda rs: first(rs, "mfu"), ".1%", True),
]


def comparison_table(runs):
    """The runs side by side, per-rank figures taken from the rank that holds the most; with two runs,
    a last column gives the first over the second."""
    names = list(runs)
    rows = [("", *names, f"{names[0]}/{names[1]}" if len(names) == 2 else "")]
    for label, figure, spec, has_ratio in COMPARISON:
        values = [figure(runs[name]) for name in names]
        both = len(values) == 2 and has_ratio and all(values)
        rows.append((label, *(fmt(v, spec) for v in values), f"{values[0] / values[1]:.2f}x" if both else ""))
    rows.append(("status", *(status(runs[name]) for name in names), ""))
    return format_table(rows)


# -----------------------------------------------------------------------------
# verdict


def check_partitioning(dense, zero3):
    counted = [r for r in zero3 if "partitioned_tensors" in r]  # a rank that failed early counted nothing
    if not counted:
        return "FAIL", "stage 3 reported no partitioning"
    whole = all(r["partitioned_tensors"] == r["param_tensors"] > 0 and r["shard_check_ok"] for r in counted)
    # stage 0 may have run out of memory before it counted anything; what it did count must be nothing
    none = all(r["partitioned_tensors"] == 0 for r in dense if "partitioned_tensors" in r)
    counted0 = [r["partitioned_tensors"] for r in dense if "partitioned_tensors" in r]
    detail = (f"stage 3 partitions {counted[0]['partitioned_tensors']}/{counted[0]['param_tensors']} tensors "
              f"(shards checked: {'ok' if all(r['shard_check_ok'] for r in counted) else 'WRONG SIZES'}), "
              f"stage 0 {counted0[0] if counted0 else 'failed before counting'}")
    same_weights = True
    if dense and "weights_checksum" in dense[0]:
        a, b = dense[0]["weights_checksum"], counted[0]["weights_checksum"]
        same_weights = math.isclose(a, b, rel_tol=1e-9)
        detail += f"; the shards hold {'exactly' if same_weights else 'NOT'} stage 0's initial weights (checksum)"
    if counted[0]["world_size"] == 1:
        detail += "; with 1 rank each shard is the whole tensor"
    return ("PASS" if whole and none and same_weights else "FAIL"), detail


def change(before, after):
    return f"{before / after:.2f}x less" if after <= before else f"{after / before:.2f}x more"


def check_memory(dense, zero3):
    if failed(zero3):
        return "FAIL", f"stage 3 did not finish: {status(zero3)}"
    if oom(dense):
        return "PASS", "stage 0 ran out of memory where stage 3 fit"
    if failed(dense):
        return "FAIL", f"stage 0 did not finish: {status(dense)}"
    world = zero3[0]["world_size"]
    s0, s3 = worst(dense, "model_state_bytes"), worst(zero3, "model_state_bytes")
    p0, p3 = worst(dense, "peak_mem_bytes"), worst(zero3, "peak_mem_bytes")
    ideal = worst(dense, "predicted_model_state_bytes") / worst(zero3, "predicted_model_state_bytes")
    on_gpu = zero3[0]["mem_kind"] == "cuda"
    detail = (f"model states per rank {size(s0)} -> {size(s3)} ({change(s0, s3)}, predicted "
              f"{ideal:.2f}x less); peak {size(p0)} -> {size(p3)} ({change(p0, p3)}"
              f"{'' if on_gpu else '; a CPU process peak is mostly the runtime, not judged'})")
    if world == 1:
        return "NOT OBSERVABLE", detail + "; with 1 rank there is nothing to shard across: rehearse N ranks " \
                                          "with `bash run.sh --ranks 4`"
    states_ok = s3 <= MEMORY_SLACK * s0 / ideal
    return ("PASS" if states_ok and (p3 < p0 or not on_gpu) else "FAIL"), detail


def loss_falls(records):
    losses = records[0]["losses"]
    return all(map(math.isfinite, losses)) and losses[-1] < losses[0]


def check_loss(dense, zero3):
    if failed(zero3):
        return "FAIL", f"stage 3 did not finish: {status(zero3)}"
    finished = {"stage 3": zero3} if failed(dense) else {"stage 0": dense, "stage 3": zero3}
    detail = "; ".join(f"{name} {' -> '.join(f'{x:.3f}' for x in rs[0]['losses'])}" for name, rs in finished.items())
    ok = all(loss_falls(rs) for rs in finished.values())
    if len(finished) == 2:
        a, b = dense[0]["first_loss"], zero3[0]["first_loss"]
        same = abs(a - b) <= FIRST_LOSS_RTOL * abs(a)
        detail += f"; first-step losses {'agree' if same else 'DIFFER'} ({a:.4f} vs {b:.4f})"
        ok = ok and same
    return ("PASS" if ok else "FAIL"), detail


def verdict(runs):
    """[(criterion, status, detail)] and the overall status, for the first stage-0 and stage-3 runs."""
    by_stage = {}
    for records in runs.values():
        if records:
            by_stage.setdefault(records[0]["stage"], records)
    dense, zero3 = by_stage.get(0, []), by_stage.get(3, [])
    differ = [key for key in SAME_IN_BOTH if dense and zero3 and dense[0].get(key) != zero3[0].get(key)]
    if differ:
        return [("the two runs are comparable", "FAIL", "they differ in " + ", ".join(differ))], "FAIL"
    checks = [("(a) stage 3 partitions every parameter tensor, stage 0 none", *check_partitioning(dense, zero3))]
    if dense and zero3:
        checks += [("(b) stage 3 holds far less per rank than stage 0", *check_memory(dense, zero3)),
                   ("(c) the loss falls at both stages", *check_loss(dense, zero3))]
    states = {s for _, s, _ in checks}
    overall = "FAIL" if "FAIL" in states else "NOT OBSERVABLE" if "NOT OBSERVABLE" in states else "PASS"
    return checks, overall


EXIT_CODES = {"PASS": 0, "FAIL": 1, "NOT OBSERVABLE": 3}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: python report.py RESULTS_FOLDER", file=sys.stderr)
        return 2
    runs = load_runs(argv[0])
    if not runs:
        print(f"report.py: error: no logs in {argv[0]}", file=sys.stderr)
        return 2
    print(comparison_table(runs))
    if any(r.get("rehearsal") for rs in runs.values() for r in rs):
        print("\nREHEARSAL: several ranks shared each GPU over gloo; per-rank memory is real, speed is not.")
    checks, overall = verdict(runs)
    print()
    for name, state, detail in checks:
        print(f"{state:>14}  {name}: {detail}")
    print(f"\nVERDICT: {overall}")
    return EXIT_CODES[overall]


if __name__ == "__main__":
    sys.exit(main())
