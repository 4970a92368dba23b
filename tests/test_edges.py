"""The edges of the pure modules that the mutation run (benchmarks/mutants.py) found no test holding: each test
kills the surviving mutants named in benchmarks/logs/cpu/mutants/survivors.md. No launch."""
import argparse
import dataclasses
import json
import math
from pathlib import Path

import pytest

import plan
from zero3bench import options, stages
from zero3bench.accounting import host, memory, moments, predict, shapes, timing, traffic
from zero3bench.options import BadInput
from zero3bench.parts import Census, MemorySnapshot, Predicted, Shards, Step
from zero3bench.planning import cluster, folders, inputs, steptime
from zero3bench.reporting import losses, verdict
from zero3bench.reporting.bounds import FALLING_STEPS
from zero3bench.reporting.figures import Check, Comparison, Loss, Memory, Partitioning, Promises, SameTraining
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


def test_a_loss_that_rises_at_one_early_step_does_not_fall():
    assert not losses.loss_falls([5.0, 4.0, 4.5] + [3.0] * 2)  # each step on the same rows must fall from the last


def test_a_loss_that_falls_and_then_is_not_finite_does_not_fall():
    assert not losses.loss_falls(falling(math.nan))
    assert not losses.loss_falls(falling(math.inf))


def test_the_gap_between_two_losses_is_relative_to_the_first_runs():
    assert losses.largest_gap([2.0, 4.0], [1.0, 4.0]) == 0.5
    assert losses.largest_gap([], []) == 0.0  # nothing to compare differs by nothing


def trained(*losses_):
    return RankResult(steps=[Step(loss=x) for x in losses_])


def test_losses_exactly_at_their_tolerances_are_the_same_training():
    """bounds.py: 2e-4 at step 1 (1 in 5000), 1% at any step (1 in 100); the quotients are exact."""
    assert losses.loss_gaps(trained(5000.0), trained(5001.0)).same
    assert losses.loss_gaps(trained(5000.0, 100.0), trained(5000.0, 101.0)).same


def test_stages_whose_losses_are_1_percent_apart_are_alike():
    assert losses.alike(Loss(gap=0.01))


def test_stages_whose_weights_are_apart_are_not_alike_and_weights_never_compared_do_not_count():
    assert not losses.alike(Loss(gap=0.0, weights_apart=0.5))
    assert losses.alike(Loss(gap=0.0, weights_apart=None))


def test_weights_are_not_compared_where_a_run_has_no_checksum():
    assert losses.weights_apart(RankResult(trained_checksum=2.0), RankResult(trained_checksum=1.0)) == 0.5
    assert losses.weights_apart(RankResult(trained_checksum=2.0), RankResult()) is None
    assert losses.weights_apart(RankResult(), RankResult(trained_checksum=2.0)) is None


def test_equal_memory_is_told_as_1_00x_less():
    assert verdict.change(2.0, 2.0) == "1.00x less"
    assert verdict.change(2.0, 4.0) == "2.00x more"


def test_flash_attention_runs_on_a_gpu_in_16_bits_only():
    assert memory.uses_flash(True, "bf16") and memory.uses_flash(True, "fp16")
    assert not memory.uses_flash(False, "bf16") and not memory.uses_flash(True, "fp32")


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
    plan.main(["--gpus", "8", "9", "--gpus-per-node", "8", "--stages", "3", "--json"])
    assert [r["nodes"] for r in json.loads(capsys.readouterr().out)["rows"]] == [1, 2]


# -----------------------------------------------------------------------------
# the verdict's words and branches


def test_a_stage_3_that_counted_nothing_is_told_so():
    assert verdict.say_partitioning(Partitioning(counted=False)) == "stage 3 reported no partitioning"


def counted(same_weights):
    return Partitioning(counted=True, partitioned=4, tensors=4, shards_ok=True, stage0_partitioned=0,
                        same_weights=same_weights, world=2)


def test_weights_without_both_checksums_are_told_as_not_compared():
    told = verdict.say_partitioning(counted(None))
    assert told.endswith("; a run failed before its checksum, so the weights were not compared")


def test_shards_that_hold_stage_0s_weights_are_told_so():
    assert "the shards hold exactly stage 0's initial weights" in verdict.say_partitioning(counted(True))


def test_a_stage_0_that_partitions_a_tensor_fails_a():
    zero3 = [RankResult(world_size=2, shards=Shards(param_tensors=4, partitioned_tensors=4, shard_check_ok=True))]
    dense = [RankResult(world_size=2, shards=Shards(param_tensors=4, partitioned_tensors=n)) for n in (2, None)]
    status, f = verdict.partitioning(dense, zero3)
    assert (status, f.stage0_partitioned) == ("FAIL", 2)
    assert verdict.partitioning(dense[1:], zero3)[0] == "PASS"  # stage 0 failed before counting


def memory_figures(**figures):
    return Memory(**{"states0": 4 * 2**30, "states3": 2**30, "peak0": 8 * 2**30, "peak3": 4 * 2**30,
                     "predicted_states_ratio": 4.0, "states_ok": True, "world": 4, "on_gpu": True, **figures})


def test_model_states_never_counted_are_told_as_a_run_that_stopped_early():
    told = verdict.say_memory(Memory(uncounted=("stage 0",)))
    assert told == "stage 0 stopped before the last step, where the model states are counted"


def test_one_rank_is_told_that_there_is_nothing_to_shard_across():
    assert "with 1 rank there is nothing to shard across" in verdict.say_memory(memory_figures(world=1))
    assert "nothing to shard across" not in verdict.say_memory(memory_figures(world=4, on_gpu=False))


def test_a_cpu_runs_peak_is_told_as_not_judged():
    told = verdict.say_memory(memory_figures(on_gpu=False))
    assert told.endswith("; a CPU process's peak is mostly its runtime, not judged)")


def test_stage_3_holding_exactly_the_slack_over_its_predicted_share_passes_b():
    """Stage 0 holds 400 bytes, stage 3 is predicted 1/4 of it: MEMORY_SLACK (1.25) allows 125 bytes."""
    def rank(states, predicted):
        return RankResult(world_size=4, model_state_breakdown=Census(params=states),
                          predicted=Predicted(states=predicted), peaks=MemorySnapshot(peak_mem_bytes=1000))
    assert verdict.measured_memory([rank(400, 400.0)], [rank(125, 100.0)]).states_ok
    assert not verdict.measured_memory([rank(400, 400.0)], [rank(126, 100.0)]).states_ok


def test_runs_from_before_the_shares_were_measured_have_no_promises_to_judge():
    assert verdict.promises({"stage 0": [RankResult()], "stage 3": [RankResult()]}) is None


def test_a_run_that_failed_fails_d_though_no_run_measured_its_shares():
    assert verdict.promises({"stage 0": [RankResult()], "stage 3": [RankResult(error="boom")]})[0] == "FAIL"


def test_runs_that_hold_their_promised_shares_pass_d():
    held = {"params": 0.5, "grads": 0.5, "optimizer": 0.5}
    runs = {"stage 3": [RankResult(partition_check_ok=True, held_fraction=held)] * 2}
    assert verdict.promises(runs) == ("PASS", Promises(held={"stage 3": held}, broken=[]))


def test_the_pair_criteria_are_named_as_a_range_where_their_letters_run_on():
    assert verdict.pair_labels() == "(a) to (c)"


def test_two_pair_criteria_or_letters_that_skip_are_listed(monkeypatch):
    def named(*letters):
        return [verdict.Criterion(f"({x}) a criterion", verdict.PAIR, None, None) for x in letters]
    monkeypatch.setattr(verdict, "CRITERIA", named("a", "b"))
    assert verdict.pair_labels() == "(a), (b)"
    monkeypatch.setattr(verdict, "CRITERIA", named("a", "c", "d"))
    assert verdict.pair_labels() == "(a), (c), (d)"


def test_a_pair_without_its_stage_0_run_is_not_observable():
    [check] = verdict.check_pair([], [RankResult()])
    assert (check.status, check.detail.split(" run ")[0]) == ("NOT OBSERVABLE", "no plain stage-0")
    [check] = verdict.check_pair([RankResult()], [])
    assert (check.status, check.detail.split(" run ")[0]) == ("NOT OBSERVABLE", "no plain stage-3")


def test_one_number_of_ranks_is_told_without_a_heading():
    check = Check("(a) a criterion", "PASS", "fine")
    line = f"{'PASS':>14}  (a) a criterion: fine"
    assert verdict.verdict_lines({"2 rank(s)": [check], verdict.ALL_RUNS: [check]}) == [line, line]
    several = {"1 rank(s)": [check], "2 rank(s)": [check], verdict.ALL_RUNS: [check]}
    assert verdict.verdict_lines(several) == ["1 rank(s):", line, "2 rank(s):", line, "all runs:", line]


def test_the_signal_run_sh_names_is_the_interruption(monkeypatch):
    monkeypatch.setenv("RUN_SIGNAL", "15")
    monkeypatch.delenv("RUN_COMMAND", raising=False)
    assert verdict.interruption({}, []) == "SIGTERM"


def test_a_rank_that_died_is_a_failure_though_its_peers_were_stopped_by_a_signal(monkeypatch):
    monkeypatch.delenv("RUN_SIGNAL", raising=False)
    monkeypatch.delenv("RUN_COMMAND", raising=False)
    stopped = RankResult(rank=1, interrupted_by="SIGTERM")
    assert verdict.interruption({"stage 3": [stopped]}, []) == "SIGTERM"
    assert verdict.interruption({"stage 3": [stopped]}, ["stage 3 rank 0 died"]) is None
    assert verdict.interruption({"stage 3": [RankResult(rank=0, oom=True), stopped]}, []) is None


def test_the_ranks_lost_in_a_run_are_told_by_run():
    assert verdict.say_lost({"stage 0": [1], "stage 3": [2, 3]}) == (
        "; stage 0 rank(s) 1, stage 3 rank(s) 2 3 wrote no complete RESULT line (cut off, garbled, mistyped, missing, "
        "twice or beyond the world): not judged")


def test_the_shares_held_are_told_by_run_and_a_run_out_of_memory_as_such():
    held = {"stage 3": {"params": 0.5, "grads": 0.5, "optimizer": 0.25}, "stage 2": None}
    assert verdict.say_promises(Promises(held=held, broken=[])) == (
        "share held of params/grads/optimizer states: stage 3 50%/50%/25%, stage 2 out of memory")


def test_only_the_runs_whose_losses_differ_from_their_reference_are_told_as_missed():
    compared = [Comparison("stage 3", "stage 0", 0.0, 0.0, True), Comparison("stage 2", "stage 0", 0.1, 0.1, False)]
    told = verdict.say_same_training(SameTraining(compared=compared))
    assert told.endswith("; MISSED: stage 2 and stage 0 DIFFER")


# -----------------------------------------------------------------------------
# the losses


def test_the_design_loss_is_read_at_its_step_for_its_model_only():
    """The acceptance check names the 1.3b model's loss at step 3 (bounds.DESIGN_LOSS)."""
    three = {"stage 0": [10.0, 9.0, 7.5], "stage 3": [10.0, 9.0, 7.6]}
    assert losses.design_losses("1.3b", three) == {"stage 0": 7.5, "stage 3": 7.6}
    assert losses.design_losses("tiny", three) is None
    assert losses.design_losses("1.3b", {"stage 0": [10.0, 9.0], "stage 3": [10.0, 9.0]}) is None


def test_a_run_at_its_presets_rate_is_not_at_a_rate_of_its_own():
    tiny = shapes.PRESETS["tiny"].lr

    def at(model, lr):
        return losses.at_own_rate(RankResult(run=options.run_from({"model": model, "lr": lr})))
    assert at("tiny", 10 * tiny) and not at("tiny", tiny)
    assert not at("a model of no preset", 10 * tiny)


def test_one_stage_is_told_without_a_gap():
    assert losses.say_loss(Loss(losses={"stage 3": [3.0, 2.0, 1.0]}, steps=3)) == "stage 3 3.000 -> 2.000 -> 1.000"
    told = losses.say_loss(Loss(losses={"stage 0": [3.0], "stage 3": [3.0]}, gap=0.001, steps=3))
    assert "; the stages agree to 0.10% at every step" in told


# -----------------------------------------------------------------------------
# plan.py's checks and defaults


def test_too_many_gpus_says_where_the_search_ends_and_other_counts_what_plan_py_plans():
    with pytest.raises(argparse.ArgumentTypeError, match=r"\(where the search for the fewest that fit ends\)"):
        plan.whole("gpus")("0")
    with pytest.raises(argparse.ArgumentTypeError, match=r"\(the most layers plan.py plans\)"):
        plan.whole("layers")("0")


def settled(*argv):
    args = plan.parse_args(list(argv))
    return plan.settle(args, plan.resolve_model(args)).inputs


def test_offloading_the_parameters_offloads_the_optimizer_too():
    """plan.py's --help: --offload-param "implies --offload"."""
    assert cluster.offloads_optimizer("3", settled("--offload-param"))
    assert cluster.offloads_optimizer("3", settled("--offload"))
    assert not cluster.offloads_optimizer("3", settled())


def test_a_reserve_and_context_that_fill_the_gpu_exactly_are_refused():
    with pytest.raises(BadInput, match="must together be less than the GPU's memory"):
        settled("--gpu-mem-gib", "10", "--reserve-gib", "4", "--context-gib", "6")


def test_a_preset_named_as_a_hugging_face_model_is_refused():
    with pytest.raises(BadInput, match="--model tiny is a preset: give it as --preset"):
        plan.hf_shape("tiny", None)


def test_an_mfu_of_exactly_what_checkpointings_recomputed_forward_leaves_is_planned():
    """With checkpointing the hardware does 4/3 of the model's FLOPs: an MFU of 3/4 is the whole peak."""
    assert settled("--checkpoint", "--mfu", "0.75").mfu == 0.75


def test_a_shape_given_by_its_fields_is_planned_without_params():
    """tiny's fields: 2 blocks of 12 x 128**2 + 13 x 128, the token and position embeddings, the final LayerNorm."""
    args = plan.parse_args(["--layers", "2", "--d-model", "128", "--heads", "4", "--vocab", "256", "--seq", "256"])
    assert plan.resolve_model(args).params == 2 * (12 * 128**2 + 13 * 128) + 2 * 256 * 128 + 2 * 128


def test_a_plan_takes_up_to_2_to_the_16_heads_and_2_to_the_20_rows_a_micro_batch():
    assert plan.whole("heads")(str(2**16)) == 2**16
    assert plan.whole("micro_batch")(str(2**20)) == 2**20


def test_a_plans_json_says_the_search_for_the_fewest_gpus_ends_at_2_to_the_20(capsys):
    plan.main(["--gpus", "8", "--stages", "3", "--json"])
    assert json.loads(capsys.readouterr().out)["max_gpus"] == 2**20


def test_a_row_with_no_headroom_left_fits_and_one_short_of_it_does_not():
    def row(headroom_left):
        return cluster.Row(**{**dict.fromkeys(f.name for f in dataclasses.fields(cluster.Row)),
                              "headroom_left": headroom_left})
    assert row(0.0).fits and not row(-1.0).fits


def tiny_planned(*argv):
    args = plan.parse_args(["--preset", "tiny", *argv])
    model = plan.resolve_model(args)
    return model, plan.settle(args, model).inputs


def test_stage_2_offloading_its_optimizer_holds_its_states_and_buffers_on_the_host():
    model, i = tiny_planned("--offload")
    terms = dict.fromkeys((f.name for f in dataclasses.fields(memory.MemoryTerms)), 0)
    m = memory.MemoryTerms(**{**terms, "breakdown": {"grads": 0}, "host_states": 100, "host_buffers": 10})
    assert cluster.host_per_rank("2", model, i, 8, {}, m) == 100 + 10


def test_a_collective_smaller_than_one_call_is_one_call_and_a_larger_one_rounds_up():
    model, i = tiny_planned()
    def calls(nbytes, bucket):  # stage 0 all-reduces in calls of a bucket of bf16 elements
        return cluster.collective("all_reduce", "after", nbytes, "0", model, i, 8, {"reduce_bucket_size": bucket},
                                  "intra").calls
    assert calls(1000, 5e8) == 1
    assert calls(5000, 1000) == 3  # 2.5 buckets of 2,000 bytes


def test_stage_0s_optimizer_pass_covers_the_whole_model_on_every_gpu_and_stage_1s_a_1_gth_partition():
    """A world-1 step of 1 s of FLOPs and 1 s of optimizer pass, the host's clock shorter: on 8 GPUs stage 0's passes
    take 2 s, stage 1's 1 + 1/8 s, shared among forward and backward as their FLOPs are (half each here)."""
    _, i = tiny_planned()
    clocks = {s: steptime.Clocks(host_s=0.0, flops_s=1.0, optimizer_s=1.0) for s in ("0", "1")}
    w = steptime.WorldOne("a folder", "tiny", 1, False, 1, ["0", "1"], {"0": 2.0, "1": 2.0}, clocks, {})
    compute = {"forward": 1.0, "backward": 1.0}
    assert cluster.world_one_seconds(compute, w, "0", i, 8) == {"forward": 1.0, "backward": 1.0}
    assert cluster.world_one_seconds(compute, w, "1", i, 8) == {"forward": 1.125 / 2, "backward": 1.125 / 2}


def test_a_model_of_params_alone_gathers_its_weights_at_stage_3_in_one_call():
    """Without a shape the blocks are unknown, so stage 3's gather of one block at a time cannot be counted."""
    args = plan.parse_args(["--params", "1e9"])
    model = plan.resolve_model(args)
    i = plan.settle(args, model).inputs
    assert cluster.collective("all_gather", "forward", 2e9, "3", model, i, 8, {}, "intra").calls == 1


def test_the_default_gpu_memory_is_an_h200s_as_torch_sees_it():
    """150,109,880,320 bytes, as torch.cuda.get_device_properties gave it on the calibrating H200."""
    assert settled().gpu_mem_gib == pytest.approx(150_109_880_320 / 2**30, abs=0.05)


def test_a_records_number_is_a_finite_positive_int_or_float_and_no_bool():
    assert inputs.positive_number(1) and inputs.positive_number(1e-300)
    assert not inputs.positive_number(0) and not inputs.positive_number(True)


def test_a_records_gpu_memory_may_lie_at_either_end_of_its_span_1_gib_to_1_pib():
    assert inputs.within("device_total_bytes", 2**30) and inputs.within("device_total_bytes", 2**50)
    assert not inputs.within("device_total_bytes", 2**30 - 1) and not inputs.within("device_total_bytes", 2**50 + 1)


def test_a_calibration_over_fewer_than_min_steady_steps_is_uncertain():
    def over(steps):
        return inputs.Calibration("a run", 0.5, 0.5, steps, "1.3b", 1024, 1, False)
    assert over(inputs.MIN_STEADY - 1).uncertain and not over(inputs.MIN_STEADY).uncertain


def test_runs_of_more_ranks_than_a_node_holds_are_not_on_one_node():
    assert folders.one_node([RankResult(world_size=8, ranks_per_node=8)])
    assert not folders.one_node([RankResult(world_size=16, ranks_per_node=8)])


def test_a_record_that_does_not_say_its_world_or_its_nodes_ranks_is_not_known_to_be_on_one_node():
    assert folders.one_node([RankResult(world_size=1, ranks_per_node=1)])
    assert not folders.one_node([RankResult(world_size=1)])
    assert not folders.one_node([RankResult(ranks_per_node=8)])
    assert not folders.one_node([RankResult()])


def test_a_run_without_records_gives_no_world_1_measurement(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"results": {"stage 0": []}}))
    assert steptime.measured(tmp_path) == {}


def test_a_summary_whose_runs_are_not_lists_of_records_is_refused(tmp_path):
    for results in ({"stage 0": {"rank": 0}}, [{"rank": 0}]):
        (tmp_path / "summary.json").write_text(json.dumps({"results": results}))
        with pytest.raises(BadInput, match='"results" must hold a list of records per run'):
            inputs.read_records(tmp_path)


# -----------------------------------------------------------------------------
# the accounting's terms

ROOT = Path(__file__).resolve().parent.parent
TINY = shapes.PRESETS["tiny"]  # 2 layers, 4 heads, d_model 128, model.py's block (GELU MLP 4x wide, LayerNorms)
TINY_PER_TOKEN = 2 * 16 * 128 + 2 * 2 * 4  # bf16: 16 values of d_model and two LayerNorms' fp32 mean and rstd


def test_the_tiny_preset_has_the_parameters_torch_counted_in_a_run():
    """docs/training-recipe.md and the cpu-stages summary.json's params_total: 462,336. Read at call time, as TINY
    above was bound when this file was imported."""
    assert shapes.PRESETS["tiny"].params == 462_336


def test_each_group_of_model_states_is_held_as_a_share_of_what_one_rank_would_hold_alone():
    states = {"params": 1.0, "grads": 2.0, "master": 2.0, "moments": 4.0}
    whole = {"params": 4.0, "grads": 4.0, "master": 8.0, "moments": 16.0}
    assert predict.shares(states, whole) == {"params": 0.25, "grads": 0.5, "optimizer": 0.25}


def test_a_group_is_held_as_promised_within_its_tolerance_of_the_promise():
    promised = {"params": 0.5, "grads": 0.5, "optimizer": 0.5}
    assert predict.holds_as_promised({**promised, "params": 0.54}, promised, 3, 0.0, 0.1)  # slack 0.1 x 0.5
    assert not predict.holds_as_promised({**promised, "params": 0.56}, promised, 3, 0.0, 0.1)


def test_stages_1_and_2_may_hold_the_gradients_of_tensors_that_straddle_their_partition_besides():
    promised = {"params": 1.0, "grads": 0.5, "optimizer": 0.5}
    assert predict.holds_as_promised({**promised, "grads": 0.6}, promised, 2, 0.1, 0.01)  # 0.5 + 0.005 + 0.1
    assert not predict.holds_as_promised({**promised, "grads": 0.6}, promised, 3, 0.1, 0.01)


def test_stage_2s_reduction_copies_the_partitions_gradients_besides_its_buckets():
    zero = {"reduce_bucket_size": 100, "overlap_comm": False}
    assert predict.reduction_bytes(2, "deepspeed", "bf16", 10_000, 1000, zero) == 2 * 1000 + 2 * 100
    assert predict.reduction_bytes(2, "deepspeed", "bf16", 10_000, 1000, {**zero, "overlap_comm": True}) == 2400


def test_stage_0s_reduction_bucket_passes_500m_elements_by_at_most_a_blocks_qkv_weight():
    assert TINY.qkv_params == 3 * 128**2  # model.py's qkv weight
    bucket = predict.reduction_bytes(0, "deepspeed", "bf16", 10**9, 10**9, {}, TINY.qkv_params)
    assert bucket == 2 * (500_000_000 + 3 * 128**2)


def test_a_block_keeps_16_values_of_d_model_a_token_and_flash_attentions_logsumexp():
    tokens = 256
    assert memory.block_activation_bytes(TINY, 2, tokens, 256, True) == tokens * (TINY_PER_TOKEN + 4 * 4)


def test_a_block_without_flash_attention_keeps_its_softmax_too():
    tokens, seq = 512, 256
    softmax = 2 * 4 * seq * tokens  # bf16, one value per score of each head
    assert memory.block_activation_bytes(TINY, 2, tokens, seq, False) == tokens * TINY_PER_TOKEN + softmax


def test_checkpointed_blocks_keep_each_blocks_input_and_the_last_block_recomputed():
    tokens = 256  # micro batch 1
    block = tokens * (TINY_PER_TOKEN + 4 * 4)  # flash
    inputs_ = 2 * 2 * tokens * 128  # 2 layers' inputs, bf16
    assert memory.blocks_backward_bytes(TINY, "bf16", 1, 256, True, True) == inputs_ + block
    assert memory.blocks_backward_bytes(TINY, "bf16", 1, 256, False, True) == 2 * block


def test_stage_3s_first_reduction_in_backward_counts_with_the_weights_gathered():
    terms = dict.fromkeys((f.name for f in dataclasses.fields(memory.MemoryTerms)), 0)
    peak = memory.MemoryTerms(**{**terms, "breakdown": {"grads": 0}, "states": 100, "gathered": 10, "scatter": 5}).peak
    assert peak == 100 + 10 + 5


def test_stage_3_reduces_a_bucket_in_backward_only_across_ranks_of_deepspeed():
    zero, blocks = {"reduce_bucket_size": 100}, 500.0
    # bf16: the bucket's flat copy and this rank's half of it, and the blocks' activations not yet freed
    assert moments.scatter_bytes(3, "deepspeed", 2, 2, zero, 1000, blocks, 0) == 2 * 100 * 1.5 + 500 * 0.9
    assert moments.scatter_bytes(3, "deepspeed", 2, 1, zero, 1000, blocks, 0) == 0
    assert moments.scatter_bytes(3, "fsdp2", 2, 2, zero, 1000, blocks, 0) == 0
    assert moments.scatter_bytes(2, "deepspeed", 2, 2, zero, 1000, blocks, 0) == 0


def test_a_prefetch_of_more_than_a_block_gathers_up_to_the_whole_model_ahead():
    """The real prefetched_twelfths gives more than 12 twelfths as inf only; any count above 12 means the same."""
    layers, block, root, params, live = 10, 100.0, 50.0, 1050.0, 10_000.0
    assert moments.gathered_ahead(layers, block, root, params, live, 13.0) == params
    assert moments.gathered_ahead(layers, block, root, params, live, math.inf) == params


def test_params_that_leave_nothing_for_the_blocks_beside_the_embeddings_are_refused():
    root = 256 * 128 + 256 * 128 + 2 * 128  # tiny's token and position embeddings and final LayerNorm
    with pytest.raises(BadInput, match="leaves nothing for the blocks"):
        plan.resolve_model(plan.parse_args(["--preset", "tiny", "--params", str(root)]))
    assert plan.resolve_model(plan.parse_args(["--preset", "tiny", "--params", str(root + 1)])).params == root + 1


def test_a_plan_takes_up_to_2_to_the_20_gpus():
    assert plan.whole("gpus")(str(2**20)) == 2**20
    with pytest.raises(argparse.ArgumentTypeError, match="from 1 to 1,048,576"):
        plan.whole("gpus")(str(2**20 + 1))


def test_a_group_held_exactly_at_its_promise_or_at_the_edge_of_its_tolerance_holds_as_promised():
    promised = {"params": 0.5, "grads": 0.5, "optimizer": 0.5}
    assert predict.holds_as_promised(promised, promised, 3, 0.0, 0.0)  # no tolerance: the promise itself
    assert predict.holds_as_promised({**promised, "params": 0.75}, promised, 3, 0.0, 0.5)  # 0.5 + 0.5 x 0.5


def test_only_deepspeeds_stages_1_and_2_make_reduction_buckets():
    zero = {"reduce_bucket_size": 100, "overlap_comm": False}
    assert predict.grad_bucket_bytes(1, "deepspeed", 2, zero) == 2 * 100
    assert [predict.grad_bucket_bytes(stage, "deepspeed", 2, zero) for stage in (0, 3)] == [0, 0]
    assert predict.grad_bucket_bytes(2, "fsdp2", 2, zero) == 0


def test_stage_1_moves_a_tensor_as_large_as_its_bucket_into_the_bucket():
    """stage_1_and_2.py reduces on its own only a tensor of more elements than reduce_bucket_size
    (`param.numel() > self.reduce_bucket_size`). Two tensors of 100 on 2 ranks: rank 1's partition is the second."""
    assert predict.moved_grad_elems([[100, 100]], 2, 1, 100) == 100


def test_stage_1_moves_nothing_of_a_tensor_larger_than_its_bucket():
    assert predict.moved_grad_elems([[100, 100]], 2, 1, 99) == 0


def test_at_stage_1_a_partition_as_large_as_the_gradients_moved_before_it_adds_nothing_to_reduce():
    """Two tensors of 4 on 2 ranks, a bucket of 100: rank 1 copies its 4 elements once the first 4 have moved
    into the bucket, freeing theirs; no tensor is reduced on its own."""
    assert predict.stage1_reduction_elems([[4, 4]], 2, 1, {"reduce_bucket_size": 100}) == 4 - 4


def test_one_rank_is_the_only_telling_rank():
    assert memory.telling_ranks(1, "deepspeed", 1, TINY.params, TINY, memory.NO_OFFLOAD) == [0]


def test_the_last_rank_is_a_telling_rank_though_it_holds_only_the_groups_padding():
    """tiny's two groups, 458,752 and 3,584 elements, in partitions of 460 and 4 elements on 1000 ranks (each padded
    to 2 elements a rank): their last elements fall in ranks 997 and 895, and rank 999 holds padding alone."""
    assert [sum(group) for group in TINY.decay_groups] == [458_752, 3_584]
    assert max(memory.telling_ranks(1, "deepspeed", 1000, TINY.params, TINY, memory.NO_OFFLOAD)) == 999


def test_rehearsed_ranks_regather_the_whole_model_at_the_step_and_one_rank_regathers_nothing():
    """DeepSpeed's all_gather_into_tensor_dp_groups skips a data-parallel group of one rank (`dp_world_size == 1`)."""
    assert moments.regathered_bytes(2, "deepspeed", 2, 1000, 2, True) == 2 * 1000
    assert moments.regathered_bytes(2, "deepspeed", 2, 1000, 1, True) == 0


def test_backwards_end_holds_every_gradient_made_the_weights_gathered_and_the_first_blocks_activations():
    terms = dict.fromkeys((f.name for f in dataclasses.fields(memory.MemoryTerms)), 0)
    peak = memory.MemoryTerms(**{**terms, "breakdown": {"grads": 20}, "states": 100, "freed_grads": 20,
                                 "gathered": 10, "last_block": 5}).peak
    assert peak == (100 - 20) + (20 + 10 + 5)  # the gradients freed between steps are not held throughout


def test_without_a_shape_stage_3_gathers_the_module_and_the_prefetch_bucket_and_keeps_no_weights_for_backward():
    """Without a shape the layers and the output layer are unknown: the weights that autograd keeps are not counted."""
    run = options.run_from({"stage": 3, "dtype": "bf16", "checkpoint": False})
    zero = {"stage3_prefetch_bucket_size": 50, "memory_efficient_linear": False}
    m = memory.rank_memory(run, None, memory.Counts(params=10_000, block=100, root=10), zero, memory.Seat(2))
    assert (m.gathered, m.saved_weights) == (2 * (100 + 50), 0)


ROPE_TINY = dataclasses.replace(TINY, positions="rope")  # tiny's blocks with no position embedding; heads of 32
ROPE_PER_TOKEN = 2 * 2 * 32  # bf16 cos and sin, one head's width each


def test_the_activations_when_backward_starts_hold_rotary_positions_cos_and_sin_once():
    tokens = 256
    rope = memory.activation_bytes(ROPE_TINY, "bf16", 1, tokens, False, True, 256)
    assert rope - memory.activation_bytes(TINY, "bf16", 1, tokens, False, True, 256) == tokens * ROPE_PER_TOKEN


def test_a_recomputed_block_keeps_rotary_positions_cos_and_sin():
    tokens = 256
    rope = memory.blocks_backward_bytes(ROPE_TINY, "bf16", 1, tokens, True, True)
    assert rope - memory.blocks_backward_bytes(TINY, "bf16", 1, tokens, True, True) == tokens * ROPE_PER_TOKEN



def test_every_blocks_saved_tensors_hold_rotary_positions_cos_and_sin_once_for_all_blocks():
    """Each block's attention saves the same cos and sin by reference: one copy, whatever the layers (2 here)."""
    tokens = 256
    rope = memory.blocks_backward_bytes(ROPE_TINY, "bf16", 1, tokens, False, True)
    assert rope - memory.blocks_backward_bytes(TINY, "bf16", 1, tokens, False, True) == tokens * ROPE_PER_TOKEN


RMS_TINY = dataclasses.replace(TINY, norm_kind="rmsnorm")


def test_an_rmsnorm_saves_its_input_in_fp32_its_rstd_and_its_normalised_input():
    assert memory.norm_bytes(RMS_TINY, 2) == 4 * 128 + 4 + 2 * 128


def test_the_final_rmsnorm_saves_what_norm_bytes_says_besides_the_output_layers_input():
    """A LayerNorm's input alone (bf16, 128 values) against an RMSNorm's 772 bytes a token."""
    tokens = 256
    rms = memory.output_layer_bytes(RMS_TINY, 2, tokens, 256)
    assert rms - memory.output_layer_bytes(TINY, 2, tokens, 256) == tokens * (772 - 2 * 128)


def test_a_gated_mlp_keeps_four_values_of_its_inner_width_a_token_where_gelus_keeps_two():
    tokens = 256
    gated = memory.block_activation_bytes(dataclasses.replace(TINY, mlp="gated"), 2, tokens, 256, True)
    assert gated - memory.block_activation_bytes(TINY, 2, tokens, 256, True) == tokens * 2 * (4 - 2) * 512


def test_stage_3_fetches_only_the_tensors_above_the_persistence_threshold():
    """partition_parameters.py persists a tensor of `ds_numel <= param_persistence_threshold` elements. At 128:
    tiny's block fetches its four matrices and qkv's and the MLP's first biases; its norms and other biases persist."""
    forward, _ = moments.fetch_order(TINY, {"stage3_param_persistence_threshold": 128}, False)
    block = [n for _, n in forward[3]]
    assert block == [3 * 128**2, 128**2, 4 * 128**2, 4 * 128**2, 3 * 128, 4 * 128]


def test_a_released_tensor_used_again_within_the_reuse_distance_stays_fetched():
    """partitioned_param_coordinator.py keeps the modules ahead while fewer than max_reuse_distance elements were
    traversed: after a's module, b's 10 elements, then a again."""
    order = [[("a", 10)], [("b", 10)], [("a", 10)]]

    def after_release(reuse):
        c = moments.Coordinator(order, {"stage3_max_live_parameters": 1e9, "stage3_prefetch_bucket_size": 0,
                                            "stage3_max_reuse_distance": reuse})
        c.fetch()
        c.release(0)
        return c.fetched
    assert after_release(11) == {"a"}
    assert after_release(10) == set()


def test_a_gated_mlps_attention_has_q_k_and_v_apart_though_its_keys_are_as_wide_as_its_queries():
    """model.py's GELU block fuses q, k and v in one matrix; a Llama layer (q_proj, k_proj, v_proj) keeps three."""
    matrices, _ = dataclasses.replace(TINY, mlp="gated").block_tensors
    assert matrices[:4] == [128**2] * 4


def test_deepspeeds_stage_3_gathers_every_weight_again_in_backward_where_fsdp2_keeps_its_root():
    assert timing.collectives(3, "deepspeed", 2, 1000, 100) == [
        ("all_gather", "forward", 2000), ("all_gather", "backward", 2000), ("reduce_scatter", "backward", 2000)]
    assert timing.collectives(3, "fsdp2", 2, 1000, 100)[1] == ("all_gather", "backward", 2 * (1000 - 100))


def test_deepspeeds_stage_3_gathers_a_block_at_a_time_and_reduces_in_buckets():
    zero = {"reduce_bucket_size": 100}
    assert timing.message_bytes("all_gather", 3, "deepspeed", 2, 1000, zero, 10**6) == 2 * 1000
    assert timing.message_bytes("reduce_scatter", 3, "deepspeed", 2, 1000, zero, 10**6) == 2 * 100


def test_deepspeeds_stages_1_and_2_gather_the_updated_weights_in_one_call_and_reduce_in_buckets():
    zero = {"reduce_bucket_size": 100}
    for stage in (1, 2):
        assert timing.message_bytes("all_gather", stage, "deepspeed", 2, 1000, zero, 10**6) == 2 * 10**6
        assert timing.message_bytes("reduce_scatter", stage, "deepspeed", 2, 1000, zero, 10**6) == 2 * 100
    assert timing.message_bytes("all_gather", 2, "fsdp2", 2, 1000, zero, 10**6) == 2 * 1000


# -----------------------------------------------------------------------------
# the run at 051b136 (benchmarks/logs/cpu/mutants/survivors.md)

def bf16(stage, **settings):
    return options.run_from({"stage": stage, "dtype": "bf16", **settings})


def test_a_rank_whose_partition_lies_wholly_in_the_groups_padding_holds_one_partition_of_padding():
    """3 elements on 4 ranks, padded to 2 a rank: rank 3's partition is elements 6 and 7, both padding; rank 1's
    holds the tensor's last element and one of padding, and keeps the whole tensor."""
    assert predict.whole_tensor_grad_elems([[3]], 4, 3) == 2
    assert predict.whole_tensor_grad_elems([[3]], 4, 1) == 3 + 1


# a group whose last tensor ends on the first element of a partition: 5 elements on 4 ranks, 2 a rank
ODD = dataclasses.replace(TINY, layers=1, tensors=shapes.Tensors(block=((2,), ()), groups=((5,), (1,)), root=4))


@pytest.mark.parametrize("shape, world", [(TINY, 1000), (ODD, 4)])
def test_the_telling_ranks_are_those_where_a_tensor_starts_or_ends_and_the_first_and_last(shape, world):
    """Read off the partitions: rank r holds elements [r * part, (r + 1) * part) of each flat group."""
    expected = {0, world - 1}
    for group in shape.decay_groups:
        part = math.ceil(sum(group) / (predict.ALIGNMENT * world)) * predict.ALIGNMENT
        start = 0
        for n in group:
            expected |= {r for r in range(world) if r * part <= start < (r + 1) * part
                         or r * part <= start + n - 1 < (r + 1) * part}
            start += n
    assert memory.telling_ranks(1, "deepspeed", world, shape.params, shape, memory.NO_OFFLOAD) == sorted(expected)


def test_a_record_without_a_shape_predicts_no_activations_and_nothing_of_blocks_or_an_output_layer():
    """Counts alone: stage 3 on 2 ranks reduces its bucket in backward (a flat copy and this rank's half of it)
    with no block's activations or tied embedding's gradient besides, and prefetches nothing it could size."""
    m = memory.rank_memory(bf16(3, micro_batch=2, seq=64, checkpoint=True), None, memory.Counts(10**9),
                           {"reduce_bucket_size": 100}, memory.Seat(2))
    assert (m.activations, m.last_block, m.prefetched, m.scatter) == (0, 0, 0, 2 * 100 * 1.5)
    assert memory.activations(bf16(3), None, memory.Seat(2)) == {"activations": 0, "logits": 0, "last_block": 0,
                                                                  "blocks": 0}


def test_a_model_whose_forward_could_not_be_counted_has_its_activations_not_predicted_and_says_why():
    unknown = dataclasses.replace(TINY, saved=(), not_counted="XGate cannot run on the meta device")
    assert memory.activations(bf16(3, micro_batch=2, seq=64), unknown, memory.Seat(2)) == {
        "activations": None, "logits": 0, "last_block": 0, "blocks": 0}
    assert memory.missing(unknown, "bf16", 64, True) == "XGate cannot run on the meta device"


KEPT = shapes.Kept(total=1000, checkpointed=300, head=100, first_block=200, most_block=250, logits=64 * 8 * 2)
COUNTED = dataclasses.replace(TINY, vocab=8, vocab_multiple=1, saved=(shapes.Saved(
    seq=64, dtype="bf16", on_gpu=True, attention="flash", one=KEPT,
    two=shapes.Kept(*(2 * n + 1 for n in dataclasses.astuple(KEPT))),
    three=shapes.Kept(*(3 * n + 2 for n in dataclasses.astuple(KEPT)))),))


def test_a_count_at_micro_batches_1_2_and_3_gives_any_micro_batch_each_row_alike_and_the_shared_once():
    assert memory.kept_at(COUNTED, "bf16", 3, 64, True).total == 1000 + 2 * 1001
    assert memory.kept_at(COUNTED, "bf16", 5, 64, True).total == 1000 + 4 * 1001


def test_a_count_at_other_settings_than_the_runs_predicts_nothing_and_names_where_it_was_made():
    assert memory.activations(bf16(3, micro_batch=2, seq=128), COUNTED, memory.Seat(2))["activations"] is None
    assert memory.missing(COUNTED, "fp32", 128, True) == (
        "what its layers keep for backward was counted at seq 64 in bf16 on a GPU, not at seq 128 in fp32 on a GPU")


def test_what_a_model_was_counted_to_keep_and_the_losss_backward_are_its_activations_at_backwards_start():
    """64 tokens of 8 logits in bf16: the logits and the chunks' gradients (2 x 1024 bytes), the last chunk's 10 more
    bytes a logit; with checkpointing, a recomputed block instead where it holds more than the loss less the head."""
    loss = 2 * 1024 + 10 * 64 * 8
    assert memory.counted_bytes(KEPT, False, 64, 8, 256) == {"activations": 1000 + loss, "logits": 100 + loss,
                                                                  "last_block": 200, "blocks": 900}
    assert memory.counted_bytes(KEPT, True, 64, 8, 256)["activations"] == 300 + max(loss, 250 - 100)
    assert memory.counted_bytes(KEPT, True, 64, 8, 256)["blocks"] == 300 - 100 + 250


def test_a_record_from_before_the_count_is_read_as_the_llama_layer_its_fields_describe_or_as_not_counted():
    old = {**shapes.as_record(TINY), "activations_known": True}
    del old["saved"], old["not_counted"]
    assert shapes.from_record(old).saved is None
    unknown = shapes.from_record({**old, "activations_known": False})
    assert unknown.saved == () and "older than the count" in unknown.not_counted


def test_a_counted_shape_reads_back_from_its_record_as_it_was():
    assert shapes.from_record(shapes.as_record(COUNTED)) == COUNTED


def test_without_a_shape_stage_0s_reduction_bucket_passes_500m_elements_by_nothing():
    m = memory.rank_memory(bf16(0), None, memory.Counts(10**9), {}, memory.Seat(2))
    assert m.reduction == 2 * 500_000_000


def test_the_last_blocks_activations_are_one_blocks_at_the_micro_batchs_tokens():
    m = memory.rank_memory(bf16(3, micro_batch=2, seq=256), TINY, memory.Counts.of_shape(TINY), {}, memory.Seat(2))
    assert m.last_block == 2 * 256 * (TINY_PER_TOKEN + 4 * 4)  # flash, as on a GPU in 16 bits


def test_an_offloaded_optimizer_makes_no_reduction_copy_and_keeps_no_gradients_on_the_gpu():
    """Stage 2 offloading its optimizer copies each reduced bucket to the host: no contiguous partition of
    gradients on the device, and no gradients freed between steps there."""
    offload = {"optimizer": "cpu", "param": None}
    m = memory.rank_memory(bf16(2, offload=offload), TINY, memory.Counts.of_shape(TINY), {}, memory.Seat(2, 0))
    assert (m.reduction, m.partition_grads, m.freed_grads) == (0, 0, 0)


def test_a_cpu_rank_has_no_workspace_and_no_host_buffers_apart_from_its_memory():
    offload = {"optimizer": "cpu", "param": None}
    m = memory.rank_memory(bf16(3, offload=offload), TINY, memory.Counts.of_shape(TINY), {},
                           memory.Seat(2, on_gpu=False))
    assert (m.workspace, m.host_buffers) == (0, 0)


def test_a_prefetch_takes_whole_tensors_while_it_has_fewer_elements_than_its_bucket():
    """partitioned_param_coordinator.py prefetches while `numel_prefetching < max_params_to_prefetch`: with a
    bucket of 11, b's 10 leave it one short, so c comes too."""
    order = [[("a", 10)], [("b", 10)], [("c", 10)]]
    c = moments.Coordinator(order, {"stage3_max_live_parameters": 1e9, "stage3_prefetch_bucket_size": 11,
                                        "stage3_max_reuse_distance": 0})
    c.fetch()
    assert c.fetched == {"a", "b", "c"}


def test_without_a_reuse_distance_a_tensor_used_again_by_the_next_module_is_released():
    """partitioned_param_coordinator.py keeps a tensor whose use the prefetch queued past only where that use comes
    after the next module (`__most_recent_step_id_param_fetched_for[param] > step_id`)."""
    c = moments.Coordinator([[("a", 10)], [("a", 10)]], {
        "stage3_max_live_parameters": 1e9, "stage3_prefetch_bucket_size": 100, "stage3_max_reuse_distance": 0})
    c.fetch()
    c.release(0)
    assert (c.fetched, c.elements) == (set(), 0)


def test_with_checkpointing_backward_fetches_each_block_twice_for_its_backward_and_its_recomputed_forward():
    forward, backward = moments.fetch_order(TINY, {}, True)
    blocks = forward[3:3 + TINY.layers]  # after the root, the embedding and the positions
    assert backward == [[], forward[-1], forward[-2], blocks[1], blocks[1], blocks[0], blocks[0], forward[2],
                        forward[1]]
    assert moments.fetch_order(TINY, {}, False)[1][3:5] == [blocks[1], blocks[0]]


def test_a_partition_that_fills_its_sub_groups_exactly_has_no_empty_last_one():
    assert host.sub_groups(2e9, {"sub_group_size": 1e9}) == [1e9, 1e9]


def test_gloos_staging_holds_a_pinned_pair_for_each_gather_in_flight_of_what_one_prefetch_takes():
    """A prefetch bucket of 140,000 elements takes tiny's whole block (its first three matrices are 131,072), so a
    gather in flight is 196,608 elements: 2**19 and 2**18 pinned bytes in bf16 on 2 ranks."""
    zero = {"stage3_prefetch_bucket_size": 140_000, "stage3_max_live_parameters": 1e9}
    _, ahead = moments.prefetch_reach(zero, TINY, TINY.params)
    assert host.staging_bytes(2, 2, zero, TINY, TINY.params) == math.ceil(ahead / 196_608) * (2**19 + 2**18)
    assert math.ceil(ahead / 196_608) != math.ceil(ahead / 140_000)


def test_gloos_staging_gathers_a_gated_blocks_own_share_where_its_matrices_are_not_12_d_squared():
    """Llama's block (q, k, v, o at grouped-query widths, then gate, up and down): a bucket of 1 takes its first
    matrix, q's d**2 of the block's matrices."""
    llama = dataclasses.replace(TINY, kv_heads=2, ffn=344, mlp="gated", norm_kind="rmsnorm", positions="rope",
                                bias=False)
    zero = {"stage3_prefetch_bucket_size": 1, "stage3_max_live_parameters": 1e9}
    _, ahead = moments.prefetch_reach(zero, llama, llama.params)
    assert llama.block_tensors[0][0] == 128**2 != sum(llama.block_tensors[0]) / 12
    assert host.staging_bytes(2, 2, zero, llama, llama.params) == math.ceil(ahead / 128**2) * (2**15 + 2**14)


def test_llama_shapes_count_the_parameters_that_meta_publishes():
    """Llama 3.1 8B (untied, 8,030,261,248) and Llama 3.2 1B (tied, 1,235,814,400), from their configs: RMSNorms of a
    weight alone, rotary positions without parameters, a gated MLP of three d x ffn matrices, no biases."""
    llama = dict(kv_heads=8, mlp="gated", norm_kind="rmsnorm", positions="rope", bias=False)
    eight = shapes.ModelShape(32, 32, 4096, 128_256, 8192, None, ffn=14_336, tied=False, **llama)
    one = shapes.ModelShape(16, 32, 2048, 128_256, 8192, None, ffn=8192, tied=True, **llama)
    assert (eight.params, one.params) == (8_030_261_248, 1_235_814_400)


def test_the_gpt_presets_have_gpt_3s_layers_widths_and_head_widths_with_gpt_2s_vocabulary():
    """Brown et al. 2020, Table 2.1 (n_layers, d_model, d_head; its n_heads of 24 for 1.3B would not divide 2048 into
    heads of 128), GPT-2's 50,257 tokens, and a context of 1,024 (GPT-2's)."""
    table = {"125m": (12, 768, 64), "350m": (24, 1024, 64), "760m": (24, 1536, 96), "1.3b": (24, 2048, 128),
             "2.7b": (32, 2560, 80), "6.7b": (32, 4096, 128)}
    presets = {name: shapes.PRESETS[name] for name in table}
    assert {name: (s.layers, s.d_model, s.d_model // s.heads) for name, s in presets.items()} == table
    assert all(s.d_model % s.heads == 0 for s in presets.values())
    assert {(s.vocab, s.context) for s in presets.values()} == {(50_257, 1024)}


def test_a_row_crosses_no_link_on_one_gpu_nvlink_within_a_node_and_the_network_beyond_it(capsys):
    capsys.readouterr()
    plan.main(["--preset", "tiny", "--stages", "3", "--gpus", "1", "2", "8", "9", "--gpus-per-node", "8", "--json"])
    links = {r["gpus"]: r["link"] for r in json.loads(capsys.readouterr().out)["rows"]}
    assert links == {1: "none", 2: "intra", 8: "intra", 9: "inter"}


def test_zero_infinity_fetches_each_ranks_partition_of_the_weights_from_the_host():
    model, i = tiny_planned("--offload-param")
    fetched = {world: [c.bytes for c in cluster.step_collectives("3", model, i, world, {})
                       if c.kind == "host_copy" and c.phase == "forward"] for world in (1, 8)}
    assert fetched == {1: [2 * model.params], 8: [2 * model.params / 8]}


def test_a_model_of_params_alone_offloading_stage_3s_optimizer_plans_the_hosts_whole_resident_set():
    """host.host_peak_bytes: the process's own 1.26 GB besides the offloaded states and buffers."""
    args = plan.parse_args(["--params", "1e9", "--offload"])
    model = plan.resolve_model(args)
    i = plan.settle(args, model).inputs
    m = cluster.memory("3", model, i, 8, {})
    assert cluster.host_per_rank("3", model, i, 8, {}, m) > m.host_states + m.host_buffers + host.PROCESS_BYTES


def test_a_stage_3_run_whose_gpu_clock_lies_under_its_launches_and_hooks_sets_zero_3s_own_cost_per_tensor():
    """1.3b-like at micro batch 8 with checkpointing: the GPU's clock (0.25 s) is past the launches (0.17 s) but
    short of them with ZeRO-3's hooks at the constant (0.29 s), so the host holds stage 3's step, which sets the
    hooks' cost."""
    def run(stage, step_s):
        return steptime.Measured(str(stage), "1.3b", stage, 8, True, step_s, 1024, 6 * 1.3e9, int(1.3e9), 292,
                                 frozenset())
    zero, three = run(0, 0.25), run(3, 0.30)
    launches = steptime.launch_s(steptime.LAUNCH_S_PER_TENSOR_PASS, three, True)
    t = steptime.terms("calibrating", {"0": zero, "3": three}, steptime.host_pass([]))  # the GPU's rate refitted
    assert launches < steptime.gpu_s(three, 8, True, t.gpu_flops_per_s) < (
        launches + steptime.OWN_S_PER_TENSOR[3] * 292)
    assert t.own_s_per_tensor[3] == pytest.approx((0.30 - launches) / 292)


def test_a_folder_of_one_rehearsal_says_it_is_one_and_of_more_that_they_are():
    def said(rehearsals):
        folder = folders.Folder(Path("results"), {}, None, None, None, rehearsals, {}, [], [])
        return " ".join(folders.folder_warnings(folder, folders.Planned("tiny", 256, 2, mfu_given=True)))
    assert "stage3 is a rehearsal" in said(["stage3"])
    assert "stage0, stage3 are rehearsals" in said(["stage0", "stage3"])


def test_a_records_peak_tflops_past_its_span_is_refused_at_its_own_unit():
    high = inputs.SPANS["peak_tflops"].high
    assert inputs.within("peak_tflops", high) and not inputs.within("peak_tflops", 1.5 * high)


def test_a_number_past_the_low_end_of_a_span_without_it_is_taken_and_the_end_itself_refused():
    above_zero = inputs.between(float, 0, 10, "a test", low_allowed=False)
    assert above_zero("1e-9") == 1e-9
    with pytest.raises(argparse.ArgumentTypeError, match="above 0"):
        above_zero("0")


def test_a_hugging_face_model_is_refused_with_a_preset_or_a_parameter_count():
    for other in (["--preset", "tiny"], ["--params", "1e9"]):
        with pytest.raises(BadInput, match="one of them"):
            plan.resolve_model(plan.parse_args(["--model", "configs/models/llama-3.2-1b.json", *other]))


def test_a_plan_without_a_micro_batch_or_a_run_plans_the_configs_rows_per_gpu_and_the_default_sequence():
    """ds_config_stage0.json's and ds_config_stage3.json's train_micro_batch_size_per_gpu, and train_gpt.py's
    sequence (options.DEFAULT_SEQ) for a model of params alone, which has no context of its own."""
    configs = {json.loads(stages.config_path(stage).read_text())["train_micro_batch_size_per_gpu"] for stage in (0, 3)}
    _, i = tiny_planned()
    args = plan.parse_args(["--params", "1e9"])
    alone = plan.settle(args, plan.resolve_model(args)).inputs
    assert {i.micro_batch, alone.micro_batch} == configs and alone.seq == options.DEFAULT_SEQ


def test_the_spans_in_gib_are_what_their_words_say():
    words = {"none": 0, "1 GiB": 1, "1 PiB": 2**20}
    for key in ("gpu_mem_gib", "reserve_gib", "context_gib"):
        low, high = inputs.SPANS[key].why.split(" to ")
        assert (inputs.SPANS[key].low, inputs.SPANS[key].high) == (words[low], words[high]), key


def test_the_assumed_network_is_400_gbit_infiniband_per_gpu_at_0_9_of_its_rate():
    assert inputs.ASSUMED["inter_busbw_gbs"].value == pytest.approx(400 / 8 * 0.9)
    assert "400 Gb/s" in inputs.ASSUMED["inter_busbw_gbs"].why and "0.9" in inputs.ASSUMED["inter_busbw_gbs"].why


def test_the_zero_settings_a_config_leaves_out_are_deepspeeds_own_defaults():
    """DeepSpeedZeroConfig's fields, under the config's names (their aliases: stage3_max_live_parameters, ...)."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    fields = DeepSpeedZeroConfig.model_fields
    own = {(f.alias or name): getattr(DeepSpeedZeroConfig(), name) for name, f in fields.items()}
    assert {key: own[key] for key in predict.DEEPSPEED_DEFAULTS} == predict.DEEPSPEED_DEFAULTS


def test_the_small_preset_is_docs_running_mds_101m_parameters_on_a_byte_vocabulary_of_256_tokens_a_row():
    small = shapes.PRESETS["small"]
    assert round(small.params / 1e6) == 101 and small.d_model % small.heads == 0
    assert (small.vocab, small.context) == (256, 256)
    assert "`small` (101M, byte vocabulary" in (ROOT / "docs" / "running.md").read_text()


def test_the_1_3b_presets_rate_is_docs_training_recipe_mds_constant_5e_6():
    assert shapes.PRESETS["1.3b"].lr == 5e-6
    assert "A constant 5e-6 for `1.3b`" in (ROOT / "docs" / "training-recipe.md").read_text()


# -----------------------------------------------------------------------------
# the operand mutants (benchmarks/logs/cpu/mutants/survivors.md, the operand run)

def test_a_curve_read_beyond_either_end_gives_that_ends_value():
    curve = {1: 10.0, 4: 40.0}
    assert [traffic.read_curve(curve, x) for x in (0.5, 1, 4, 8)] == [10.0, 10.0, 40.0, 40.0]


def test_a_partitioned_group_held_at_the_low_edge_of_its_tolerance_holds_as_promised():
    """The slack is a share of the promise, not of what is held: 0.45 against 0.5 give or take 10%."""
    promised = {"params": 0.5, "grads": 0.5, "optimizer": 0.5}
    assert predict.holds_as_promised({**promised, "params": 0.45}, promised, 3, 0.0, 0.1)


@pytest.mark.parametrize("rank, params", [(None, TINY.params), (0, TINY.params + 1)], ids=["no rank", "other params"])
def test_deepspeeds_flat_groups_are_not_known_without_a_rank_or_for_params_that_are_not_the_shapes(rank, params):
    assert predict.grad_layout(1, "deepspeed", TINY.params, TINY, 0, memory.NO_OFFLOAD) == TINY.decay_groups
    assert predict.grad_layout(1, "deepspeed", params, TINY, rank, memory.NO_OFFLOAD) is None


def test_a_prefetch_ahead_of_a_model_of_few_blocks_holds_no_more_than_the_whole_model():
    """2 blocks of 100 and a root of 200: half a block ahead at each block, and 4 besides, reach past the model."""
    assert moments.gathered_ahead(2, 100, 200, 400, 1e12, 12) == 400


def test_a_shapes_counts_are_its_parameters_its_embedding_as_the_largest_tensor_a_block_and_the_root():
    assert memory.Counts.of_shape(TINY) == memory.Counts(params=TINY.params, largest=TINY.embedding,
                                                         block=TINY.block_params, root=TINY.root_params)


def test_the_optimizer_steps_moment_holds_the_gradient_norms_copies_where_they_are_its_most():
    nothing = {f.name: 0.0 for f in dataclasses.fields(memory.MemoryTerms)}
    terms = memory.MemoryTerms(**{**nothing, "breakdown": {"grads": 0.0}, "grad_norm": 5.0, "overflow_check": 3.0})
    assert terms.peak == 5.0


def test_a_loss_over_fewer_tokens_than_a_chunk_is_one_chunk_of_those_tokens():
    assert memory.output_layer_bytes(TINY, 2, 100, 256) == memory.output_layer_bytes(TINY, 2, 100, 100)


def test_two_rows_without_flash_attention_hold_twice_one_rows_activations():
    """Each row's attention keeps its own softmax, seq x seq a head: the micro batch multiplies it, and no row
    attends to another's tokens."""
    one, two = (memory.activation_bytes(TINY, "bf16", rows, 64, False, False, 1024) for rows in (1, 2))
    assert two == 2 * one


def test_a_shape_read_back_from_its_record_is_the_same_shape():
    assert shapes.from_record(shapes.as_record(ODD)) == ODD


def test_the_vocabulary_is_padded_to_the_shapes_own_multiple():
    assert dataclasses.replace(TINY, vocab=100, vocab_multiple=1).padded_vocab == 100
    assert dataclasses.replace(TINY, vocab=100, vocab_multiple=64).padded_vocab == 128


def test_a_gelu_block_with_fewer_key_heads_than_query_heads_keeps_q_k_and_v_apart():
    """model.py fuses q, k and v where they are alike; a GELU family with grouped keys (4 heads, 2 of keys) does not."""
    matrices, _ = dataclasses.replace(TINY, kv_heads=2).block_tensors
    assert matrices[:4] == [128**2, 64 * 128, 64 * 128, 128**2]


def test_backward_fetches_the_modules_in_forwards_reverse_order_after_the_root():
    """With no tensor persisting, every module fetches: the output layer (the embedding, tied), the final norm, the
    blocks from the last, the positions and the embedding."""
    forward, backward = moments.fetch_order(TINY, {"stage3_param_persistence_threshold": 0}, checkpoint=False)
    assert backward == [[], *reversed(forward[1:])] and forward[-2] == [("norm.0", 128), ("norm.1", 128)]


@pytest.mark.parametrize("text", ["not json", "{}", "[1]"], ids=["no JSON", "no results", "not an object"])
def test_a_summary_json_that_is_no_json_or_holds_no_results_is_refused_in_one_line(text, tmp_path):
    (tmp_path / "summary.json").write_text(text)
    with pytest.raises(BadInput, match="summary.json holds no results"):
        inputs.read_records(tmp_path)


def test_a_steps_seconds_and_a_links_bus_bandwidths_may_be_whole_numbers():
    assert inputs.step_problem({"step": 1, "time_s": 2}) is None
    assert inputs.bus_bandwidths({"1024": 50 * 10**9, "2048": 60.5e9})  # bytes a second


def test_a_link_curve_with_a_bus_bandwidth_out_of_its_range_is_refused():
    assert not inputs.bus_bandwidths({"1024": 50e9, "2048": -1.0})


def test_every_positive_figure_of_a_record_has_its_range():
    """record_problem checks a positive figure against its span where it has one: each has."""
    assert set(inputs.POSITIVE) <= set(inputs.RECORD_SPANS)


def test_fsdp2_holds_its_root_gathered_and_keeps_it_out_of_backwards_all_gather():
    model, i = tiny_planned("--stages", "fsdp2")
    assert cluster.memory("fsdp2", model, i, 8, {}).gathered == 2 * (model.root + 2 * model.block)
    [backward] = [c for c in cluster.step_collectives("fsdp2", model, i, 8, {}) if c.phase == "backward"
                  and c.kind == "all_gather"]
    assert backward.bytes == 2 * (model.params - model.root)


def test_each_setups_rows_scale_against_its_own_fewest_gpus():
    args = plan.parse_args(["--preset", "tiny", "--stages", "0", "3", "--gpus", "8", "64"])
    model = plan.resolve_model(args)
    settled = plan.settle(args, model)
    rows = cluster.plan(model, settled.inputs, {}, None, settled.host).rows
    firsts = {r.setup: r for r in reversed(rows)}
    assert [r.scaling for r in firsts.values()] == [cluster.Modes(1.0, 1.0)] * 2
    assert rows[0].tokens_per_s_per_gpu != rows[2].tokens_per_s_per_gpu


def test_a_presets_largest_tensor_is_its_padded_embedding():
    model, _ = tiny_planned()
    assert model.embedding == TINY.embedding


def test_plan_py_names_itself_and_says_what_it_does_in_its_help(capsys):
    with pytest.raises(SystemExit):
        plan.parse_args(["--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: plan.py ") and "Plan a cluster:" in out


def test_a_plan_that_cannot_be_written_says_so_on_standard_error_and_exits_6(monkeypatch, capsys):
    class Full:
        def write(self, text):
            raise OSError(28, "No space left on device")

        def fileno(self):
            return 1
    monkeypatch.setattr(plan.sys, "stdout", Full())
    # plan.py's os alone: the redirection of what is buffered to /dev/null would take pytest's own standard output
    monkeypatch.setattr(plan, "os", argparse.Namespace(open=lambda *_: -1, dup2=lambda *_: None, devnull="",
                                                       O_WRONLY=0))
    with pytest.raises(SystemExit) as exited:
        plan.write("the plan")
    assert exited.value.code == 6
    assert capsys.readouterr().err == ("plan.py: error: cannot write the plan to standard output: No space left on "
                                       "device\n")


def test_one_rank_holds_its_persistent_tensors_once_where_its_partition_stays_on_the_device():
    """DeepSpeed gathers nothing on one rank: each tensor's data is its partition (_no_gather_coalesced), so a tiny
    Llama whose every block matrix persists held 100% of its weights where 169.3% had been promised."""
    assert predict.persistent_besides(1000, 1, memory.NO_OFFLOAD) == 0
    assert predict.persistent_besides(1000, 1, {"optimizer": "cpu", "param": "cpu"}) == 1000  # copied to the GPU
    assert predict.persistent_besides(1000, 2, memory.NO_OFFLOAD) == 1000
