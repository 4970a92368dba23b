"""Every GPU's own rank times offload's host pass on its host after training (issue 57, item 1): DeepSpeed's own
CPU Adam and what stage 3 does around it, on a slice of the rank's partition and on the threads the rank had,
recorded in its RESULT line with the host's cores and CPU (tests/test_gpu.py); CPU ranks and a rehearsal's, whose
folders plan.py takes no speed from, do not build CPU Adam for it; a host that cannot build CPU Adam says why and
trains; a record from before it, or a reader from before it, still reads."""
import json

import pytest
import torch

from conftest import facts, record
from zero3bench import machine, parts, result
from zero3bench.accounting import hostpass
from zero3bench.reporting import reading


def test_a_cpu_rank_times_no_host_pass_since_plan_refuses_a_folder_of_cpu_ranks(run_sh):
    assert [r.get("host_pass") for name in ("stage0", "stage3") for r in run_sh.runs[name]] == [None] * 4


def test_a_gpus_own_rank_times_the_host_pass_and_a_rehearsals_or_a_cpus_does_not():
    assert hostpass.timed_here(torch.device("cuda", 0), rehearsal=False)
    assert not hostpass.timed_here(torch.device("cuda", 0), rehearsal=True)
    assert not hostpass.timed_here(torch.device("cpu"), rehearsal=False)


def test_the_probe_times_each_part_on_the_ranks_threads_and_the_slice_is_its_partition_at_most_slice(monkeypatch):
    """On a CPU, no GPU to copy the weights into."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(machine.extensions_folder()))  # where the runs build CPU Adam
    monkeypatch.setattr(hostpass, "SLICE", 4096)
    assert hostpass.load_cpu_adam() is None
    h = hostpass.probe(torch.device("cpu"), torch.bfloat16, 10**12)
    assert h.elements == 4096 and h.threads == torch.get_num_threads() and h.host_cores == hostpass.host_cores()
    assert h.cpu and h.dtype == "bfloat16" and h.why_not is None
    assert all(t > 0 for t in (h.unscale_s, h.adam_s, h.to_host_s)) and h.to_gpu_s is None
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
