"""plan.py's offload (issue 57): its host pass, CPU Adam and what DeepSpeed does around it, taken from the runs that
timed it on their host, else assumed and said so, never a silent zero; a node's ranks share its cores; and the
folders that contradict themselves or belong to another tool, each refused in one line with exit status 2. CPU
only, no launch."""
import json
import math

import pytest

from test_plan import MB2, planned, planned_text, rows, run_of
from test_plan_inputs import one_clean_line, record, refused
from zero3bench import parts
from zero3bench.accounting import timing
from zero3bench.planning import steptime

PARAMS = 1_313_722_368  # 1.3b
# a rank's host pass as a GPU rank times it: 2^25 elements on 16 threads of 16 cores
PROBE = {"elements": 1 << 25, "threads": 16, "host_cores": 16, "cpu": "a CPU", "dtype": "bfloat16",
         "unscale_s": 0.004, "adam_s": 0.030, "to_gpu_s": 0.016, "to_host_s": 0.002}
OFFLOAD = ["--gpus", "1", "--stages", "3", "--offload"]


def calibrating(tmp_path, probe=PROBE, **changes):
    """A folder of the README's command at world 1, 1.3b: stages 0 and 3, their ranks' host passes."""
    steps = [{"step": i, "loss": 5.0, "time_s": 0.45 if i <= 3 else 0.40} for i in range(1, 31)]
    flops = timing.flops_per_token(PARAMS, 24, 2048, 1024)
    own = {"micro_batch": 16, "steps": steps, "step_time_s": 0.40, "flops_per_token": flops, "params_total": PARAMS,
           "param_tensors": 292, **({"host_pass": probe} if probe else {})}
    runs = {f"stage{stage}": [record(stage=stage, **{**own, **changes})] for stage in (0, 3)}
    (tmp_path / "summary.json").write_text(json.dumps({"results": runs}))
    return tmp_path


def per_element(probe, copy):
    return (probe["unscale_s"] + probe["adam_s"] + probe[copy]) * probe["threads"] / probe["elements"]


# -----------------------------------------------------------------------------
# where the host pass comes from


@pytest.mark.parametrize("flag", ["--offload", "--offload-param"])
def test_without_a_measurement_the_host_pass_is_assumed_named_with_its_log_and_never_zero(capsys, flag):
    p = planned(capsys, "--gpus", "1", "8", "--stages", "3", flag)
    assert all(r["host_pass_s"] > 0.4 for r in p["rows"])
    text = planned_text(capsys, "--gpus", "1", "8", "--stages", "3", flag)
    assert " assumed " in text.split("\n\n")[1]  # the table's host pass column
    assert "assumed: what 36-step-time's 92vQ's" in text and "step-check-18aea3b.txt" in text


def test_the_assumed_host_pass_is_what_92vqs_offload_steps_left_on_its_16_cores():
    left = steptime.terms(MB2).host_step_s
    for setup in steptime.OFFLOADS:
        assert steptime.ASSUMED_HOST_CORE_S[setup] * PARAMS / 16 == pytest.approx(left[setup], rel=2e-3)


@pytest.mark.parametrize("flag, setup, copy", [("--offload", "3_offload", "to_gpu_s"),
                                               ("--offload-param", "3_infinity", "to_host_s")])
def test_a_folder_whose_runs_timed_the_host_pass_plans_offload_from_it(capsys, tmp_path, flag, setup, copy):
    """The README's command alone: 3_offload and 3_infinity on its stage 3 and its ranks' host pass, on the 16 cores
    they timed it on: (unscale + CPU Adam + the copy) x 16 threads / 2^25 elements x 1.3b / 16 cores."""
    folder = calibrating(tmp_path)
    p = planned(capsys, "--from", folder, "--gpus", "1", "--stages", "3", flag)
    assert p["inputs"]["host_cores"] == 16
    assert rows(p, "3")[1]["host_pass_s"] == pytest.approx(per_element(PROBE, copy) * PARAMS / 16)
    assert p["host_pass"]["sources"][setup].startswith("measured by DeepSpeedCPUAdam's probe")
    text = planned_text(capsys, "--from", folder, "--gpus", "1", "--stages", "3", flag)
    assert " measured " in text.split("\n\n")[1] and "a CPU: CPU Adam 1.12G elements/s" in text


def test_of_a_folders_probes_the_fastest_sets_the_host_pass_since_a_hosts_other_work_only_slows_one(capsys, tmp_path):
    """h200/47-offload-step: the calibrating folder's two probes of one host 1.7x apart, its offload steps at the
    faster."""
    folder = calibrating(tmp_path)
    summary = json.loads((folder / "summary.json").read_text())
    summary["results"]["stage0"][0]["host_pass"] = {**PROBE, "unscale_s": 0.010, "adam_s": 0.045, "to_gpu_s": 0.03}
    (folder / "summary.json").write_text(json.dumps(summary))
    p = planned(capsys, "--from", folder, *OFFLOAD)
    assert rows(p, "3")[1]["host_pass_s"] == pytest.approx(per_element(PROBE, "to_gpu_s") * PARAMS / 16)
    assert "CPU Adam 1.12G elements/s" in p["host_pass"]["sources"]["3_offload"]  # the fast probe's, 2^25 / 30 ms


def test_the_fastest_probe_is_one_made_on_the_plans_cores_and_the_largest_slice():
    """A rank of one thread costs a fraction of 16 threads' core-seconds, and a small slice runs in the caches:
    neither is the pass of 16 cores on a partition of billions."""
    on = {"16 threads": PROBE, "16 threads, slower": {**PROBE, "adam_s": 0.06},
          "1 thread of 2 ranks": {**PROBE, "threads": 1, "adam_s": 0.001},
          "a small slice": {**PROBE, "elements": 1 << 20, "unscale_s": 1e-4, "adam_s": 5e-4, "to_gpu_s": 3e-4}}
    ranks = {"1 thread of 2 ranks": 2}
    h = steptime.host_pass([(parts.HostPass(**p), ranks.get(name, 1)) for name, p in on.items()])
    assert h.cores == 16 and h.core_s["3_offload"] == pytest.approx(per_element(PROBE, "to_gpu_s"))


def test_a_folders_offload_run_at_world_1_sets_its_host_pass(capsys):
    """92vQ ran 3_offload: what its step left after its passes and copies, not an assumption."""
    p = planned(capsys, "--from", MB2, *OFFLOAD)
    assert p["host_pass"]["sources"]["3_offload"].startswith("measured: what stage3_offload's step in")
    assert rows(p, "3")[1]["step_s"]["overlapped"] == pytest.approx(run_of(MB2, "3_offload").step_s)


def test_a_plan_says_in_one_line_where_the_host_pass_not_the_gpu_sets_the_step(capsys):
    """1.194 s of host pass on 1 and 8 GPUs of a node against 0.04 s of passes; on 1024 GPUs, 128 nodes, 0.009 s."""
    lines = planned_text(capsys, "--gpus", "1", "8", "1024", "--stages", "0", "3", "--offload").splitlines()
    [said] = [line for line in lines if line.startswith("offload's host pass")]
    assert said == ("offload's host pass, not the GPU, sets the step (it is longer than the passes) for: "
                    "3+offload at G = 1, 8")
    lines = planned_text(capsys, "--gpus", "1024", "--stages", "3", "--offload").splitlines()
    assert "offload's host pass is shorter than the passes on the GPU in every row: the GPU sets the step" in lines


def test_stages_1_and_2_offloaded_copy_their_weights_as_3_infinity_does_and_stage_3_into_the_gpus(capsys):
    """Stages 1 and 2 copy the updated weights into a pinned host buffer, then to the GPU with the host copies;
    stage 3 without offload_param copies them into the GPU's from the CPU (DeepSpeed 0.19.8)."""
    p = planned(capsys, "--gpus", "1", "--stages", "1", "2", "3", "--offload", "--host-cores", "16")
    host = {setup: rows(p, setup)[1]["host_pass_s"] for setup in ("1", "2", "3")}
    per_rank = {s: steptime.ASSUMED_HOST_CORE_S[s] * PARAMS / 16 for s in steptime.OFFLOADS}
    assert host == pytest.approx({"1": per_rank["3_infinity"], "2": per_rank["3_infinity"], "3": per_rank["3_offload"]})


def test_the_host_cores_default_to_those_the_probes_ranks_ran_on_and_fewer_scale_the_host_pass(capsys, tmp_path):
    folder = calibrating(tmp_path)
    at = {cores: rows(planned(capsys, "--from", folder, *OFFLOAD, *cores), "3")[1]["host_pass_s"]
          for cores in ((), ("--host-cores", "16"), ("--host-cores", "4"))}
    assert at[()] == at[("--host-cores", "16")] == pytest.approx(at[("--host-cores", "4")] / 4)


# -----------------------------------------------------------------------------
# bad input: one line, exit status 2


def refused_folder(capsys, folder, *argv):
    status, err = refused(capsys, "--from", folder, *argv)
    one_clean_line(status, err)
    return err


def test_host_cores_beyond_the_host_the_folder_timed_are_refused(capsys, tmp_path):
    err = refused_folder(capsys, calibrating(tmp_path), *OFFLOAD, "--host-cores", "32")
    assert "--host-cores 32 is more than the 16 cores of the host" in err and "plan at most 16" in err


BAD_PROBES = [
    ({"adam_s": None}, "host_pass.adam_s is null", "the seconds its 33,554,432 elements took"),
    ({"adam_s": math.nan}, "host_pass.adam_s is NaN", "from 100,000 to 1e+12"),
    ({"adam_s": 1e-12}, "host_pass.adam_s is 1e-12", "at a rate from 100,000 to 1e+12"),
    ({"unscale_s": 1e6}, "host_pass.unscale_s is 1000000.0", "at a rate from 100,000 to 1e+12"),
    ({"to_gpu_s": None}, "host_pass.to_gpu_s is null", "the seconds its 33,554,432 elements took"),
    ({"threads": 0}, "host_pass.threads is 0", "a whole number from 1"),
    ({"elements": "many"}, 'host_pass.elements is "many"', "a whole number from 1"),
]


@pytest.mark.parametrize("changes, where, wanted", BAD_PROBES, ids=[w for _, w, _ in BAD_PROBES])
def test_a_host_pass_missing_not_finite_or_absurd_is_refused(capsys, tmp_path, changes, where, wanted):
    err = refused_folder(capsys, calibrating(tmp_path, {**PROBE, **changes}))
    assert f"results.stage0[0].{where}" in err and wanted in err, err


def test_a_folder_whose_runs_could_not_time_the_host_pass_is_refused_for_offload_alone(capsys, tmp_path):
    folder = calibrating(tmp_path, {"threads": 16, "host_cores": 16, "cpu": "a CPU",
                                    "why_not": "RuntimeError: Unable to JIT load the cpu_adam op"})
    err = refused_folder(capsys, folder, *OFFLOAD)
    assert "could not time offload's host pass (RuntimeError: Unable to JIT load the cpu_adam op)" in err
    assert planned(capsys, "--from", folder, "--gpus", "1", "--stages", "0", "3")["rows"]


def test_an_mfu_given_in_percent_is_refused_not_read_as_a_gpu_of_9_9_tflops(capsys, tmp_path):
    """A record of another tool, without peak_tflops: RankResult.from_dict would take 346.5 / 35 = 9.9 TFLOP/s."""
    folder = calibrating(tmp_path, peak_tflops=None, tflops_per_gpu=346.5, mfu=35.0)
    err = refused_folder(capsys, folder)
    assert "results.stage0[0].mfu is 35.0" in err and "a fraction of the peak, not a percentage" in err


def test_flops_per_token_that_do_not_match_the_recorded_parameters_are_refused(capsys, tmp_path):
    err = refused_folder(capsys, calibrating(tmp_path, flops_per_token=8e9))
    assert "results.stage0[0].flops_per_token is 8,000,000,000.0" in err
    assert f"it must be {timing.flops_per_token(PARAMS, 24, 2048, 1024):,}" in err


def test_a_world_1_step_with_a_negative_clock_term_is_refused(capsys, tmp_path):
    """Stage 0's 0.08 s at micro batch 8 without checkpointing (MFU 0.88), shorter than the 0.086 s of 1.3b's
    optimizer pass on the GPU alone, would give the GPU a negative rate."""
    steps = [{"step": i, "loss": 5.0, "time_s": 0.08} for i in range(1, 31)]
    folder = calibrating(tmp_path, steps=steps, step_time_s=0.08, micro_batch=8, checkpoint=False)
    err = refused_folder(capsys, folder, "--gpus", "1")
    assert "stage 0's step (0.08 s) is no longer than its optimizer's pass on the GPU alone (0.0862 s)" in err
    assert "its figures contradict themselves" in err


def test_a_stage_3_step_far_under_the_launches_that_stage_0_sets_is_refused():
    zero = run_of(MB2, "0")  # micro batch 2 with checkpointing: the host holds it
    three = steptime.Measured("3", zero.model, 3, 2, True, zero.step_s / 2, zero.seq, zero.flops_per_token,
                              zero.params, zero.param_tensors, frozenset())
    with pytest.raises(steptime.BadInput, match=r"stage 3's step \(0.085 s\) is shorter than the launches"):
        steptime.terms(MB2, {"0": zero, "3": three}, steptime.host_pass([]))


def test_an_offload_step_that_leaves_nothing_for_its_host_pass_is_refused(capsys, tmp_path):
    folder = calibrating(tmp_path)
    summary = json.loads((folder / "summary.json").read_text())
    offload = {**summary["results"]["stage3"][0], "offload": {"optimizer": "cpu", "param": None}}
    summary["results"]["stage3_offload"] = [offload]  # its 0.40 s, the same as stage 3's without the optimizer
    (folder / "summary.json").write_text(json.dumps(summary))
    err = refused_folder(capsys, folder, *OFFLOAD)
    assert "stage3_offload's step (0.4 s) leaves nothing for its host pass" in err


@pytest.mark.parametrize("results", [{}, {"stage0": []}], ids=["no run", "a run of no record"])
def test_a_summary_of_no_record_is_refused_not_planned_on_assumptions(capsys, tmp_path, results):
    (tmp_path / "summary.json").write_text(json.dumps({"results": results}))
    assert '"results" holds no run\'s record' in refused_folder(capsys, tmp_path, "--gpus", "8")


def test_a_stage_a_few_percent_faster_than_the_launches_stage_0_sets_is_noise_not_a_contradiction():
    """Stage 1 at world 1 is stage 0 again: 5% under stage 0's launches gives it no own cost, and no refusal."""
    zero = run_of(MB2, "0")  # micro batch 2 with checkpointing: the host holds it, and sets the launches
    one = steptime.Measured("1", zero.model, 1, 2, True, zero.step_s * 0.95, zero.seq, zero.flops_per_token,
                            zero.params, zero.param_tensors, frozenset())
    t = steptime.terms(MB2, {"0": zero, "1": one}, steptime.host_pass([]))
    assert t.launch_s_per_tensor_pass * 292 * 3 == pytest.approx(zero.step_s) and t.own_s_per_tensor[1] == 0.0
