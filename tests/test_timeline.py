"""--timeline: each rank's memory through its traced step, at each hook, against the moments that the prediction names
(zero3bench/timeline.py, zero3bench/reporting/timelines.py). On 2 CPU ranks (`bash run.sh --timeline --peer fsdp2`, the
other stages and offload, and a planted fault that keeps weights gathered), and on the committed
GPU trace of benchmarks/logs/h200/35-trace (tests/committed_trace.py). A Hugging Face model's: tests/test_hf_runs.py."""
import json
import re

import pytest

import committed_trace
import report
from conftest import ROOT, assert_refused
from zero3bench import options, parts, timeline
from zero3bench.accounting.memory import MOMENTS
from zero3bench.reporting import reading, timelines

PHASES = ["forward", "backward", "optimizer"]


def points(record):
    return parts.Timeline.from_dict(record["memory_timeline"]).points


def test_every_rank_of_each_run_traces_its_last_step_through_its_three_phases(traced_run):
    assert traced_run.proc.returncode == report.EXIT["PASS"], traced_run.proc.stdout[-3000:]
    assert list(traced_run.runs) == ["fsdp2", "stage0", "stage3"]
    for name, ranks in traced_run.runs.items():
        for r in ranks:
            assert r["memory_timeline"]["step"] == 3 and r["memory_timeline"]["memory"] in ("malloc", "rss"), name
            phases = [p.phase for p in points(r)]
            assert sorted(set(phases), key=PHASES.index) == PHASES and phases == sorted(phases, key=PHASES.index)


def test_each_block_and_each_module_with_weights_of_its_own_marks_its_forward_and_backward(traced_run):
    for name, ranks in traced_run.runs.items():
        said = {(p.event, p.module) for p in points(ranks[0])}
        for module in ("wte", "wpe", "blocks.0", "blocks.1", "ln_f", "lm_head"):
            assert {("forward", module), ("forward done", module), ("backward", module)} <= said, (name, module)


def test_stage_3_and_fsdp2_trace_each_gather_and_release_and_stage_0_gathers_nothing(traced_run):
    for name in ("stage3", "fsdp2"):
        traced = points(traced_run.runs[name][0])
        assert {"gathered", "released"} <= {p.event for p in traced}, name
        returned = next(p for p in traced if p.event == "backward done")
        assert max(p.gathered for p in traced) > 0 and returned.gathered == traced[-1].gathered == 0, name
        assert traced_run.runs[name][0]["memory_timeline"]["still_gathered"] == []
    assert not any(p.gathered or p.event == "gathered" for p in points(traced_run.runs["stage0"][0]))


def test_the_first_and_last_steps_are_traced_marked_and_not_timed_for_speed(traced_run):
    for ranks in traced_run.runs.values():
        for r in ranks:
            assert [s.get("traced", False) for s in r["steps"]] == [True, False, True]
            assert r["step_time_s"] == r["steps"][1]["time_s"]
            assert 0 < r["memory_timeline"]["hooks_s"] < r["steps"][2]["time_s"]


def test_the_report_says_in_one_line_per_run_where_each_peaked_and_what_tracing_cost(traced_run):
    text = (traced_run.folder / "report.txt").read_text()
    said = [line.strip() for line in text.splitlines() if line.startswith("  ") and ", step 3: " in line]
    assert [line.split(" rank ")[0] for line in said] == ["fsdp2", "stage0", "stage3"]
    for line in said:
        assert "rose most" in line and "above the states" in line and "hooks took" in line
        assert any(f"in {part} (" in line for part in MOMENTS.values())
        assert "STILL GATHERED" not in line


def test_report_writes_timeline_png_beside_memory_png(traced_run):
    assert (traced_run.folder / "timeline.png").stat().st_size > 0
    assert "timeline.png" in (traced_run.folder / "report.txt").read_text().splitlines()[-1]


def test_the_pictures_predicted_peak_is_summary_jsons(traced_run):
    summary = json.loads((traced_run.folder / "summary.json").read_text())
    drawn = timelines.panels(reading.load_runs(traced_run.folder))
    assert len(drawn) == 3
    for p in drawn:
        assert p.predicted.bytes == summary["results"][p.name][0]["predicted_peak_bytes"]
        assert p.marks[p.predicted.what][1] == p.predicted.bytes - p.states  # drawn as a rise above the states


def test_every_stage_and_offload_traces_its_last_step(other_stages):
    for name, ranks in other_stages.runs.items():
        for r in ranks:
            traced = points(r)
            assert {p.phase for p in traced} == set(PHASES) and r["memory_timeline"]["still_gathered"] == [], name
    infinity = points(other_stages.runs["stage3_infinity"][0])
    assert any(p.event == "gathered" and p.gathered for p in infinity)


@pytest.mark.parametrize("fault", ["keep_gathered", "keep_block"])
def test_weights_kept_gathered_rise_as_backward_ends_and_the_report_names_them(fault, planted_faults, capsys):
    traced = reading.load_runs(planted_faults[fault])["stage3"][0].memory_timeline.points
    released = [p.gathered for p in traced if p.event == "released" and p.phase == "backward"][-1]
    returned = next(p.gathered for p in traced if p.event == "backward done")
    assert returned > released  # the curve of gathered weights rises as backward ends, where a healthy one falls to 0
    kept = ["blocks.0"] if fault == "keep_block" else ["wte", "wpe", "blocks.0"]
    report.main([str(planted_faults[fault])])
    said = [line for line in capsys.readouterr().out.splitlines() if "stage3 rank 0, step 3" in line]
    assert len(said) == 1 and f"STILL GATHERED as backward returned: {', '.join(kept)}" in said[0], said


# the committed GPU trace

@pytest.fixture(scope="module")
def gpu_trace(tmp_path_factory):
    folder = committed_trace.results_folder(tmp_path_factory.mktemp("35-trace") / "r")
    assert report.main(["--write", str(folder)]) == report.EXIT["NOT OBSERVABLE"]  # stage 3 alone: no pair
    return folder


def test_on_the_committed_gpu_trace_the_peak_is_where_the_largest_predicted_moment_is(gpu_trace):
    [p] = timelines.panels(reading.load_runs(gpu_trace))
    assert p.measured.part == p.predicted.part == "the output layer's backward"
    assert p.measured.what == "lm_head gathered"  # the loss's backward: the output layer's weight gathered for it
    assert p.measured.bytes == pytest.approx(p.predicted.bytes, rel=0.01)


def test_on_the_committed_gpu_trace_the_pictures_predicted_peak_is_summary_jsons(gpu_trace):
    summary = json.loads((gpu_trace / "summary.json").read_text())
    [p] = timelines.panels(reading.load_runs(gpu_trace))
    assert p.predicted.bytes == summary["results"]["stage3"][0]["predicted_peak_bytes"] == p.marks[p.predicted.what][1]
    assert (gpu_trace / "timeline.png").stat().st_size > 0


def test_on_the_committed_gpu_trace_the_report_line_names_the_peak_and_its_prediction(gpu_trace):
    assert [line.strip() for line in timelines.lines(reading.load_runs(gpu_trace))[1:]] == [
        "stage3 rank 0, step 3: allocated peaked at 3.70 GiB in the output layer's backward (lm_head gathered); "
        "predicted 3.70 GiB there (backward's start), -0.0%; its 377 hooks (their time not recorded)"]


# the record and the options

def test_a_record_keeps_at_most_max_points_and_the_one_where_the_peak_was_reached():
    made = [parts.Point("forward" if i < 500 else "backward", "forward", "m", None, i, min(i, 700), 0, 0)
            for i in range(1000)]
    kept = timeline.thinned(made, 100)
    assert len(kept) == 100 and made[700] in kept and made[699] in kept and made[499] in kept and made[500] in kept
    assert timeline.thinned(made[:50], 100) == made[:50]


def test_a_snapshot_is_refused_in_one_line_on_a_cpu(check):
    assert_refused(check("--timeline=snapshot"), "--timeline=snapshot records the CUDA allocator's history")


def test_a_snapshot_is_refused_in_one_line_by_version_where_recording_the_history_breaks_the_step(monkeypatch):
    monkeypatch.setattr(timeline, "SNAPSHOT_BREAKS", {"2.11": "a planted defect (its log)"})
    run = options.run_from({"timeline": "snapshot"})
    said = timeline.refusal(run, True, "2.11.0+cu130")
    assert "torch 2.11.0+cu130: a planted defect (its log)" in said and "\n" not in said
    assert timeline.refusal(run, True, "2.11.0") == said.replace("+cu130", "")  # torch's defect
    assert timeline.refusal(run, True, "2.12.0") is None
    assert timeline.refusal(options.run_from({"timeline": "memory"}), True, "2.11.0+cu130") is None


def test_each_known_snapshot_defect_names_the_committed_log_that_shows_it():
    for defect in timeline.SNAPSHOT_BREAKS.values():
        [log] = re.findall(r"benchmarks/logs/[\w./-]+", defect)
        assert (ROOT / log.rstrip(".")).exists(), log


def test_deepcompile_is_refused_a_timeline_whose_hooks_would_not_see_its_gathers():
    run = options.run_from({"timeline": "memory", "deepcompile": True})
    assert "DeepCompile" in timeline.refusal(run, True, "2.11.0")


def test_a_run_without_a_timeline_records_none_and_reports_no_line(run_sh):
    assert all(r["memory_timeline"] is None and "traced" not in r["steps"][-1] for rs in run_sh.runs.values()
               for r in rs)
    assert timelines.lines(reading.load_runs(run_sh.folder)) == []
    assert not (run_sh.folder / "timeline.png").exists()


def test_the_readmes_timeline_is_a_committed_gpu_default_run_s_stage_0_beside_stage_3():
    [picture] = re.findall(r"\]\((benchmarks/logs/[^)]+/timeline\.png)\)", (ROOT / "README.md").read_text())
    folder = (ROOT / picture).parent
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["verdict"] == "PASS" and list(summary["results"]) == ["stage0", "stage3"]
    assert summary["sized_for"]["device"].startswith("NVIDIA")  # sized for the GPU: the default on one
    panels = timelines.panels(reading.load_runs(folder))
    assert [p.name for p in panels] == ["stage0", "stage3"] and (folder / "timeline.png").stat().st_size > 0
    assert all(p.measured.bytes == pytest.approx(p.predicted.bytes, rel=0.05) for p in panels)
