"""A Hugging Face config as --model (zero3bench/hf.py): read, refused or counted before anything starts. transformers
and accelerate are optional: without them these tests skip, and the GPT's run on."""
import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers", reason="transformers is optional (requirements-hf.txt)")
pytest.importorskip("accelerate", reason="HfDeepSpeedConfig needs accelerate")
import torch  # noqa: E402

import plan  # noqa: E402
from conftest import assert_refused, shared  # noqa: E402
from zero3bench import hf, inputs  # noqa: E402
from zero3bench.accounting import memory  # noqa: E402
from zero3bench.options import DEFAULT_SEQ, BadInput  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = {path.stem.removeprefix("tiny-"): str(path) for path in sorted((ROOT / "tests" / "models").glob("*.json"))}
TINY = {family: CONFIGS[family] for family in ("llama", "qwen2", "mistral")}
# the published parameter counts of the bundled configs (their model cards)
PUBLISHED = {"llama-3.2-1b": 1_235_814_400, "qwen2.5-1.5b": 1_543_714_304, "llama-3.1-8b": 8_030_261_248,
             "mistral-7b-v0.1": 7_241_732_096, "gemma-2-2b": 2_614_341_888, "gpt2-xl": 1_557_611_200,
             "pythia-1.4b": 1_414_647_808, "phi-3-mini-4k": 3_821_079_552, "qwen1.5-moe-a2.7b": 14_315_784_192}
# A mixture of experts whose router reads its scores' values (JetMoE's top-k gating copies them to the host): the meta
# device has none, so what it keeps for backward cannot be counted there
UNCOUNTABLE = {"model_type": "jetmoe", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
               "num_key_value_heads": 2, "kv_channels": 16, "intermediate_size": 128, "num_local_experts": 2,
               "num_experts_per_tok": 1, "vocab_size": 512, "max_position_embeddings": 256}


@pytest.mark.parametrize("name", PUBLISHED)
def test_a_bundled_config_counts_its_published_parameters_on_the_meta_device(name):
    shape, _ = inputs.chosen(name)
    assert shape.params == PUBLISHED[name]


@pytest.mark.parametrize("family", CONFIGS)
def test_the_counted_shape_is_the_built_models(family):
    shape, config = inputs.chosen(CONFIGS[family])
    with hf.quiet():
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert shape.params == sum(p.numel() for p in model.parameters())


# what each family's config and modules say, as the shape reads them (one row a family: fields unlike Llama's)
FIELDS = {
    "llama": dict(mlp="gated", norm_kind="rmsnorm", norm_vectors=1, positions="rope", bias=False, tied=True,
                  kv_heads=2, head_dim=32, parallel=False, experts=0, window=None, dropout=0.0),
    "gemma2": dict(window=32, tied=True, ffn=256, parallel=False),
    "gpt2": dict(mlp="plain", norm_kind="layernorm", norm_vectors=2, positions="learned", bias=True, tied=True,
                 kv_heads=4, parallel=False, dropout=0.1),
    "gpt-neox": dict(mlp="plain", positions="rope", bias=True, tied=False, parallel=True, dropout=0.1),
    "falcon": dict(mlp="plain", norm_kind="layernorm", bias=False, kv_heads=1, parallel=True, ffn=512),
    "mixtral": dict(mlp="gated", experts=4, top_k=2, ffn=224, tied=False),
    "qwen2-moe": dict(experts=8, top_k=2, ffn=64, bias=True),
    "mistral": dict(window=4096, tied=False),
    "qwen2": dict(window=None, bias=True),
    "phi3": dict(mlp="gated", kv_heads=4, ffn=352),
    "starcoder2": dict(mlp="plain", norm_kind="layernorm", norm_vectors=2, bias=True, dropout=0.1),
    "granite": dict(mlp="gated", dropout=0.1),
    "olmo2": dict(norm_kind="rmsnorm", kv_heads=4, tied=False),
}


@pytest.mark.parametrize("family", FIELDS)
def test_every_field_of_the_shape_is_read_off_the_config_the_built_modules_and_the_counted_forward(family):
    shape = inputs.counted(CONFIGS[family], 64, "bf16", False)
    assert {name: getattr(shape, name) for name in FIELDS[family]} == FIELDS[family]


def kept_and_saved_on_this_cpu(config_path, shape, micro_batch, seq=64):
    """What shape, the config's count in bf16 on this CPU at seq (made at micro batches 1, 2 and 3, on the meta
    device), predicts that its model keeps for backward at micro_batch, and what its forward in training mode saves
    there: its saved tensors found with saved_tensors_hooks and counted once per storage, the weights, the token ids
    and the logits (the loss's, apart) left out; each as (bytes kept, the logits' bytes)."""
    _, config = inputs.chosen(config_path)
    with hf.quiet():
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16,
                                                              attn_implementation=hf.attention(config))
    model.train()
    ids = torch.arange(micro_batch * seq).remainder(config.vocab_size).view(micro_batch, seq)
    given = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers(), ids]}
    saved, held = {}, []

    def pack(tensor):  # each storage held as saved.py holds it: one freed would free its address for another
        held.append(tensor.untyped_storage())
        saved[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        logits = model(input_ids=ids, use_cache=False).logits
    counted = sum(n for ptr, n in saved.items() if ptr not in given | {logits.untyped_storage().data_ptr()})
    kept = memory.kept_at(shape, "bf16", micro_batch, seq, on_gpu=False)
    return (kept.total, kept.logits), (counted, logits.untyped_storage().nbytes())


@pytest.mark.parametrize("family", CONFIGS)
def test_what_a_models_forward_saves_on_a_cpu_is_what_its_count_predicts(family):
    """At micro batch 4, one more than the counts: dropout's masks, the experts' routed tokens, a sliding window's
    mask and whichever attention kernel PyTorch runs here are among what is saved."""
    counted = inputs.counted(CONFIGS[family], 64, "bf16", False)
    predicted, saved = kept_and_saved_on_this_cpu(CONFIGS[family], counted, 4)
    assert predicted == saved


@pytest.mark.parametrize("micro_batch", [1, 4])
def test_one_row_that_keeps_less_than_a_row_of_more_is_counted_apart(micro_batch):
    """Multi-query attention on the math path (torch 2.11's choice on a CPU): the key and value heads broadcast to
    the query's stay views when reshaped for one row, and are copied for more, so that a row of one keeps less."""
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        shape, config = inputs.chosen(CONFIGS["falcon"])
        counted = hf.counted_at(config, shape, 64, "bf16", False)  # not inputs.counted's, kept from another kernel's
        predicted, saved = kept_and_saved_on_this_cpu(CONFIGS["falcon"], counted, micro_batch)
    assert predicted == saved


def test_the_llama_layers_arithmetic_of_older_records_is_its_count_on_a_gpu_but_flashs_random_seed():
    """The block that records from before the count describe by their fields (memory.block_activation_bytes),
    against what the count finds on the meta device with CUDA's flash kernel: its seed and offset (24 bytes) apart."""
    micro_batch, seq = 2, 128
    shape = inputs.counted(TINY["llama"], seq, "bf16", True)
    described = dataclasses.replace(shape, tensors=None, saved=None)
    kept = memory.kept_at(shape, "bf16", micro_batch, seq, on_gpu=True)
    assert kept.first_block == memory.block_activation_bytes(described, 2, micro_batch * seq, seq, True) + 24


def test_a_model_whose_forward_reads_its_activations_values_is_not_predicted_and_says_which_module(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(UNCOUNTABLE))
    shape = inputs.counted.__wrapped__(str(path), 64, "bf16", True)
    assert shape.saved == () and shape.not_counted.startswith("JetMoeTopKGating cannot run on the meta device")
    with pytest.raises(BadInput, match="its activations are not predicted, so no peak can be planned: JetMoeTopKG"):
        plan.hf_shape(str(path), 64, checkpoint=False)  # JetMoE's class cannot checkpoint


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
    "a quantized model": ({"quantization_config": {"quant_method": "gptq", "bits": 4}},
                          "a quantized model's config .quantization_config: gptq., which this benchmark would train "
                          "unquantized"),
    "a context of 0": ({"max_position_embeddings": 0}, "max_position_embeddings must be a whole number of at least 1"),
    "a negative context": ({"max_position_embeddings": -8}, "max_position_embeddings must be a whole number of at "),
    "an MLP width of 0": ({"intermediate_size": 0}, r"builds model.layers.0.mlp.gate_proj.weight of shape \[0, 128\], "
                                                    "no elements: a size of the config is 0"),
    "a head width of 0": ({"head_dim": 0}, "head_dim must be a whole number of at least 1, not 0"),
    "a window of 0": ({"model_type": "mistral", "sliding_window": 0}, "sliding_window 0: a window of attention sees"),
    "more experts per token than experts": ({"model_type": "mixtral", "num_local_experts": 2, "num_experts_per_tok": 3},
                                            "num_experts_per_tok 3 routes each token to none or more than the 2"),
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
    """Its bos and eos ids (50256) outside the vocabulary make transformers log a line of its own as it reads the
    config: the refusal (of its context of 0) is the only line, whoever speaks first."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(Path(CONFIGS["starcoder2"]).read_text()), "bos_token_id": 50256,
                                "eos_token_id": 50256, "max_position_embeddings": 0}))
    done = subprocess.run([sys.executable, "train_gpt.py", "--check", "2", "--model", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"train_gpt.py: error: --model {path}: max_position_embeddings must be a whole")


@shared
def built_alike(tmp_path_factory):
    """tests/weights_alike.py over every config of tests/models, once for all workers: {family: its line}."""
    done = subprocess.run([sys.executable, "tests/weights_alike.py", *CONFIGS.values()], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return {line.split(": ")[0].removeprefix("tiny-"): line for line in done.stdout.splitlines()}


@pytest.mark.parametrize("family", CONFIGS)
def test_every_weight_is_drawn_alike_at_stage_0_and_partitioned_at_stage_3(built_alike, family):
    """transformers 5.17 to 5.22 left GPT-2's scaled c_proj at its first draw under ZeRO-3 (hf.OLDEST): on one H100,
    gpt2-xl's stage 3 then started 1.8% above stage 0's loss, and (a) failed (benchmarks/logs/h100/7-families)."""
    assert built_alike[family] == f"tiny-{family}: alike"


def test_the_oldest_transformers_accepted_is_the_one_requirements_hf_names():
    assert f"transformers>={hf.OLDEST}," in (ROOT / "requirements-hf.txt").read_text()


@pytest.mark.parametrize("version", ["5.22.0", "5.17.0", "4.57.1"])
def test_a_transformers_that_builds_other_weights_under_zero3_is_refused_in_one_line(version, monkeypatch):
    # the module that `import transformers` gives now: building some models on the meta device replaces it
    monkeypatch.setattr(sys.modules["transformers"], "__version__", version)
    with pytest.raises(BadInput) as refused:
        hf.importable(Path("config.json"))
    assert str(refused.value) == (f"--model config.json needs transformers {hf.OLDEST} or newer, not {version}, which "
                                  f"builds some models under ZeRO-3 with other weights than at stage 0: {hf.INSTALL}")


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


def test_plan_refuses_a_family_whose_peak_it_cannot_predict_in_one_line_naming_the_module(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(UNCOUNTABLE))
    done = subprocess.run([sys.executable, "plan.py", "--model", str(path), "--no-checkpoint"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "its activations are not predicted, so no peak can be planned: JetMoeTopKGating" in done.stderr


@pytest.mark.parametrize("family", CONFIGS)
def test_plan_predicts_the_peak_of_every_family_it_holds_a_config_of(family, capsys):
    plan.main(["--model", CONFIGS[family], "--stages", "0", "3", "--gpus", "8", "--json"])
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert rows and all(row["peak"] > row["held"] > 0 for row in rows)


def test_a_plan_of_a_hugging_face_model_is_at_its_seq_else_its_context_up_to_train_gpt_pys_default():
    """Llama 3.2 1B's context is 131,072 tokens: planned at options.DEFAULT_SEQ unless --seq says otherwise."""
    at_512 = plan.resolve_model(plan.parse_args(["--model", "llama-3.2-1b", "--seq", "512"])).shape
    assert at_512.context == 512 and [s.seq for s in at_512.saved] == [512]
    assert plan.resolve_model(plan.parse_args(["--model", "llama-3.2-1b"])).shape.context == DEFAULT_SEQ


# Families beyond tests/models, tiny, that a held-out battery of 74 configs found read, refused or counted wrong
BEYOND = {
    "mpt": {"model_type": "mpt", "d_model": 64, "n_heads": 4, "n_layers": 2, "expansion_ratio": 2, "max_seq_len": 256,
            "vocab_size": 512},
    "dbrx": {"model_type": "dbrx", "d_model": 64, "n_heads": 4, "n_layers": 2, "max_seq_len": 256, "vocab_size": 512,
             "attn_config": {"kv_n_heads": 2, "clip_qkv": 8, "rope_theta": 10000},
             "ffn_config": {"ffn_hidden_size": 64, "moe_num_experts": 4, "moe_top_k": 2}},
    "doge": {"model_type": "doge", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "vocab_size": 512,
             "max_position_embeddings": 256, "keep_window_size": 32, "is_moe": False},
    "gpt_neox_japanese": {"model_type": "gpt_neox_japanese", "num_hidden_layers": 2, "hidden_size": 64,
                          "num_attention_heads": 4, "intermediate_multiple_size": 2, "vocab_size": 512,
                          "max_position_embeddings": 256},
    "mamba": {"model_type": "mamba", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 512, "state_size": 8},
    "biogpt": {"model_type": "biogpt", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
               "num_attention_heads": 4, "max_position_embeddings": 256, "vocab_size": 512},
    "ctrl": {"model_type": "ctrl", "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 256, "dff": 128,
             "vocab_size": 512},
    "llama4": {"model_type": "llama4", "text_config": {"num_hidden_layers": 2, "hidden_size": 64,
                                                       "num_attention_heads": 4, "vocab_size": 512}},
    "deepseek_v3": {"model_type": "deepseek_v3", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                    "num_key_value_heads": 4, "vocab_size": 512, "max_position_embeddings": 256,
                    "intermediate_size": 128, "moe_intermediate_size": 32, "n_routed_experts": 4,
                    "n_shared_experts": 1, "num_experts_per_tok": 2, "first_k_dense_replace": 1, "n_group": 1,
                    "topk_group": 1, "q_lora_rank": 32, "kv_lora_rank": 16, "qk_rope_head_dim": 8,
                    "qk_nope_head_dim": 8, "v_head_dim": 16},
    "opt": {"model_type": "opt", "hidden_size": 64, "ffn_dim": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "word_embed_proj_dim": 64, "max_position_embeddings": 256, "vocab_size": 512},
}


@pytest.fixture
def beyond(tmp_path):
    """beyond(family): the path of BEYOND's config of the family."""
    def path(family):
        written = tmp_path / f"{family}.json"
        written.write_text(json.dumps(BEYOND[family]))
        return str(written)
    return path


def test_a_context_that_the_family_calls_max_seq_len_is_the_models_context(beyond):
    """MPT's: read as none, it was 2048, and the default seq of 1024 overran its ALiBi biases of 256 positions."""
    assert inputs.chosen(beyond("mpt"))[0].context == 256
    assert plan.hf_shape(beyond("mpt"), None).context == 256


def test_plan_refuses_a_seq_beyond_the_models_context_as_train_gpt_does(check):
    """The meta device indexes no embedding: the count would succeed, and the run would fail in its first step."""
    refusal = f"--seq 512 is outside the {CONFIGS['gpt2']} model's context of 1..256 tokens"
    assert_refused(check("--model", CONFIGS["gpt2"], "--seq", "512"), refusal)
    with pytest.raises(BadInput, match=re.escape(refusal)):
        plan.hf_shape(CONFIGS["gpt2"], 512)
    assert plan.hf_shape(CONFIGS["gpt2"], 256).context == 256  # its whole context


def test_a_family_that_transformers_cannot_checkpoint_is_refused_with_checkpointing_on(beyond, check):
    refusal = "transformers cannot checkpoint GPTNeoXJapaneseForCausalLM's activations"
    assert_refused(check("--model", beyond("gpt_neox_japanese")), refusal, "give --no-checkpoint")
    with pytest.raises(BadInput, match=refusal):
        plan.hf_shape(beyond("gpt_neox_japanese"), 64)


def test_a_family_that_transformers_cannot_checkpoint_runs_and_plans_without(beyond, check):
    assert check("--model", beyond("gpt_neox_japanese"), "--no-checkpoint").status == 0
    args = plan.parse_args(["--model", beyond("gpt_neox_japanese"), "--no-checkpoint"])
    assert plan.resolve_model(args).shape.saved


def test_a_model_without_attention_heads_is_refused_naming_what_it_lacks(beyond):
    with pytest.raises(BadInput, match="no num_attention_heads in model_type 'mamba': a model without attention"):
        inputs.chosen(beyond("mamba"))


def test_a_multimodal_config_is_refused_naming_its_text_models_config(beyond):
    with pytest.raises(BadInput, match="model_type 'llama4' keeps its sizes in text_config: give that as a config of "
                                       "its own .model_type 'llama4_text'."):
        inputs.chosen(beyond("llama4"))


def test_a_forward_that_sizes_a_tensor_by_its_activations_values_is_not_predicted_and_says_which_module(beyond):
    """DBRX's experts loop over the tokens routed to each (torch.nonzero), which the meta device cannot list."""
    shape = inputs.counted(beyond("dbrx"), 64, "bf16", True)
    assert shape.saved == () and shape.not_counted.startswith("DbrxExperts reads the values of its activations "
                                                              "(nonzero, whose output is as large as they say)")


@pytest.mark.parametrize("family", ["biogpt", "ctrl"])
def test_a_family_that_names_no_block_class_is_counted_as_built(beyond, family):
    shape, config = inputs.chosen(beyond(family))
    with hf.quiet():
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert shape.params == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("family", ["doge", "biogpt", "gpt_neox_japanese"])
def test_what_a_held_out_familys_forward_saves_on_a_cpu_is_what_its_count_predicts(beyond, family):
    """Doge's learned mask, which the CPU's flash kernel cannot give a gradient; BioGPT's blocks, which its class names
    not; a family that cannot checkpoint, counted without."""
    predicted, saved = kept_and_saved_on_this_cpu(beyond(family), inputs.counted(beyond(family), 64, "bf16", False), 4)
    assert predicted == saved


@pytest.mark.parametrize("family, fields", [("deepseek_v3", dict(experts=4, top_k=2, ffn=32)),
                                            ("opt", dict(dropout=0.1)), ("mpt", dict(positions="none", context=256))])
def test_a_field_is_read_wherever_the_model_holds_it(beyond, family, fields):
    """The experts of a model whose first blocks are dense; a dropout that a block applies as a function."""
    shape = inputs.chosen(beyond(family))[0]
    assert {name: getattr(shape, name) for name in fields} == fields
