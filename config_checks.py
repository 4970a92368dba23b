"""
The DeepSpeed config as DeepSpeed itself reads it, checked before any process group starts: keys it does not
know, what its config classes refuse, and what it would assert on only once the model and engine are built.
Bad input is an options.BadInput, whose message is the one line the user sees. train_gpt.py alone imports this
module: it loads DeepSpeed, and with it torch, which train_gpt.py loads anyway.
"""
import difflib
import functools
import sys
import typing

import pydantic
import torch
from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS, DeepSpeedConfig
from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

from options import BadInput


# deepspeed.initialize reads these itself, to build its device mesh; DeepSpeedConfig reads them only when a
# process group is up, so the probe in deepspeed_keys() never sees them
READ_BY_INITIALIZE = {"sequence_parallel_size", "data_parallel_size"}
# the optimizer names that DeepSpeed builds as its CPU Adam or CPU Lion when the optimizer is offloaded
# (DeepSpeedEngine._configure_basic_optimizer), the only optimizers it lets ZeRO-Offload step
CPU_OPTIMIZERS = ("adam", "adamw", "lion")


@functools.cache
def deepspeed_keys():
    """The top-level keys DeepSpeed knows."""
    # Noted as DeepSpeedConfig asks a minimal config for each key it reads: in 0.19.8 it is no pydantic model whose
    # fields could be listed, and its *constants.py files mix nested keys ("enabled", "type") with top-level ones
    # and lack others ("compile", "hybrid_engine", "wandb"), so neither would give the set that it reads.
    asked = set()

    class Noting(dict):
        def __contains__(self, key):
            asked.add(key)
            return super().__contains__(key)

        def __getitem__(self, key):
            asked.add(key)
            return super().__getitem__(key)

        def get(self, key, default=None):
            asked.add(key)
            return super().get(key, default)

        def keys(self):  # `key in config.keys()` then asks through __contains__
            return self

    DeepSpeedConfig(Noting(train_micro_batch_size_per_gpu=1))
    return frozenset(asked | READ_BY_INITIALIZE)


def pydantic_models():
    """pydantic's model classes. DeepSpeed before 0.15.0 (PR #5167) builds its configs on pydantic 1's API, which
    pydantic 2 keeps as pydantic.v1, loaded by such a DeepSpeed: their fields have the same names, aliases and
    annotations, listed in __fields__ instead of model_fields."""
    return tuple(m.BaseModel for m in (pydantic, sys.modules.get("pydantic.v1")) if m)


def fields(model):
    """{name: field} of a DeepSpeed pydantic config, on pydantic 2's API or pydantic 1's."""
    return model.model_fields if issubclass(model, pydantic.BaseModel) else model.__fields__


def model_keys(model):
    """The keys a DeepSpeed pydantic config accepts: its fields' names and their aliases."""
    return {name for name in fields(model)} | {f.alias for f in fields(model).values() if f.alias}


def submodel(field):
    """The pydantic config a field holds (Optional unwrapped), or None."""
    for kind in (field.annotation, *typing.get_args(field.annotation)):
        if isinstance(kind, type) and issubclass(kind, pydantic_models()):
            return kind
    return None


def refuse_unknown(section, known, path, where):
    for key in section:
        if key not in known:
            near = difflib.get_close_matches(key, known, n=1)
            raise BadInput(f"config{where}: {path}{key} is not a key that DeepSpeed knows"
                           + (f" (did you mean {near[0]}?)" if near else ""))


def refuse_unknown_in_model(section, model, path, where):
    """A section that a DeepSpeed pydantic config reads, and each of its sections that another one reads."""
    refuse_unknown(section, model_keys(model), path, where)
    for name, field in fields(model).items():
        inner = submodel(field)
        for key in {name, field.alias} & section.keys():
            if inner and isinstance(section[key], dict):
                refuse_unknown_in_model(section[key], inner, f"{path}{key}.", where)


def refuse_unknown_keys(config, where):
    """DeepSpeed ignores a top-level key it does not know, so a misspelt section would silently be left out
    (a misspelt zero_optimization trains stage 0); pydantic refuses one inside zero_optimization, without
    saying what was meant."""
    refuse_unknown(config, deepspeed_keys(), "", where)
    zero = config.get("zero_optimization")
    if isinstance(zero, dict):
        refuse_unknown_in_model(zero, DeepSpeedZeroConfig, "zero_optimization.", where)


def deepspeed_config(config, micro_batch, where):
    """DeepSpeed's own reading of the config, whose pydantic and assertion errors become one line; one rank's
    batch stands for all, as no process group has started."""
    try:
        return DeepSpeedConfig({**config, "train_batch_size": micro_batch})
    except Exception as e:  # noqa: BLE001 -- pydantic and assertion errors alike
        raise BadInput(f"config{where}: DeepSpeed refuses it: " + " ".join(str(e).split())) from None


def nvme_has_a_path(ds, where):
    """Offload to NVMe swaps to files under nvme_path: without one, zero.Init asserts on every rank (parameters)
    and ZeRO-3 joins None to a folder name (the optimizer)."""
    zero = ds.zero_config
    for name, offload in (("offload_param", zero.offload_param), ("offload_optimizer", zero.offload_optimizer)):
        if offload is not None and offload.device == "nvme" and offload.nvme_path is None:
            raise BadInput(f'config{where}: zero_optimization.{name} offloads to NVMe but gives no "nvme_path", '
                           "the folder on the NVMe drive to swap to")


def offload_has_a_cpu_optimizer(ds, where):
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


def refuse_what_the_build_would(ds, where):
    """What DeepSpeed asserts on only while it builds the model and the engine, found in its reading of the config."""
    nvme_has_a_path(ds, where)
    if "max_grad_norm" in (ds.optimizer_params or {}):  # DeepSpeedConfig warns; building the optimizer raises
        raise BadInput(f"config{where}: optimizer.params.max_grad_norm is refused by DeepSpeed when it builds the "
                       "optimizer: use the top-level gradient_clipping instead")
    offload_has_a_cpu_optimizer(ds, where)


def known_optimizer(name):
    """DeepSpeed builds its own optimizers by name and, for any other name, torch.optim's class of that name."""
    return name.lower() in DEEPSPEED_OPTIMIZERS or isinstance(getattr(torch.optim, name, None), type)
