"""plan.py's inputs and figures held to what they say (issue 47, items 3 to 6; issue 45, item 5): DS est. is
DeepSpeed's own estimator's, MFU is PaLM's and HFU beside it, --from questions its folder, and every bad input is
one line and exit status 2. CPU only, no launch."""
import ast
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

import plan
from test_layout import untyped
from test_plan import planned, planned_text
from zero3bench.accounting import predict
from zero3bench.accounting.shapes import PRESETS
from zero3bench.planning import cluster, inputs

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / "benchmarks" / "logs"
# 1.3b, stage 0 on one H200 at micro batch 16, checkpointing, 30 steps: 27 steady
STEADY = LOGS / "h200/30-steady/3-steady/results/steady30_mb16/20261202-101344-dZPx"
REHEARSAL = LOGS / "h200/26-off-default/4-rest/results/fp16_rehearsal/20261201-224405-ePv7"  # 4 ranks on one H200
CPU_RUN = LOGS / "cpu-cap/20261129-171703-7p70"  # 2 CPU processes


def refused(capsys, *argv):
    """plan.py's exit status and its standard error for arguments it should refuse."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        plan.main([str(a) for a in argv])
    return stop.value.code, capsys.readouterr().err


def record(**changes):
    """A GPU rank's record as plan.py reads it: 1.3b on one H200, steps of 0.5 s after a slow first three."""
    steps = [{"step": i, "loss": 5.0, "time_s": 2.0 if i == 1 else 0.6 if i <= 3 else 0.5} for i in range(1, 13)]
    r = {"stage": 0, "rank": 0, "world_size": 1, "ranks_per_node": 1, "gpus": 1, "micro_batch": 2, "seq": 1024,
         "model": "1.3b", "checkpoint": True, "mem_kind": "cuda", "rehearsal": False, "steps": steps,
         "flops_per_token": 8e9, "peak_tflops": 989.0, "device_total_bytes": 150109880320}
    return {**r, **changes}


def folder_of(tmp_path, **changes):
    (tmp_path / "summary.json").write_text(json.dumps({"results": {"stage0": [record(**changes)]}}))
    return tmp_path


def time_s_of_step_6(value):
    steps = record()["steps"]
    steps[5]["time_s"] = value
    return {"steps": steps}


# -----------------------------------------------------------------------------
# DS est.: DeepSpeed's own estimator

GRID_GPUS = [*range(1, 18), 24, 31, 48, 96, 100, 1000, 1024]
GRID_PER_NODE = [1, 2, 4, 6, 8, 16]
OFFLOADS = {"none": [], "optimizer": ["--offload"], "params": ["--offload-param"]}


def deepspeeds(stage, total, largest, per_node, nodes, optimizer, param):
    """DeepSpeed's own estimator, its (host per node, GPU) bytes, as its functions give them."""
    zero3 = pytest.importorskip("deepspeed.runtime.zero.stage3")
    zero2 = pytest.importorskip("deepspeed.runtime.zero.stage_1_and_2")
    if stage == 3:
        host, device, _ = zero3.estimate_zero3_model_states_mem_needs(
            total_params=total, largest_layer_params=largest, num_gpus_per_node=per_node, num_nodes=nodes,
            cpu_offload=optimizer, cpu_offload_params=param, zero_init=True, additional_buffer_factor=1.5)
    else:
        host, device = zero2.estimate_zero2_model_states_mem_needs(
            total_params=total, num_gpus_per_node=per_node, num_nodes=nodes, cpu_offload=optimizer,
            additional_buffer_factor=1.5)
    return host, device


@pytest.mark.parametrize("offload", OFFLOADS)
@pytest.mark.parametrize("per_node", GRID_PER_NODE)
def test_ds_est_is_deepspeeds_own_estimate_for_every_gpu_count_and_gpus_per_node(offload, per_node, capsys):
    """12 GPUs at 8 a node read 5.20 and 3.14 GiB at stages 2 and 3, DeepSpeed's for 8 GPUs, where its own for 12
    are 4.28 and 2.22. DeepSpeed's GPU bytes depend on num_gpus_per_node x num_nodes alone: the plan's equal them
    asked as one node of G and as G nodes of one."""
    p = planned(capsys, "--stages", 1, 2, 3, "--gpus", *GRID_GPUS, "--gpus-per-node", per_node, *OFFLOADS[offload])
    model = plan.resolve_model(plan.parse_args([]))
    for r in p["rows"]:
        stage = int(r["setup"])
        optimizer, param = offload != "none", offload == "params" and stage == 3
        one_node = deepspeeds(stage, model.params, model.embedding, r["gpus"], 1, optimizer, param)[1]
        one_each = deepspeeds(stage, model.params, model.embedding, 1, r["gpus"], optimizer, param)[1]
        assert r["deepspeed_estimate"] == one_node == one_each, (r["setup"], r["gpus"])


@pytest.mark.parametrize("stage, optimizer, param", [(1, False, False), (2, False, False), (2, True, False),
                                                     (3, False, False), (3, True, False), (3, True, True)])
def test_the_estimators_host_and_gpu_bytes_are_deepspeeds_byte_for_byte_over_a_grid(stage, optimizer, param):
    """Every preset's, its products taken in DeepSpeed's order: 16 x total / nodes x 1.5 rounds a byte apart from
    DeepSpeed's 16 x total x (1 / nodes) x 1.5 for 125m on 27 nodes and 760m on 81."""
    offload = {"optimizer": "cpu" if optimizer else None, "param": "cpu" if param else None}
    for shape in PRESETS.values():
        total, largest = shape.params, shape.padded_vocab * shape.d_model
        for per_node in (1, 2, 3, 4, 6, 8, 16):
            for nodes in (1, 2, 3, 5, 7, 12, 27, 64, 81, 125):
                host, device = deepspeeds(stage, total, largest, per_node, nodes, optimizer, param)
                mine = predict.deepspeed_estimate(stage, total, largest, per_node, nodes, offload)
                assert mine == {"device": device, "host_per_node": host}, (total, per_node, nodes)


def test_deepspeed_is_asked_of_nodes_whose_gpus_make_the_world():
    for world in GRID_GPUS:
        for per_node in GRID_PER_NODE:
            gpus, nodes = cluster.node_layout(world, per_node)
            assert gpus * nodes == world and (gpus <= per_node or nodes == 1)
    assert cluster.node_layout(12, 8) == (6, 2) and cluster.node_layout(64, 8) == (8, 8)
    assert cluster.node_layout(13, 8) == (13, 1)


# -----------------------------------------------------------------------------
# MFU as PaLM defines it, HFU beside it


def step_line_mfus(log):
    """The mfu each step line of a log prints, by step."""
    found = re.findall(r"step (\d+)/\d+ .* mfu ([\d.]+)%", log.read_text())
    return {int(step): float(pct) / 100 for step, pct in found}


def test_the_plans_mfu_is_the_median_of_the_step_lines_mfu_over_the_steady_steps(capsys):
    """Not 4/3 of it: plan.py printed MFU 0.491 for a run whose step lines print mfu 36.8%."""
    p = planned(capsys, "--from", STEADY, "--gpus", 8)
    lines = step_line_mfus(STEADY / "stage0.log")
    steady = [mfu for step, mfu in lines.items() if inputs.STEADY_FROM <= step < max(lines)]  # not the profiled last
    assert p["inputs"]["mfu"] == pytest.approx(statistics.median(steady), abs=0.0005)  # the lines' 0.1%
    assert p["inputs"]["mfu"] == p["calibration"]["mfu"]  # the run checkpointed, as the plan does


def test_the_plans_mfu_is_summary_jsons_and_the_reports_to_their_printed_digits(capsys):
    """summary.json's mfu, the report's MFU row, is the median step over steps 2..N, the plan's over 4..N."""
    p = planned(capsys, "--from", STEADY, "--gpus", 8)
    [r] = json.loads((STEADY / "summary.json").read_text())["results"]["stage0"]
    report = re.search(r"^MFU +([\d.]+)%", (STEADY / "report.txt").read_text(), re.M)
    assert p["inputs"]["mfu"] == pytest.approx(r["mfu"], rel=0.005)
    assert f"{100 * p['inputs']['mfu']:.1f}" == f"{100 * r['mfu']:.1f}" == report.group(1)


def test_hfu_stands_beside_mfu_in_the_step_line_summary_json_the_report_and_the_plan(capsys):
    """A third more with checkpointing, the same in each: the plan's over the steady steps, the report's (and
    summary.json's) over steps 2..N, so they differ by what steps 2 and 3 move the median (45.1% and 45.0%)."""
    import report
    from zero3bench import rank_lines
    from zero3bench.result import RankResult, as_dict
    [d] = json.loads((STEADY / "summary.json").read_text())["results"]["stage0"]
    r = RankResult.from_dict(d)
    lines = [re.search(r"mfu ([\d.]+)%  hfu ([\d.]+)%", rank_lines.step_line(r, s)) for s in r.steps]
    steady = [float(m.group(2)) / 100 for m, s in zip(lines, r.steps) if s.step >= inputs.STEADY_FROM and not s.comm_s]
    assert all(float(m.group(2)) == pytest.approx(float(m.group(1)) * 4 / 3, abs=0.12) for m in lines)
    assert planned(capsys, "--from", STEADY, "--gpus", 8)["inputs"]["hfu"] == pytest.approx(statistics.median(steady),
                                                                                           abs=0.0005)
    assert as_dict(r)["hfu"] == pytest.approx(4 / 3 * r.mfu) and r.hfu == pytest.approx(4 / 3 * r.mfu)
    capsys.readouterr()
    report.main([str(STEADY)])
    assert re.search(rf"^  HFU +{100 * r.hfu:.1f}%$", capsys.readouterr().out, re.M)


def test_hfu_is_four_thirds_of_the_mfu_with_checkpointing_and_the_mfu_without(capsys):
    on, off = (planned(capsys, "--mfu", 0.3, "--gpus", 8, flag)["inputs"] for flag in ("--checkpoint",
                                                                                       "--no-checkpoint"))
    assert on["hfu"] == pytest.approx(0.4) and off["hfu"] == 0.3
    assert "MFU 0.3 (HFU 0.4, the recomputed forward counted)" in planned_text(capsys, "--mfu", 0.3, "--gpus", 8)


def test_a_runs_hardware_rate_carries_to_a_plan_without_checkpointing(capsys):
    on, off = (planned(capsys, "--from", STEADY, "--gpus", 8, "--stages", 0, flag)
               for flag in ("--checkpoint", "--no-checkpoint"))
    assert off["inputs"]["mfu"] == pytest.approx(on["inputs"]["hfu"])
    assert "its HFU 0.451 carried to steps without checkpointing" in off["sources"]["mfu"]


def test_scaling_is_not_called_efficiency_and_passes_100_percent_only_where_each_gpus_work_falls(capsys):
    """6.7b with the optimizer offloaded read "efficiency" 156 to 326%: its copies are of a 1/G partition."""
    plain = planned(capsys, "--preset", "6.7b", "--gpus", 1, 2, 8, 64)
    offloaded = planned(capsys, "--preset", "6.7b", "--gpus", 1, 2, 8, 64, "--offload", "--stages", 3)
    assert all("efficiency" not in r for r in plain["rows"] + offloaded["rows"])
    assert all(r["scaling"][m] <= 1 for r in plain["rows"] for m in cluster.MODES)
    assert any(r["scaling"]["serial"] > 1 for r in offloaded["rows"])
    [head] = [line for line in planned_text(capsys, "--gpus", 8, 64).splitlines() if line.startswith("setup  GPUs")]
    assert head.split()[-1] == "scaling" and "efficiency" not in head


# -----------------------------------------------------------------------------
# --from questions its folder


def test_a_folder_of_cpu_runs_is_refused_in_one_line(capsys):
    """It planned from one, headed "GPU (cpu): 139.8 GiB, 989 TFLOP/s"."""
    status, err = refused(capsys, "--from", CPU_RUN)
    assert status == 2 and err.count("\n") == 1 and "CPU processes" in err and "--from" in err


def test_a_rehearsal_gives_the_gpus_memory_not_its_speed_and_says_so(capsys):
    """4 ranks sharing one GPU gave an MFU of 0.0127, without a word."""
    p = planned(capsys, "--from", REHEARSAL, "--gpus", 8)
    capsys.readouterr()
    plan.main(["--from", str(REHEARSAL), "--gpus", "8"])
    err = capsys.readouterr().err
    assert p["sources"]["gpu_mem_gib"].startswith("measured") and p["inputs"]["device"] == "NVIDIA H200"
    assert p["sources"]["mfu"].startswith("assumed") and p["sources"]["intra_busbw_gbs"].startswith("assumed")
    assert "rehearsal" in err and "speed is not real" in err


def test_a_rehearsal_beside_a_run_of_its_own_gpu_leaves_the_speed_to_that_run(capsys, tmp_path):
    shared = record(world_size=4, ranks_per_node=4, rehearsal=True, link_busbw=1e11,
                    steps=[{**s, "time_s": s["time_s"] / 10} for s in record()["steps"]])  # faster: not taken
    (tmp_path / "summary.json").write_text(json.dumps({"results": {"stage0": [record()], "stage3_4": [shared]}}))
    p = planned(capsys, "--from", tmp_path, "--gpus", 8)
    assert p["calibration"]["run"] == "stage0" and p["sources"]["intra_busbw_gbs"].startswith("assumed")


@pytest.mark.parametrize("argv, said", [
    (["--preset", "6.7b"], "measured on 1.3b, planned for 6.7b"),
    (["--seq", 2048], "measured at seq 1024, planned at seq 2048"),
    (["--micro-batch", 8], "measured at micro batch 2, planned at 8"),
])
def test_a_plan_of_another_model_sequence_or_micro_batch_than_its_runs_says_so(argv, said, capsys, tmp_path):
    capsys.readouterr()
    plan.main(["--from", str(folder_of(tmp_path)), "--gpus", "8", *map(str, argv)])
    assert said in capsys.readouterr().err


def test_a_plan_of_its_runs_model_sequence_and_micro_batch_warns_of_nothing(capsys, tmp_path):
    capsys.readouterr()
    steps = [{"step": i, "loss": 5.0, "time_s": 0.5} for i in range(1, 31)]
    plan.main(["--from", str(folder_of(tmp_path, steps=steps)), "--gpus", "8"])
    assert capsys.readouterr().err == ""


def test_summary_json_is_read_once(capsys, monkeypatch):
    reads = []
    read_text = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: reads.append(self.name) or read_text(self, *a, **k))
    planned(capsys, "--from", STEADY, "--gpus", 8)
    assert reads.count("summary.json") == 1


# -----------------------------------------------------------------------------
# bad input: one line, exit status 2, the option and its range named

BAD_FLAGS = [
    (["--params", "0.4"], "--params", "from 1 to 1e+14"),
    (["--params", "0.5"], "--params", "from 1 to 1e+14"),
    (["--params", "1e-300"], "--params", "from 1 to 1e+14"),
    (["--params", "-1e5"], "--params", "from 1 to 1e+14"),  # said "expected one argument"
    (["--peak-tflops", "5e-324"], "--peak-tflops", "from 0.1 to 1,000,000"),
    (["--peak-tflops", "1e-300"], "--peak-tflops", "from 0.1 to 1,000,000"),  # printed a 300-digit step time
    (["--mfu", "1e-320"], "--mfu", "from 1e-06 to 1"),
    (["--mfu", "0.8"], "--mfu", "at most 0.75 with checkpointing"),
    (["--intra-busbw-gbs", "1e-320"], "--intra-busbw-gbs", "from 0.1 to 100,000"),
    (["--host-gbs", "1e-320", "--offload"], "--host-gbs", "from 0.1 to 100,000"),
    (["--layers", "100000", "--d-model", "1048576", "--heads", "16", "--vocab", "256", "--seq", "64"], "--layers",
     "at most 1e+14"),  # 1.3e18 parameters, where --params stops at 1e14
    (["--context-gib", "200"], "--context-gib", "below 133.8"),  # larger than the GPU
    (["--gpu-mem-gib", "1e-300"], "--gpu-mem-gib", "from 1 to 1,048,576"),
    (["--gpus", "8.5"], "--gpus", "a whole number from 1 to 1,048,576"),
    (["--host-cores", "0"], "--host-cores", "a whole number from 1 to 16,384"),
]
BAD_RECORDS = [
    ({"seq": None}, "results.stage0[0].seq is null", "a whole number from 1"),
    ({"micro_batch": None}, "results.stage0[0].micro_batch is null", "a whole number from 1"),
    ({"link_busbw": 1e-300}, "results.stage0[0].link_busbw is 1e-300", "from 100,000,000 to 1e+14"),
    ({"flops_per_token": 1e308}, "results.stage0[0].flops_per_token is 1e+308", "from 6 to 1e+20"),  # MFU clamped to 1
    ({"checkpoint": "yes"}, 'results.stage0[0].checkpoint is "yes"', "true or false"),
    (time_s_of_step_6("0.4"), 'results.stage0[0].steps[5].time_s is "0.4"', "from 1e-06 to 1,000,000"),  # "missing"
    ({"flops_per_token": 1e15}, "results.stage0: its steady steps reach MFU", "from 1e-06 to 1 is real"),
    ({"mem_kind": "cpu_rss"}, "stage0 ran as CPU processes", "plan from a GPU run's folder"),
]


def one_clean_line(status, err):
    assert status == 2 and err.startswith("plan.py: error: ") and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("argv, option, span", BAD_FLAGS, ids=lambda x: " ".join(x) if isinstance(x, list) else "")
def test_a_bad_flag_exits_2_in_one_line_naming_the_option_and_its_range(argv, option, span, capsys):
    status, err = refused(capsys, *argv)
    one_clean_line(status, err)
    assert option in err and span in err, err


@pytest.mark.parametrize("changes, where, span", BAD_RECORDS, ids=lambda x: x if isinstance(x, str) else "")
def test_a_bad_record_exits_2_in_one_line_naming_it_and_what_it_must_be(changes, where, span, capsys, tmp_path):
    status, err = refused(capsys, "--from", folder_of(tmp_path, **changes))
    one_clean_line(status, err)
    assert "--from" in err and where in err and span in err, err


def test_a_plan_that_cannot_be_written_exits_6_in_one_line():
    """Standard output on a full device (/dev/full) gave a traceback; 6 is every script's status for what a full
    disk leaves unwritten (zero3bench/exits.py)."""
    proc = subprocess.run(f"{sys.executable} plan.py --gpus 8 > /dev/full", shell=True, cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 6 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("plan.py: error: cannot write the plan to standard output")


# -----------------------------------------------------------------------------
# typed like the package


@pytest.mark.parametrize("path", [ROOT / "plan.py", *sorted((ROOT / "zero3bench/planning").glob("*.py"))],
                         ids=lambda p: p.name)
def test_every_function_of_plan_py_and_planning_is_typed(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):  # private ones too
        if isinstance(node, ast.FunctionDef):
            node.name = node.name.lstrip("_")
    assert untyped(tree) == []


def test_a_plans_rows_are_typed_records_read_by_attribute(capsys):
    model = plan.resolve_model(plan.parse_args([]))
    settled = plan.settle(plan.parse_args(["--gpus", "8"]), model)
    p = cluster.plan(model, settled.inputs, settled.sources, None, settled.host)
    [row, *_] = p.rows
    assert isinstance(row, cluster.Row) and isinstance(row.step_s, cluster.Modes)
    assert all(isinstance(c, cluster.Collective) for c in row.comm)
    assert p.as_dict() == planned(capsys, "--gpus", 8)


def test_a_folders_link_is_its_curve_read_at_the_old_probes_256_mib(capsys, tmp_path):
    """docs/measurement.md: the row reads the link's curve at 256 MiB, the one size that logs from before the
    curve hold."""
    curve = {str(1 << 27): 1e11, str(1 << 28): 2e11, str(1 << 29): 3e11}
    folder = folder_of(tmp_path, world_size=2, ranks_per_node=2, link_busbw=curve)
    p = planned(capsys, "--from", folder, "--gpus", "2")
    assert p["inputs"]["intra_busbw_gbs"] == 200.0
    assert "the row reads it at 256 MiB" in (ROOT / "docs" / "measurement.md").read_text()
