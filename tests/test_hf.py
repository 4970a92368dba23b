"""A Hugging Face config as --model (zero3bench/hf.py): read, refused or counted before anything starts. transformers
and accelerate are optional: without them these tests skip, and the GPT's run on."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers", reason="transformers is optional (requirements-hf.txt)")
pytest.importorskip("accelerate", reason="HfDeepSpeedConfig needs accelerate")
import torch  # noqa: E402

import plan  # noqa: E402
from zero3bench import hf, inputs  # noqa: E402
from zero3bench.accounting import activations  # noqa: E402
from zero3bench.options import DEFAULT_SEQ, BadInput  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TINY = {family: str(ROOT / "tests" / "models" / f"tiny-{family}.json") for family in ("llama", "qwen2", "mistral")}
NEOX = str(ROOT / "tests" / "models" / "tiny-gpt-neox.json")
# the published parameter counts of the bundled configs (their model cards)
PUBLISHED = {"llama-3.2-1b": 1_235_814_400, "qwen2.5-1.5b": 1_543_714_304, "llama-3.1-8b": 8_030_261_248,
             "mistral-7b-v0.1": 7_241_732_096}


@pytest.mark.parametrize("name", PUBLISHED)
def test_a_bundled_config_counts_its_published_parameters_on_the_meta_device(name):
    shape, _ = inputs.chosen(name)
    assert shape.params == PUBLISHED[name]


@pytest.mark.parametrize("family", TINY)
def test_the_counted_shape_is_the_built_models(family):
    shape, config = inputs.chosen(TINY[family])
    model = transformers.AutoModelForCausalLM.from_config(config)
    assert shape.params == sum(p.numel() for p in model.parameters())
    assert shape.activations_known


@pytest.mark.parametrize("family", TINY)
def test_a_llama_layer_saves_what_the_activation_formula_counts(family):
    """One decoder layer in bf16 on a CPU, its saved tensors counted by storage (the rotary cos and sin, made once
    for all layers, apart): SDPA's CPU flash kernel saves what CUDA's does."""
    shape, config = inputs.chosen(TINY[family])
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
    layer = hf.decoder_layers(model, config.num_hidden_layers)[0]
    batch, seq = 2, 64
    x = torch.randn(batch, seq, config.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    positions = torch.arange(seq)[None].expand(batch, seq)
    cos_sin = model.model.rotary_emb(x, positions)
    saved = {}

    def pack(tensor):
        saved[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        layer(x, position_embeddings=cos_sin, attention_mask=None, position_ids=positions)
    apart = {t.untyped_storage().data_ptr() for t in [*layer.parameters(), *cos_sin]}
    counted = sum(n for ptr, n in saved.items() if ptr not in apart)
    assert counted == activations.block_activation_bytes(shape, 2, batch * seq, seq, True)


def test_a_family_whose_layer_is_not_llamas_has_no_predicted_activations():
    shape, _ = inputs.chosen(NEOX)
    assert not shape.activations_known


def test_a_llama_with_dropout_has_no_predicted_activations_and_plan_says_why(tmp_path):
    path = str(config_file(tmp_path, attention_dropout=0.1))
    shape, _ = inputs.chosen.__wrapped__(path)
    assert not shape.activations_known
    with pytest.raises(BadInput, match="its dropout is on"):
        plan.hf_shape(path)


def test_gpt2_is_read_as_the_causal_language_model_it_is(tmp_path):
    """GPT-2's causal head is GPT2LMHeadModel, not ...ForCausalLM; its tensors are counted as built."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 512,
                                "n_positions": 128}))
    shape, config = inputs.chosen.__wrapped__(str(path))
    model = transformers.AutoModelForCausalLM.from_config(config)
    assert shape.params == sum(p.numel() for p in model.parameters()) and shape.tied
    assert not shape.activations_known


def test_a_family_without_sdpa_is_built_with_transformers_own_attention(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "bloom", "n_layer": 2, "hidden_size": 64, "n_head": 4,
                                "vocab_size": 512}))
    _, config = inputs.chosen.__wrapped__(str(path))
    assert hf.attention(config) == "eager"
    assert hf.attention(inputs.chosen(TINY["llama"])[1]) == "sdpa"


def config_file(tmp_path, **fields):
    base = json.loads(Path(TINY["llama"]).read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**base, **fields}))
    return path


BAD = {
    "an encoder": ({"model_type": "bert", "architectures": ["BertModel"]}, "not a decoder-only causal language model"),
    "a vision model": ({"model_type": "vit"}, "not a decoder-only causal language model"),
    "an unknown model_type": ({"model_type": "llama9"}, "is not one that transformers"),
    "remote code": ({"auto_map": {"AutoModelForCausalLM": "modeling_x.X"}}, "never runs"),
    "a LoRA adapter": ({"peft_type": "LORA", "r": 8, "base_model_name_or_path": "x"}, "an adapter's config"),
    "a tokenizer": ({"model": {"type": "BPE"}, "added_tokens": []}, "a tokenizer"),
    "0 layers": ({"num_hidden_layers": 0}, "num_hidden_layers must be a whole number of at least 1"),
    "heads that do not divide": ({"num_attention_heads": 3},
                                 "not a multiple of the number of attention heads|3 attention heads do not divide"),
    "kv heads that do not divide": ({"num_key_value_heads": 3}, "num_key_value_heads 3 does not divide 4"),
    "a pad token past the vocabulary": ({"pad_token_id": 600}, "transformers cannot build it: AssertionError"),
}


@pytest.mark.parametrize("name", BAD)
def test_a_config_that_cannot_be_built_here_is_refused_in_one_line(name, tmp_path):
    fields, message = BAD[name]
    path = config_file(tmp_path, **fields)
    with pytest.raises(BadInput, match=message):
        inputs.chosen.__wrapped__(str(path))


def test_a_uint16_bin_is_refused_for_a_vocabulary_past_its_ids(tmp_path):
    data = tmp_path / "tokens.bin"
    data.write_bytes(bytes(4096))
    with pytest.raises(BadInput, match="cannot hold ids of 65,536"):
        inputs.load_tokens(data, 128_256, 64)


def test_a_npy_of_uint32_holds_ids_past_65535(tmp_path):
    import numpy as np
    data = tmp_path / "tokens.npy"
    np.save(data, np.arange(100_000, 100_200, dtype=np.uint32))
    assert int(inputs.load_tokens(data, 128_256, 64).max()) == 100_199


def test_a_bad_config_exits_2_with_one_line_before_anything_starts(tmp_path):
    path = config_file(tmp_path, auto_map={"AutoModelForCausalLM": "x.X"})
    done = subprocess.run([sys.executable, "train_gpt.py", "--check", "2", "--model", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert done.returncode == 2 and len(errors) == 1 and "Traceback" not in done.stderr
    assert errors[0].startswith("train_gpt.py: error: --model ")


@pytest.mark.parametrize("family", TINY)
def test_plans_deepspeed_estimate_is_deepspeeds_own_on_the_built_model(family):
    """plan.py --model's DS est. at stage 3 on 8 GPUs against estimate_zero3_model_states_mem_needs on the counts
    that DeepSpeed's own model_to_params takes of the model (what estimate_..._all_live does), built on the CPU:
    on the meta device every data_ptr is 0, and model_to_params' de-duplication would merge every tensor."""
    stage3 = pytest.importorskip("deepspeed.runtime.zero.stage3")
    _, config = inputs.chosen(TINY[family])
    total, largest = stage3.model_to_params(transformers.AutoModelForCausalLM.from_config(config))
    _, device, _ = stage3.estimate_zero3_model_states_mem_needs(total, largest, 8, 1, cpu_offload=False,
                                                                cpu_offload_params=False)
    command = [sys.executable, "plan.py", "--model", TINY[family], "--stages", "3", "--gpus", "8", "--json"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["rows"][0]["deepspeed_estimate"] == device


def test_plan_refuses_a_family_whose_peak_it_cannot_predict():
    done = subprocess.run([sys.executable, "plan.py", "--model", NEOX], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "not predicted" in done.stderr


def test_a_plan_of_a_hugging_face_model_is_at_its_seq_else_its_context_up_to_train_gpt_pys_default():
    """Llama 3.2 1B's context is 131,072 tokens: planned at options.DEFAULT_SEQ unless --seq says otherwise."""
    assert plan.resolve_model(plan.parse_args(["--model", "llama-3.2-1b", "--seq", "512"])).shape.context == 512
    assert plan.resolve_model(plan.parse_args(["--model", "llama-3.2-1b"])).shape.context == DEFAULT_SEQ
