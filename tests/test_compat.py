"""Features that an older stack lacks are skipped in one line, never a crash: each is taken away here from the
newest stack, where all are there."""
import sys
from types import SimpleNamespace
from typing import Optional

import pytest
import torch
from deepspeed.runtime.engine import DeepSpeedEngine

from zero3bench import compat, config_checks, fsdp2, machine, options
from conftest import assert_refused
from zero3bench.options import BadInput


def a_run(**settings):
    return options.Run(**{"stage": 3, "engine": "deepspeed", "model": "tiny", "config": "ds_config_stage3.json",
                          "dtype": "bf16", "micro_batch": 2, "seq": 256, "steps_planned": 3, "lr": 1e-3, "warmup": 0,
                          "seed": 0, "checkpoint": True, "compile": False, "deepcompile": False, "max_mem_gib": None,
                          "timeout_s": 120.0, **settings})


def test_the_newest_stack_has_every_feature():
    assert fsdp2.missing() is None
    assert compat.has_engine_compile() and compat.has_deepcompile() and compat.has_leaf_modules()
    assert compat.profiler_options() == {"acc_events": True}
    assert compat.fused_adamw(torch.device("cpu"))
    assert compat.degrade(a_run(), {}, torch.device("cpu"))[2] == []


def test_a_torch_without_fully_shard_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.distributed.fsdp", None)  # its import now fails
    assert "FSDP2 (torch.distributed.fsdp.fully_shard) needs torch >= 2.6" in fsdp2.missing()


def test_fsdp2_on_a_torch_without_it_is_refused_in_one_line(check, monkeypatch):
    monkeypatch.setattr(fsdp2, "missing", lambda: "FSDP2 (torch.distributed.fsdp.fully_shard) needs torch >= 2.6")
    assert_refused(check("--engine", "fsdp2"), "--engine fsdp2: FSDP2", "needs torch >= 2.6")


def test_compile_without_engine_compile_is_skipped_in_one_line(monkeypatch):
    monkeypatch.delattr(DeepSpeedEngine, "compile")
    run, _, [line] = compat.degrade(a_run(compile=True), {}, torch.device("cpu"))
    assert not run.compile
    assert line.startswith("--compile skipped: DeepSpeed's engine.compile() needs DeepSpeed >= 0.14.4; this is ")


def test_deepcompile_without_deepcompile_is_skipped_in_one_line(monkeypatch):
    monkeypatch.delattr(DeepSpeedEngine, "is_deepcompile_enabled")
    config = {"compile": {"deepcompile": True, "other": 1}}
    run, config, [line] = compat.degrade(a_run(compile=True, deepcompile=True), config, torch.device("cpu"))
    assert line.startswith("DeepCompile skipped: it needs DeepSpeed >= 0.16.6")
    assert not run.deepcompile and run.compile and config["compile"] == {"other": 1}


def test_unfused_adamw_and_whole_linears_are_said_in_one_line_each(monkeypatch):
    monkeypatch.setattr(compat, "fused_adamw", lambda device: False)
    monkeypatch.delattr("deepspeed.utils.set_z3_leaf_modules")
    run, _, [unfused, leaves] = compat.degrade(a_run(), {}, torch.device("cpu"))
    assert not run.fused_adamw and not run.leaf_modules
    assert unfused.startswith("torch's AdamW steps unfused: its fused kernel runs on cpu from torch 2.4")
    assert leaves.startswith("ZeRO-3 gathers each Linear, not each block: deepspeed.utils.set_z3_leaf_modules needs")


def test_a_profiler_without_acc_events_is_asked_without_it(monkeypatch):
    monkeypatch.setattr(torch.profiler, "profile", lambda activities=None, record_shapes=False: None)
    assert compat.profiler_options() == {}


def test_deepcompile_active_is_what_deepspeed_says_or_unknown():
    assert compat.deepcompile_active(SimpleNamespace(is_deepcompile_active=lambda: True)) is True
    assert compat.deepcompile_active(SimpleNamespace(is_deepcompile_active=lambda: False)) is False
    assert compat.deepcompile_active(SimpleNamespace()) is None  # DeepSpeed before 0.18.0 cannot say


def test_a_deepspeed_config_on_pydantic_1s_api_has_its_unknown_keys_refused():
    """DeepSpeed before 0.15.0 builds its configs on pydantic 1's API (pydantic.v1), nested ones and aliases too."""
    from pydantic import v1

    class Offload(v1.BaseModel):
        device: str = "none"

    class Zero(v1.BaseModel):
        stage: int = 0
        offload_param: Optional[Offload] = v1.Field(None, alias="cpu_offload_param_config")

    config_checks.refuse_unknown_in_model({"stage": 3, "cpu_offload_param_config": {"device": "cpu"}}, Zero,
                                          "zero_optimization.", "")
    with pytest.raises(BadInput, match=r"zero_optimization\.offload_param\.devic is not .* \(did you mean device\?\)"):
        config_checks.refuse_unknown_in_model({"offload_param": {"devic": "cpu"}}, Zero, "zero_optimization.", "")


# -----------------------------------------------------------------------------
# fp16 without ZeRO: DeepSpeed's engine.backward leaves the loss unscaled, its FP16 optimizers unscale at the step

def an_fp16_engine(zero=False, fp16=True, scale=1024.0):
    """An engine as machine.loss_for_backward reads it: ZeRO's optimizers keep the scale as cur_scale, DeepSpeed's
    16-bit optimizers without ZeRO in loss_scale_config."""
    from deepspeed.runtime.base_optimizer import ZeROOptimizer
    if zero:
        optimizer = object.__new__(type("ZeRO", (ZeROOptimizer,), {}))
        optimizer.cur_scale = scale
    else:
        optimizer = SimpleNamespace(loss_scale_config=SimpleNamespace(cur_scale=scale))
    return SimpleNamespace(optimizer=optimizer, fp16_enabled=lambda: fp16)


def test_without_zero_an_fp16_loss_is_scaled_before_backward_as_its_step_expects():
    engine = an_fp16_engine()
    assert machine.loss_for_backward(engine, torch.tensor(2.0)).item() == 2048.0
    assert machine.loss_scale(engine) == 1024.0
    assert "DeepSpeed PR #8393" in machine.unscaled_fp16_backward(engine)


@pytest.mark.parametrize("engine", [an_fp16_engine(zero=True), an_fp16_engine(fp16=False), SimpleNamespace()],
                         ids=["zero", "bf16", "fsdp2"])
def test_zero_s_optimizers_and_other_precisions_leave_the_loss_to_engine_backward(engine):
    assert machine.loss_for_backward(engine, torch.tensor(2.0)).item() == 2.0
    assert machine.unscaled_fp16_backward(engine) == ""


def test_a_deepspeed_newer_than_those_read_is_left_to_scale_the_loss_itself(monkeypatch):
    monkeypatch.setattr(machine, "FP16_BACKWARD_UNSCALED", machine.leaves_fp16_loss_unscaled("0.19.9"))
    assert machine.loss_for_backward(an_fp16_engine(), torch.tensor(2.0)).item() == 2.0
