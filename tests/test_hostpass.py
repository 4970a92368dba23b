"""Every run times offload's host pass on its host after training (issue 57, item 1): DeepSpeed's own CPU Adam and
what stage 3 does around it, on a slice of the rank's partition and on the threads the rank had, recorded in its
RESULT line with the host's cores and CPU; a host that cannot build CPU Adam says why and trains; a record from
before it, or a reader from before it, still reads."""
import json
import math
import os

import pytest
import torch

from conftest import facts, record
from zero3bench import machine, parts, result
from zero3bench.accounting import hostpass
from zero3bench.reporting import reading

TIMED = ("unscale_s", "adam_s", "to_host_s")


def test_every_rank_records_its_host_pass_on_its_share_of_the_hosts_cores(run_sh):
    """2 CPU ranks of the tiny model: each times its half of the 462,336 parameters on half of the cores, which
    train_gpt.py gives each CPU rank; no GPU, so no copy into a GPU's weights."""
    for name in ("stage0", "stage3"):
        for r in run_sh.runs[name]:
            h = r["host_pass"]
            assert h["elements"] == math.ceil(r["params_total"] / 2) == 231_168
            assert h["threads"] == max(1, os.cpu_count() // 2) and h["host_cores"] == len(os.sched_getaffinity(0))
            assert h["cpu"] and h["dtype"] == "bfloat16" and "why_not" not in h
            assert all(h[key] > 0 for key in TIMED) and h["to_gpu_s"] is None


def test_the_slice_is_the_ranks_partition_at_most_slice(monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(machine.extensions_folder()))  # where the runs build CPU Adam
    monkeypatch.setattr(hostpass, "SLICE", 4096)
    assert hostpass.load_cpu_adam() is None
    assert hostpass.probe(torch.device("cpu"), torch.bfloat16, 10**12).elements == 4096
    assert hostpass.probe(torch.device("cpu"), torch.bfloat16, 1000).elements == 1000


def test_a_stage_3_ranks_partition_is_its_share_of_the_parameters():
    assert hostpass.partition_of(462_336, 2) == 231_168 and hostpass.partition_of(7, 2) == 4
    assert hostpass.partition_of(None, None) == 0  # a rank that failed before it counted: a slice of one element


def test_a_host_that_cannot_build_cpu_adam_records_why_and_raises_nothing(monkeypatch):
    import deepspeed.ops.adam

    def no_compiler(*args, **kwargs):
        raise RuntimeError("Unable to JIT load the cpu_adam op due to ninja not being installed.\nmore")
    monkeypatch.setattr(deepspeed.ops.adam, "DeepSpeedCPUAdam", no_compiler)
    h = hostpass.load_cpu_adam()
    assert h.why_not == "RuntimeError: Unable to JIT load the cpu_adam op due to ninja not being installed."
    assert h.threads == torch.get_num_threads() and h.adam_s is None


def test_a_signal_while_cpu_adam_loads_is_not_taken_for_a_failed_build(monkeypatch):
    """train_gpt.py's Stop raises its Interrupted (an Exception) at a signal before training: it must end the run,
    not become a host pass that could not be timed."""
    import deepspeed.ops.adam

    class Interrupted(Exception):
        pass

    def signalled(*args, **kwargs):
        raise Interrupted("interrupted by SIGINT before training")
    monkeypatch.setattr(deepspeed.ops.adam, "DeepSpeedCPUAdam", signalled)
    with pytest.raises(Interrupted):
        hostpass.load_cpu_adam()


def test_a_record_from_before_the_host_pass_reads_it_as_none_and_one_with_it_reads_back_whole():
    h = parts.HostPass.made(elements=8, threads=2, host_cores=2, cpu="a CPU", dtype="bfloat16", unscale_s=1e-6,
                            adam_s=2e-6, to_gpu_s=None, to_host_s=1e-6, why_not=None)
    line = json.loads(result.result_line(record(**facts(3), host_pass=h.as_dict()))[len("RESULT "):])
    assert not reading.mistyped(line)
    assert result.RankResult.from_dict(line).host_pass == h
    assert result.RankResult.from_dict({k: v for k, v in line.items() if k != "host_pass"}).host_pass is None


def test_a_reader_passes_over_a_part_and_a_key_it_does_not_know_as_older_readers_pass_over_the_host_pass():
    """RankResult.from_dict and reading.mistyped read the keys they know: a newer record's part reads as the record
    without it, which is how report.py from before the host pass reads a log that has it."""
    line = json.loads(result.result_line(record(**facts(3)))[len("RESULT "):])
    newer = {**line, "a_newer_part": {"elements": 8, "seconds": [1.0]}}
    assert not reading.mistyped(newer)
    assert result.RankResult.from_dict(newer) == result.RankResult.from_dict(line)
