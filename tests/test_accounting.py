"""The arithmetic behind the predictions and checks, on made-up counts: no launch, no GPU needed."""
from argparse import Namespace

import pytest
import torch

import train_gpt as t

PSI, G = 1_000_000, 4  # parameters, ranks


def paper(stage, psi=PSI, g=G):
    """The ZeRO paper's model states per rank for mixed-precision Adam (K = 12)."""
    return {0: 16 * psi, 1: 4 * psi + 12 * psi / g, 2: 2 * psi + 14 * psi / g, 3: 16 * psi / g}[stage]


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_predicted_states_are_the_papers_formulas(stage):
    shard = t.shard_elems(stage, {"params_total": PSI, "local_param_elems": PSI // G}, G)
    assert sum(t.predicted_states(stage, "bf16", PSI, shard, 0).values()) == pytest.approx(paper(stage))


def test_stage3_adds_whole_copies_of_persistent_parameters():
    states = t.predicted_states(3, "bf16", PSI, PSI // G, persistent=1000)
    assert states["params"] == 2 * (PSI // G + 1000)


def test_in_fp32_stage0_has_no_master_copy_and_stage3_has_one():
    assert sum(t.predicted_states(0, "fp32", PSI, PSI, 0).values()) == 16 * PSI
    assert sum(t.predicted_states(3, "fp32", PSI, PSI // G, 0).values()) == 20 * (PSI // G)


def test_offloading_the_optimizer_moves_its_gradients_weights_and_moments_to_the_host():
    assert t.host_kinds({"optimizer": None, "param": None}) == []
    assert t.host_kinds({"optimizer": "cpu", "param": None}) == ["grads", "master", "moments"]
    assert t.host_kinds({"optimizer": "cpu", "param": "cpu"}) == ["grads", "master", "moments", "params"]
    assert t.offload_devices({"offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "none"}}) == \
        {"optimizer": "cpu", "param": None}


def record(stage, world=G, offload=None, other=0):
    shards = {"params_total": PSI, "local_param_elems": PSI // world if stage == 3 else PSI,
              "persistent_elems": 0, "largest_param_elems": PSI // 10}
    return {**shards, "world_size": world, "ranks_per_node": world, "stage": stage,
            "offload": offload or {"optimizer": None, "param": None}, "model_state_breakdown": {"other": other},
            "deepspeed_estimate": None}


def args(stage, checkpoint=False, dtype="bf16"):
    return Namespace(stage=stage, dtype=dtype, model="1.3b", micro_batch=2, seq=1024, checkpoint=checkpoint)


def test_on_a_gpu_an_offloaded_optimizer_is_predicted_in_host_memory():
    r = record(3, offload={"optimizer": "cpu", "param": None})
    figures = t.predict_memory(r, args(3), torch.device("cuda"), {})
    assert figures["predicted_model_state_bytes"] == 2 * (PSI // G)  # the bf16 shards of the weights
    assert figures["predicted_host_state_bytes"] == (2 + 4 + 8) * (PSI // G)
    assert figures["step_transient_bytes"] == 0  # the step runs on the host


def test_without_gpus_device_and_host_are_one_memory():
    r = record(3, offload={"optimizer": "cpu", "param": "cpu"})
    figures = t.predict_memory(r, args(3), torch.device("cpu"), {})
    assert figures["predicted_host_state_bytes"] == 0
    assert figures["predicted_model_state_bytes"] == 16 * (PSI // G)


def test_the_peak_estimate_adds_the_larger_of_activations_and_the_steps_fp32_gradients():
    r = record(0, world=1, other=123)
    figures = t.predict_memory(r, args(0), torch.device("cuda"), {})
    assert figures["step_transient_bytes"] == 4 * PSI
    busiest = max(figures["activation_estimate_bytes"], figures["step_transient_bytes"])
    assert figures["predicted_peak_bytes"] == 16 * PSI + 123 + busiest


def test_checkpointing_keeps_far_fewer_activations_and_fp32_doubles_them():
    layers, heads, d_model, vocab = t.PRESETS["1.3b"][:4]
    full = t.activation_bytes(args(0), layers, heads, d_model, vocab, flash=True)
    checkpointed = t.activation_bytes(args(0, checkpoint=True), layers, heads, d_model, vocab, flash=True)
    def logits(width):  # the logits and their gradient whole, one chunk of the loss in fp32
        return (3 * width * 2048 + 16 * t.LOSS_CHUNK) * 50304
    assert (checkpointed - logits(2)) < (full - logits(2)) / 8
    fp32 = t.activation_bytes(args(0, dtype="fp32"), layers, heads, d_model, vocab, flash=True)
    assert fp32 - logits(4) == pytest.approx(2 * (full - logits(2)))


def test_the_loss_taken_in_chunks_equals_the_cross_entropy_of_all_logits():
    torch.manual_seed(0)
    model = t.GPT(*t.PRESETS["tiny"][:5])
    idx, targets = torch.randint(0, 256, (3, 200)), torch.randint(0, 256, (3, 200))  # 600 rows: 3 chunks
    logits = model.lm_head(model.ln_f(model.blocks[1](model.blocks[0](model.wte(idx) + model.wpe(torch.arange(200))))))
    whole = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
    assert model(idx, targets).item() == pytest.approx(whole.item(), rel=1e-6)


def test_deepspeeds_estimator_has_none_for_stage0_and_counts_host_memory_per_node():
    r = record(3)
    assert t.deepspeed_estimate(0, r, 4, 1, r["offload"]) is None
    one = t.deepspeed_estimate(3, r, 4, 1, {"optimizer": "cpu", "param": None})
    two = t.deepspeed_estimate(3, r, 4, 2, {"optimizer": "cpu", "param": None})
    assert two["host_per_node"] == pytest.approx(one["host_per_node"] / 2, rel=0.01)


def whole(stage):
    return t.predicted_states(stage, "bf16", PSI, PSI, 0)


def held(stage, params, grads, optimizer):
    """Made-up held shares, turned into bytes the way predicted_states counts them."""
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
    shard = t.shard_elems(stage, {"params_total": PSI, "local_param_elems": PSI // G}, G)
    promised = t.shares(t.predicted_states(stage, "bf16", PSI, shard, 0), whole(stage))
    measured = t.shares(held(stage, *shares), whole(stage))
    assert t.partition_check(measured, promised, stage, {"params_total": PSI, "largest_param_elems": PSI // 100}) is ok


def test_with_parameters_offloaded_the_persistent_ones_are_predicted_on_the_gpu():
    r = {**record(3, offload={"optimizer": "cpu", "param": "cpu"}), "persistent_elems": 1000}
    figures = t.predict_memory(r, args(3), torch.device("cuda"), {})
    assert figures["predicted_model_state_bytes"] == 2 * 1000
    assert figures["predicted_host_state_bytes"] == sum(figures["predicted_breakdown"].values()) - 2 * 1000


def test_differences_name_the_kind_and_its_cause():
    r = {**record(1), "mem_kind": "cpu_rss"}
    r["predicted_breakdown"] = t.predicted_states(1, "bf16", PSI, PSI / G, 0)
    r["model_state_breakdown"] = {**held(1, 1.0, 0.3, 0.25), "other": 0}
    [line] = t.differences(r)
    assert line.startswith("model states: grads -") and "stage 1 also reduces the gradients" in line


def test_differences_explain_a_gpu_peak_far_from_its_estimate():
    r = {**record(3), "mem_kind": "cuda", "peak_mem_bytes": 3 * 2**30, "predicted_peak_bytes": 2**30,
         "activation_estimate_bytes": 2**29, "step_transient_bytes": 2**28}
    r["predicted_breakdown"] = t.predicted_states(3, "bf16", PSI, PSI // G, 0)
    r["model_state_breakdown"] = {**r["predicted_breakdown"], "other": 0}
    [line] = t.differences(r)
    assert line.startswith("peak: 3.00 GiB measured against 1.00 GiB estimated")


@pytest.mark.parametrize("stage, offload, adds", [
    (3, None, ["2 bytes per partition element (18 where the paper counts 16)", "largest layer (100,000 elements)"]),
    (1, None, ["4 bytes per partition element (18 where the paper counts 14): fp32 gradients"]),
    (3, {"optimizer": "cpu", "param": "cpu"}, ["largest layer (100,000 elements)"]),
])
def test_differences_say_what_deepspeeds_estimator_adds(stage, offload, adds):
    r = {**record(stage, offload=offload), "mem_kind": "cuda", "model_state_bytes": 10 * 2**20,
         "deepspeed_estimate": {"device": 12 * 2**20, "host_per_node": 0}}
    [line] = t.estimator_gap(r)
    assert line.startswith("DeepSpeed's estimator: 12.0 MiB against 10.0 MiB measured: it adds ")
    assert all(a in line for a in adds)
    assert ("bytes per partition element" in line) == (offload is None) and ("largest layer" in line) == (stage == 3)


def test_an_estimate_within_10_percent_needs_no_explanation():
    r = {**record(3), "mem_kind": "cuda", "model_state_bytes": 10 * 2**20,
         "deepspeed_estimate": {"device": 10.5 * 2**20, "host_per_node": 0}}
    assert t.estimator_gap(r) == []


def test_out_of_memory_covers_gpu_and_capped_cpu_allocations():
    assert t.out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert t.out_of_memory(RuntimeError("CUDA error: out of memory"))
    assert t.out_of_memory(RuntimeError("[enforce fail] DefaultCPUAllocator: can't allocate memory: you tried to ..."))
    assert not t.out_of_memory(RuntimeError("Connection closed by peer"))


def test_a_runs_peaks_are_the_largest_of_its_steps_and_of_its_start():
    # the H200 offload runs once reported the host RSS after engine start instead of the steps' larger one
    steps = [{"step": i, "loss": 1.0, "time_s": 0.5, "peak_mem_bytes": 10 * i, "peak_reserved_bytes": 20 * i,
              "host_peak_rss_bytes": 30 * i} for i in (1, 2, 3)]
    result = {"steps": steps, "world_size": 1, "gpus": 1, "model_state_breakdown": {"other": 0},
              "peak_mem_bytes": 5, "peak_reserved_bytes": 100, "host_peak_rss_bytes": 40}
    t.summarize(result, Namespace(micro_batch=2, seq=8), flops_per_token=1, peak=None)
    assert (result["peak_mem_bytes"], result["peak_reserved_bytes"], result["host_peak_rss_bytes"]) == (30, 100, 90)
