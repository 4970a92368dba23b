"""run.sh end to end, and the verdict that report.py draws from the logs."""
import json
import re
from pathlib import Path

import report


def test_run_sh_passes_on_cpu(run_sh):
    assert run_sh.proc.returncode == 0, run_sh.proc.stdout[-3000:] + run_sh.proc.stderr[-3000:]
    assert "VERDICT: PASS" in run_sh.proc.stdout
    assert run_sh.proc.stdout.count("PASS  (") == 4  # (a) to (d)


def test_run_sh_keeps_both_logs(run_sh):
    assert {"stage0.log", "stage3.log", "report.txt"} <= {p.name for p in run_sh.folder.iterdir()}
    assert "VERDICT: PASS" in (run_sh.folder / "report.txt").read_text()
    assert list(run_sh.runs) == ["stage0", "stage3"]


def test_run_sh_prints_one_comparison_table(run_sh):
    out = run_sh.proc.stdout
    for row in ("partitioned tensors", "local params", "model states", "predicted", "peak memory",
                "first loss", "last loss", "tokens/s"):
        assert row in out


def test_a_run_leaves_no_shared_memory_behind(run_sh):
    # DeepSpeed's CPU all-reduce never unlinks its /dev/shm buffers, named after the master port
    port = re.search(r"--master_port (\d+)", report.read_command(run_sh.folder / "stage3.log"))[1]
    assert not list(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{port}_*"))


def test_each_rank_prints_the_original_design_lines(stage3, run_sh):
    log = (run_sh.folder / "stage3.log").read_text()
    for rank in (0, 1):
        assert f"[Stage 3] Rank {rank} - total param tensors: {stage3[0]['param_tensors']}, sharded param tensors: " \
               f"{stage3[0]['param_tensors']}" in log
        assert f"[Stage 3] Rank {rank} peak memory:" in log
    assert "[Stage 3] first-step loss:" in log


# what train_gpt.py's main() records before anything can fail
EARLY_KEYS = ("stage", "rank", "world_size", "model", "config", "dtype", "micro_batch", "seq", "lr", "warmup", "seed",
              "checkpoint", "compile", "max_mem_gib", "timeout_s", "offload", "launcher", "steps", "oom", "error",
              "peak_mem_bytes", "mem_kind")


def oom_log(records):
    """A log as a GPU run leaves it when one rank runs out of memory while building the model: that
    rank's record with only what main() sets up front, and no record from its peers, which the launcher ends."""
    record = {key: records[0][key] for key in EARLY_KEYS}
    record.update(oom=True, error="CUDA out of memory. Tried to allocate 2.00 GiB", steps=[], peak_mem_bytes=0)
    return "Traceback (most recent call last):\nRESULT " + json.dumps(record) + "\n"


def test_report_counts_a_stage0_out_of_memory_as_a_pass(run_sh, tmp_path, capsys):
    (tmp_path / "stage0.log").write_text(oom_log(run_sh.runs["stage0"]))
    (tmp_path / "stage3.log").write_text((run_sh.folder / "stage3.log").read_text())
    assert report.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "OOM" in out
    assert "stage 0 ran out of memory where stage 3 fit" in out
    assert "VERDICT: PASS" in out


def test_report_fails_when_stage3_runs_out_of_memory(run_sh, tmp_path, capsys):
    (tmp_path / "stage0.log").write_text((run_sh.folder / "stage0.log").read_text())
    (tmp_path / "stage3.log").write_text(oom_log(run_sh.runs["stage3"]))
    assert report.main([str(tmp_path)]) == 1
    assert "VERDICT: FAIL" in capsys.readouterr().out


def test_report_fails_when_stage3_partitions_nothing(run_sh, tmp_path, capsys):
    (tmp_path / "stage0.log").write_text((run_sh.folder / "stage0.log").read_text())
    (tmp_path / "stage3.log").write_text((run_sh.folder / "stage0.log").read_text().replace('"stage": 0', '"stage": 3'))
    assert report.main([str(tmp_path)]) == 1
    assert "FAIL  (a)" in capsys.readouterr().out


def test_one_process_runs_without_a_launcher(single_process):
    for stage, proc in single_process.procs.items():
        assert proc.returncode == 0, proc.stderr[-3000:]
        [record] = single_process.runs[f"stage{stage}"]
        assert record["world_size"] == 1


def test_one_rank_cannot_show_sharding_and_says_so(single_process, capsys):
    assert report.main([str(single_process.folder)]) == 5
    out = capsys.readouterr().out
    assert "NOT OBSERVABLE" in out and "with 1 rank there is nothing to shard across" in out
    assert "VERDICT: NOT OBSERVABLE" in out


def test_report_fails_runs_that_are_not_comparable(run_sh, tmp_path, capsys):
    (tmp_path / "stage0.log").write_text((run_sh.folder / "stage0.log").read_text())
    log = (run_sh.folder / "stage3.log").read_text()
    (tmp_path / "stage3.log").write_text(log.replace('"micro_batch": 2', '"micro_batch": 4'))
    assert report.main([str(tmp_path)]) == 1
    assert "they differ in micro_batch" in capsys.readouterr().out
