"""The verdict off the default path: fp16's skipped steps, (b) against theory, every rank accounted for, the cause
of a failed run on the terminal, and DeepSpeed's known defects named. Records are built from run_sh's healthy logs
(or the committed ones of older DeepSpeed versions), since fp16 needs a GPU."""
import dataclasses
import json
import shutil
import socket
import sys

import pytest

import report
from zero3bench import parts, rank_lines, result
from zero3bench.reporting import defects, reading, theory, verdict
from conftest import LAUNCHED_AS_RANK_0, ROOT, facts, free_port, planted, record, run, shared

GIB = 2**30
OLDEST = ROOT / "benchmarks" / "logs" / "h200" / "25-oldest"


def edited_log(folder, tmp_path, name, edit):
    """A copy of a results folder in which edit(lines) rewrites the log of the run `name`."""
    copy = tmp_path / f"edited-{name}"
    shutil.copytree(folder, copy)
    log = copy / f"{name}.log"
    log.write_text("\n".join(edit(log.read_text().splitlines())) + "\n")
    return copy


def result_index(lines, rank):
    return next(i for i, line in enumerate(lines) if line.startswith("RESULT {") and f'"rank": {rank},' in line)


def reported(folder, capsys):
    status = report.main([str(folder)])
    out = capsys.readouterr().out
    assert "Traceback" not in out
    return status, out


# -----------------------------------------------------------------------------
# every rank accounted for


@pytest.mark.parametrize("edit, lost", [
    (lambda lines: lines[: result_index(lines, 0) + 1], 1),  # cut just after rank 0's RESULT line
    (lambda lines: [*lines[: result_index(lines, 1)], lines[result_index(lines, 1)][:2000]], 1),  # cut mid-line
    (lambda lines: [line for i, line in enumerate(lines) if i != result_index(lines, 0)], 0),  # one line removed
    (lambda lines: [line if i != result_index(lines, 1) else 'RESULT {"rank": 1, garbage'
                    for i, line in enumerate(lines)], 1),  # a line of garbage in its place
], ids=["cut after rank 0", "cut mid-line", "a rank's line removed", "a line of garbage"])
def test_a_rank_without_a_complete_result_keeps_the_verdict_from_passing_and_is_named(edit, lost, run_sh, tmp_path,
                                                                                     capsys):
    status, out = reported(edited_log(run_sh.folder, tmp_path, "stage3", edit), capsys)
    assert status == report.EXIT["NOT OBSERVABLE"] and "VERDICT: NOT OBSERVABLE" in out
    assert f"stage 3 rank(s) {lost} wrote no complete RESULT line" in out.split("(a)")[1].splitlines()[0]
    assert f"stage3 rank(s) {lost} wrote no complete RESULT line" in out.split("(d)")[1].splitlines()[0]
    assert f"rank(s) {lost} wrote no complete RESULT" in out.split("status")[1].splitlines()[0]


def one_record(lines, rank, edit):
    """lines with rank's RESULT record rewritten by edit(record)."""
    i = result_index(lines, rank)
    return [*lines[:i], "RESULT " + json.dumps(edit(json.loads(lines[i][len("RESULT "):]))), *lines[i + 1:]]


@pytest.mark.parametrize("edit, lost", [
    (lambda lines: one_record(lines, 1, lambda d: {**d, "peak_mem_bytes": "1"}), "1"),  # a number in quotes
    (lambda lines: one_record(lines, 1, lambda d: {**d, "steps": "x"}), "1"),  # steps not a list
    (lambda lines: one_record(lines, 1, lambda d: {**d, "steps": [1, 2, 3]}), "1"),  # steps not records
    (lambda lines: one_record(lines, 1, lambda d: {**d, "steps": [{**s, "comm": [1]} for s in d["steps"]]}),
     "1"),  # a step's collectives not a record of kinds
    (lambda lines: one_record(lines, 1, lambda d: {**d, "model_state_breakdown": [1]}), "1"),  # a census not a record
    (lambda lines: one_record(lines, 1, lambda d: {**d, "rank": 0}), "0 1"),  # rank 0 twice
    (lambda lines: [*lines, *one_record(lines, 1, lambda d: {**d, "rank": 2})[result_index(lines, 1):][:1]], "2"),
], ids=["a number in quotes", "steps not a list", "steps not records", "collectives not a record",
        "a census not a record", "a rank twice", "a rank beyond the world"])
def test_a_mistyped_doubled_or_stray_result_keeps_the_verdict_from_passing(edit, lost, run_sh, tmp_path, capsys):
    status, out = reported(edited_log(run_sh.folder, tmp_path, "stage3", edit), capsys)
    assert status == report.EXIT["NOT OBSERVABLE"] and "VERDICT: NOT OBSERVABLE" in out
    assert f"stage3 rank(s) {lost} wrote no complete RESULT line" in out.split("(d)")[1].splitlines()[0]


def test_a_log_that_is_a_folder_is_a_run_without_a_result(run_sh, tmp_path, capsys):
    folder = edited_log(run_sh.folder, tmp_path, "stage3", lambda lines: lines)
    (folder / "stage3.log").unlink()
    (folder / "stage3.log").mkdir()
    status, out = reported(folder, capsys)
    assert status == report.EXIT["FAIL"] and "stage3 did not finish (no result)" in out


def test_a_fault_found_on_the_ranks_that_reported_still_fails(run_sh, tmp_path, capsys):
    folder = planted(run_sh.folder, tmp_path, "stage3", lambda r: {**r, "partition_check_ok": False})
    status, out = reported(edited_log(folder, tmp_path, "stage3", lambda lines: lines[: result_index(lines, 0) + 1]),
                           capsys)
    assert status == report.EXIT["FAIL"] and "FAIL  (d)" in out


def test_a_failed_run_is_judged_as_failed_not_as_ranks_missing(run_sh, tmp_path, capsys):
    def out_of_memory(r):
        return {**r, "oom": True, "error": "CUDA out of memory"}
    folder = planted(run_sh.folder, tmp_path, "stage3", out_of_memory)
    status, out = reported(edited_log(folder, tmp_path, "stage3", lambda lines: lines[: result_index(lines, 0) + 1]),
                           capsys)
    assert status == report.EXIT["FAIL"] and "wrote no complete RESULT" not in out


# -----------------------------------------------------------------------------
# fp16: judged on the steps that trained


def as_fp16(skipped):
    """A record as fp16 leaves it: the first `skipped` steps skipped on overflow (the loss unchanged, the loss
    scale halved), then the run's own steps, applied."""
    def edit(r):
        first = r["steps"][0]
        skips = [{**first, "step": i + 1, "applied": False, "loss_scale": 2.0 ** (16 - i)} for i in range(skipped)]
        trained = [{**s, "step": skipped + i + 1, "applied": True, "loss_scale": 2.0 ** (16 - skipped)}
                   for i, s in enumerate(r["steps"])]
        return {**r, "dtype": "fp16", "steps": skips + trained}
    return edit


def test_fp16_c_judges_the_first_3_applied_steps(run_sh, tmp_path, capsys):
    folder = planted(planted(run_sh.folder, tmp_path, "stage0", as_fp16(0)), tmp_path, "stage3", as_fp16(3))
    status, out = reported(folder, capsys)
    assert status == report.EXIT["PASS"], out
    line = out.split("(c)")[1].splitlines()[0]
    assert "skipped as fp16's loss scale overflowed: stage 3 3" in line and "DIFFER" not in line
    assert [row.split()[-2:] for row in out.splitlines() if row.startswith("skipped steps")] == [["0", "3"]]


@shared
def skipped_3(run_sh, tmp_path_factory):
    """Stage 3 with its first 3 optimizer steps skipped (tests/plant_fault.py skip_3, as fp16's loss scaler skips
    on overflow) beside run_sh's healthy stage 0."""
    folder = tmp_path_factory.mktemp("skip3")
    shutil.copy(run_sh.folder / "stage0.log", folder)
    run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
         "tests/plant_fault.py", "skip_3", "--stage", "3"], log=folder / "stage3.log")
    return folder


def test_a_run_trains_until_its_steps_are_applied_on_the_same_rows(skipped_3, run_sh):
    [r, *_] = reading.read_results(skipped_3 / "stage3.log")
    assert [s.applied for s in r.steps] == [False] * 3 + [True] * 3
    assert len({s.loss for s in r.steps[:4]}) == 1  # nothing trained: the same rows, the same loss
    dense = reading.read_results(run_sh.folder / "stage0.log")[0]
    assert r.trained_losses == pytest.approx(dense.trained_losses, rel=verdict.LOSS_RTOL)


def test_skipped_steps_leave_the_verdict_to_the_applied_ones(skipped_3, capsys):
    status, out = reported(skipped_3, capsys)
    assert status == report.EXIT["PASS"], out
    assert "skipped as fp16's loss scale overflowed: stage 3 3" in out.split("(c)")[1].splitlines()[0]


def test_fp16_with_no_step_applied_leaves_b_and_c_not_observable(run_sh, tmp_path, capsys):
    def every_step_skipped(r):
        return {**r, "dtype": "fp16", "steps": [{**s, "applied": False, "loss": r["steps"][0]["loss"]}
                                                for s in r["steps"]]}
    folder = planted(planted(run_sh.folder, tmp_path, "stage0", as_fp16(0)), tmp_path, "stage3", every_step_skipped)
    status, out = reported(folder, capsys)
    assert status == report.EXIT["NOT OBSERVABLE"]
    assert "NOT OBSERVABLE  (b)" in out and "stage 3 applied none of its steps" in out
    assert "NOT OBSERVABLE  (c)" in out and "0 step(s) applied" in out


def test_the_step_line_says_a_step_was_skipped_with_its_loss_scale():
    r = record(**facts(3))
    r.steps = [parts.Step(step=1, loss=11.098, lr=1e-5, applied=False, loss_scale=32768.0, time_s=1.0,
                          memory=parts.MemorySnapshot(peak_mem_bytes=GIB))]
    assert "loss scale 32768  SKIPPED: overflow" in rank_lines.step_line(r, r.steps[0])
    r.steps.append(dataclasses.replace(r.steps[0], step=2, applied=True))
    assert rank_lines.step_line(r, r.steps[1]).endswith("loss scale 32768  applied 1 of 3")


def test_the_progress_line_counts_applied_and_skipped_steps():
    r = record(**facts(3))
    r.steps = [parts.Step(step=i, loss=1.0, applied=i > 2) for i in (1, 2, 3)]
    assert verdict.progress_lines({"stage3": [r]}) == ["stage3 1 of 3 steps (2 more skipped)"]


# -----------------------------------------------------------------------------
# (b) expects what theory predicts


def zero_config(stage):
    return json.loads((ROOT / f"ds_config_stage{stage}.json").read_text())["zero_optimization"]


def gpu_rank(stage, world, peak, **settings):
    """A GPU rank's record that peaked at `peak` bytes (a whole number, as torch counts them)."""
    r = record(**{**facts(stage, world), **settings}, peak_mem_bytes=round(peak), zero_config=zero_config(stage),
               predicted_model_state_bytes=4)
    r.steps = [parts.Step(step=1, loss=1.0, applied=True)]
    r.model_state_breakdown = parts.Census(params=1, grads=1, master=1, moments=1)
    return r


def test_the_default_at_4_ranks_still_expects_the_acceptance_checks_3x():
    dense, zero3 = (record(**{**facts(stage, 4), "checkpoint": True}, zero_config=zero_config(stage))
                    for stage in (0, 3))
    assert theory.predicted_peak(dense) / theory.predicted_peak(zero3) / theory.PEAK_SLACK >= 3


@pytest.mark.parametrize("stage3_gib, status", [(5.00, "PASS"), (8.00, "FAIL")])
def test_fp32_at_2_ranks_passes_b_where_stage_3_holds_what_is_predicted(stage3_gib, status):
    # measured on one H200: 350m in fp32 at 2 ranks peaked at 6.68 GiB at stage 0 and 5.00 GiB at stage 3
    settings = {"model": "350m", "dtype": "fp32", "checkpoint": True}
    found, f = verdict.memory([gpu_rank(0, 2, 6.68 * GIB, **settings)], [gpu_rank(3, 2, stage3_gib * GIB, **settings)])
    assert found == status, f


@pytest.mark.parametrize("world, stage0_gib, stage3_gib", [(4, 24.54, 6.14), (2, 24.54, 11.01)])
def test_stage_3_holding_every_blocks_weights_whole_fails_b(world, stage0_gib, stage3_gib):
    # 1.3b at 4 ranks peaked at 24.54 GiB at stage 0 and 6.14 at stage 3 on one H200 (benchmarks/logs/h200/24-peaks);
    # at 2, theory's 11.01; 24 blocks' weights in bf16 are 2.25 GiB more
    def judged(stage3):
        return verdict.memory([gpu_rank(0, world, stage0_gib * GIB, checkpoint=True)],
                              [gpu_rank(3, world, stage3 * GIB, checkpoint=True)])[0]
    assert judged(stage3_gib) == "PASS" and judged(stage3_gib + 2.25) == "FAIL"


# -----------------------------------------------------------------------------
# the cause of a failed run, under the verdict


def failed_stage3(run_sh, tmp_path, log_text):
    folder = tmp_path / "failed"
    folder.mkdir()
    shutil.copy(run_sh.folder / "stage0.log", folder)
    (folder / "stage3.log").write_text(log_text)
    return folder


@pytest.mark.parametrize("log_text, why", [
    ("COMMAND deepspeed train_gpt.py\n[rank0]: Traceback (most recent call last):\n[rank0]: OSError: [Errno 30] "
     "Read-only file system: '/home/u/.cache/torch_extensions/py311_cpu'\nENDED 1 1\n",
     "Read-only file system: '/home/u/.cache/torch_extensions/py311_cpu'"),
    ("COMMAND deepspeed --hostfile hosts train_gpt.py\nTraceback (most recent call last):\nRuntimeError: Using hostfile "
     "at hosts but host=node-7 was not reachable via ssh. If you are running with a single node please remove hosts "
     "or setup passwordless ssh.\nENDED 1 1\n", "host=node-7 was not reachable via ssh"),
    ("COMMAND python3 -m torch.distributed.run --nproc_per_node 3 train_gpt.py\n[   3.6s] stage 3, bf16\nW1208 "
     "00:57:14.081000 3495 torch/distributed/elastic/agent/server/api.py:739] Received 15 death signal, shutting down "
     "workers\n", "Received 15 death signal"),
], ids=["unwritable extension cache", "launcher error", "ranks ended by a signal before they said"])
def test_a_run_without_results_gets_the_line_of_its_log_that_says_why(log_text, why, run_sh, tmp_path, capsys):
    status, out = reported(failed_stage3(run_sh, tmp_path, log_text), capsys)
    assert status == report.EXIT["FAIL"]
    below = out.split("VERDICT: FAIL")[1].splitlines()
    assert below[1].startswith("stage3 did not finish (no result): ") and why in below[1]


def test_a_hung_rank_is_named_by_the_barrier_that_it_failed(hung_rank):
    assert "failed to pass monitoredBarrier" in reading.cause(hung_rank.log)


def test_a_port_taken_before_a_stage_is_named(tmp_path):
    log = tmp_path / "stage3.log"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # one rank, as a launcher starts it: the deepspeed launcher would wait 30 s more for a rank stuck
        # connecting to the taken port, which a SIGTERM does not reach
        run([sys.executable, "train_gpt.py", "--stage", "3", "--steps", "1"], log=log,
            env={**LAUNCHED_AS_RANK_0, "MASTER_PORT": str(port)})
    assert "EADDRINUSE" in reading.cause(log) or "ddress already in use" in reading.cause(log)


# -----------------------------------------------------------------------------
# known DeepSpeed defects


@pytest.mark.parametrize("version, criterion, source", [
    ("0.19.2", "(d)", "DeepSpeed issue #5524, fixed by PR #8148; fixed in 0.19.3"),
    ("0.18.4", "(c)", "DeepSpeed PR #7839; fixed in 0.18.6"),
    ("0.17.5", "(b)", "DeepSpeed PR #7515; fixed in 0.17.6"),
])
def test_a_criterion_failing_with_a_known_defects_symptom_names_it(version, criterion, source, capsys):
    [folder] = (OLDEST / "quick" / f"quick-{version}").iterdir()
    status, out = reported(folder, capsys)
    line = out.split(f"FAIL  {criterion}")[1].splitlines()[0]
    assert f"KNOWN DEEPSPEED DEFECT in {version}" in line and source in line


FP16_REHEARSALS = ROOT / "benchmarks" / "logs" / "h200" / "26-off-default"  # before and after the loss-scaling fix


def test_fp16_stage_0_whose_loss_went_unscaled_is_named_as_deepspeeds_open_defect(capsys):
    [folder] = (FP16_REHEARSALS / "1-batch" / "results" / "fp16_rehearsal").iterdir()
    status, out = reported(folder, capsys)
    for criterion in ("(c)", "(e)"):
        line = out.split(f"FAIL  {criterion}")[1].splitlines()[0]
        assert "KNOWN DEEPSPEED DEFECT in 0.19.8" in line and "DeepSpeed PR #8393, open" in line


def test_fp16_stage_0_with_its_loss_scaled_passes_and_names_no_defect(capsys):
    [folder] = (FP16_REHEARSALS / "4-rest" / "results" / "fp16_rehearsal").iterdir()
    status, out = reported(folder, capsys)
    assert status == report.EXIT["PASS"] and "KNOWN DEEPSPEED DEFECT" not in out


def test_the_version_that_fixed_the_defects_names_none(capsys):
    [folder] = (OLDEST / "quick" / "quick-0.19.3").iterdir()
    assert "KNOWN DEEPSPEED DEFECT" not in reported(folder, capsys)[1]


def test_a_fault_with_a_defects_symptom_is_not_blamed_on_a_version_that_is_fixed(run_sh, tmp_path, capsys):
    def held_more(r):
        return {**r, "partition_check_ok": False, "held_fraction": {**r["held_fraction"], "params": 0.65}}
    status, out = reported(planted(run_sh.folder, tmp_path, "stage3", held_more), capsys)
    assert "FAIL  (d)" in out and "KNOWN DEEPSPEED DEFECT" not in out


def test_versions_compare_as_numbers():
    assert defects.version("0.19.10+abc") > defects.version("0.19.3") and defects.version("dev") is None
