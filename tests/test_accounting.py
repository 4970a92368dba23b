"""The arithmetic behind the predictions and checks, on made-up counts: no launch, no GPU needed."""
import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from zero3bench import explain, finishing, machine, options, parts, result, stages
import train_gpt as t
from zero3bench.accounting import host, measure, memory, moments, predict, shapes
from zero3bench.accounting.memory import NO_OFFLOAD, Counts, Seat, rank_memory
from zero3bench.reporting import theory
from conftest import facts, record

PSI, G = 1_000_000, 4  # parameters, ranks


def run(stage, **settings):
    """A run of DeepSpeed's, in bf16 unless settings say otherwise, as memory.rank_memory reads it."""
    return options.run_from({"stage": stage, "dtype": "bf16", **settings})


def paper(stage, psi=PSI, g=G):
    """The ZeRO paper's model states per rank for mixed-precision Adam (K = 12)."""
    return {0: 16 * psi, 1: 4 * psi + 12 * psi / g, 2: 2 * psi + 14 * psi / g, 3: 16 * psi / g}[stage]


def states(stage, psi=PSI, g=G, dtype="bf16", persistent=0):
    shard = predict.shard_elems(stage, psi, psi // g, g)
    return predict.model_states(stage, dtype, psi, shard, persistent)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_predicted_states_are_the_papers_formulas(stage):
    assert sum(states(stage).values()) == pytest.approx(paper(stage))


@pytest.mark.parametrize("stage, gb", [(0, 120), (1, 31.4), (2, 16.6), (3, 1.88)])
def test_the_prediction_gives_the_papers_figure_1_for_7_5b_parameters_on_64_gpus(stage, gb):
    psi = 7_500_000_000
    assert sum(states(stage, psi=psi, g=64).values()) / 1e9 == pytest.approx(gb, abs=0.05)


def test_the_partition_table_says_what_each_stage_partitions():
    assert [sorted(predict.PARTITIONS[s]) for s in range(4)] == \
        [[], ["optimizer"], ["grads", "optimizer"], ["grads", "optimizer", "params"]]
    assert [predict.partitioned(3, kind) for kind in predict.KINDS] == [True] * 4
    assert [predict.partitioned(1, kind) for kind in predict.KINDS] == [False, False, True, True]


def test_the_prediction_imports_neither_torch_nor_deepspeed():
    pure = ["predict", "moments", "memory", "shapes", "host", "traffic", "timing"]
    code = (f"import sys; import {', '.join('zero3bench.accounting.' + m for m in pure)}; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'deepspeed', 'numpy'}))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=stages.ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr[-2000:]


def test_train_gpt_builds_its_model_from_the_torch_free_shapes_which_count_its_parameters():
    assert t.PRESETS is shapes.PRESETS
    assert sum(p.numel() for p in t.GPT(t.PRESETS["tiny"]).parameters()) == t.PRESETS["tiny"].params


def test_stage3_adds_whole_copies_of_persistent_parameters():
    assert states(3, persistent=1000)["params"] == 2 * (PSI // G + 1000)


def test_in_fp32_stage0_has_no_master_copy_and_stage3_has_one():
    assert sum(states(0, dtype="fp32").values()) == 16 * PSI
    assert sum(states(3, dtype="fp32").values()) == 20 * (PSI // G)


def test_offloading_the_optimizer_moves_its_gradients_weights_and_moments_to_the_host():
    assert predict.host_kinds({"optimizer": None, "param": None}) == []
    assert predict.host_kinds({"optimizer": "cpu", "param": None}) == ["grads", "master", "moments"]
    assert predict.host_kinds({"optimizer": "cpu", "param": "cpu"}) == ["grads", "master", "moments", "params"]
    zero = {"offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "none"}}
    assert options.offload_devices({"zero_optimization": zero}) == {"optimizer": "cpu", "param": None}


def rank(stage, world=G, offload=None, other=0, mem_kind="cuda", **figures):
    """A made-up record after the census: PSI parameters, a tenth of them in the largest tensor."""
    counts = {"params_total": PSI, "local_param_elems": PSI // world if stage == 3 else PSI, "persistent_elems": 0,
              "largest_param_elems": PSI // 10, "model_state_breakdown": {"other": other}}
    return record(**facts(stage, world, offload, mem_kind), **{**counts, **figures})


def test_the_placement_a_rank_fills_in_is_named_for_fields_of_its_result():
    assert {f.name for f in dataclasses.fields(t.Placement)} <= {f.name for f in dataclasses.fields(result.RankResult)}


def test_a_part_named_for_no_field_of_the_result_fails_loudly():
    @dataclasses.dataclass(frozen=True)
    class Misspelt:
        gpu: int = 1
    with pytest.raises(AttributeError, match="Misspelt.gpu is no field of RankResult"):
        t.fill(record(), Misspelt())


def test_a_key_that_the_line_carries_flat_is_no_field_to_fill():
    @dataclasses.dataclass(frozen=True)
    class Peak:
        peak_mem_bytes: int = 1  # the line's key, held by r.peaks
    with pytest.raises(AttributeError, match="Peak.peak_mem_bytes is no field of RankResult"):
        t.fill(record(), Peak())


def predicted(r, checkpoint=False, prefetch=0, sub_group=1e9):
    r.run = dataclasses.replace(r.run, checkpoint=checkpoint)
    finishing.add_predictions(r, t.PRESETS["1.3b"], {"stage3_prefetch_bucket_size": prefetch,
                                                     "sub_group_size": sub_group})
    return r


def test_on_a_gpu_an_offloaded_optimizer_is_predicted_in_host_memory():
    r = predicted(rank(3, offload={"optimizer": "cpu", "param": None}))
    assert r.predicted.states == 2 * (PSI // G)  # the bf16 shards of the weights
    assert r.predicted.host_states == (2 + 4 + 8) * (PSI // G)
    assert r.predicted.transient == 0  # the step runs on the host


def test_without_gpus_device_and_host_are_one_memory():
    r = predicted(rank(3, offload={"optimizer": "cpu", "param": "cpu"}, mem_kind="cpu_rss"))
    assert r.predicted.host_states == 0
    assert r.predicted.states == 16 * (PSI // G)


def test_stage_0_counts_its_gradients_at_backwards_end_and_at_the_step_not_at_its_start():
    r = predicted(rank(0, world=1, other=123))  # the census's other tensors are predicted, not read back
    last_block = memory.block_activation_bytes(t.PRESETS["1.3b"], 2, 2048, 1024, True)
    assert r.predicted.transient == 4 * PSI
    assert r.predicted.peak == 14 * PSI + predict.WORKSPACE_BYTES + max(
        r.predicted.activations, 2 * PSI + last_block, 2 * PSI + 4 * PSI)


def test_stage_3_keeps_its_gradient_buffer_and_its_bucket_throughout():
    r = predicted(rank(3), prefetch=0)
    m = rank_memory(run(3), None, Counts(PSI, shard=PSI // G), {"reduce_bucket_size": 1000}, Seat(G))
    assert m.freed_grads == 0 and m.buffers == 2 * 1000
    assert m.held == 16 * (PSI // G) + 2 * 1000 + predict.WORKSPACE_BYTES
    assert r.predicted.states == 16 * (PSI // G)


def test_one_deepspeed_rank_gathers_nothing_and_fsdp2_casts_its_weights_even_alone():
    assert predict.gathered_bytes(3, "deepspeed", 2, False, 10, 30, 5, 7) == 0
    assert predict.gathered_bytes(3, "deepspeed", 2, True, 10, 30, 5, 7) == 2 * (30 + 7)
    assert predict.gathered_bytes(3, "fsdp2", 2, False, 10, 30, 5, 7) == 2 * (5 + 2 * 10)
    assert predict.gathered_bytes(2, "deepspeed", 2, True, 10, 30, 5, 7) == 0


@pytest.mark.parametrize("stage, engine, world, param, fetches", [
    (3, "deepspeed", 1, None, False), (3, "deepspeed", 1, "cpu", True), (3, "deepspeed", 4, None, True),
    (3, "fsdp2", 1, "cpu", False), (2, "deepspeed", 1, "cpu", False)])
def test_stage_3_fetches_weights_on_several_ranks_or_on_one_whose_partitions_live_in_host_memory(stage, engine, world,
                                                                                                param, fetches):
    assert predict.fetches_weights(stage, engine, world, {"optimizer": "cpu", "param": param}) == fetches


def test_stage_3_makes_the_fp32_gradients_one_sub_group_at_a_time():
    # a sub-group closes at the parameter that reaches sub_group_size: the largest (PSI // 10) may overrun it
    assert predicted(rank(3), sub_group=1e9).predicted.transient == 4 * (PSI // G)
    assert predicted(rank(3), sub_group=1000).predicted.transient == 4 * (1000 + PSI // 10 // G)


def test_stage_3_takes_its_gradient_norm_through_an_fp64_copy_of_each_tensors_partition():
    assert predict.grad_norm_bytes(3, "deepspeed", 1001, 4, False) == 8 * 251  # the largest tensor's, padded
    assert predict.grad_norm_bytes(3, "deepspeed", 1001, 4, True) == 0  # offloaded: taken on the way to the host
    assert predict.grad_norm_bytes(2, "deepspeed", 1001, 4, False) == 0
    assert predict.grad_norm_bytes(3, "fsdp2", 1001, 4, False) == 0


def test_stage_3_where_it_fetches_weights_keeps_the_output_layers_and_without_checkpointing_every_blocks():
    torch_linear = {"memory_efficient_linear": False}
    assert predict.saved_weights_bytes(3, "deepspeed", 2, True, 24, 100, 300, False, torch_linear) == 2 * (300 + 2400)
    assert predict.saved_weights_bytes(3, "deepspeed", 2, True, 24, 100, 300, True, torch_linear) == 2 * 300  # blocks
    assert predict.saved_weights_bytes(3, "deepspeed", 2, False, 24, 100, 300, False, torch_linear) == 0  # no fetch
    assert predict.saved_weights_bytes(3, "deepspeed", 2, True, 24, 100, 300, False, {}) == 0  # DeepSpeed's linear
    assert predict.saved_weights_bytes(3, "fsdp2", 2, True, 24, 100, 300, False, torch_linear) == 0  # frees storage


def test_backwards_first_prefetch_on_all_gathering_ranks_takes_the_output_weight_then_whole_tensors_past_the_bucket():
    shape = t.PRESETS["1.3b"]
    assert moments.start_gathered_bytes(2, 4, True, 0, {}, shape, True, shape.params) == 2 * shape.embedding
    qkv = 3 * 2048**2  # the last block's first tensor, taken whole
    bucket = {"stage3_prefetch_bucket_size": shape.embedding + 1}
    taken = moments.start_gathered_bytes(2, 4, True, 0, bucket, shape, True, shape.params)
    assert taken == 2 * (shape.embedding + qkv)
    assert moments.start_gathered_bytes(2, 1, False, 0, {}, shape, True, shape.params) == 0  # not gathered


def test_only_a_tied_output_layer_holds_its_whole_gradient_through_the_blocks_backward():
    assert moments.held_output_grad_elems(t.PRESETS["1.3b"]) == t.PRESETS["1.3b"].embedding
    assert moments.held_output_grad_elems(dataclasses.replace(t.PRESETS["1.3b"], tied=False)) == 0


def test_checkpointing_keeps_far_fewer_activations_and_fp32_doubles_them():
    shape = t.PRESETS["1.3b"]

    def saved(dtype="bf16", checkpoint=False):
        return memory.activation_bytes(shape, dtype, 2, 1024, checkpoint, True, shapes.LOSS_CHUNK)

    def output(width):  # ln_f, the logits and their gradient, one chunk of the loss in fp32
        return memory.output_layer_bytes(shape, width, 2048, shapes.LOSS_CHUNK)
    full, checkpointed = saved(), saved(checkpoint=True)
    assert (checkpointed - output(2)) < (full - output(2)) / 8
    # all but the LayerNorms' statistics and flash's logsumexp, which are fp32 in either
    assert saved("fp32") - output(4) == pytest.approx(2 * (full - output(2)), rel=1e-3)


def test_the_output_layers_backward_holds_what_its_formula_counts_on_an_h200():
    """benchmarks/output_layer_probe.py's cases (350m and 1.3b, micro batch 1, 2 and 16, bf16 and fp32), measured
    after a first pass that let cuBLAS make its workspace (30-steady/1-probe, without it, held 35 MB more in its first
    case)."""
    lines = (LOGS / "h200" / "31-suite" / "probe" / "output_layer.jsonl").read_text().splitlines()
    for case in map(json.loads, lines):
        predicted = memory.output_layer_bytes(t.PRESETS[case["preset"]], predict.WIDTH[case["dtype"]],
                                               case["tokens"], case["chunk"])
        assert predicted == pytest.approx(case["measured_bytes"], rel=0.02), case
    assert len(lines) == 12

def test_a_block_saves_what_the_activation_formula_counts():
    """model.py's Block in bf16 on a CPU, its saved tensors counted by storage: the formula's 16 values of d_model
    a token, with flash's logsumexp. The CPU keeps the LayerNorms' mean and rstd in bf16 where CUDA keeps fp32
    (8 bytes a token less), and runs SDPA's CPU flash kernel, which saves what CUDA's does."""
    shape = shapes.ModelShape(layers=1, heads=4, d_model=256, vocab=256, context=128, lr=0)
    block = t.GPT.block_class(shape.d_model, shape.heads, 0.02).to(torch.bfloat16)
    x = torch.randn(2, shape.context, shape.d_model, dtype=torch.bfloat16, requires_grad=True)
    saved = {}

    def pack(tensor):
        saved[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        block(x)
    weights = {p.untyped_storage().data_ptr() for p in block.parameters()}
    counted = sum(n for ptr, n in saved.items() if ptr not in weights)
    tokens = 2 * shape.context
    assert counted == memory.block_activation_bytes(shape, 2, tokens, shape.context, True) - 8 * tokens


def test_the_loss_taken_in_chunks_equals_the_cross_entropy_of_all_logits():
    torch.manual_seed(0)
    model = t.GPT(t.PRESETS["tiny"])
    idx, targets = torch.randint(0, 256, (3, 200)), torch.randint(0, 256, (3, 200))  # 600 rows: 3 chunks
    x = model.wte(idx) + model.wpe(torch.arange(200))
    logits = model.lm_head(model.ln_f(model.blocks[1](model.blocks[0](x))))
    whole = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
    assert model(idx, targets).item() == pytest.approx(whole.item(), rel=1e-6)


def test_deepspeeds_estimator_has_none_for_stage0_and_counts_host_memory_per_node():
    offload = {"optimizer": "cpu", "param": None}
    assert predict.deepspeed_estimate(0, PSI, PSI // 10, 4, 1, offload) is None
    one = predict.deepspeed_estimate(3, PSI, PSI // 10, 4, 1, offload)
    two = predict.deepspeed_estimate(3, PSI, PSI // 10, 4, 2, offload)
    assert two["host_per_node"] == pytest.approx(one["host_per_node"] / 2, rel=0.01)


# 1 and 2 GPUs as well as 8: an offloaded optimizer's host bytes a param are max(4 GPUs, 16 or 18), which turns there;
# the parameters offloaded alone count as nothing offloaded, as DeepSpeed's estimator reads them only with the optimizer
@pytest.mark.parametrize("per_node, nodes", [(1, 1), (2, 1), (4, 2)])
@pytest.mark.parametrize("stage, optimizer, param", [(1, None, None), (2, None, None), (2, "cpu", None),
                                                     (3, None, None), (3, "cpu", None), (3, "cpu", "cpu"),
                                                     (3, None, "cpu")])
def test_the_estimator_arithmetic_equals_deepspeeds_own_functions(stage, optimizer, param, per_node, nodes):
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
    mine = predict.deepspeed_estimate(stage, PSI, PSI // 10, per_node, nodes, {"optimizer": optimizer, "param": param})
    if stage == 3:
        host, device, _ = estimate_zero3_model_states_mem_needs(PSI, PSI // 10, num_gpus_per_node=per_node,
                                                                num_nodes=nodes, cpu_offload=bool(optimizer),
                                                                cpu_offload_params=bool(param))
    else:
        host, device = estimate_zero2_model_states_mem_needs(PSI, num_gpus_per_node=per_node, num_nodes=nodes,
                                                             cpu_offload=bool(optimizer))
    assert mine == {"device": device, "host_per_node": host}


def whole(stage):
    return predict.model_states(stage, "bf16", PSI, PSI)


def held(stage, params, grads, optimizer):
    """Made-up held shares, turned into bytes the way model_states counts them."""
    w = whole(stage)
    return {"params": params * w["params"], "grads": grads * w["grads"],
            "master": optimizer * w["master"], "moments": optimizer * w["moments"]}


@pytest.mark.parametrize("stage, shares, ok", [
    (3, (0.25, 0.25, 0.25), True),
    (3, (1.0, 0.25, 0.25), False),  # stage 3 that keeps the weights whole
    (2, (1.0, 0.25, 0.25), True),
    (2, (1.0, 1.0, 0.25), False),  # stage 2 that keeps the gradients whole
    (1, (1.0, 0.30, 0.25), True),  # DeepSpeed's stage 1 holds fewer gradients than the paper says
    (1, (1.0, 1.0, 1.0), False),  # stage 1 that partitions nothing
    (0, (1.0, 1.0, 1.0), True),
])
def test_partition_check_holds_each_stage_to_its_promise(stage, shares, ok):
    promised = predict.shares(states(stage), whole(stage))
    measured = predict.shares(held(stage, *shares), whole(stage))
    assert predict.holds_as_promised(measured, promised, stage, 2 / 100, finishing.PARTITION_TOLERANCE) is ok


def test_with_parameters_offloaded_the_persistent_ones_are_predicted_on_the_gpu():
    r = predicted(rank(3, offload={"optimizer": "cpu", "param": "cpu"}, persistent_elems=1000))
    assert r.predicted.states == 2 * 1000
    assert r.predicted.host_states == sum(r.predicted.breakdown.values()) - 2 * 1000


def test_differences_name_the_kind_and_its_cause():
    r = rank(3, mem_kind="cpu_rss", deepspeed_estimate=None, predicted_breakdown=states(3))
    [line] = explain.differences(r, held(3, 0.5, 0.25, 0.25))
    assert line.startswith("model states: params +") and "still gathered after backward" in line


def test_a_difference_without_a_known_cause_says_so():
    r = rank(1, mem_kind="cpu_rss", deepspeed_estimate=None, predicted_breakdown=states(1))
    [line] = explain.differences(r, held(1, 1.0, 0.3, 0.25))
    assert line.startswith("model states: grads -") and line.endswith("no known cause")


@pytest.mark.parametrize("preset", sorted(shapes.PRESETS))
def test_the_shapes_tensor_groups_are_the_models_decay_groups_in_order(preset):
    with torch.device("meta"):
        model = t.GPT(t.PRESETS[preset])
    groups = [[p.numel() for p in group["params"]] for group in t.decay_groups(model)]
    assert groups == list(t.PRESETS[preset].decay_groups)


# The gradient elements DeepSpeed 0.19.8's stages 1 and 2 held on each rank after backward (the census, /2 bytes):
# 1.3b on 2 rehearsed ranks (h200x2/stages0123-2gpus), 4 (28-suite-matrix/4-trace) and 8 (28-suite-matrix/3-steady-r8)
MEASURED_GRAD_ELEMS = {2: [659089408, 671410176], 4: [340162560, 335706112, 352483328, 335706112],
                       8: [168116224, 184631296, 184631296, 167854080, 180436992, 184631296, 184631296, 167854080]}


@pytest.mark.parametrize("world", sorted(MEASURED_GRAD_ELEMS))
def test_stages_1_and_2_keep_whole_the_gradients_of_the_tensors_in_a_ranks_partition(world):
    groups = t.PRESETS["1.3b"].decay_groups
    kept = [predict.whole_tensor_grad_elems(groups, world, rank) for rank in range(world)]
    assert kept == MEASURED_GRAD_ELEMS[world]
    assert all(t.PRESETS["1.3b"].params / world < k for k in kept)


def test_stage_1s_reduction_peaks_at_the_embeddings_two_copies_or_at_its_partitions_first_tensor():
    shape, zero = t.PRESETS["1.3b"], {"reduce_bucket_size": 5e7}
    groups, embedding = shape.decay_groups, shape.padded_vocab * shape.d_model
    kept = predict.whole_tensor_grad_elems(groups, 4, 0)
    assert predict.stage1_reduction_elems(groups, 4, 0, zero) == kept > 2 * embedding  # nothing moved before rank 0's
    assert predict.stage1_reduction_elems(groups, 4, 1, zero) == 2 * embedding  # rank 0's tensors moved before its
    assert predict.stage1_reduction_elems(groups, 8, 0, zero) == 2 * embedding  # a partition smaller than both copies
    moved = predict.moved_grad_elems(groups, 4, 1, 5e8)  # a bucket above the embedding takes it too
    assert predict.stage1_reduction_elems(groups, 4, 1, {"reduce_bucket_size": 5e8}) == (
        predict.whole_tensor_grad_elems(groups, 4, 1) - moved) and moved > embedding


def test_the_groups_padding_to_an_even_partition_falls_in_the_last_one():
    assert predict.whole_tensor_grad_elems([[3, 4]], 1, 0) == 7 + 1
    assert predict.whole_tensor_grad_elems([[3, 4]], 2, 0) == 3 + 4  # partitions of 4 elements: [0, 4) holds both
    assert predict.whole_tensor_grad_elems([[3, 4]], 2, 1) == 4 + 1


def test_differences_explain_a_gpu_peak_far_from_its_estimate():
    r = rank(3, peak_mem_bytes=3 * 2**30, predicted_peak_bytes=2**30, activation_estimate_bytes=2**29,
             step_transient_bytes=2**28, deepspeed_estimate=None, predicted_breakdown=states(3))
    [line] = explain.differences(r, r.predicted.breakdown)
    assert line.startswith("peak: 3.00 GiB measured against 1.00 GiB estimated")
    assert "stage3_max_live_parameters" not in line  # a record without its zero section: its cap is unknown


@pytest.mark.parametrize("live, named", [(1e9, True), (1e8, False)])
def test_a_stage_3_peak_above_its_estimate_names_a_prefetch_cap_above_the_estimates_bucket(live, named):
    r = rank(3, peak_mem_bytes=3 * 2**30, predicted_peak_bytes=2**30, activation_estimate_bytes=2**29,
             step_transient_bytes=2**28, deepspeed_estimate=None,
             zero_config={"stage3_max_live_parameters": live, "stage3_prefetch_bucket_size": 5e7},
             predicted_breakdown=states(3))
    [line] = explain.differences(r, r.predicted.breakdown)
    assert ("stage3_max_live_parameters (1e+09) lets the prefetch gather" in line) is named


def held_in_params(nbytes):
    return {"params": nbytes, "grads": 0, "master": 0, "moments": 0, "other": 0}


@pytest.mark.parametrize("stage, offload, adds", [
    (3, None, ["2 bytes per partition element (18 where the paper counts 16)", "largest layer (100,000 elements)"]),
    (1, None, ["4 bytes per partition element (18 where the paper counts 14): fp32 gradients"]),
    (3, {"optimizer": "cpu", "param": "cpu"}, ["largest layer (100,000 elements)"]),
])
def test_differences_say_what_deepspeeds_estimator_adds(stage, offload, adds):
    r = rank(stage, offload=offload, model_state_breakdown=held_in_params(10 * 2**20),
             deepspeed_estimate={"device": 12 * 2**20, "host_per_node": 0})
    [line] = explain.estimator_gap(r)
    assert line.startswith("DeepSpeed's estimator: 12.0 MiB against 10.0 MiB measured: it adds ")
    assert all(a in line for a in adds)
    assert ("bytes per partition element" in line) == (offload is None) and ("largest layer" in line) == (stage == 3)


def test_an_estimate_within_10_percent_needs_no_explanation():
    r = rank(3, model_state_breakdown=held_in_params(10 * 2**20),
             deepspeed_estimate={"device": 10.5 * 2**20, "host_per_node": 0})
    assert explain.estimator_gap(r) == []


def test_out_of_memory_covers_gpu_and_capped_cpu_allocations():
    assert machine.out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert machine.out_of_memory(RuntimeError("CUDA error: out of memory"))
    assert machine.out_of_memory(RuntimeError("[enforce fail] DefaultCPUAllocator: can't allocate memory: you tried"))
    assert not machine.out_of_memory(RuntimeError("Connection closed by peer"))


def test_a_runs_peaks_are_the_largest_of_its_steps_and_of_its_start():
    # the H200 offload runs once reported the host RSS after engine start instead of the steps' larger one
    steps = [{"step": i, "loss": 1.0, "lr": 1e-5, "time_s": 0.5, "peak_mem_bytes": 10 * i,
              "peak_reserved_bytes": 20 * i,
              "host_peak_rss_bytes": 30 * i} for i in (1, 2, 3)]
    start = {"peak_mem_bytes": 5, "peak_reserved_bytes": 100, "host_peak_rss_bytes": 40}
    r = record(**facts(0, world=1), steps=steps, memory_at_start=start)
    finishing.finish(r, t.PRESETS["1.3b"], parts.MemorySnapshot(peak_mem_bytes=0))
    assert (r.peaks.peak_mem_bytes, r.peaks.peak_reserved_bytes, r.peaks.host_peak_rss_bytes) == (30, 100, 90)


def test_a_cpu_ranks_memory_snapshot_records_its_peak_resident_set_alone():
    snapshot = measure.memory_snapshot(torch.device("cpu"))
    assert snapshot.as_dict() == {"peak_mem_bytes": snapshot.peak_mem_bytes} and snapshot.peak_mem_bytes > 0


def test_the_learning_rate_warms_up_linearly_from_zero_to_lr():
    from argparse import Namespace
    args = Namespace(lr=1e-5, warmup=2)
    assert [t.learning_rate(step, args) for step in range(5)] == [0, 5e-6, 1e-5, 1e-5, 1e-5]
    assert t.learning_rate(1, Namespace(lr=1e-5, warmup=0)) == 1e-5


def test_fsdp2_keeps_fp32_weights_and_gradients_and_no_master_copy():
    assert predict.model_states(3, "bf16", PSI, PSI // G, engine="fsdp2") == {
        "params": 4 * (PSI // G), "grads": 4 * (PSI // G), "master": 0, "moments": 8 * (PSI // G)}
    assert predict.step_transient_bytes(3, "bf16", PSI // G, False, "fsdp2") == 0


def test_speed_leaves_out_the_first_step_and_the_profiled_one():
    r = rank(3)
    r.steps = [parts.Step(step=i, time_s=t, comm_s=profiled) for i, (t, profiled) in
               enumerate([(9.0, None), (1.0, None), (3.0, None), (8.0, {"all_gather": 0.1})], start=1)]
    assert r.step_time_s == 2.0


def test_bus_bandwidth_of_a_run_comes_from_the_profiled_steps_kernels():
    r = rank(3, world=2)
    comm = dict.fromkeys(("all_gather", "reduce_scatter", "all_reduce"),
                         parts.Collectives(bytes=10**9, elems=5 * 10**8, calls=1))
    seconds = {"all_gather": 0.01, "reduce_scatter": 0.02, "all_reduce": None}
    r.steps = [parts.Step(time_s=1.0, comm=comm, comm_s=seconds)]
    assert r.busbw == {"all_gather": pytest.approx(50e9), "reduce_scatter": pytest.approx(25e9), "all_reduce": None}
    assert r.comm_volume == pytest.approx(4 * 5e8 / PSI)


def test_a_collective_too_small_to_time_the_link_gets_no_bus_bandwidth():
    r = rank(3, world=2)
    comm = dict.fromkeys(("all_gather", "reduce_scatter", "all_reduce"), parts.Collectives(bytes=4, elems=1, calls=1))
    r.steps = [parts.Step(time_s=1.0, comm=comm, comm_s=dict.fromkeys(comm, 1e-5))]
    assert r.busbw == dict.fromkeys(comm)


# -----------------------------------------------------------------------------
# the predicted peak against every committed GPU run that records what it needs (issues 24 and 33)

LOGS = stages.ROOT / "benchmarks" / "logs"
PEAK_RUNS = LOGS / "h200" / "24-peaks" / "results"
PEAK_TOLERANCE = 0.05
# Runs whose peak the prediction misses by more than PEAK_TOLERANCE, by name, with the measured miss: none. The 350m
# model offloaded on one rank had been +5.4%, until the output layer's backward was measured
# (benchmarks/logs/h200/30-steady/1-probe). Parameter offload (ds_config_stage3_infinity.json) on one rank had been
# -47.3% at micro batch 2 and -12.0% to -21.0% at 8 and 16 with checkpointing and at 2 without (36-step-time,
# 38-step-time2), until one rank that offloads its parameters fetched them too (predict.fetches_weights,
# coordinator.py): now +2.3%, -0.3%, +4.8%, +0.1% and -0.1%. Hugging Face models (39-hf, issue 46) at stage 3 on 4
# rehearsed ranks had missed by -5.5% (Llama 3.2 1B, 0.40 GiB short at the loss's backward) and +5.4% (Mistral 7B cut
# to 4 layers): the prediction held its output layer's weight once and a prefetched bucket there, where the probe
# (benchmarks/logs/cpu/backward-probe) finds it twice, autograd's copy and backward's first prefetch, and held an
# untied output layer's gradient and a prefetch beyond stage3_max_live_parameters in the blocks' backward. Now within
# 0.1% and -1.1%, and 1.3b on 4 and 8 ranks, -1.6% and -2.6% before, within 0.1%.
PEAK_MISSES: dict[str, float] = {}


def run_name(r):
    """The run's setup by its config's name (stage3_infinity apart from stage3_offload), world, micro batch and
    checkpointing: one run of a results folder."""
    setup = "fsdp2" if r.run.engine == "fsdp2" else Path(r.run.config).stem.removeprefix("ds_config_")
    return f"{setup} G{r.world_size} mb{r.run.micro_batch} ck{int(r.run.checkpoint)}"


def records(folder):
    """Every rank's record under a folder's summary.json files, as RESULT lines give them, by file."""
    for summary in sorted(folder.glob("**/summary.json")):
        for rs in json.loads(summary.read_text())["results"].values():
            yield from ((summary, result.RankResult.from_dict(d)) for d in rs)


def peak_runs():
    """Every rank's record of every run in 24-peaks."""
    return (r for _, r in records(PEAK_RUNS))


def training_peak(r):
    """The most allocated in any step. The record's peak_mem_bytes also covers what ran after the last step:
    in these runs the trained weights' checksum, which on FSDP2 built an autograd graph of 8 bytes a weight
    (24.91 GiB against 20.12 in training at micro batch 2), since run under no_grad."""
    return max(s.memory.peak_mem_bytes for s in r.steps)


def test_the_predicted_peak_is_within_5_percent_of_every_committed_gpu_run_that_records_its_config():
    """24-peaks (1.3b: stages 0 and 3 and FSDP2, micro batch 2 and 16, checkpointing on and off, 1, 4 and 8
    ranks), 25-oldest (tiny on 2 rehearsed ranks, DeepSpeed 0.14.4 to 0.19.8, and 1.3b on one) and the FSDP2
    runs on 2 H200s (h200x2/13-fsdp2, micro batch 2 and 16, checkpointing on and off), and 26-off-default (fp16,
    fp32, the tiny, 350m and 2.7b models, stages 1 and 2, micro batch 1 and 16, offload, 1, 2 and 4 ranks), and
    27-suite-matrix (the test suite's GPU launches, offload at micro batch 1 and with the 350m model), and
    28-suite-matrix (2.7b, micro batch 8 without checkpointing, offload, the original design's config, --compile,
    8 ranks, and the same settings at other rank counts, which its new terms were not fitted to), and 29-live
    (stage 0 on one rank, 10 and 30 steps; its timelines write no summary.json, as they reset the peak at each
    event), and 32-s12 (stages 1 and 2 on 350m at 2 ranks in fp32, 3 and 8, on 2.7b at 4, in fp16, without
    checkpointing), 33-suite (the test suite's GPU launches) and 34-s1 (stage 1 on 1.3b in fp32 at 4 ranks, 760m at
    6, 125m in fp32 at 5, 350m at 8, predicted before they ran) and 36-step-time and 38-step-time2 (stages 0 to 3
    and offload at world 1, micro batch 2 to 16, with checkpointing and without, and the default, run after this
    test was written), and 39-hf (Llama 3.2 1B, Qwen2.5 1.5B and Mistral 7B cut to 4 layers, at 1 and 4 rehearsed
    ranks) and 41-hf-rest (Qwen2.5 at stages 1, 2 and 3_offload, Mistral's 4 layers offloaded, Llama on 4 ranks
    without checkpointing), 40-heldout and 42-infinity-rehearsed (offload on 2 and 4 rehearsed ranks), and
    43-suite (the test suite's GPU launches) and 44-weights (bf16, fp16 and fp32 on 2 and 4 ranks), and an 80 GB H100's
    h100/1-first-run and 2-sized (the default at 3 and 4 ranks, 760m and 350m on 2 beside a card's worth held),
    3-timeline (the default traced), 4-offload-step (1.3b and 2.7b at world 1, offloaded and not), 5-suite,
    6-suite, 9-suite and 10-suite (the test suite's GPU launches), 7-families (Gemma 2 2B, GPT-2 XL, Pythia 1.4B, Granite 3.0 2B and
    Qwen1.5-MoE cut to 2 layers, at world 1) and 8-offload-step (3_offload and 3_infinity at micro batch 2 to 16),
    and another H200's h200/45-suite (the test suite's GPU launches), 46-families (Phi-3 mini's 8 layers offloaded,
    GPT-2 XL and Pythia 1.4B) and 47-offload-step (1.3b at world 1, offloaded and not), run after this test was
    written: the workspace was fitted on 24-peaks alone; 25-oldest's tiny runs, where it is 90% of the peak, hold it
    too."""
    misses, covered = {}, set()
    for summary, r in records(LOGS):
        if not theory.predictable(r):
            continue
        finishing.add_predictions(r, result.shape_of(r), r.zero_config or {})
        miss = r.predicted.peak / training_peak(r) - 1
        covered.add((summary.relative_to(LOGS).parts[1], r.run.model, run_name(r)))
        if abs(miss) > PEAK_TOLERANCE:
            misses[f"{summary.relative_to(LOGS)} {run_name(r)}"] = round(miss, 3)
    assert {folder for folder, _, _ in covered} == {"24-peaks", "25-oldest", "13-fsdp2", "26-off-default",
                                                    "27-suite-matrix", "28-suite-matrix", "29-live", "30-steady",
                                                    "31-suite", "32-s12", "33-suite", "34-s1", "36-step-time",
                                                    "38-step-time2", "39-hf", "40-heldout", "41-hf-rest",
                                                    "42-infinity-rehearsed", "43-suite", "44-weights",
                                                    "1-first-run", "2-sized", "3-timeline", "4-offload-step",
                                                    "5-suite", "6-suite", "7-families", "8-offload-step", "9-suite", "10-suite",
                                                    "45-suite", "46-families", "47-offload-step"}
    assert len({c for c in covered if c[0] == "24-peaks"}) == 15  # 3 setups x 2 mb x checkpointing, G 1, 4, 8
    assert ("25-oldest", "tiny", "stage3 G2 mb2 ck1") in covered
    assert misses == PEAK_MISSES


STATE_TOLERANCE = 0.01
OLDEST_DEEPSPEED = next(line.split("==")[1] for line in (stages.ROOT / "requirements-oldest.txt").read_text().split()
                        if line.startswith("deepspeed=="))
# Model states that DeepSpeed below the tested range (requirements-oldest.txt) holds apart from the prediction, by
# version and run, with the miss (h200/25-oldest): up to 0.19.2, stage 3 keeps the tied embedding gathered after
# backward (DeepSpeed issue #5524); up to 0.17.5, stage 0's bf16 optimizer holds half its fp32 weights and moments on
# each of 2 ranks, as stage 1 would.
OLD_STATE_MISSES = {**{(v, "tiny stage0 G2 mb2 ck1"): 0.6 for v in ("0.14.4", "0.15.4", "0.16.9", "0.17.5")},
                    **{(v, "tiny stage3 G2 mb2 ck1"): -0.034
                       for v in ("0.14.4", "0.15.4", "0.16.9", "0.17.5", "0.18.4", "0.18.9", "0.19.2")},
                    ("0.19.2", "1.3b stage3 G4 mb2 ck1"): -0.038}


def version(text):
    return tuple(int(part) for part in text.split(".")[:3])


def test_the_predicted_model_states_are_within_1_percent_of_every_committed_run_in_the_tested_range():
    """Every rank that counted its model states and records its config, on CPUs and GPUs, on the device and in host
    memory: the stages' partitions, DeepSpeed's stages 1 and 2 keeping the gradients of the tensors in a rank's
    partition (whole_tensor_grad_elems), stage 3's persistent parameters, fp32's master copy, offload, FSDP2."""
    misses, old, hosts = {}, {}, 0
    for summary, r in records(LOGS):
        if not (r.model_state_breakdown and r.steps and not r.oom and (r.zero_config or r.run.engine == "fsdp2")):
            continue
        finishing.add_predictions(r, result.shape_of(r), r.zero_config or {})
        miss = r.predicted.states / r.model_state_bytes - 1
        if version(r.env.deepspeed) < version(OLDEST_DEEPSPEED):
            old.update({(r.env.deepspeed, f"{r.run.model} {run_name(r)}"): round(miss, 3)} if abs(miss) > 0.01 else {})
            continue
        if r.host_state_breakdown and r.mem_kind == "cuda":
            hosts += 1
            miss = max(miss, r.predicted.host_states / r.host_state_bytes - 1, key=abs)
        if abs(miss) > STATE_TOLERANCE:
            misses[f"{summary.relative_to(LOGS)} rank {r.rank} {r.run.model} {run_name(r)}"] = round(miss, 4)
    assert misses == {} and old == OLD_STATE_MISSES and hosts >= 10


def test_the_8_rank_stage_0_rehearsal_that_ran_out_of_memory_was_predicted_not_to_fit():
    oom = [r for r in peak_runs() if r.oom]
    assert {run_name(r) for r in oom} == {"stage0 G8 mb2 ck1"}
    r = oom[0]
    shape = result.shape_of(r)
    peak = rank_memory(dataclasses.replace(r.run, stage=0, offload={}), shape, Counts.of_shape(shape), {},
                       Seat(r.world_size)).peak
    assert r.ranks_per_gpu * peak > r.peaks.device_total_bytes


def test_runs_made_with_rank_memory_record_a_predicted_peak_within_5_percent_of_their_own():
    records = [result.RankResult.from_dict(d)
               for summary in sorted((PEAK_RUNS.parent / "rank-memory" / "results").glob("*/summary.json"))
               for rs in json.loads(summary.read_text())["results"].values() for d in rs]
    assert len({run_name(r) for r in records}) == 14  # 3 setups x 2 micro batches x checkpointing, and G 4
    assert {run_name(r): round(r.predicted.peak / r.peaks.peak_mem_bytes - 1, 3) for r in records
            if abs(r.predicted.peak / r.peaks.peak_mem_bytes - 1) > PEAK_TOLERANCE} == {}


# -----------------------------------------------------------------------------
# the terms that DeepSpeed 0.19.8's own code adds (issue 33), each against a committed run it decides

def test_stages_1_and_2_step_on_a_flat_16_bit_copy_and_its_fp32_cast_at_once():
    assert predict.step_transient_bytes(1, "bf16", 1000, False) == (2 + 4) * 1000
    assert predict.step_transient_bytes(2, "fp32", 1000, False) == 4 * 1000  # the cast is the copy itself
    assert predict.step_transient_bytes(2, "bf16", 1000, True) == 0  # the step runs on the host


def test_stage_1_frees_the_gradients_outside_its_partition_before_the_step():
    m = rank_memory(run(1), None, Counts(PSI, shard=PSI // G), {}, Seat(G))
    assert m.freed_grads == 2 * PSI and m.partition_grads == 2 * (PSI // G)


def test_stage_0_all_reduces_through_a_flat_copy_of_at_most_a_bucket():
    assert predict.reduction_bytes(0, "deepspeed", "fp32", PSI, PSI, {}) == 4 * PSI
    big = 10 * predict.ALLREDUCE_ELEMS
    assert predict.reduction_bytes(0, "deepspeed", "bf16", big, big, {}, 7) == 2 * (predict.ALLREDUCE_ELEMS + 7)
    assert predict.reduction_bytes(0, "fsdp2", "bf16", PSI, PSI, {}) == 0


def test_stage_3_checks_fp16_gradients_for_overflow_through_a_16_bit_copy_and_a_mask_of_the_partition():
    assert predict.overflow_check_bytes(3, "deepspeed", "fp16", 1000) == (2 + 1) * 1000
    assert predict.overflow_check_bytes(3, "deepspeed", "bf16", 1000) == 0  # bf16 is not loss-scaled
    assert predict.overflow_check_bytes(2, "deepspeed", "fp16", 1000) == 0  # has_inf_or_nan reduces first
    assert predict.overflow_check_bytes(3, "fsdp2", "fp16", 1000) == 0


def test_fp16_at_stage_3_on_2_h200_ranks_peaks_at_its_overflow_check_within_1_percent():
    """1.3b, 2 rehearsed ranks: 0.74 GiB above bf16's peak at the same setting, from the first step after an
    applied one, where the overflow check passes backward's start; at 4 ranks its partition is too small to."""
    for path, name in {"2-probe/results/fp16_p12_r2/20261201-221859-A7dr": "stage3_p12",
                       "3-suite/gpu_fp160/20261201-224004-Ka1m": "stage3"}.items():
        for r in committed(f"h200/26-off-default/{path}/summary.json", name):
            finishing.add_predictions(r, result.shape_of(r), r.zero_config)
            shape = result.shape_of(r)
            m = rank_memory(run(3, dtype="fp16", micro_batch=2, seq=r.run.seq, checkpoint=True), shape,
                            dataclasses.replace(Counts.of_shape(shape), params=r.shards.params_total,
                                                shard=r.shards.local_param_elems), r.zero_config, Seat(2))
            assert m.held + m.overflow_check == m.peak
            assert r.predicted.peak / training_peak(r) == pytest.approx(1, abs=0.01)


def test_stage_3_offloading_its_optimizer_peaks_with_the_embeddings_gradient_on_its_way_to_the_host():
    assert predict.offloaded_grad_bytes(3, "deepspeed", 2, 1000, 2, True) == 12 * 500
    assert predict.offloaded_grad_bytes(3, "deepspeed", 2, 1000, 2, False) == 0
    assert predict.offloaded_grad_bytes(2, "deepspeed", 2, 1000, 2, True) == 0  # stages 1 and 2: another path
    m = rank_memory(run(3, micro_batch=1, seq=1024, checkpoint=True, offload={"optimizer": "cpu", "param": None}),
                    t.PRESETS["1.3b"], dataclasses.replace(Counts.of_shape(t.PRESETS["1.3b"]), params=PSI), {},
                    Seat(1))
    assert m.peak == m.held + m.offloaded_grad


def test_a_model_smaller_than_the_prefetch_bucket_gathers_at_most_itself():
    assert predict.gathered_bytes(3, "deepspeed", 2, True, 10, 30, 5, 5e7, params=1000) == 2 * 1000


PREFETCH_PROBES = LOGS / "cpu" / "prefetch"
INFINITY = stages.ROOT / "configs" / "ds_config_stage3_infinity.json"


def prefetch_probes(pattern):
    """benchmarks/prefetch_probe.py's cases whose files match pattern, by name."""
    return {path.stem: json.loads(path.read_text()) for path in PREFETCH_PROBES.glob(pattern)
            if not path.name.endswith(".config.json")}


def test_the_prefetch_ahead_of_backward_is_deepspeeds_own_within_2_percent():
    """DeepSpeed 0.19.8's coordinator on 2 CPU ranks (benchmarks/prefetch_probe.py): capped at 1e8, 5e8 and 1e9
    (scaled), uncapped at 12 to 48 blocks and with roots of 1.7, 2 and 4 blocks, and prefetches of a third, two
    thirds, one, two, four and ten blocks; AHEAD was read off the uncapped ones. On one rank whose partitions live in
    host memory (the infinity config, run after AHEAD was read) the same."""
    probes = {**prefetch_probes("*.json"), **prefetch_probes("one-rank/infinity.json")}
    assert len(probes) == 16
    for name, p in probes.items():
        zero, d_model = p["zero"], round((p["block"] / 12) ** 0.5)
        twelfths = moments.prefetched_twelfths(zero["stage3_prefetch_bucket_size"], gpt_block_matrices(d_model))
        ahead = moments.gathered_ahead(p["layers"], p["block"], p["root"], p["layers"] * p["block"] + p["root"],
                                       zero["stage3_max_live_parameters"], twelfths)
        assert ahead == pytest.approx(p["peak"], rel=0.02), name


def test_the_coordinator_fetches_and_releases_as_deepspeeds_own_until_the_losss_backward():
    """Each of benchmarks/prefetch_probe.py's 17 cases, on 2 ranks and on one (the infinity config, with
    checkpointing and without): the elements fetched after each fetch and release of forward and after the root's
    backward fetch, exactly."""
    probes = prefetch_probes("**/*.json")
    assert len(probes) == 17
    for name, p in probes.items():
        d_model = round((p["block"] / 12) ** 0.5)
        shape = shapes.ModelShape(p["layers"], 4, d_model, p["vocab"], p["root"] // d_model - p["vocab"], 0)
        rows = moments.fetched_until_backward(shape, p["zero"], "--no-checkpoint" not in p.get("flags", []))
        assert [row[:2] for row in p["rows"][len(rows) - 2:len(rows)]] == [["release", "GPT"], ["fetch", "GPT"]]
        assert rows == [row[2] for row in p["rows"][:len(rows)]], name


def test_at_the_offload_configs_settings_the_losss_backward_finds_the_embedding_and_5_blocks_fetched():
    shape, zero = t.PRESETS["1.3b"], json.loads(INFINITY.read_text())["zero_optimization"]
    for checkpoint in (True, False):
        assert moments.fetched_at_backward_start(shape, zero, checkpoint) == shape.embedding + 5 * 12 * 2048**2


def test_one_rank_that_copies_its_weights_in_holds_what_the_coordinator_fetched_at_backwards_start():
    shape, zero = t.PRESETS["1.3b"], json.loads(INFINITY.read_text())["zero_optimization"]
    infinity = run(3, micro_batch=2, seq=1024, checkpoint=False, offload={"optimizer": "cpu", "param": "cpu"})
    alone, rehearsed = (rank_memory(infinity, shape, Counts.of_shape(shape), zero, Seat(world)) for world in (1, 2))
    assert alone.start_gathered == 2 * (shape.embedding + 5 * 12 * 2048**2)
    assert rehearsed.start_gathered == 2 * shape.embedding  # all-gathered: what backward's first prefetch takes
    assert rank_memory(dataclasses.replace(infinity, offload={"optimizer": "cpu", "param": None}), shape,
                       Counts.of_shape(shape), zero, Seat(1)).start_gathered == 0


@pytest.mark.parametrize("prefetch, twelfths", [
    (0, 0), (1, 3), (3 * 64**2, 3), (3 * 64**2 + 1, 4), (4 * 64**2, 4), (4e4, 12), (12 * 64**2, 12),
    (12 * 64**2 + 1, math.inf)])
def test_a_prefetch_takes_whole_tensors_of_a_block_while_it_has_less_than_its_bucket(prefetch, twelfths):
    assert moments.prefetched_twelfths(prefetch, gpt_block_matrices(64)) == twelfths


def gpt_block_matrices(d_model):
    """model.py's block's matrices in order: qkv, its projection, fc, mlp.proj."""
    return shapes.ModelShape(1, 1, d_model, 1, 1, 0).block_tensors[0]


def test_a_prefetch_of_more_than_a_block_gathers_the_whole_model_ahead():
    assert moments.gathered_ahead(24, 100, 200, 2600, 1e12, 12) == (12 + 4) * 100 + 200
    assert moments.gathered_ahead(24, 100, 200, 2600, 1e12, 8) == (6 + 3) * 100 + 200
    assert moments.gathered_ahead(24, 100, 200, 2600, 1e12, 4) == (1 + 4 / 12) * 100 + 200  # no climb
    assert moments.gathered_ahead(24, 100, 200, 2600, 1e12, math.inf) == 2600
    assert moments.gathered_ahead(24, 100, 200, 2600, 500, math.inf) == 500 + 100  # the cap, and the block asked for
    assert moments.gathered_ahead(24, 100, 200, 2600, 100, 12) == 100  # a block reaches the cap: no prefetch


@pytest.mark.parametrize("stage, fetches, checkpoint", [(2, True, True), (3, False, True), (3, True, False)])
def test_only_stage_3_with_checkpointing_where_it_fetches_weights_prefetches_ahead_of_backward(stage, fetches,
                                                                                              checkpoint):
    shape = t.PRESETS["1.3b"]
    assert moments.prefetch_bytes(stage, "deepspeed", 2, 2, fetches, {}, shape, shape.params, checkpoint, 2048, 1,
                                  1) == 0
    matrices, embedding = 12 * 2048**2, shape.padded_vocab * 2048
    ahead = (24 / 2 + 4) * matrices + shape.root_params  # DeepSpeed's cap of 1e9 is further
    # the 16 blocks reached 8 blocks into backward (the one it asks for, 7 ahead as it starts, one more at each): 16
    # of the 24 inputs held
    assert moments.prefetch_bytes(3, "deepspeed", 2, 2, True, {}, shape, shape.params, True, 2048, 1, 1) == (
        pytest.approx(2 * (ahead + embedding) + 16 * 2 * 2048 * 2048 + 1 + 2 * 5e8 * 1.5))


@pytest.mark.parametrize("case, model", [("live1e9", "1.3b"), ("as_2.7b_live1e9", "2.7b")])
def test_the_most_gathered_ahead_comes_where_deepspeeds_coordinator_reached_it(case, model):
    """prefetch_probe's rows: the block releases before the first row at its peak, against the inputs left."""
    probe = json.loads((LOGS / "cpu" / "prefetch" / f"{case}.json").read_text())
    rows = probe["rows"]
    backward = [i for i, r in enumerate(rows) if r[:2] == ["fetch", "GPT"]][1]
    peak_row = next(i for i, r in enumerate(rows) if r[2] == probe["peak"])
    released = sum(1 for r in rows[backward:peak_row] if r[:2] == ["release", "Block"])
    shape = t.PRESETS[model]
    zero = {"stage3_max_live_parameters": 1e9, "stage3_prefetch_bucket_size": 5e7}
    twelfths, ahead = moments.prefetch_reach(zero, shape, shape.params)
    assert moments.inputs_left(twelfths, ahead, shape) == pytest.approx(1 - released / probe["layers"])


LIVE = LOGS / "h200" / "29-live"
# At the offload config's 1e8 cap the peak was the loss's backward (2.28 GiB), predicted by backward's start at 2.31
# (+1.3%; 2.38 while a bucket was counted beside the output layer's weight that backward's first prefetch gathers);
# the first bucket's reduction had been predicted at 2.49 (+9.2%) while it counted the output layer's activations,
# which the reductions that follow that layer's backward no longer hold.
LIVE_MISSES: dict[str, float] = {}


def test_the_stage_3_timelines_peak_within_5_percent_of_the_prediction_at_every_prefetch_cap():
    """29-live's timelines on 2 and 4 rehearsed ranks: the offload config at 1e8, 5e8 and 1e9, and
    ds_config_stage3.json at 1e9, each its step 3's peak against rank_memory for its RESULT line's settings."""
    misses, judged = {}, []
    for log in sorted(LIVE.glob("*/timeline_*.txt")):
        tag = log.stem.removeprefix("timeline_")
        summary = log.parent / "timeline" / f"{tag}_summary.txt"
        lines = [json.loads(line[7:]) for line in log.read_text().splitlines() if line.startswith("RESULT ")]
        r = result.RankResult.from_dict(next(d for d in lines if d["rank"] == 0))
        # fp16's first steps skip on overflow: the original design's step 3 was its first applied, before which
        # Adam's states did not exist (a 7.21 GiB peak against 9.52, which its run.sh run, 9.66, holds)
        if r.run.stage != 3 or r.world_size < 2 or r.run.dtype != "bf16":
            continue
        peak = float(summary.read_text().split("peak ")[1].split(" GiB")[0]) * 2**30
        judged.append(f"{log.parent.name}/{tag}")
        finishing.add_predictions(r, result.shape_of(r), r.zero_config)
        if abs(r.predicted.peak / peak - 1) > PEAK_TOLERANCE:
            misses[tag] = round(r.predicted.peak / peak - 1, 3)
    # the 9 timelines less the 1-rank ones (offload_r1, offload350m_r1) and fp16's (original3_r4)
    assert judged == ["1-live/offload_r2", "1-live/offload_r4", "2-cap/offload_live1e8", "2-cap/offload_live5e8",
                      "2-cap/stage3_live1e9", "4-trace350m/offload350m_r2"]
    assert misses == LIVE_MISSES


# stage 3's reductions in backward at a 1e8 cap, as traced (the most between two events of which the second is
# __reduce_and_partition_ipg_grads, in the timeline's summary), against the moment that predicts them
REDUCTION_TRACES = {LIVE / "2-cap" / "timeline_offload_live1e8.txt": 2.24,
                    LOGS / "h200" / "35-trace" / "timeline_stage3_r8.txt": 3.45}


@pytest.mark.parametrize("log", REDUCTION_TRACES, ids=lambda p: p.stem)
def test_stage_3_reductions_in_backward_are_predicted_within_3_percent_of_the_trace(log):
    """After the output layer's backward: the weights gathered, the bucket's copies, the blocks' activations and the
    tied embedding's whole gradient (moments.scatter_bytes), on 2 ranks offloaded and on 8."""
    summary = (log.parent / "timeline" / f"{log.stem.removeprefix('timeline_')}_summary.txt").read_text()
    traced = max(float(line.split(" GiB")[0]) for line in summary.splitlines()[2:]
                 if "and _DeepSpeedZeroOptimizer_Stage3__reduce_and_partition_ipg_grads" in line)
    assert traced == REDUCTION_TRACES[log]
    lines = [json.loads(line[7:]) for line in log.read_text().splitlines() if line.startswith("RESULT ")]
    r = result.RankResult.from_dict(next(d for d in lines if d["rank"] == 0))
    shape = result.shape_of(r)
    m = rank_memory(r.run, shape, dataclasses.replace(finishing.counted(r, shape), shard=r.shards.local_param_elems),
                    r.zero_config, Seat(r.world_size))
    assert abs((m.held + m.gathered + m.scatter) / 2**30 / traced - 1) < 0.03


def committed(path, run):
    """The records of one run in a committed summary.json, by rank."""
    return [result.RankResult.from_dict(d) for d in json.loads((LOGS / path).read_text())["results"][run]]


def miss_with_todays_config(r):
    """The prediction's miss of a run without a recorded config, with its stage's config as it is today."""
    zero = json.loads(stages.config_path(r.run.stage).read_text())["zero_optimization"]
    finishing.add_predictions(r, result.shape_of(r), zero)
    return r.predicted.peak / training_peak(r) - 1


def test_stage_0_in_fp32_peaks_at_the_all_reduces_flat_copy_within_1_percent_on_2_h200s():
    """1.3b, checkpointing, micro batch 2: the flat copy of a 5e8-element bucket is 2.05 GB (8.9% of the peak).
    Stage 0 reads nothing of its config's zero_optimization section that the prediction uses."""
    [r, *_] = committed("h200x2/10-final/results/20261130-135408-BSt7/summary.json", "stage0")
    assert r.run.dtype == "fp32" and abs(miss_with_todays_config(r)) < 0.01


# Stage 1 at 4 rehearsed ranks without checkpointing peaked 0.69 GB above its backward's start as predicted, as
# stage 2 did (both 11,115,331,584 bytes). The run predates the loss taken in chunks: made again on today's code
# (31-suite/s1_r4_nock, predicted at 9.71 GiB before it ran) it peaked at 9.70, +0.03%, and the peak test holds it.
STAGE_1_2_MISSES = {"all-stages-4ranks stage1": -0.062}


def test_stages_1_and_2_are_predicted_within_5_percent_on_2_and_4_h200_ranks_but_one_named_miss():
    """Made with ds_config_stage1.json and ds_config_stage2.json as they are today: neither has changed since
    it was written (git log), before these runs. Stage 1 at 4 ranks was 18% over before its gradients were
    freed at the step and its partition copied beside them."""
    misses, covered = {}, 0
    for path in ("h200x2/stages0123-2gpus/summary.json", "h200/5-stages-offload-cap/all-stages-4ranks/summary.json"):
        for run in ("stage1", "stage2"):
            for r in committed(path, run):
                miss, covered = miss_with_todays_config(r), covered + 1
                if abs(miss) > PEAK_TOLERANCE:
                    misses[f"{Path(path).parent.name} {run}"] = round(miss, 3)
    assert covered == 2 * (2 + 4) and misses == STAGE_1_2_MISSES


@pytest.mark.parametrize("run", ["stage3_offload", "stage3_infinity"])
@pytest.mark.parametrize("path", ["h200/5-stages-offload-cap/offload-1rank/summary.json",
                                  "h200/5-stages-offload-cap/all-stages-4ranks/summary.json"])
def test_the_host_holds_the_offloaded_states_and_the_cpu_optimizers_fp32_gradients_within_1_percent(path, run):
    """Against the census of the host's tensors, its other tensors included (offload reads no zero setting that
    the host's figure uses). The processes' resident memory besides (the runtime, pinned staging, the CPU
    optimizer's temporaries) is not predicted."""
    for r in committed(path, run):
        c = r.shards
        shard = predict.shard_elems(r.run.stage, c.params_total, c.local_param_elems, r.world_size)
        m = rank_memory(r.run, None, Counts(c.params_total, shard=shard, persistent=c.persistent_elems), {},
                        Seat(r.world_size))
        host = r.host_state_breakdown
        assert m.host_states + m.host_buffers == pytest.approx(host.states + host.other, rel=0.01)


def test_only_ranks_rehearsed_over_gloo_copy_the_gathered_weights_at_the_step_end_of_stages_1_and_2():
    rehearsed, nccl = (rank_memory(run(2), None, Counts(PSI), {}, Seat(8, rehearsed=flag)) for flag in (True, False))
    assert rehearsed.regathered == 2 * PSI and nccl.regathered == 0
    assert rank_memory(run(3), None, Counts(PSI), {}, Seat(8, rehearsed=True)).regathered == 0


def test_stage_0_in_fp16_with_deepspeeds_adam_holds_two_fp32_copies_of_the_gradients_at_its_step():
    theirs, torchs = (rank_memory(run(0, dtype="fp16"), None, Counts(PSI), {}, Seat(2, deepspeed_adam=flag))
                      for flag in (True, False))
    assert theirs.transient == 8 * PSI and torchs.transient == 4 * PSI


# -----------------------------------------------------------------------------
# the host's peak resident set where stage 3 offloads its optimizer (issue 33)

def test_pinned_host_blocks_round_up_to_a_power_of_two():
    assert [host.pinned(n) for n in (0, 1, 1000, 1024, 1025)] == [0, 1, 1024, 1024, 2048]


def test_a_partition_steps_in_sub_groups_of_sub_group_size_and_the_rest():
    assert host.sub_groups(2.5e9, {"sub_group_size": 1e9}) == [1e9, 1e9, 0.5e9]
    assert host.sub_groups(0.6e9, {}) == [0.6e9]  # DeepSpeed's 1e9


def test_only_stage_3_with_its_optimizer_on_the_cpu_has_a_predicted_host_peak():
    shape, cpu = t.PRESETS["1.3b"], {"offload_optimizer": {"device": "cpu", "pin_memory": False}}
    assert host.host_peak_bytes(2, 2, 1, 1e9, cpu, shape, shape.params, False) is None
    assert host.host_peak_bytes(3, 2, 1, 1e9, {}, shape, shape.params, False) is None
    unpinned = host.host_peak_bytes(3, 2, 1, 1e9, cpu, shape, shape.params, False)
    assert unpinned == host.PROCESS_BYTES + (2 + 4 + 4 + 8) * 1e9 + host.FIRST_STEP_BYTES + 2 * 1e9
    pinned = {"offload_optimizer": {"device": "cpu", "pin_memory": True}}
    rounding = (2**31 - 2e9) + (2**32 - 4e9)  # the 16-bit gradients' 2 GB and the fp32 ones' 4 GB, pinned
    assert host.host_peak_bytes(3, 2, 1, 1e9, pinned, shape, shape.params, False) == unpinned + rounding


def test_offloaded_weights_are_pinned_flat_buffers_and_the_cached_blocks_of_zero_inits_own_partitions():
    shape = shapes.ModelShape(1, 1, 8, 64, 8, 0)  # matrices: embedding 512, positions 64, a block's 192, 64, 256, 256
    pinned = {"offload_param": {"device": "cpu", "pin_memory": True}, "stage3_param_persistence_threshold": 32}
    flat = 4096 + 256  # the matrices' 1344 elements and the vectors' 120 in bf16, each rounded up to a power of two
    own = 1024 + 128 + 512 + 128 + 512 + 512 + 1024  # each matrix's, and the output layer's built before tying
    assert host.offloaded_weights_bytes(2, 1, pinned, shape) == flat + own
    unpinned = {**pinned, "offload_param": {"device": "cpu", "pin_memory": False}}
    assert host.offloaded_weights_bytes(2, 1, unpinned, shape) == flat
    assert host.offloaded_weights_bytes(2, 1, {}, shape) == 0


def test_offloaded_weights_take_the_steps_update_in_place_and_nvme_is_not_predicted():
    shape, cpu = t.PRESETS["1.3b"], {"offload_optimizer": {"device": "cpu", "pin_memory": False}}
    infinity = {**cpu, "offload_param": {"device": "cpu", "pin_memory": False}}
    weights = host.offloaded_weights_bytes(2, 1, infinity, shape)
    assert host.host_peak_bytes(3, 2, 1, 1e9, infinity, shape, shape.params, False) == (
        host.host_peak_bytes(3, 2, 1, 1e9, cpu, shape, shape.params, False) - 2 * 1e9 + weights)
    nvme = {**cpu, "offload_param": {"device": "nvme"}}
    assert host.host_peak_bytes(3, 2, 1, 1e9, nvme, shape, shape.params, False) is None


def test_offloading_the_weights_too_adds_them_to_the_resident_set_once_the_engine_is_ready_within_1_percent():
    """36-step-time's two runs and 38-step-time2's 8zcB, where 3_infinity and 3_offload ran with the same settings:
    the process's peak resident set when the engine was ready, one less the other, is the offloaded weights (7.454
    to 7.455 GB, 7.455 predicted), the rest of the host's memory being alike."""
    pairs = 0
    for summary in sorted(LOGS.glob("h200/3[68]-step-time*/**/summary.json")):
        results = json.loads(summary.read_text())["results"]
        runs = {name: result.RankResult.from_dict(ranks[0]) for name, ranks in results.items()}
        if {"stage3_infinity", "stage3_offload"} <= set(runs):
            r, offload = runs["stage3_infinity"], runs["stage3_offload"]
            added = r.memory_at_start.host_peak_rss_bytes - offload.memory_at_start.host_peak_rss_bytes
            predicted = host.offloaded_weights_bytes(predict.WIDTH[r.run.dtype], 1, r.zero_config, result.shape_of(r))
            assert predicted == pytest.approx(added, rel=0.01), summary
            pairs += 1
    assert pairs == 3


def test_the_host_peak_of_every_committed_offload_run_is_within_5_percent_of_its_prediction():
    """1.3b on 1, 2 and 4 ranks (the constants fitted on 1 rank; at micro batch 2 and 16 in 36-step-time, run after
    this test: 28.31 and 28.32 GiB against 28.34), 350m on 1 and 2, 2.7b on 1 and 2 (predicted
    before it ran: 57.19 GB, 57.22 measured), 38-step-time2's offloaded runs at micro batch 2, 8 and 16 (run after this
    test), and the timelines' runs at prefetch caps of 1e8 and 5e8. Issue 33
    asks 10%; at 5%, leaving out the pinned blocks' rounding or gloo's staging fails it. Parameter offload
    (ds_config_stage3_infinity.json, 36-step-time and 38-step-time2, five runs): 36.35 to 36.37 GB against 35.89
    (-1.3%), where the weights' pinned buffers (offloaded_weights_bytes) were left out at 30.43 (-16.3%)."""
    timelines = ((log, result.RankResult.from_dict(json.loads(line[len("RESULT "):])))
                 for log in sorted(LOGS.glob("h200/**/timeline_*.txt"))
                 for line in log.read_text(errors="replace").splitlines() if line.startswith("RESULT "))
    found = {}
    for path, r in (*records(LOGS), *timelines):
        predicted = theory.predicted_host_peak(r) if r.peaks.host_peak_rss_bytes and r.steps else None
        if predicted:
            found[(str(path.relative_to(LOGS)), Path(r.run.config).stem, r.rank)] = (
                predicted / r.peaks.host_peak_rss_bytes - 1)
    # 36-step-time's two offloaded runs, 38-step-time2's three, 39-hf's Llama, 40-heldout's 350m, 41-hf-rest's Qwen
    # and Mistral, 42-infinity-rehearsed's 350m on 2 ranks and 1.3b on 4, h100/4-offload-step's and
    # 8-offload-step's 1.3b and 2.7b on one rank, and h200/46-families' Phi-3 and 47-offload-step's 1.3b among them
    assert len({run for run, _, _ in found}) == 38
    assert len(found) == 63
    assert {run: round(miss, 3) for run, miss in found.items() if abs(miss) > PEAK_TOLERANCE} == {}


@pytest.mark.parametrize("model, stage, world", [("tiny", 1, 257), ("350m", 2, 13), ("1.3b", 1, 8), ("2.7b", 2, 100)])
def test_the_rank_that_holds_the_most_is_among_the_telling_ranks(model, stage, world):
    shape, zero = t.PRESETS[model], json.loads(stages.config_path(stage).read_text())["zero_optimization"]

    def peak(rank):
        return rank_memory(run(stage, micro_batch=2, seq=1024, checkpoint=True), shape, Counts.of_shape(shape), zero,
                           Seat(world, rank)).peak
    telling = memory.telling_ranks(stage, "deepspeed", world, shape.params, shape, NO_OFFLOAD)
    assert max(map(peak, telling)) == max(map(peak, range(world)))


def test_where_every_rank_holds_alike_rank_0_stands_for_them_and_elsewhere_a_few_ranks_for_many():
    shape = t.PRESETS["1.3b"]
    assert len(memory.telling_ranks(1, "deepspeed", 2**20, shape.params, shape, NO_OFFLOAD)) < 1000
    assert memory.telling_ranks(3, "deepspeed", 2**20, shape.params, shape, NO_OFFLOAD) == [0]
    assert memory.telling_ranks(1, "deepspeed", 8, shape.params, shape, {"optimizer": "cpu", "param": None}) == [0]
