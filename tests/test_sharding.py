"""What each stage partitions, read from the RESULT lines of real 2-rank runs (and one 3-rank run)."""
import math

import pytest
import torch

import train_gpt
from zero3bench import parts
from zero3bench.accounting import predict


def tiny_tensor_sizes():
    with torch.device("meta"):
        model = train_gpt.GPT(train_gpt.PRESETS["tiny"])
    return [p.numel() for p in model.parameters()]


def test_stage0_partitions_nothing(stage0):
    assert len(stage0) == 2
    for r in stage0:
        assert r["partitioned_tensors"] == 0
        assert r["param_tensors"] == len(tiny_tensor_sizes())
        assert r["local_param_elems"] == r["params_total"] == sum(tiny_tensor_sizes())


def test_stage3_partitions_every_tensor(stage3):
    assert len(stage3) == 2
    for r in stage3:
        assert r["partitioned_tensors"] == r["param_tensors"] == len(tiny_tensor_sizes())
        assert r["shard_check_ok"]
        assert r["params_total"] == sum(tiny_tensor_sizes())


def test_stage3_persistent_tensors_are_counted_as_partitioned_too(stage3):
    r = stage3[0]
    assert 0 < r["persistent_tensors"] < r["partitioned_tensors"]
    assert 0 < r["persistent_elems"] < r["params_total"]


@pytest.mark.parametrize("world", [2, 3])
def test_stage3_shards_are_ceil_of_numel_over_world(world, stage3, stage3_torchrun_3_ranks):
    records = stage3 if world == 2 else stage3_torchrun_3_ranks.records
    assert len(records) == world
    expected = sum(math.ceil(n / world) for n in tiny_tensor_sizes())
    for r in records:
        assert r["world_size"] == world
        assert r["local_param_elems"] == expected
        assert r["shard_check_ok"]


def test_odd_world_size_runs_under_torchrun(stage3_torchrun_3_ranks):
    assert stage3_torchrun_3_ranks.proc.returncode == 0, stage3_torchrun_3_ranks.proc.stderr[-3000:]
    assert [r["rank"] for r in stage3_torchrun_3_ranks.records] == [0, 1, 2]


def test_stage3_shards_hold_exactly_the_stage0_weights(stage0, stage3, stage3_torchrun_3_ranks):
    reference = stage0[0]["weights_checksum"]
    for r in stage0 + stage3 + stage3_torchrun_3_ranks.records:
        assert r["weights_checksum"] == pytest.approx(reference, rel=1e-9)


def test_stage3_model_states_per_rank_are_half_of_stage0(stage0, stage3):
    dense = stage0[0]["model_state_bytes"]
    for r in stage3:
        assert 0.5 * dense <= r["model_state_bytes"] <= 0.5 * dense * 1.02


@pytest.mark.parametrize("stage", [0, 3])
def test_model_states_match_the_zero_prediction(stage, stage0, stage3):
    for r in stage0 if stage == 0 else stage3:
        assert r["model_state_bytes"] == pytest.approx(r["predicted_model_state_bytes"], rel=0.05)
        held = parts.Census.from_dict(r["model_state_breakdown"])
        assert all(held.kind(kind) > 0 for kind in predict.KINDS)
        assert held.moments == pytest.approx(2 * held.master, rel=0.01)  # Adam's m and v, fp32 each
