"""Communication per step and rank: bytes counted where DeepSpeed and FSDP2 call torch.distributed, in the
ZeRO paper's units, and nccl-tests' bus bandwidth."""
import pytest
import torch

from zero3bench import parts
from zero3bench.accounting import comms, traffic


def test_the_paper_moves_2_params_per_step_below_stage_3_and_3_at_stage_3():
    assert [traffic.comm_volume(stage, 8) for stage in (0, 1, 2, 3)] == [2, 2, 2, 3]
    assert traffic.comm_volume(3, 1) == 0


def test_volume_counts_an_all_reduce_twice():
    counts = {"all_gather": parts.Collectives(elems=20), "reduce_scatter": parts.Collectives(elems=10),
              "all_reduce": parts.Collectives(elems=5)}
    assert traffic.volume(counts, 10) == 4.0


@pytest.mark.parametrize("kind, factor", [("all_gather", 0.75), ("reduce_scatter", 0.75), ("all_reduce", 1.5)])
def test_bus_bandwidth_is_nccl_tests_algbw_times_its_factor(kind, factor):
    assert traffic.bus_bandwidth(kind, 8e9, 2.0, 4) == pytest.approx(4e9 * factor)


def test_a_collective_is_counted_at_its_nccl_tests_size_once_even_when_it_calls_another():
    def inner(output_tensor, input_tensor, group=None, async_op=False):
        return None

    counted_inner = comms.counted("all_gather_into_tensor", inner)

    def outer(output_tensor, input_tensor, group=None, async_op=False):
        return counted_inner(output_tensor, input_tensor)

    counted_outer = comms.counted("_all_gather_base", outer)
    comms.COUNTER.take()
    counted_outer(torch.zeros(8, dtype=torch.bfloat16), torch.zeros(4, dtype=torch.bfloat16))
    assert comms.COUNTER.take()["all_gather"] == parts.Collectives(bytes=16, elems=8, calls=1)


def test_a_reduce_scatter_is_sized_by_its_input_and_a_list_by_its_sum():
    rs = comms.counted("reduce_scatter_tensor", lambda output, input, op=None, group=None, async_op=False: None)
    ag = comms.counted("all_gather", lambda tensor_list, tensor, group=None, async_op=False: None)
    comms.COUNTER.take()
    rs(torch.zeros(2), input=torch.zeros(4))
    ag([torch.zeros(3), torch.zeros(3)], torch.zeros(3))
    taken = comms.COUNTER.take()
    assert taken["reduce_scatter"].bytes == 16 and taken["all_gather"].bytes == 24


def test_stage_0_all_reduces_its_gradients_once_per_step(stage0):
    for r in stage0:
        for s in r["steps"]:
            assert s["comm"]["all_gather"]["elems"] == s["comm"]["reduce_scatter"]["elems"] == 0
            # the gradients, and the loss with the ranks' stop flag (train_gpt.all_reduced_loss)
            assert s["comm"]["all_reduce"]["elems"] == r["params_total"] + 2
        assert r["comm_volume"] == pytest.approx(2.0, abs=1e-4) and r["paper_comm_volume"] == 2


def test_stage_3_reduce_scatters_every_gradient_and_gathers_every_parameter_at_least_once(stage3):
    for r in stage3:
        last = r["steps"][-1]["comm"]
        assert last["reduce_scatter"]["elems"] >= r["params_total"]
        assert last["all_gather"]["elems"] >= r["params_total"] - r["persistent_elems"]
        assert 2 <= r["comm_volume"] <= 3.1 and r["paper_comm_volume"] == 3


def test_fsdp2_gathers_each_block_in_forward_and_again_in_backward(fsdp2_peer):
    for r in fsdp2_peer.runs["fsdp2"]:
        last = r["steps"][-1]["comm"]
        assert last["reduce_scatter"]["elems"] == r["params_total"]
        assert r["params_total"] < last["all_gather"]["elems"] < 2 * r["params_total"]


def test_without_nccl_kernels_no_bandwidth_is_claimed(stage3, fsdp2_peer):
    for r in stage3 + fsdp2_peer.runs["fsdp2"]:
        assert r["busbw"] is None and r["link_busbw"] is None and r["link_bytes_per_s"] is None


def test_the_comparison_shows_the_bytes_of_each_kind_of_collective(run_sh):
    out = run_sh.proc.stdout
    for row in ("all-gather / step", "reduce-scatter / step", "all-reduce / step", "volume, x params"):
        assert row in out, row
