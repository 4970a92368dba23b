"""DeepCompile, DeepSpeed's compiler for ZeRO-3, as ds_config_stage3_deepcompile.json turns it on: it implies
--compile, needs GPUs, is timed only after the step at which it compiles again, and is held to the same losses
as the eager runs. Its ops build against CUDA, so on a CPU these tests plant its records in a real run's logs."""
import argparse
import dataclasses
import json
import shutil
import statistics

import deepspeed.compile.init_z3
import pytest

from zero3bench import options, result, stages
import report
from zero3bench.reporting import reading
from conftest import ROOT, assert_refused, facts, planted, record

RECOMPILE = options.DEEPCOMPILE_RECOMPILE_STEP
COMPILE_S = 100.0


def test_deepcompile_compiles_again_where_deepspeed_schedules_it():
    assert RECOMPILE == deepspeed.compile.init_z3.WARMUP + 1  # DeepSpeed counts steps from 0


def test_deepcompile_is_refused_without_gpus_in_one_line(check):
    assert_refused(check("--config", "configs/ds_config_stage3_deepcompile.json", "--steps", "8"),
                   "turns DeepCompile on, which needs GPUs")


def deepcompile_args(steps, stage=3):
    args = argparse.Namespace(steps=steps, stage=stage, compile=False)
    options.deepcompile({"compile": {"deepcompile": True}}, args, on_gpu=True, where=" c.json")
    return args


def test_deepcompile_implies_compile_and_is_timed_after_its_second_compile():
    args = deepcompile_args(RECOMPILE + 2)
    assert args.compile and args.deepcompile and options.first_timed_step(True, 3) == RECOMPILE + 1


def test_deepcompile_needs_a_timed_step_after_its_second_compile_besides_the_profiled_last():
    with pytest.raises(options.BadInput, match=f"compiles at step 1 and again at step {RECOMPILE}: give --steps "
                                               f"{RECOMPILE + 2} or more"):
        deepcompile_args(RECOMPILE + 1)


def test_deepcompile_compiles_once_below_stage_3():
    assert deepcompile_args(2, stage=1).compile and options.first_timed_step(True, 1) == 2


def test_deepcompile_is_refused_at_stage_0_where_deepspeed_would_quietly_not_use_it():
    with pytest.raises(options.BadInput, match="DeepCompile on at stage 0; DeepCompile compiles ZeRO stages 1 to 3"):
        deepcompile_args(RECOMPILE + 2, stage=0)


def steps_compiling_at(*compiles, n=RECOMPILE + 4):
    """n steps of 1 s, the compiling ones COMPILE_S, the last under the profiler."""
    return [{"step": i, "loss": 5.0, "time_s": COMPILE_S if i in compiles else 1.0 + i / 100,
             "comm": {"all_gather": {"bytes": 10, "elems": 5, "calls": 1}},
             **({"comm_s": {"all_gather": 0.1}} if i == n else {})} for i in range(1, n + 1)]


def test_a_deepcompile_run_is_timed_from_the_step_after_it_compiles_again():
    steps = steps_compiling_at(1, RECOMPILE)
    r = record(**facts(3), deepcompile=True, steps=steps, params_total=1000)
    assert r.step_time_s == pytest.approx(statistics.median(s.time_s for s in r.steps[RECOMPILE:-1]))


def test_an_eager_run_is_timed_from_step_2():
    steps = steps_compiling_at(1)
    r = record(**facts(3), steps=steps, params_total=1000)
    assert r.step_time_s == pytest.approx(statistics.median(s.time_s for s in r.steps[1:-1]))


def test_a_deepcompile_run_that_stopped_before_it_was_timed_has_no_speed():
    r = record(**facts(3), deepcompile=True, steps=steps_compiling_at(1, n=RECOMPILE - 1), params_total=1000)
    assert r.step_time_s is None and r.tokens_per_s is None


def test_deepcompile_s_collectives_are_not_counted_rather_than_undercounted():
    r = record(**facts(3), deepcompile=True, steps=steps_compiling_at(1, RECOMPILE), params_total=1000)
    assert r.comm_bytes is None and r.comm_volume is None and r.busbw is None


def with_deepcompile_run(folder, tmp_path, edit=lambda r: r):
    """A copy of a stage-3 and FSDP2 run with a DeepCompile run beside them: stage 3's records as DeepCompile's,
    compiling at step 1 and RECOMPILE, passed through edit, and their figures worked out again by result.RankResult."""
    copy = tmp_path / "with-deepcompile"
    shutil.copytree(folder, copy)
    shutil.copy(copy / "stage3.log", copy / "stage3_deepcompile.log")

    def as_deepcompile(r):
        losses = r["losses"] + [r["losses"][-1]] * (RECOMPILE + 4 - len(r["losses"]))
        steps = [{**s, "loss": loss} for s, loss in zip(steps_compiling_at(1, RECOMPILE), losses)]
        r = edit({**r, "config": str(ROOT / "configs" / "ds_config_stage3_deepcompile.json"), "compile": True,
                  "deepcompile": True, "steps": steps})
        return result.as_dict(result.RankResult.from_dict(r))
    return planted(copy, tmp_path, "stage3_deepcompile", as_deepcompile)


def test_the_report_says_what_deepcompile_cost_and_sets_it_against_fsdp2(fsdp2_peer, tmp_path, capsys):
    folder = with_deepcompile_run(fsdp2_peer.folder, tmp_path)
    report.main(["--write", str(folder)])
    out = capsys.readouterr().out
    assert (f"stage3_deepcompile: DeepCompile compiled, taking {COMPILE_S:.0f} s at step 1 and {COMPILE_S:.0f} s at "
            f"step {RECOMPILE}; its speed is timed from step {RECOMPILE + 1} on") in out
    assert "stage 3 against fsdp2: " in out and "stage3_deepcompile against fsdp2: " in out
    assert "stage3_deepcompile 0.000% at step 1 and 0.00% at most from stage3" in out  # (e) holds it to eager
    results = json.loads((folder / "summary.json").read_text())["results"]["stage3_deepcompile"]
    assert all(r["comm_bytes"] is None and r["timed_from"] == RECOMPILE + 1 for r in results)


def test_an_eager_run_is_the_reference_before_a_compiled_one(fsdp2_peer):
    eager = fsdp2_peer.runs["stage3"][0]
    eager = result.RankResult.from_dict(eager)
    compiled = dataclasses.replace(eager, run=dataclasses.replace(eager.run, compile=True))
    assert reading.reference_rank(eager) < reading.reference_rank(compiled)


def test_fsdp2_is_set_only_against_stage_3_runs_with_its_settings(fsdp2_peer, tmp_path, capsys):
    copy = tmp_path / "another-batch"
    shutil.copytree(fsdp2_peer.folder, copy)
    shutil.copy(copy / "stage3.log", copy / "stage3_mb4.log")
    report.main([str(planted(copy, tmp_path, "stage3_mb4", lambda r: {**r, "micro_batch": 4}))])
    out = capsys.readouterr().out
    assert "stage 3 against fsdp2: " in out and "stage3_mb4 against" not in out


def test_a_failed_deepcompile_run_is_set_against_fsdp2_by_its_status(fsdp2_peer, tmp_path, capsys):
    report.main([str(with_deepcompile_run(fsdp2_peer.folder, tmp_path, lambda r: {**r, "error": "RuntimeError: x"}))])
    out = capsys.readouterr().out
    assert "stage3_deepcompile against fsdp2: fsdp2 ok, stage3_deepcompile error" in out
    assert "DeepCompile compiled" not in out


def test_a_compiled_run_that_trains_another_model_fails_the_verdict(fsdp2_peer, tmp_path, capsys):
    def race(r):
        first, *rest = r["steps"]
        return {**r, "steps": [{**first, "loss": first["loss"] * 1.001}, *rest]}
    assert report.main([str(with_deepcompile_run(fsdp2_peer.folder, tmp_path, race))]) == 1
    assert "stage3_deepcompile and stage3 DIFFER" in capsys.readouterr().out


def test_the_deepcompile_config_changes_only_the_compiler():
    eager, compiled = (json.loads(stages.config_path(name).read_text()) for name in ("3", "3_deepcompile"))
    assert compiled.pop("compile") == {"deepcompile": True} and compiled == eager
