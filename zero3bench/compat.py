"""
What the installed PyTorch and DeepSpeed can do, asked of them (not of their version strings, where a feature
can be asked for), so that one benchmark runs on every tested pair (requirements-oldest.txt to
requirements.txt). A feature that the stack lacks is skipped with one line that says which version brings it;
each entry says when it can go. FSDP2's own check is fsdp2.missing(), which needs torch alone.
"""
from __future__ import annotations

import inspect
import json
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import deepspeed
import torch
from deepspeed.runtime.engine import DeepSpeedEngine

from zero3bench.stages import shards_params

if TYPE_CHECKING:
    from zero3bench import fsdp2
    from zero3bench.options import Run

# torch.OutOfMemoryError from torch 2.5; before it, torch.cuda's (the same class since)
OutOfMemoryError = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError


def fused_adamw(device: torch.device) -> bool:
    """Whether torch's fused AdamW steps tensors on this device: CUDA's from torch 2.0, a CPU's from 2.4. Its
    constructor refuses a device that it cannot step."""
    try:
        torch.optim.AdamW([torch.zeros(1, device=device, requires_grad=True)], fused=True)
    except RuntimeError:
        return False
    return True


def profiler_options() -> dict[str, Any]:
    """torch.profiler keeps the events of a profile that has no schedule when asked with acc_events, from
    torch 2.4 on; before it, it kept them without being asked."""
    return {"acc_events": True} if "acc_events" in inspect.signature(torch.profiler.profile).parameters else {}


def has_engine_compile() -> bool:
    # DeepSpeed 0.14.4's own: the engine also inherits torch.nn.Module.compile, which is not DeepSpeed's
    return "compile" in vars(DeepSpeedEngine)


def has_deepcompile() -> bool:
    return hasattr(DeepSpeedEngine, "is_deepcompile_enabled")  # DeepSpeed 0.16.6


def has_leaf_modules() -> bool:
    return hasattr(deepspeed.utils, "set_z3_leaf_modules")  # DeepSpeed 0.13.0


def deepcompile_active(engine: DeepSpeedEngine | fsdp2.Engine) -> bool | None:
    """Whether DeepCompile compiled this engine, as DeepSpeed 0.18.0 on says; None where DeepSpeed cannot say.
    The config alone does not tell: on 0.16.6 to 0.18.3 DeepSpeed's check of the torch version quietly turns it
    off for torch 2.7.1 and for builds named like 2.7.0+cu126."""
    ask = getattr(engine, "is_deepcompile_active", None)
    return bool(ask()) if callable(ask) else None


def zero_config(engine: DeepSpeedEngine | fsdp2.Engine) -> dict[str, Any] | None:
    """The zero_optimization section as DeepSpeed read it, its defaults filled in and named as in a config file;
    None for FSDP2, or where DeepSpeed keeps it elsewhere. Pydantic 2 dumps it with model_dump, 1 with dict."""
    section = getattr(getattr(engine, "_config", None), "zero_config", None)
    if section is None:
        return None
    dump = getattr(section, "model_dump", None) or section.dict
    return json.loads(json.dumps(dump(by_alias=True), default=str))


def degrade(run: Run, config: dict[str, Any], device: torch.device) -> tuple[Run, dict[str, Any], list[str]]:
    """Skip what this stack cannot do, each with one line that says so. Returns the run and the config as they
    will train (compile, deepcompile, fused_adamw and leaf_modules, and the config's compile section), and the
    lines."""
    lines, stack = [], f"this is DeepSpeed {deepspeed.__version__} with torch {torch.__version__}"
    if run.deepcompile and not has_deepcompile():
        run = replace(run, deepcompile=False)
        config = {**config, "compile": {k: v for k, v in config["compile"].items() if k != "deepcompile"}}
        lines.append(f"DeepCompile skipped: it needs DeepSpeed >= 0.16.6; {stack}")
    if run.compile and run.engine == "deepspeed" and not has_engine_compile():
        run = replace(run, compile=False)
        lines.append(f"--compile skipped: DeepSpeed's engine.compile() needs DeepSpeed >= 0.14.4; {stack}")
    run = replace(run, fused_adamw=fused_adamw(device), leaf_modules=has_leaf_modules())
    if not run.fused_adamw and "optimizer" not in config:
        lines.append(f"torch's AdamW steps unfused: its fused kernel runs on {device.type} from torch "
                     f"{'2.4' if device.type == 'cpu' else '2.0'}; {stack}")
    if shards_params(run.stage) and run.engine == "deepspeed" and not run.deepcompile and not run.leaf_modules:
        lines.append("ZeRO-3 gathers each Linear, not each block: deepspeed.utils.set_z3_leaf_modules needs "
                     f"DeepSpeed >= 0.13.0; {stack}")
    return run, config, lines
