"""benchmarks/memory_timeline.py, the per-event timeline behind BENCHMARKS.md section 11d, on 2 CPU ranks: there
only the gathered elements mean anything (CPU memory is not counted), so these tests hold it to those."""
import csv

from conftest import run, shared
from zero3bench.machine import free_port

STEPS = 2


@shared
def timeline(tmp_path_factory):
    out = tmp_path_factory.mktemp("timeline")
    proc = run(["deepspeed", "--num_gpus", "2", "--master_port", str(free_port()), "benchmarks/memory_timeline.py",
                "--stage", "3", "--steps", str(STEPS)], env={"TIMELINE_OUT": str(out), "TIMELINE_TAG": "tiny"},
               log=out / "run.log")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {rank: list(csv.DictReader((out / f"tiny_rank{rank}.csv").read_text().splitlines())) for rank in (0, 1)}
    return out, rows


def test_each_rank_writes_every_step(timeline):
    _, rows = timeline
    for rank_rows in rows.values():
        assert {int(r["step"]) for r in rank_rows} == set(range(1, STEPS + 1))


def test_it_sees_parameters_gathered_in_forward(timeline):
    _, rows = timeline
    for rank_rows in rows.values():
        assert any(int(r["gathered_elements"]) > 0 for r in rank_rows if r["event"] == "gathered"
                   and r["where"].endswith("fwd"))


def test_nothing_stays_gathered_after_backward(timeline):
    _, rows = timeline
    ends = [r for rank_rows in rows.values() for r in rank_rows
            if r["event"] in ("backward done", "optimizer step done")]
    assert len(ends) == 2 * 2 * STEPS
    assert all(int(r["gathered_elements"]) == 0 for r in ends)


def test_rank_0_writes_the_last_steps_summary(timeline):
    out, _ = timeline
    text = (out / "tiny_summary.txt").read_text()
    assert text.startswith(f"step {STEPS}: peak ")
    assert "most gathered: " in text
