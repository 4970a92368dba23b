"""
A Hugging Face causal language model from its config (--model PATH): the config read and checked before anything
starts (one line where it cannot be used); its shape (accounting.shapes.ModelShape, which the accounting and plan.py
read) read off the config and the model that transformers builds on the meta device, without weights, every field
from what they say, never from the family's name, and what it keeps for backward counted there (zero3bench/saved.py);
and the model built by transformers as it builds one under ZeRO-3: from_config, with HfDeepSpeedConfig alive, so that
zero.Init partitions each parameter as its module is built. transformers and accelerate (which HfDeepSpeedConfig
needs) are imported here alone, and only for such a model: the GPT runs without them.
"""
import collections
import contextlib
import json
import math
import warnings
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from zero3bench import saved
from zero3bench.accounting.shapes import PRESETS, ModelShape, Tensors
from zero3bench.options import BadInput

BUNDLED = Path(__file__).resolve().parent.parent / "configs" / "models"  # --model NAME: configs/models/NAME.json
INSTALL = "pip install -r requirements-hf.txt"
# transformers 5.17 to 5.22 initialise a model under ZeRO-3 module by module, each with its own weights gathered and
# its children's left partitioned: an init that a module gives a child's weight (GPT-2's scaled c_proj) writes into
# an empty shard and draws nothing, so stage 3 trains another model than stage 0 (5.23.0 gathers the children's too)
OLDEST = "5.23.0"
CONTEXTS = ("max_position_embeddings", "max_seq_len")  # the longest sequence, as families name it (MPT the second)
ATTENTION = "sdpa"  # PyTorch's scaled_dot_product_attention: flash kernels on a GPU in 16 bits, as model.py's GPT
CAUSAL_HEADS = ("ForCausalLM", "LMHeadModel", "WithLMHead")


def config_path(model: str | None) -> Path | None:
    """The config.json that --model names: a bundled name, a file, or a folder that holds one; None for a preset."""
    if model is None or model in PRESETS:
        return None
    path = BUNDLED / f"{model}.json" if (BUNDLED / f"{model}.json").is_file() else Path(model)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        presets = ", ".join(PRESETS)
        raise BadInput(f"--model {model}: no such preset ({presets}), bundled config (configs/models/) or config.json")
    return path


def read_config(path: Path) -> dict[str, Any]:
    """The config's fields, refused where they are no causal language model's config that can be built here."""
    where = f"--model {path}"
    try:
        d = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadInput(f"{where}: not a readable JSON config ({type(e).__name__}: {str(e).splitlines()[0]})") from None
    if not isinstance(d, dict):
        raise BadInput(f"{where}: a config is a JSON object, not {type(d).__name__}")
    if "peft_type" in d or {"base_model_name_or_path", "r"} <= d.keys():
        raise BadInput(f"{where}: an adapter's config ({d.get('peft_type', 'PEFT')}), not a model's: give the "
                       f"config.json of its base model ({d.get('base_model_name_or_path', 'base_model_name_or_path')})")
    if "model" in d and ({"added_tokens", "normalizer", "pre_tokenizer"} & d.keys()):
        raise BadInput(f"{where}: a tokenizer (tokenizer.json), not a model's config.json")
    if "auto_map" in d:
        raise BadInput(f"{where}: needs code from the model's folder (auto_map), which this benchmark never runs")
    if not isinstance(d.get("model_type"), str):
        raise BadInput(f"{where}: no model_type: not a Hugging Face model config")
    if d.get("quantization_config"):
        # from_config builds the model unquantized: its training here would be another model's, 2 to 4 times larger
        method = d["quantization_config"].get("quant_method", "") if isinstance(d["quantization_config"], dict) else ""
        raise BadInput(f"{where}: a quantized model's config (quantization_config{f': {method}' if method else ''}), "
                       "which this benchmark would train unquantized in 16 or 32 bits: remove quantization_config to "
                       "measure the unquantized model")
    return d


def transformers_config(d: dict[str, Any], path: Path) -> Any:
    """transformers' config for the fields d, checked to describe a decoder-only causal language model of sizes that
    make sense."""
    transformers = importable(path)
    from transformers.models.auto import modeling_auto
    where, kind = f"--model {path}", d["model_type"]
    if kind not in transformers.CONFIG_MAPPING:
        raise BadInput(f"{where}: model_type {kind!r} is not one that transformers {transformers.__version__} knows")
    architecture = modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(kind, "")
    # GPT-2's head is GPT2LMHeadModel; a ...ForConditionalGeneration in this mapping is a vision-language model, and
    # BERT's and RoBERTa's causal heads are an encoder's (they have a masked one too)
    if (not architecture.endswith(CAUSAL_HEADS) or kind in modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES
            or d.get("is_encoder_decoder")):
        raise BadInput(f"{where}: model_type {kind!r} is not a decoder-only causal language model")
    try:
        with quiet():
            config = transformers.AutoConfig.for_model(**d)
    except Exception as e:  # noqa: BLE001 -- a config's own validators raise their own kinds (huggingface_hub's)
        # the cause is on the last line of a validator's message
        raise BadInput(f"{where}: transformers cannot read it: {str(e).strip().splitlines()[-1].strip()}") from None
    check_sizes(config, where)
    config.use_cache = False  # training: no key/value cache
    return config


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """transformers' own warnings and log lines off while a config is read and a model built on the meta device, so
    that a refusal is one line and a count says nothing."""
    import transformers
    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        transformers.logging.set_verbosity(level)


def importable(path: Path) -> Any:
    try:
        import accelerate  # noqa: F401 -- HfDeepSpeedConfig needs it
        import transformers
    except ImportError as e:
        raise BadInput(f"--model {path} needs transformers and accelerate ({e.name} is missing): {INSTALL}") from None
    from packaging.version import Version  # transformers' own dependency
    if Version(transformers.__version__) < Version(OLDEST):
        raise BadInput(f"--model {path} needs transformers {OLDEST} or newer, not {transformers.__version__}, which "
                       f"builds some models under ZeRO-3 with other weights than at stage 0: {INSTALL}")
    return transformers


def check_sizes(config: Any, where: str) -> None:
    """The sizes that every causal language model has, and those that some have where they are set (transformers
    builds 0 or a negative one, or fails on it in an op of its own)."""
    sizes = {n: getattr(config, n, None) for n in ("num_hidden_layers", "hidden_size", "num_attention_heads",
                                                     "vocab_size")}
    if (text := config.get_text_config()) is not config:  # a multimodal family's (Llama 4's): it trains its text model
        raise BadInput(f"{where}: model_type {config.model_type!r} keeps its sizes in text_config: give that as a "
                       f"config of its own (model_type {text.model_type!r})")
    if sizes["num_attention_heads"] is None:
        raise BadInput(f"{where}: no num_attention_heads in model_type {config.model_type!r}: a model without "
                       "attention (a state-space one: Mamba, RWKV) is not one this benchmark counts")
    optional = {name: getattr(config, name, None) for name in ("head_dim", *CONTEXTS)}
    for name, value in {**sizes, **{k: v for k, v in optional.items() if v is not None}}.items():
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            raise BadInput(f"{where}: {name} must be a whole number of at least 1, not {value!r}")
    heads = sizes["num_attention_heads"]
    kv = getattr(config, "num_key_value_heads", None) or heads
    if getattr(config, "head_dim", None) is None and sizes["hidden_size"] % heads:
        raise BadInput(f"{where}: {heads} attention heads do not divide hidden_size {sizes['hidden_size']}")
    if not isinstance(kv, int) or kv < 1 or heads % kv:
        raise BadInput(f"{where}: num_key_value_heads {kv!r} does not divide {heads} attention heads")


def decoder_layers(model: Any, layers: int) -> list[Any]:
    """The model's blocks: its modules of the class that transformers keeps whole (_no_split_modules), else, where
    the family names none (BioGPT, CTRL, OpenAI GPT), its one list of `layers` modules of a class."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    blocks = [m for m in model.modules() if type(m).__name__ in names] if names else listed_blocks(model, layers)
    if len(blocks) != layers:
        found = ", ".join(sorted(names)) or f"none named, nor one list of {layers} modules of a class"
        raise BadInput(f"--model: found {len(blocks)} decoder layers ({found}), not the config's {layers}")
    return blocks


def listed_blocks(model: Any, layers: int) -> list[Any]:
    """The model's one list of `layers` modules of a class; none where it has more than one such list."""
    lists = [list(m) for m in model.modules()
             if type(m).__name__ == "ModuleList" and len(m) == layers and len({type(b) for b in m}) == 1]
    return lists[0] if len(lists) == 1 else []


def layer_class(model: Any) -> type:
    return type(decoder_layers(model, model.config.num_hidden_layers)[0])


def causal_class(config: Any) -> type:
    """The class that from_config builds for the config: the family's causal language model."""
    from transformers.models.auto import modeling_auto
    return modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]


def attention(config: Any) -> str:
    """ATTENTION where the family implements it, else transformers' own ("eager"; Bloom and MPT, say)."""
    return ATTENTION if getattr(causal_class(config), "_supports_sdpa", False) else "eager"


def model_is_tied(model: Any) -> bool:
    out = model.get_output_embeddings()
    return out is not None and out.weight is model.get_input_embeddings().weight


UNSET_CONTEXT = 2048  # the default run's sequence where a config names no context (ALiBi's Bloom)


def nearest_rate(params: int) -> float:
    """The learning rate of the GPT preset nearest in parameters, on a log scale (shapes.PRESETS says why each)."""
    return min(PRESETS.values(), key=lambda s: abs(math.log(s.params / params))).lr


def meta_model(config: Any, dtype: Any = None) -> Any:
    """The model as transformers builds it, on the meta device (no weights), in dtype, quiet."""
    import torch
    import transformers
    try:
        with quiet(), torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype,
                                                                  attn_implementation=attention(config))
    except Exception as e:  # noqa: BLE001 -- a family's constructor checks its own fields with its own errors
        raise BadInput(f"--model: transformers cannot build it: {type(e).__name__}: "
                       f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}") from None
    return model


def counted_tensors(model: Any, blocks: list[Any]) -> Tensors:
    """The model's tensors, counted once each (a tied embedding is one), in the order its parameters come: the
    first block's, every tensor's in the two decay groups, and the root's."""
    one = [p.numel() for p in blocks[0].parameters()]
    block = (tuple(n for n, p in zip(one, blocks[0].parameters()) if p.dim() >= 2),
             tuple(n for n, p in zip(one, blocks[0].parameters()) if p.dim() < 2))
    every = list(model.parameters())
    groups = (tuple(p.numel() for p in every if p.dim() >= 2), tuple(p.numel() for p in every if p.dim() < 2))
    return Tensors(block, groups, sum(map(sum, groups)) - len(blocks) * sum(one))


def no_empty_tensor(model: Any) -> None:
    """A size of 0 (an MLP width, a head's, experts) builds tensors of no elements, which train nothing."""
    for name, p in model.named_parameters():
        if p.numel() == 0:
            raise BadInput(f"--model: transformers builds {name} of shape {list(p.shape)}, no elements: a size of "
                           "the config is 0")


def parts(block: Any) -> tuple[Any, Any]:
    """A block's attention (its child module whose class transformers names ...Attention) and its MLP (its largest
    other child), either None where there is none."""
    children = list(block.children())
    attention = next((m for m in children if type(m).__name__.endswith("Attention")), None)
    others = [m for m in children if m is not attention]
    mlp = max(others, key=lambda m: sum(p.numel() for p in m.parameters()), default=None)
    return attention, mlp


def heads_of(config: Any, attention: Any) -> tuple[int, int]:
    """Key/value heads and one head's width, as the attention module holds them (transformers' attributes), else as
    the config says."""
    heads = config.num_attention_heads
    groups = getattr(attention, "num_key_value_groups", None)
    kv = heads // groups if groups else (getattr(attention, "num_kv_heads", None)
                                        or getattr(config, "num_key_value_heads", None) or heads)
    head = (getattr(attention, "head_dim", None) or getattr(attention, "head_size", None)
            or getattr(config, "head_dim", None) or config.hidden_size // heads)
    return kv, head


def mlp_of(mlp: Any, d: int) -> tuple[str, int | None, int]:
    """The MLP's kind, inner width and experts, from its matrices: each has the model's width on one side and an
    inner width on the other (an expert's, where they are stacked in 3-D tensors, whose first size is the experts).
    Gated, where one inner width has three matrices (gate, up, down), or one twice another (gate and up fused)."""
    matrices = [tuple(p.shape) for p in (mlp.parameters() if mlp is not None else []) if p.dim() >= 2]
    stacked = [s for s in matrices if len(s) == 3 and d in s[1:]]
    widths = collections.Counter((s[-1] if s[-2] == d else s[-2]) for s in (stacked or matrices))
    gated = any(n >= 3 or 2 * w in widths for w, n in widths.items())
    inner = min((w for w, n in widths.items() if n >= 2 or 2 * w in widths), default=None)
    return ("gated" if gated else "plain"), inner, (stacked[0][0] if stacked else 0)


def norm_of(model: Any, blocks: list[Any]) -> tuple[str, int]:
    """The final norm's kind and its vectors: the module outside the blocks whose class names a norm."""
    inside = {id(m) for b in blocks for m in b.modules()}
    norms = [m for m in model.modules() if id(m) not in inside and type(m).__name__.endswith("Norm")]
    if not norms:
        return "layernorm", 0
    final = norms[-1]
    kind = "rmsnorm" if "RMS" in type(final).__name__.upper() else "layernorm"
    return kind, sum(1 for _ in final.parameters(recurse=False))


def positions_of(model: Any) -> str:
    """Learned (an embedding besides the tokens'), rotary (a module that makes them) or none (ALiBi's biases)."""
    tokens = model.get_input_embeddings()
    embeddings = [m for m in model.modules() if type(m).__name__.endswith("Embedding") and m is not tokens
                  and any(True for _ in m.parameters(recurse=False))]
    if embeddings:
        return "learned"
    return "rope" if any("Rotary" in type(m).__name__ for m in model.modules()) else "none"


def dropout_of(model: Any) -> float:
    """The largest dropout that training applies: the Dropout modules', and the probabilities that modules keep for
    a functional dropout of their own (attention's, OPT's blocks')."""
    found = [getattr(m, "p", 0.0) for m in model.modules() if type(m).__name__ == "Dropout"]
    found += [v for m in model.modules() for k, v in vars(m).items()
              if k.endswith(("dropout", "pdrop")) and isinstance(v, float)]
    return max(found, default=0.0)


def window_of(config: Any) -> int | None:
    """The sliding window, where some layer has one: the config's, unless it is switched off or no layer type
    slides."""
    window, types = getattr(config, "sliding_window", None), getattr(config, "layer_types", None)
    if not isinstance(window, int) or getattr(config, "use_sliding_window", True) is False:
        return None
    if types is not None and "sliding_attention" not in types:
        return None
    if window < 1:
        raise BadInput(f"--model: sliding_window {window}: a window of attention sees at least 1 token")
    return window


def experts_of(config: Any, experts: int) -> int:
    """The experts each token is routed to (num_experts_per_tok), checked against the experts built."""
    top_k = getattr(config, "num_experts_per_tok", None) or 0
    if experts and not 1 <= top_k <= experts:
        raise BadInput(f"--model: num_experts_per_tok {top_k!r} routes each token to none or more than the "
                       f"{experts} experts")
    return top_k if experts else 0


def shape_of(config: Any) -> ModelShape:
    """The model's shape, read off its config and the model built on the meta device; what it keeps for backward
    not yet counted (counted_at)."""
    model = meta_model(config)
    no_empty_tensor(model)
    blocks = decoder_layers(model, config.num_hidden_layers)
    tensors, attention, d = counted_tensors(model, blocks), parts(blocks[0])[0], config.hidden_size
    # the MLP of the block with the most experts (DeepSeek's first blocks are dense), else the first block's
    kind, inner, experts = max((mlp_of(parts(b)[1], d) for b in blocks), key=lambda mlp: mlp[2])
    (kv, head), (norm, vectors) = heads_of(config, attention), norm_of(model, blocks)
    bias = any(getattr(m, "bias", None) is not None for b in blocks for m in b.modules()
               if getattr(getattr(m, "weight", None), "dim", lambda: 0)() >= 2)
    return ModelShape(layers=config.num_hidden_layers, heads=config.num_attention_heads, d_model=d,
                      vocab=config.vocab_size, lr=nearest_rate(sum(map(sum, tensors.groups))),
                      context=next(filter(None, (getattr(config, name, None) for name in CONTEXTS)), UNSET_CONTEXT),
                      kv_heads=kv, ffn=inner, mlp=kind, tied=model_is_tied(model), norm_kind=norm,
                      positions=positions_of(model), bias=bias, vocab_multiple=1, tensors=tensors, head_dim=head,
                      norm_vectors=vectors, experts=experts, top_k=experts_of(config, experts),
                      window=window_of(config), dropout=dropout_of(model), saved=(), parallel=None)


def counted_at(config: Any, shape: ModelShape, seq: int, dtype: str, on_gpu: bool) -> ModelShape:
    """The shape with what its model keeps for backward counted at seq, in dtype, on a GPU or a CPU, and whether
    its block is a parallel one, as the counted forward shows it (saved.counted); where that forward cannot run on
    the meta device, neither, and why (not_counted)."""
    import torch
    width = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    model = meta_model(config, width)
    with quiet():
        blocks = decoder_layers(model, config.num_hidden_layers)
        switch = (lambda on: checkpointing(model, on)) if can_checkpoint(config) else None
        try:
            count, parallel = saved.counted(model, blocks, seq, dtype, on_gpu, switch, parts(blocks[0]))
        except saved.Uncountable as e:
            return replace(shape, saved=(), not_counted=str(e))
    return replace(shape, saved=(*(shape.saved or ()), count), not_counted="", parallel=parallel)


def build(config: Any, dtype: Any, zero3_config: dict[str, Any] | None, device: Any,
          checkpoint: bool) -> tuple[Any, Any]:
    """The model, built by transformers in dtype with random weights: at stage 3 with HfDeepSpeedConfig alive, so that
    from_config builds it inside zero.Init and initialises each module gathered, as it does for from_pretrained; else
    on the device. Gradient checkpointing through the model's own switch. Returns the model and the
    HfDeepSpeedConfig, which must outlive the build (transformers holds it by a weak reference)."""
    import transformers
    from transformers.integrations import HfDeepSpeedConfig
    from transformers.initialization import no_init_weights
    keep = HfDeepSpeedConfig(zero3_config) if zero3_config else None
    if keep:
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype,
                                                              attn_implementation=attention(config))
    else:
        # as from_config builds under ZeRO-3: the constructors' own init skipped, then each module's, so that every
        # stage draws the same weights for a seed (the constructors' draws would move the generator first)
        with device, no_init_weights():
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype,
                                                                  attn_implementation=attention(config))
        model.init_weights()
    checkpointing(model, checkpoint)
    return model, keep


def can_checkpoint(config: Any) -> bool:
    """Whether transformers can checkpoint the family's activations (its supports_gradient_checkpointing)."""
    return bool(getattr(causal_class(config), "supports_gradient_checkpointing", False))


def check_checkpointing(config: Any, on: bool, model: str) -> None:
    """A run or a plan with checkpointing on, refused for a family that transformers cannot checkpoint."""
    if on and not can_checkpoint(config):
        raise BadInput(f"--model {model}: transformers cannot checkpoint {causal_class(config).__name__}'s "
                       "activations (supports_gradient_checkpointing is False): give --no-checkpoint")


def checkpointing(model: Any, on: bool) -> None:
    """The model's own activation checkpointing, non-reentrant, on or off."""
    if on:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    elif model.is_activation_checkpointing:
        model.activation_checkpointing_disable()


def built_by() -> str:
    import transformers
    return f"transformers {transformers.__version__}"
