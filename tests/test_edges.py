"""The edges of the pure modules that the mutation run (benchmarks/mutants.py) found no test holding: each test
kills the surviving mutants named in benchmarks/logs/cpu/mutants/survivors.md. No launch."""
import math

from zero3bench.accounting import activations, predict
from zero3bench.planning import inputs
from zero3bench.reporting import losses, verdict
from zero3bench.reporting.bounds import FALLING_STEPS
from zero3bench.result import RankResult


def falling(*tail):
    """Losses that fall at each of the first FALLING_STEPS steps, then tail."""
    return [5.0 - i for i in range(FALLING_STEPS)] + list(tail)


def test_a_loss_that_holds_level_over_the_same_rows_does_not_fall():
    assert losses.loss_falls(falling())
    assert not losses.loss_falls([5.0] * FALLING_STEPS)


def test_a_later_loss_back_at_the_first_ones_does_not_fall():
    assert losses.loss_falls(falling(4.9))
    assert not losses.loss_falls(falling(5.0))


def test_a_loss_that_falls_and_then_is_not_finite_does_not_fall():
    assert not losses.loss_falls(falling(math.nan))
    assert not losses.loss_falls(falling(math.inf))


def test_the_gap_between_two_losses_is_relative_to_the_first_runs():
    assert losses.largest_gap([2.0, 4.0], [1.0, 4.0]) == 0.5
    assert losses.largest_gap([], []) == 0.0  # nothing to compare differs by nothing


def test_weights_are_not_compared_where_a_run_has_no_checksum():
    assert losses.weights_apart(RankResult(trained_checksum=2.0), RankResult(trained_checksum=1.0)) == 0.5
    assert losses.weights_apart(RankResult(trained_checksum=2.0), RankResult()) is None
    assert losses.weights_apart(RankResult(), RankResult(trained_checksum=2.0)) is None


def test_equal_memory_is_told_as_1_00x_less():
    assert verdict.change(2.0, 2.0) == "1.00x less"
    assert verdict.change(2.0, 4.0) == "2.00x more"


def test_flash_attention_runs_on_a_gpu_in_16_bits_only():
    assert activations.uses_flash(True, "bf16") and activations.uses_flash(True, "fp16")
    assert not activations.uses_flash(False, "bf16") and not activations.uses_flash(True, "fp32")


def test_at_stage_1_a_tensor_no_larger_than_the_bucket_is_not_reduced_on_its_own():
    bucket = 100
    zero = {"reduce_bucket_size": bucket}
    alone = [[bucket + 1, 1]]  # one rank's groups of gradient sizes
    assert predict.stage1_reduction_elems(alone, 1, 0, zero) >= 2 * (bucket + 1)
    assert predict.stage1_reduction_elems([[bucket, 1]], 1, 0, zero) < 2 * bucket


def test_a_ranges_end_is_written_whole_below_1e9_and_as_a_float_else():
    assert inputs.number(1_048_576) == "1,048,576"
    assert inputs.number(1.5) == "1.5"
    assert inputs.number(1e9) == "1e+09"


def test_a_plan_counts_the_nodes_its_gpus_fill_rounding_up(capsys):
    import json
    import plan
    plan.main(["--gpus", "8", "9", "--gpus-per-node", "8", "--stages", "3", "--json"])
    assert [r["nodes"] for r in json.loads(capsys.readouterr().out)["rows"]] == [1, 2]
