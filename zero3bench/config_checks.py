"""
The DeepSpeed config as DeepSpeed itself reads it, checked before any process group starts: keys it does not
know, what its config classes refuse, and what it would assert on only once the model and engine are built.
Bad input is an options.BadInput, whose message is the one line the user sees. train_gpt.py alone imports this
module: it loads DeepSpeed, and with it torch, which train_gpt.py loads anyway.
"""
import copy
import difflib
import functools
import inspect
import json
import math
import sys
import typing
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import pydantic
import torch
from deepspeed.runtime import lr_schedules
from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS, DeepSpeedConfig
from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

from zero3bench.options import BadInput


# deepspeed.initialize reads these itself, to build its device mesh; DeepSpeedConfig reads them only when a
# process group is up, so the probe in deepspeed_keys() never sees them
READ_BY_INITIALIZE = {"sequence_parallel_size", "data_parallel_size"}
# the optimizer names that DeepSpeed builds as its CPU Adam or CPU Lion when the optimizer is offloaded
# (DeepSpeedEngine._configure_basic_optimizer), the only optimizers it lets ZeRO-Offload step
CPU_OPTIMIZERS = ("adam", "adamw", "lion")


def read_config(path: Path) -> dict[str, Any]:
    """The DeepSpeed config file as a dict."""
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise BadInput(f"config not found: {path}") from None
    except IsADirectoryError:
        raise BadInput(f"config {path} is a directory, not a file") from None
    except PermissionError:
        raise BadInput(f"config {path} cannot be read: permission denied") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadInput(f"config {path} is not valid JSON: {e}") from None
    except OSError as e:
        raise BadInput(f"config {path} cannot be read: {e.strerror}") from None
    if not isinstance(config, dict):
        raise BadInput(f"config {path} is not a JSON object")
    return config


@functools.cache
def deepspeed_reads() -> dict[str, Any]:
    """{top-level key: the default DeepSpeed reads it with, or None} for each key it knows."""
    # Noted as DeepSpeedConfig asks a minimal config for each key it reads: in 0.19.8 it is no pydantic model whose
    # fields could be listed, and its *constants.py files mix nested keys ("enabled", "type") with top-level ones
    # and lack others ("compile", "hybrid_engine", "wandb"), so neither would give the set that it reads.
    asked: dict[Any, Any] = {}  # DeepSpeed asks by str; `in` takes any object

    class Noting(dict):
        def __contains__(self, key: object) -> bool:
            asked.setdefault(key, None)
            return super().__contains__(key)

        def __getitem__(self, key: str) -> Any:
            asked.setdefault(key, None)
            return super().__getitem__(key)

        def get(self, key: str, default: Any = None) -> Any:
            asked[key] = default
            return super().get(key, default)

        def keys(self) -> "Noting":  # `key in config.keys()` then asks through __contains__
            return self

    DeepSpeedConfig(Noting(train_micro_batch_size_per_gpu=1))
    return asked


def deepspeed_keys() -> frozenset[str]:
    """The top-level keys DeepSpeed knows."""
    return frozenset(deepspeed_reads().keys() | READ_BY_INITIALIZE)


def pydantic_models() -> tuple[type, ...]:
    """pydantic's model classes. DeepSpeed before 0.15.0 (PR #5167) builds its configs on pydantic 1's API, which
    pydantic 2 keeps as pydantic.v1, loaded by such a DeepSpeed: their fields have the same names, aliases and
    annotations, listed in __fields__ instead of model_fields."""
    return tuple(m.BaseModel for m in (pydantic, sys.modules.get("pydantic.v1")) if m)


def fields(model: type[Any]) -> dict[str, Any]:
    """{name: field} of a DeepSpeed pydantic config, on pydantic 2's API or pydantic 1's."""
    return model.model_fields if issubclass(model, pydantic.BaseModel) else model.__fields__


def model_keys(model: type[Any]) -> set[str]:
    """The keys a DeepSpeed pydantic config accepts: its fields' names and their aliases."""
    return {name for name in fields(model)} | {f.alias for f in fields(model).values() if f.alias}


def submodel(field: Any) -> type | None:
    """The pydantic config a field holds (Optional unwrapped), or None."""
    for kind in (field.annotation, *typing.get_args(field.annotation)):
        if isinstance(kind, type) and issubclass(kind, pydantic_models()):
            return kind
    return None


def refuse_unknown(section: dict[str, Any], known: Collection[str], path: str, where: str) -> None:
    for key in section:
        if key not in known:
            near = difflib.get_close_matches(key, known, n=1)
            raise BadInput(f"config{where}: {path}{key} is not a key that DeepSpeed knows"
                           + (f" (did you mean {near[0]}?)" if near else ""))


def refuse_unknown_in_model(section: dict[str, Any], model: type[Any], path: str, where: str) -> None:
    """A section that a DeepSpeed pydantic config reads, and each of its sections that another one reads."""
    refuse_unknown(section, model_keys(model), path, where)
    for name, field in fields(model).items():
        inner = submodel(field)
        for key in {name, field.alias} & section.keys():
            if inner and isinstance(section[key], dict):
                refuse_unknown_in_model(section[key], inner, f"{path}{key}.", where)


def refuse_unknown_keys(config: dict[str, Any], where: str) -> None:
    """DeepSpeed ignores a top-level key it does not know, so a misspelt section would silently be left out
    (a misspelt zero_optimization trains stage 0); pydantic refuses one inside zero_optimization, without
    saying what was meant."""
    refuse_unknown(config, deepspeed_keys(), "", where)
    zero = config.get("zero_optimization")
    if isinstance(zero, dict):
        refuse_unknown_in_model(zero, DeepSpeedZeroConfig, "zero_optimization.", where)


# "auto" is what Hugging Face's DeepSpeed templates leave for its Trainer to fill in from its own arguments and the
# model (transformers.integrations.deepspeed.HfTrainerDeepSpeedConfig); DeepSpeed drops it from its pydantic
# sections, for their defaults, and takes it as it is elsewhere ("auto" > 1.0 fails at step 1). One rule for
# each: what train_gpt.py sets itself reads as absent, what HF works out from the model's width is worked out
# here the same way, and a training choice the config must make is refused with what to write.
AS_ABSENT = {"train_micro_batch_size_per_gpu": "--micro-batch, else 2", "train_batch_size": "the micro batch x ranks",
             "gradient_accumulation_steps": "1", "optimizer.params.lr": "--lr, else the preset's",
             "steps_per_print": "train_gpt.py prints every step itself"}
FROM_THE_WIDTH = {"zero_optimization.reduce_bucket_size": ("d_model²", lambda d: d * d),
                  "zero_optimization.stage3_prefetch_bucket_size": ("0.9 d_model²", lambda d: int(0.9 * d * d)),
                  "zero_optimization.stage3_param_persistence_threshold": ("10 d_model", lambda d: 10 * d)}
WRITE_INSTEAD = {
    "gradient_clipping": "the largest gradient norm, such as 1.0 (Hugging Face's default max_grad_norm), or 0 for none",
    "optimizer.params.betas": "[0.9, 0.95], the betas of train_gpt.py's own AdamW",
    "optimizer.params.eps": "1e-8, AdamW's default", "optimizer.params.weight_decay": "0.1, as train_gpt.py's AdamW",
    "scheduler.params.warmup_min_lr": "0", "scheduler.params.warmup_max_lr": "the peak rate",
    "scheduler.params.warmup_num_steps": "a number of steps",
    "scheduler.params.total_num_steps": "the run's steps (--steps)",
    "fp16.enabled": "true or false", "bf16.enabled": "true or false"}


def leaves(section: dict[str, Any], path: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, value) of each value in a config that is not an object."""
    for key, value in section.items():
        if isinstance(value, dict):
            yield from leaves(value, f"{path}{key}.")
        else:
            yield f"{path}{key}", value


def quoted_number(value: object) -> bool:
    try:
        return isinstance(value, str) and math.isfinite(float(value))
    except ValueError:
        return False


def built_defaults(config: dict[str, Any], section: str) -> dict[str, Any]:
    """{parameter: its default, or its annotation where that is a number's} of the class that the config's
    optimizer (a torch.optim class of that name) or scheduler (DeepSpeed's lr_schedules) section builds."""
    name = str((config.get(section) or {}).get("type", ""))
    module = torch.optim if section == "optimizer" else lr_schedules
    built = next((c for n, c in vars(module).items() if n.lower() == name.lower() and isinstance(c, type)), None)
    if built is None:
        return {}
    return {n: p.annotation if p.annotation in (int, float) else p.default
            for n, p in inspect.signature(built).parameters.items() if p.default is not p.empty}


def expected_kind(config: dict[str, Any], path: str) -> tuple[type | tuple[type, ...] | None, str | None]:
    """What a value must be, from DeepSpeed's default for a top-level key that it reads as it is (gradient_clipping's
    1.0, prescale_gradients' false) or the built class's for an optimizer's or scheduler's parameter; or None."""
    section, _, name = path.rpartition(".params.")
    built = section in ("optimizer", "scheduler")
    default = built_defaults(config, section).get(name) if built else deepspeed_reads().get(path)
    if isinstance(default, bool) or default is bool:
        return bool, "true or false"
    if default in (int, float) or isinstance(default, (int, float)):
        return (int, float), "a number"
    if isinstance(default, tuple):
        return list, "a list of numbers"
    return None, None


def refuse_mistyped(config: dict[str, Any], path: str, value: Any, where: str) -> None:
    """A number in quotes anywhere, and a value of another kind than the one its reader takes."""
    if quoted_number(value):
        raise BadInput(f'config{where}: {path} is the string "{value}": write the number {value}, without quotes')
    # DeepSpeed clips nothing at NaN or below 0, where FSDP2's peer (clip_grad_norm_) would turn the gradients
    # round or into NaN; Python's json reads NaN and Infinity
    if path == "gradient_clipping" and type(value) in (int, float) and not 0 <= value < math.inf:
        raise BadInput(f"config{where}: gradient_clipping is {json.dumps(value)}: write {WRITE_INSTEAD[path]}")
    kind, name = expected_kind(config, path)
    if kind and (not isinstance(value, kind) or kind != bool and isinstance(value, bool)
                 or kind == list and not all(isinstance(x, (int, float)) for x in value)):
        raise BadInput(f"config{where}: {path} must be {name}, not {json.dumps(value)}")


def resolve_auto(config: dict[str, Any], path: str, d_model: int, where: str) -> str:
    """One "auto" of config resolved in place, and how; or BadInput, saying what to write."""
    *outer, key = path.split(".")
    section = functools.reduce(dict.__getitem__, outer, config)
    if path in AS_ABSENT:
        del section[key]
        return f"{path} as absent ({AS_ABSENT[path]})"
    if path in FROM_THE_WIDTH:
        formula, value = FROM_THE_WIDTH[path]
        section[key] = value(d_model)
        return f"{path} {section[key]:,} ({formula}, as Hugging Face's Trainer sets it)"
    raise BadInput(f'config{where}: {path} is "auto", which only Hugging Face\'s Trainer fills in: write '
                   + WRITE_INSTEAD.get(path, "the value that DeepSpeed should read"))


def from_other_tools(config: dict[str, Any], d_model: int, where: str) -> tuple[dict[str, Any], str]:
    """A config, perhaps written for Hugging Face's Trainer, as train_gpt.py can take it: keys DeepSpeed knows, each
    "auto" resolved or refused, no number in quotes. Returns the config and a note for the check's line that says
    how each "auto" was read, or ""."""
    refuse_unknown_keys(config, where)
    config = copy.deepcopy(config)
    resolved = [resolve_auto(config, path, d_model, where) if value == "auto"
                else refuse_mistyped(config, path, value, where) for path, value in list(leaves(config))]
    read = [line for line in resolved if line]
    return config, f'; "auto" read as: {", ".join(read)}' if read else ""


def deepspeed_config(config: dict[str, Any], micro_batch: int, where: str) -> DeepSpeedConfig:
    """DeepSpeed's own reading of the config, whose pydantic and assertion errors become one line; one rank's
    batch stands for all, as no process group has started."""
    try:
        return DeepSpeedConfig({**config, "train_batch_size": micro_batch})
    except Exception as e:  # noqa: BLE001 -- pydantic and assertion errors alike
        raise BadInput(f"config{where}: DeepSpeed refuses it: " + " ".join(str(e).split())) from None


def nvme_has_a_path(ds: DeepSpeedConfig, where: str) -> None:
    """Offload to NVMe swaps to files under nvme_path: without one, zero.Init asserts on every rank (parameters)
    and ZeRO-3 joins None to a folder name (the optimizer)."""
    zero = ds.zero_config
    for name, offload in (("offload_param", zero.offload_param), ("offload_optimizer", zero.offload_optimizer)):
        if offload is not None and offload.device == "nvme" and offload.nvme_path is None:
            raise BadInput(f'config{where}: zero_optimization.{name} offloads to NVMe but gives no "nvme_path", '
                           "the folder on the NVMe drive to swap to")


def offload_has_a_cpu_optimizer(ds: DeepSpeedConfig, where: str) -> None:
    """ZeRO-Offload steps the optimizer on the host, and DeepSpeed refuses any optimizer there but its CPU Adam
    or CPU Lion unless zero_force_ds_cpu_optimizer is false."""
    offload = ds.zero_config.offload_optimizer
    if offload is None or offload.device == "none" or not ds.zero_force_ds_cpu_optimizer:
        return
    torch_adam = (ds.optimizer_params or {}).get("torch_adam", False)
    if ds.optimizer_name in CPU_OPTIMIZERS and not torch_adam:
        return
    given = ("has no optimizer section, so train_gpt.py would give it torch's AdamW" if ds.optimizer_name is None
             else f"has optimizer.type {ds.optimizer_name}" + (" with params.torch_adam" if torch_adam else ""))
    raise BadInput(f"config{where} offloads the optimizer to {offload.device}, where DeepSpeed steps only its own "
                   f"CPU Adam or CPU Lion, but {given}: name Adam, AdamW or Lion in an optimizer section, or set "
                   "zero_force_ds_cpu_optimizer to false")


def refuse_what_the_build_would(ds: DeepSpeedConfig, where: str) -> None:
    """What DeepSpeed asserts on only while it builds the model and the engine, found in its reading of the config."""
    nvme_has_a_path(ds, where)
    if "max_grad_norm" in (ds.optimizer_params or {}):  # DeepSpeedConfig warns; building the optimizer raises
        raise BadInput(f"config{where}: optimizer.params.max_grad_norm is refused by DeepSpeed when it builds the "
                       "optimizer: use the top-level gradient_clipping instead")
    offload_has_a_cpu_optimizer(ds, where)


def known_optimizer(name: str) -> bool:
    """DeepSpeed builds its own optimizers by name and, for any other name, torch.optim's class of that name."""
    return name.lower() in DEEPSPEED_OPTIMIZERS or isinstance(getattr(torch.optim, name, None), type)
