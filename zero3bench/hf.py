"""
A Hugging Face causal language model from its config (--model PATH): the config read and checked before anything
starts (one line where it cannot be used), its shape counted on the meta device, without weights
(accounting.shapes.ModelShape, which the accounting and plan.py read), and the model built by transformers as it
builds one under ZeRO-3: from_config, with HfDeepSpeedConfig alive, so that zero.Init partitions each parameter as
its module is built. transformers and accelerate (which HfDeepSpeedConfig needs) are imported here alone, and only
for such a model: the GPT runs without them.
"""
import json
import math
from pathlib import Path
from typing import Any

from zero3bench.accounting.shapes import PRESETS, ModelShape, Tensors
from zero3bench.options import BadInput

BUNDLED = Path(__file__).resolve().parent.parent / "configs" / "models"  # --model NAME: configs/models/NAME.json
INSTALL = "pip install -r requirements-hf.txt"
# The families whose decoder layer is Llama's (RMSNorms, attention with grouped keys and values and rotary positions,
# a gated SiLU MLP): predict.py's block of saved tensors is theirs, as tests/test_hf.py counts it on each. Another
# family's activations are not predicted, nor its peak.
LLAMA_LAYER = ("llama", "mistral", "qwen2")
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
        config = transformers.AutoConfig.for_model(**d)
    except Exception as e:  # noqa: BLE001 -- a config's own validators raise their own kinds (huggingface_hub's)
        # the cause is on the last line of a validator's message
        raise BadInput(f"{where}: transformers cannot read it: {str(e).strip().splitlines()[-1].strip()}") from None
    check_sizes(config, where)
    config.use_cache = False  # training: no key/value cache
    return config


def importable(path: Path) -> Any:
    try:
        import accelerate  # noqa: F401 -- HfDeepSpeedConfig needs it
        import transformers
    except ImportError as e:
        raise BadInput(f"--model {path} needs transformers and accelerate ({e.name} is missing): {INSTALL}") from None
    return transformers


def check_sizes(config: Any, where: str) -> None:
    sizes = {name: getattr(config, name, None) for name in
             ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")}
    for name, value in sizes.items():
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            raise BadInput(f"{where}: {name} must be a whole number of at least 1, not {value!r}")
    heads = sizes["num_attention_heads"]
    kv = getattr(config, "num_key_value_heads", None) or heads
    if getattr(config, "head_dim", None) is None and sizes["hidden_size"] % heads:
        raise BadInput(f"{where}: {heads} attention heads do not divide hidden_size {sizes['hidden_size']}")
    if not isinstance(kv, int) or kv < 1 or heads % kv:
        raise BadInput(f"{where}: num_key_value_heads {kv!r} does not divide {heads} attention heads")


def counted_tensors(model: Any, layers: int) -> tuple[Tensors, bool]:
    """The model's tensors, counted once each (a tied embedding is one), in the order its parameters come: one
    block's, every tensor's in the two decay groups, and the root's; and whether its blocks are alike."""
    blocks = decoder_layers(model, layers)
    one = [p.numel() for p in blocks[0].parameters()]
    block = (tuple(n for n, p in zip(one, blocks[0].parameters()) if p.dim() >= 2),
             tuple(n for n, p in zip(one, blocks[0].parameters()) if p.dim() < 2))
    every = list(model.parameters())
    groups = (tuple(p.numel() for p in every if p.dim() >= 2), tuple(p.numel() for p in every if p.dim() < 2))
    alike = all([p.numel() for p in b.parameters()] == one for b in blocks)
    return Tensors(block, groups, sum(map(sum, groups)) - layers * sum(one)), alike


def decoder_layers(model: Any, layers: int) -> list[Any]:
    """The model's blocks: its modules of the class that transformers keeps whole (_no_split_modules)."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if len(blocks) != layers:
        raise BadInput(f"--model: found {len(blocks)} decoder layers ({', '.join(sorted(names)) or 'none named'}), "
                       f"not the config's {layers}")
    return blocks


def layer_class(model: Any) -> type:
    return type(decoder_layers(model, model.config.num_hidden_layers)[0])


def nearest_rate(params: int) -> float:
    """The learning rate of the GPT preset nearest in parameters, on a log scale (shapes.PRESETS says why each)."""
    return min(PRESETS.values(), key=lambda s: abs(math.log(s.params / params))).lr


def attention(config: Any) -> str:
    """ATTENTION where the family implements it, else transformers' own ("eager"; Bloom and MPT, say)."""
    from transformers.models.auto import modeling_auto
    return ATTENTION if getattr(modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING[type(config)], "_supports_sdpa",
                                False) else "eager"


def shape_of(config: Any) -> ModelShape:
    """The model's shape, its tensors counted on the meta device: no weights are made."""
    import torch
    import transformers
    try:
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attention(config))
    except Exception as e:  # noqa: BLE001 -- a family's constructor checks its own fields with its own errors
        raise BadInput(f"--model: transformers cannot build it: {type(e).__name__}: "
                       f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}") from None
    d, heads = config.hidden_size, config.num_attention_heads
    tensors, alike = counted_tensors(model, config.num_hidden_layers)
    head = getattr(config, "head_dim", None) or d // heads
    known = (config.model_type in LLAMA_LAYER and alike and head * heads == d
             and getattr(config, "hidden_act", "silu") == "silu" and not drops_out(config))
    params = sum(map(sum, tensors.groups))
    return ModelShape(layers=config.num_hidden_layers, heads=heads, d_model=d, vocab=config.vocab_size,
                      context=getattr(config, "max_position_embeddings", None) or 2048, lr=nearest_rate(params),
                      kv_heads=getattr(config, "num_key_value_heads", None) or heads,
                      ffn=getattr(config, "intermediate_size", None), mlp="gated", tied=model_is_tied(model),
                      norm_kind="rmsnorm", positions="rope", bias=False, vocab_multiple=1, tensors=tensors,
                      activations_known=known)


def drops_out(config: Any) -> bool:
    """Whether any dropout of the config is on: its masks are activations that activations.py does not count."""
    return any(isinstance(v, (int, float)) and v > 0 for k, v in config.to_dict().items() if "dropout" in k)


def why_not_predicted(config: Any) -> str:
    """Why a model whose shape_of says its activations are not known has none predicted, in words."""
    if config.model_type in LLAMA_LAYER and drops_out(config):
        return "its dropout is on, whose masks the activations do not count"
    return f"its family's activations are not predicted (those of {', '.join(LLAMA_LAYER)} are)"


def model_is_tied(model: Any) -> bool:
    out = model.get_output_embeddings()
    return out is not None and out.weight is model.get_input_embeddings().weight


def build(config: Any, dtype: Any, zero3_config: dict[str, Any] | None, device: Any,
          checkpoint: bool) -> tuple[Any, Any]:
    """The model, built by transformers in dtype with random weights: at stage 3 with HfDeepSpeedConfig alive, so that
    from_config builds it inside zero.Init and initialises each module gathered, as it does for from_pretrained; else
    on the device. Gradient checkpointing through the model's own switch. Returns the model and the
    HfDeepSpeedConfig, which must outlive the build (transformers holds it by a weak reference)."""
    import transformers
    from transformers.integrations import HfDeepSpeedConfig
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # transformers 4
        from transformers.modeling_utils import no_init_weights
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
    if checkpoint:  # transformers 5 renamed the switch; 4 has the old name alone
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model, keep


def built_by() -> str:
    import transformers
    return f"transformers {transformers.__version__}"
