"""Every ZeRO stage and offload: what each partitions, measured against the ZeRO paper, and a model
that only stage 3 can fit."""
import pytest

import report
from zero3bench import rank_lines, result
from zero3bench.reporting import reading
from conftest import planted

# what each stage promises to partition over the ranks; the rest stays whole on every rank
PARTITIONED = {0: set(), 1: {"optimizer"}, 2: {"optimizer", "grads"}, 3: {"optimizer", "grads", "params"}}


def test_the_other_stages_run(other_stages):
    assert other_stages.proc.returncode == 0, other_stages.proc.stdout[-3000:]
    assert list(other_stages.runs) == ["stage0", "stage1", "stage2", "stage3", "stage3_infinity", "stage3_offload"]
    for records in other_stages.runs.values():
        assert len(records) == 2 and not any(r["error"] for r in records)


@pytest.mark.parametrize("stage", [1, 2])
def test_stages_1_and_2_partition_optimizer_states_but_not_parameters(stage, other_stages):
    for r in other_stages.runs[f"stage{stage}"]:
        assert r["stage"] == stage and r["partitioned_tensors"] == 0
        assert r["held_fraction"]["params"] == pytest.approx(1.0)
        assert r["held_fraction"]["optimizer"] == pytest.approx(0.5, rel=0.01)
        assert r["partition_check_ok"]


def test_stage2_partitions_gradients_too(other_stages):
    # DeepSpeed's stage 1 does so too (see test_accounting), so this cannot tell stage 2 from stage 1
    for r in other_stages.runs["stage2"]:
        # half, plus the whole gradients of tensors that straddle the partition boundary
        assert 0.5 <= r["held_fraction"]["grads"] < 0.5 + 2 * r["largest_param_elems"] / r["params_total"]


def test_each_run_holds_the_shares_its_stage_promises(other_stages):
    for name, records in other_stages.runs.items():
        for r in records:
            assert r["partition_check_ok"], (name, r["held_fraction"], r["promised_fraction"])
            for kind in PARTITIONED[r["stage"]]:
                assert r["held_fraction"][kind] < 0.6, (name, kind)


def test_measured_model_states_are_within_1_percent_of_the_prediction_for_every_stage(other_stages):
    for name, records in other_stages.runs.items():
        for r in records:
            measured = r["model_state_bytes"] + (r["host_state_bytes"] or 0)  # none apart from the device's on CPUs
            predicted = r["predicted_model_state_bytes"] + r["predicted_host_state_bytes"]
            assert measured == pytest.approx(predicted, rel=0.01), name


def test_deepspeeds_estimator_is_reported_for_stages_1_to_3(other_stages):
    assert other_stages.runs["stage0"][0]["deepspeed_estimate"] is None
    for name, records in list(other_stages.runs.items())[1:]:
        estimate = records[0]["deepspeed_estimate"]
        assert estimate["device"] > 0 and estimate["host_per_node"] > 0, name


def test_the_output_says_what_deepspeeds_estimator_adds_beyond_the_measurement(other_stages):
    gaps = {name: [d for d in other_stages.runs[name][0]["differences"] if d.startswith("DeepSpeed's estimator")]
            for name in ("stage1", "stage2", "stage3")}
    assert all(len(found) == 1 for found in gaps.values()), gaps
    assert all("4 bytes per partition element" in gaps[name][0] for name in ("stage1", "stage2"))
    assert "2 bytes per partition element" in gaps["stage3"][0] and "largest layer (" in gaps["stage3"][0]


def test_offload_moves_the_optimizer_and_the_parameters_to_the_host(other_stages):
    assert other_stages.runs["stage3_offload"][0]["offload"] == {"optimizer": "cpu", "param": None}
    assert other_stages.runs["stage3_infinity"][0]["offload"] == {"optimizer": "cpu", "param": "cpu"}
    assert all(r["optimizer"] == "deepspeed.DeepSpeedCPUAdam" for name in ("stage3_offload", "stage3_infinity")
               for r in other_stages.runs[name])


def test_the_report_compares_every_stage_and_the_cost_of_offload(other_stages):
    out = other_stages.proc.stdout
    for row in ("ZeRO paper", "DeepSpeed estimator", "error", "step time s"):
        assert row in out
    assert "offload stage3_offload: " in out and "x the step time of stage 3" in out
    assert "(d) every run holds what its stage promises" in out and "VERDICT: PASS" in out


def test_a_gpu_rank_that_offloads_every_model_state_is_reported_without_a_division_by_zero(other_stages):
    # on a GPU, ZeRO-Infinity predicts no model states on the device: the H200 run once crashed here
    cpu = other_stages.runs["stage3_infinity"][0]
    r = dict(cpu, mem_kind="cuda", predicted_model_state_bytes=0, host_state_breakdown=cpu["model_state_breakdown"],
             host_state_bytes=cpu["model_state_bytes"], predicted_host_state_bytes=cpu["predicted_model_state_bytes"])
    lines = "\n".join(rank_lines.human_lines(result.RankResult.from_dict(r)))
    assert "vs ZeRO prediction 0.0 MiB (-)" in lines and "host (CPU) model states" in lines


def test_a_model_that_only_stage_3_fits_under_a_memory_cap(memory_cap):
    assert memory_cap.proc.returncode == 5, memory_cap.proc.stdout[-3000:]  # nothing compared the two stages
    dense, zero3 = memory_cap.runs["stage0"], memory_cap.runs["stage3"]
    assert reading.oom([result.RankResult.from_dict(r) for r in dense]) and any("can't allocate memory" in r["error"] for r in dense)
    assert not reading.failed([result.RankResult.from_dict(r) for r in zero3]) and len(zero3) == 2
    assert "only stage 3 trains this model on this hardware, with memory capped at 1.75 GiB" in memory_cap.proc.stdout
    assert all(r["peak_mem_bytes"] > 0 for r in dense)
    assert reading.read_command(memory_cap.folder / "stage0.log").endswith("--model small --max-mem-gib 1.75")
    assert "PASS  (b)" in memory_cap.proc.stdout and "VERDICT: NOT OBSERVABLE" in memory_cap.proc.stdout


def test_a_stage_that_holds_more_than_it_promises_fails_the_verdict(other_stages, tmp_path, capsys):
    folder = planted(other_stages.folder, tmp_path, "stage2", lambda r: {**r, "partition_check_ok": False})
    assert report.main([str(folder)]) == 1
    assert "stage2 not as promised" in capsys.readouterr().out


def test_a_failed_offload_run_fails_the_verdict_and_says_so(other_stages, tmp_path, capsys):
    folder = planted(other_stages.folder, tmp_path, "stage3_offload", lambda r: {**r, "error": "RuntimeError: boom"})
    assert report.main([str(folder)]) == 1
    out = capsys.readouterr().out
    assert "offload stage3_offload: error" in out and "stage3_offload error" in out


def test_on_a_gpu_the_offload_line_gives_the_hosts_tensors_and_peak_rss(other_stages, tmp_path, capsys):
    host = {"params": 0, "grads": 2**20, "master": 2**21, "moments": 2**22, "other": 3 * 2**20}
    on_gpu = {"mem_kind": "cuda", "host_state_breakdown": host, "host_state_bytes": 7 * 2**20,
              "predicted_host_state_bytes": 7 * 2**20, "host_peak_rss_bytes": 2**31}
    folder = planted(other_stages.folder, tmp_path, "stage3_offload", lambda r: {**r, **on_gpu})
    report.main([str(folder)])
    out = capsys.readouterr().out
    assert "host (CPU) model states 7.0 MiB, other host tensors 3.0 MiB, host peak RSS 2.00 GiB" in out
    assert "host model states" in out and "+0.0%" in out.split("host model states")[1].splitlines()[2]


def only(folder, tmp_path, *names):
    """A results folder that holds only the named runs' logs."""
    import shutil
    copy = tmp_path / ("only-" + "-".join(names))
    copy.mkdir()
    for name in names:
        shutil.copy(folder / f"{name}.log", copy)
    return copy


def test_stages_without_a_stage0_and_stage3_pair_cannot_pass(other_stages, tmp_path, capsys):
    assert report.main([str(only(other_stages.folder, tmp_path, "stage1", "stage2"))]) == 5
    assert "no stage-0 and plain stage-3 runs" in capsys.readouterr().out


def test_offload_runs_beside_stage_3_alone_are_not_observable_rather_than_failed(other_stages, tmp_path, capsys):
    assert report.main([str(only(other_stages.folder, tmp_path, "stage3", "stage3_offload"))]) == 5
    out = capsys.readouterr().out
    assert "no plain stage-0 run with this number of ranks" in out and "offload stage3_offload: " in out
