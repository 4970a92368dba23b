"""Bad input, as a specification: every input that no run can use stops with exit status 2 and exactly one
line on stderr (`train_gpt.py: error: ...`, or `run.sh: error: ...`), never a traceback, before any process
group starts or anything is launched. A valid `--check` prints one line that says how the inputs were read.

Most cases run train_gpt.main() in this process with `--check`, as rank 0 of a launch of one, which costs
milliseconds; a few run `python3 train_gpt.py` for real, to prove that no traceback reaches the terminal."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from zero3bench import config_checks, options, stages
from zero3bench.formatting import size
import report
import train_gpt
from zero3bench.accounting.shapes import PRESETS
from conftest import ROOT, assert_refused

def fragments(message):
    return message if isinstance(message, tuple) else (message,)


# -----------------------------------------------------------------------------
# the command line

OPTION_CASES = {
    "a learning rate that is not a number": (["--lr", "nan"], "argument --lr: must be a positive number up to"),
    "an infinite learning rate": (["--lr", "inf"], ("argument --lr: must be a positive number up to", "not inf")),
    "a negative learning rate": (["--lr", "-1"], ("argument --lr: must be a positive number up to", "not -1")),
    "a micro batch of 0": (["--micro-batch", "0"], "argument --micro-batch: must be at least 1, not 0"),
    "a micro batch that is not a number": (["--micro-batch", "abc"],
                                           "argument --micro-batch: invalid int value: 'abc'"),
    "0 steps": (["--steps", "0"], ("argument --steps: must be a whole number from 1 to", "not 0")),
    "a negative seed": (["--seed", "-1"], f"argument --seed: must be a whole number from 0 to {2**63 - 1}, not -1"),
    "a seed beyond 64 bits": (["--seed", "18446744073709551616"],
                              f"argument --seed: must be a whole number from 0 to {2**63 - 1}, not 18446744073709551616"),
    "a memory cap of nothing": (["--max-mem-gib", "0"], ("argument --max-mem-gib: must be a positive number up to", "not 0")),
    "a memory cap that is not a number": (["--max-mem-gib", "nan"],
                                          ("argument --max-mem-gib: must be a positive number up to", "not nan")),
    "a sequence beyond the model's context": (["--seq", "257"],
                                              "--seq 257 is outside the tiny model's context of 1..256 tokens"),
    "a negative warm-up": (["--warmup", "-1"], ("argument --warmup: must be a whole number from 0 to", "not -1")),
    "a timeout of nothing": (["--timeout-s", "0"], ("argument --timeout-s: must be a positive number up to", "not 0")),
    "an unknown option": (["--stages", "3"], "unrecognized arguments: --stages 3"),
    "an unknown model": (["--model", "13b"], "--model 13b: no such preset"),
    "a stage that does not exist": (["--stage", "5"], "argument --stage: invalid choice: 5"),
    "--check for 0 ranks": (["--check", "0"], ("argument --check: must be a whole number from 1 to", "not 0")),
}


@pytest.mark.parametrize("case", OPTION_CASES)
def test_a_bad_option_is_refused_in_one_line(case, check):
    argv, message = OPTION_CASES[case]
    assert_refused(check(*argv), *fragments(message))


def test_fp16_is_refused_on_a_machine_without_a_gpu(check):
    assert_refused(check("--dtype", "fp16"), "fp16 needs a GPU, and this machine has none",
                   "(--dtype asks for fp16)")


def test_a_mistyped_option_is_refused_with_the_nearest_valid_one(check):
    assert_refused(check("--microbatch", "4"), "unrecognized arguments: --microbatch 4 (did you mean --micro-batch?)")


@pytest.mark.parametrize("argv, message", [
    (["--rank", "2"], "unrecognized arguments: --rank 2 (did you mean --ranks, an option of run.sh?)"),
    (["--stages", "3"], "unrecognized arguments: --stages 3 (--stages is an option of run.sh; did you mean --stage?)"),
], ids=["mistyped", "given to train_gpt.py"])
def test_an_option_of_run_sh_is_named_as_run_sh_s(argv, message, check):
    assert_refused(check(*argv), message)


# -----------------------------------------------------------------------------
# every number has a range: what the code can hold, or what means something, checked before any launch

RANGE_CASES = {
    "a timeout beyond what timedelta holds": (["--timeout-s", "1e15"], "argument --timeout-s: must be a positive "
                                              f"number up to {options.MAX_TIMEOUT_S}, not 1e15"),
    "a memory cap beyond what RLIMIT_DATA holds": (["--max-mem-gib", "1e10"], "argument --max-mem-gib: must be a "
                                                   f"positive number up to {options.MAX_MEM_GIB}, not 1e10"),
    "more steps than a RESULT line can list": (["--steps", options.MAX_STEPS + 1], "argument --steps: must be a whole "
                                               f"number from 1 to {options.MAX_STEPS}"),
    "a warm-up longer than any run": (["--warmup", options.MAX_STEPS + 1], "argument --warmup: must be a whole "
                                      f"number from 0 to {options.MAX_STEPS}"),
    "a rate beyond float32's": (["--lr", "1e39"], "argument --lr: must be a positive number up to 3.4e+38, not 1e39"),
    "more ranks than any cluster": (["--check", options.MAX_RANKS + 1], "argument --check: must be a whole number "
                                    f"from 1 to {options.MAX_RANKS}"),
    "a micro batch beyond what the kernels index": (["--micro-batch", options.MAX_TOKENS], (
        f"micro batch {options.MAX_TOKENS} (from --micro-batch) x seq 256 is over {options.MAX_TOKENS:,} tokens "
        "per rank per step")),
}


@pytest.mark.parametrize("case", RANGE_CASES)
def test_a_number_out_of_its_range_is_refused_in_one_line(case, check):
    argv, message = RANGE_CASES[case]
    assert_refused(check(*argv), *fragments(message))


@pytest.mark.parametrize("argv", [["--timeout-s", options.MAX_TIMEOUT_S], ["--max-mem-gib", options.MAX_MEM_GIB],
                                  ["--steps", options.MAX_STEPS], ["--lr", options.MAX_LR],
                                  ["--check", options.MAX_RANKS], ["--seed", options.SEED_LIMIT - 1],
                                  ["--micro-batch", options.MAX_TOKENS // 256]], ids=lambda argv: argv[0])
def test_the_top_of_each_range_passes_the_check(argv, check):
    result = check(*argv)
    assert result.status == 0, result


def test_the_top_of_the_time_and_memory_ranges_is_what_the_code_can_hold():
    """What --timeout-s and --max-mem-gib become at launch: a process group's timeout, and the data segment's
    limit (in a process of its own, which the limit would otherwise cap)."""
    code = ("import resource, datetime, torch; from zero3bench import machine, options; "
            "from torch import distributed as d; d.init_process_group('gloo', store=d.HashStore(), rank=0, world_size=1, "
            "timeout=datetime.timedelta(seconds=options.MAX_TIMEOUT_S)); d.barrier(); "
            "machine.cap_memory(torch.device('cpu'), options.MAX_MEM_GIB); "
            "print(resource.getrlimit(resource.RLIMIT_DATA)[0])")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert int(proc.stdout.split()[-1]) > options.MAX_MEM_GIB * 2**30


def test_a_rate_in_the_config_out_of_its_range_is_refused(check, tmp_path):
    config = config_file(tmp_path, {"optimizer": {"type": "AdamW", "params": {"lr": 1e39}}})
    assert_refused(check("--config", config), f"config {config}: optimizer.params.lr must be a positive number up to")


# -----------------------------------------------------------------------------
# the launcher's variables, as a set: the check fixture starts from a launch of one (conftest.LAUNCHED_AS_RANK_0)

LAUNCHER_CASES = {
    "RANK without the rest": ({"RANK": "1"}, ["LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"],
                              "RANK=1 is set but not LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT"),
    "LOCAL_RANK missing, as in a PyTorchJob pod": ({"RANK": "1", "WORLD_SIZE": "2"}, ["LOCAL_RANK"],
                                                   "RANK=1 is set but not LOCAL_RANK"),
    "WORLD_SIZE without RANK": ({"WORLD_SIZE": "2"}, ["RANK"], "WORLD_SIZE=2 is set but not RANK, so this process "
                                                             "would train alone"),
    "RANK beyond WORLD_SIZE": ({"RANK": "2", "WORLD_SIZE": "2"}, [], "RANK runs from 0 to WORLD_SIZE - 1"),
    "a WORLD_SIZE of 0": ({"WORLD_SIZE": "0"}, [], "WORLD_SIZE runs from 1 to"),
    "LOCAL_RANK beyond WORLD_SIZE": ({"LOCAL_RANK": "1"}, [], "LOCAL_RANK runs from 0 to WORLD_SIZE - 1"),
    "a LOCAL_WORLD_SIZE over WORLD_SIZE": ({"LOCAL_WORLD_SIZE": "2"}, [], "LOCAL_WORLD_SIZE runs from 1 to WORLD_SIZE"),
    "a RANK that is not a number": ({"RANK": "one"}, [], "RANK='one' must be a whole number, 0 or more"),
    "a negative LOCAL_RANK": ({"LOCAL_RANK": "-1"}, [], "LOCAL_RANK='-1' must be a whole number, 0 or more"),
    "a port beyond 65535": ({"MASTER_PORT": "70000"}, [], "MASTER_PORT runs from 1 to 65535"),
}


@pytest.mark.parametrize("case", LAUNCHER_CASES)
def test_launcher_variables_that_do_not_agree_are_refused_in_one_line(case, check, monkeypatch):
    setting, unset, message = LAUNCHER_CASES[case]
    for name, value in setting.items():
        monkeypatch.setenv(name, value)
    for name in unset:
        monkeypatch.delenv(name)
    assert_refused(check(), message)


def test_an_error_on_a_rank_other_than_0_is_said_with_its_rank(check, monkeypatch):
    for name, value in {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    assert_refused(check("--lr", "nan"), "train_gpt.py: error: rank 1: argument --lr: must be a positive number")


# -----------------------------------------------------------------------------
# the DeepSpeed config: each case's text is written to a file, {config} in its message stands for its path

CONFIG_CASES = {
    "a JSON list": ("[1, 2]", [], "config {config} is not a JSON object"),
    "a stage that does not exist": ({"zero_optimization": {"stage": 5}}, [],
                                    "config {config}: zero_optimization.stage must be 0, 1, 2 or 3, not 5"),
    "a stage given as a string": ({"zero_optimization": {"stage": "3"}}, [],
                                  'config {config}: zero_optimization.stage is the string "3": write the number 3, '
                                  "without quotes"),
    "a micro batch given as a word": ({"train_micro_batch_size_per_gpu": "two"}, [],
                                      'config {config}: train_micro_batch_size_per_gpu must be a number, not "two"'),
    "a fractional micro batch": ({"train_micro_batch_size_per_gpu": 2.5}, [],
                                 "config {config}: train_micro_batch_size_per_gpu must be a positive whole number, "
                                 "not 2.5"),
    "a micro batch of NaN": ('{"train_micro_batch_size_per_gpu": NaN}', [],
                             "config {config}: train_micro_batch_size_per_gpu must be finite, not nan"),
    "a clipping of NaN": ('{"gradient_clipping": NaN}', [],
                          "config {config}: gradient_clipping is NaN: write the largest gradient norm"),
    "a negative clipping": ({"gradient_clipping": -1}, [],
                            "config {config}: gradient_clipping is -1: write the largest gradient norm"),
    "gradient accumulation": ({"gradient_accumulation_steps": 4}, [],
                              ("config {config}: the benchmark times one micro batch per step",
                               "set gradient_accumulation_steps to 1, not 4")),
    "fp16 and bf16 both enabled": ({"fp16": {"enabled": True}, "bf16": {"enabled": True}}, [],
                                   "config {config} enables both fp16 and bf16"),
    "fp16 enabled on a CPU machine": ({"fp16": {"enabled": True}}, [],
                                      "fp16 needs a GPU, and this machine has none: use --dtype bf16 or fp32 "
                                      "(the config asks for fp16)"),
    "an optimizer DeepSpeed does not build": ({"optimizer": {"type": "Adamm"}}, [],
                                              'config {config}: optimizer.type "Adamm" is not an optimizer that '
                                              "DeepSpeed builds"),
    "a learning rate given as a word": ({"optimizer": {"type": "AdamW", "params": {"lr": "fast"}}}, [],
                                        'params.lr must be a number, not "fast"'),
    "an offload device DeepSpeed refuses": ({"zero_optimization": {"stage": 3, "offload_param": {"device": "gpu"}}},
                                            [], ("config {config}: DeepSpeed refuses it:", "offload_param.device")),
    "a train batch that does not divide over the ranks": ({"train_batch_size": 3}, ["--check", "2"],
                                                          "config {config}: train_batch_size 3 does not divide over "
                                                          "2 rank(s)"),
    "a train batch that contradicts the micro batch": ({"train_batch_size": 8}, ["--micro-batch", "2", "--check", "2"],
                                                       "--micro-batch 2 x 2 rank(s) contradicts train_batch_size 8 "
                                                       "in config {config}"),
}


def config_file(tmp_path, content, name="config.json"):
    """content, a JSON text or what json.dumps writes, in a file."""
    config = tmp_path / name
    config.write_text(content if isinstance(content, str) else json.dumps(content))
    return config


@pytest.mark.parametrize("case", CONFIG_CASES)
def test_a_bad_config_is_refused_in_one_line(case, check, tmp_path):
    content, argv, message = CONFIG_CASES[case]
    config = config_file(tmp_path, content)
    result = check("--config", config, *argv)
    assert_refused(result, *(f.format(config=config) for f in fragments(message)))


@pytest.mark.parametrize("argv, message", [
    (["--config", "{tmp}/no-such.json"], "config not found: {tmp}/no-such.json"),
    (["--config", "tests"], "config tests is a directory, not a file"),
    (["--config", "run.sh"], "config run.sh is not valid JSON: Expecting value: line 1 column 1"),
    (["--stage", "3", "--config", "ds_config_stage0.json"],
     "config ds_config_stage0.json has zero_optimization.stage 0, but --stage is 3"),
], ids=["a missing file", "a directory", "not JSON", "a stage that contradicts --stage"])
def test_a_config_that_cannot_be_used_is_refused_in_one_line(argv, message, check, tmp_path):
    assert_refused(check(*(a.format(tmp=tmp_path) for a in argv)), message.format(tmp=tmp_path))


SHIPPED_CONFIGS = sorted(ROOT.glob("ds_config_stage*.json")) + [ROOT / "benchmarks" / "original_design.json"]


@pytest.mark.parametrize("path", SHIPPED_CONFIGS, ids=lambda path: path.name)
def test_the_shipped_configs_pass_deepspeeds_checks(path):
    """Through config_checks alone: on a machine without a GPU --check refuses fp16 and DeepCompile first."""
    config, note = config_checks.from_other_tools(json.loads(path.read_text()), PRESETS["1.3b"].d_model, "")
    assert note == ""  # no "auto" to read
    config_checks.refuse_what_the_build_would(config_checks.deepspeed_config(config, 2, ""), "")


@pytest.mark.parametrize("content, key, near", [
    ({"zero_optimisation": {"stage": 3}}, "zero_optimisation", "zero_optimization"),
    ({"zero_optimization": {"stage": 3, "stage3_max_live_parameter": 1e8}},
     "zero_optimization.stage3_max_live_parameter", "stage3_max_live_parameters"),
    ({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_pth": "/nvme"}}},
     "zero_optimization.offload_param.nvme_pth", "nvme_path"),
], ids=["at the top", "in zero_optimization", "in zero_optimization.offload_param"])
def test_a_key_that_deepspeed_does_not_know_is_refused_with_the_nearest_it_knows(content, key, near, check, tmp_path):
    config = config_file(tmp_path, content)
    assert_refused(check("--config", config),
                   f"config {config}: {key} is not a key that DeepSpeed knows (did you mean {near}?)")


@pytest.mark.parametrize("kind", ["offload_param", "offload_optimizer"])
def test_offload_to_nvme_without_a_path_is_refused(kind, check, tmp_path):
    config = config_file(tmp_path, {"optimizer": {"type": "AdamW"},
                                    "zero_optimization": {"stage": 3, kind: {"device": "nvme"}}})
    assert_refused(check("--config", config),
                   f'config {config}: zero_optimization.{kind} offloads to NVMe but gives no "nvme_path"')


@pytest.mark.parametrize("optimizer, given", [
    ({}, "has no optimizer section, so train_gpt.py would give it torch's AdamW"),
    ({"optimizer": {"type": "SGD"}}, "has optimizer.type SGD"),
], ids=["torch's AdamW", "SGD"])
def test_offloading_the_optimizer_needs_deepspeeds_cpu_optimizer(optimizer, given, check, tmp_path):
    config = config_file(tmp_path, {**optimizer,
                                    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}})
    assert_refused(check("--config", config), f"config {config} offloads the optimizer to cpu", given,
                   "set zero_force_ds_cpu_optimizer to false")


def test_max_grad_norm_among_the_optimizer_params_is_refused(check, tmp_path):
    config = config_file(tmp_path, {"optimizer": {"type": "AdamW", "params": {"max_grad_norm": 1.0}}})
    assert_refused(check("--config", config),
                   f"config {config}: optimizer.params.max_grad_norm is refused by DeepSpeed when it builds the "
                   "optimizer: use the top-level gradient_clipping instead")


# -----------------------------------------------------------------------------
# configs written for other tools: Hugging Face's "auto", numbers in quotes

AUTO_REFUSED = {
    "gradient_clipping": ({"gradient_clipping": "auto"}, "the largest gradient norm, such as 1.0 (Hugging Face's "
                                                     "default max_grad_norm), or 0 for none"),
    "optimizer.params.betas": ({"optimizer": {"type": "AdamW", "params": {"betas": "auto"}}}, "[0.9, 0.95]"),
    "bf16.enabled": ({"bf16": {"enabled": "auto"}}, "true or false"),
    "scheduler.params.warmup_num_steps": ({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": "auto"}}},
                                          "a number of steps"),
    "wall_clock_breakdown": ({"wall_clock_breakdown": "auto"}, "the value that DeepSpeed should read"),
}


@pytest.mark.parametrize("key", AUTO_REFUSED)
def test_an_auto_that_the_config_must_settle_is_refused_with_what_to_write(key, check, tmp_path):
    content, write = AUTO_REFUSED[key]
    config = config_file(tmp_path, content)
    assert_refused(check("--config", config),
                   f'config {config}: {key} is "auto", which only Hugging Face\'s Trainer fills in: write {write}')


def test_hugging_faces_zero3_template_is_refused_in_one_line(check, tmp_path):
    """transformers' docs/source/en/deepspeed.md, "ZeRO-3 example", as users copy it."""
    auto = "auto"
    config = config_file(tmp_path, {
        "fp16": {"enabled": auto, "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
                 "hysteresis": 2, "min_loss_scale": 1},
        "optimizer": {"type": "AdamW", "params": {"lr": auto, "betas": auto, "eps": auto, "weight_decay": auto}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": auto, "warmup_max_lr": auto,
                                                     "warmup_num_steps": auto}},
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                              "offload_param": {"device": "cpu", "pin_memory": True}, "overlap_comm": True,
                              "contiguous_gradients": True, "sub_group_size": 1e9, "reduce_bucket_size": auto,
                              "stage3_prefetch_bucket_size": auto, "stage3_param_persistence_threshold": auto,
                              "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
                              "stage3_gather_16bit_weights_on_model_save": True},
        "gradient_accumulation_steps": auto, "gradient_clipping": auto, "steps_per_print": 2000,
        "train_batch_size": auto, "train_micro_batch_size_per_gpu": auto, "wall_clock_breakdown": False})
    assert_refused(check("--config", config), f'config {config}: fp16.enabled is "auto"', "write true or false")


def test_an_auto_that_the_benchmark_sets_reads_as_absent_and_the_check_says_so(check, tmp_path):
    autos = {"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto", "gradient_accumulation_steps": "auto",
             "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}}
    auto, absent = check("--config", config_file(tmp_path, autos), "--check", "2"), check(
        "--config", config_file(tmp_path, {"optimizer": {"type": "AdamW"}}, "absent.json"), "--check", "2")
    assert auto.status == absent.status == 0, (auto, absent)
    assert auto.out[1] == absent.out[1]  # the same prediction
    assert "micro batch 2 per rank (from the default)" in auto.out[0] and "lr 0.001 (from the preset" in auto.out[0]
    assert auto.out[0].endswith('; "auto" read as: train_micro_batch_size_per_gpu as absent (--micro-batch, else 2), '
                                "train_batch_size as absent (the micro batch x ranks), gradient_accumulation_steps "
                                "as absent (1), optimizer.params.lr as absent (--lr, else the preset's)")


def test_an_auto_bucket_size_is_worked_out_from_the_models_width_as_hugging_face_does(check, tmp_path):
    d = PRESETS["tiny"].d_model
    zero = {"stage": 3, "reduce_bucket_size": d * d, "stage3_prefetch_bucket_size": int(0.9 * d * d),
            "stage3_param_persistence_threshold": 10 * d}
    auto = check("--config", config_file(tmp_path, {"zero_optimization": {
        "stage": 3, **{key: "auto" for key in zero if key != "stage"}}}))
    written = check("--config", config_file(tmp_path, {"zero_optimization": zero}, "written.json"))
    assert auto.status == written.status == 0, (auto, written)
    assert auto.out[1] == written.out[1]  # the same prediction as with the numbers written out
    assert (f"zero_optimization.reduce_bucket_size {d * d:,} (d_model², as Hugging Face's Trainer sets it), "
            f"zero_optimization.stage3_prefetch_bucket_size {int(0.9 * d * d):,} (0.9 d_model², ") in auto.out[0]


@pytest.mark.parametrize("content, key, value", [
    ({"gradient_clipping": "1.0"}, "gradient_clipping", "1.0"),
    ({"zero_optimization": {"stage": 3, "reduce_bucket_size": "5e8"}}, "zero_optimization.reduce_bucket_size", "5e8"),
], ids=["at the top", "in zero_optimization"])
def test_a_number_in_quotes_is_refused_with_the_number_to_write(content, key, value, check, tmp_path):
    config = config_file(tmp_path, content)
    assert_refused(check("--config", config),
                   f'config {config}: {key} is the string "{value}": write the number {value}, without quotes')


@pytest.mark.parametrize("content, message", [
    ({"gradient_clipping": "one"}, 'gradient_clipping must be a number, not "one"'),
    ({"prescale_gradients": "false"}, 'prescale_gradients must be true or false, not "false"'),
    ({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": "ten"}}},
     'scheduler.params.warmup_num_steps must be a number, not "ten"'),
    ({"optimizer": {"type": "AdamW", "params": {"betas": "0.9, 0.95"}}},
     'optimizer.params.betas must be a list of numbers, not "0.9, 0.95"'),
], ids=["a word for a number", "a word for true or false", "a scheduler's", "an optimizer's"])
def test_a_value_of_another_kind_than_its_reader_takes_is_refused(content, message, check, tmp_path):
    """The reader: DeepSpeed, for a top-level key (its default's kind), or the optimizer or scheduler class that a
    section builds (its parameter's default)."""
    config = config_file(tmp_path, content)
    assert_refused(check("--config", config), f"config {config}: {message}")


# -----------------------------------------------------------------------------
# the token file: the tiny model has a vocabulary of 256 and a context of 256 tokens

def tokens(*ids):
    return b"".join(i.to_bytes(2, "little") for i in ids)


DATA_CASES = {
    "a missing file": (None, "--data {data}: no such file"),
    "a directory": (lambda path: path.mkdir(), "--data {data}: not a file"),
    "an empty file": (lambda path: path.write_bytes(b""), "the data has 0 tokens, fewer than one row of 256 + 1"),
    "an odd-sized file": (lambda path: path.write_bytes(tokens(*range(300)) + b"\0"),
                          "--data {data}: not a flat uint16 token file (odd size)"),
    "too few tokens for one row": (lambda path: path.write_bytes(tokens(*range(256))),
                                   "the data has 256 tokens, fewer than one row of 256 + 1"),
    "token ids beyond the vocabulary": (lambda path: path.write_bytes(tokens(*range(300))),
                                        "--data {data}: token ids reach 299, outside the vocabulary of 256"),
}


@pytest.mark.parametrize("case", DATA_CASES)
def test_bad_data_is_refused_in_one_line(case, check, tmp_path):
    make, message = DATA_CASES[case]
    data = tmp_path / "tokens.bin"
    if make:
        make(data)
    assert_refused(check("--data", data), message.format(data=data))


# -----------------------------------------------------------------------------
# files this user may not read

# As root, one process: the check first as root, on a copy of the file and its output discarded, which reads every
# module the check imports; then as nobody, on the file itself. This Python's folder may be root's alone (pyenv's,
# under a /root of mode 0700), so that nobody could not start it; a module left to import as nobody fails with
# another message than the one asserted. The real and effective ids become nobody's, the saved ones stay root's,
# and root's come back before the exit: what the imports left for the exit to clean up is root's (torch 2.4's
# TemporaryDirectory in torch.distributed.nn.jit.instantiator), which nobody could not remove.
BECOME_NOBODY = """import os, pwd, runpy, shutil, sys, tempfile
sys.path.insert(0, os.getcwd())
script, option, path, *rest = sys.argv[1:]
saved = os.dup(1), os.dup(2)
quiet = os.open(os.devnull, os.O_WRONLY)
os.dup2(quiet, 1); os.dup2(quiet, 2)
copy = tempfile.mkdtemp()
sys.argv = [script, option, shutil.copy(path, copy), *rest]
try:
    runpy.run_path(script, run_name="__main__")
except SystemExit:
    pass
sys.stdout.flush(); sys.stderr.flush()
os.dup2(saved[0], 1); os.dup2(saved[1], 2)
shutil.rmtree(copy)
nobody = pwd.getpwnam("nobody")
os.setgroups([]); os.setresgid(nobody.pw_gid, nobody.pw_gid, 0); os.setresuid(nobody.pw_uid, nobody.pw_uid, 0)
sys.argv = [script, option, path, *rest]
try:
    runpy.run_path(script, run_name="__main__")
finally:
    os.setresuid(0, 0, 0); os.setresgid(0, 0, 0)"""


def as_another_user(*argv: str) -> list[str]:
    """A command that runs a script of this Python (argv) as a user other than root, whom file permissions bind:
    as this user where it is not root, else as nobody (BECOME_NOBODY)."""
    return [sys.executable, *argv] if os.geteuid() != 0 else [sys.executable, "-c", BECOME_NOBODY, *argv]


@pytest.fixture(scope="module")
def unreadable():
    """unreadable(name, content): a file of this content that no one may read, in a folder that anyone may enter
    (pytest's own is root's alone), and the check of train_gpt.py, run as a user other than root."""
    folder = Path(tempfile.mkdtemp(prefix="zero3-unreadable-"))
    folder.chmod(0o755)

    def check_unreadable(option, name, content):
        path = folder / name
        path.write_bytes(content)
        path.chmod(0)
        proc = subprocess.run(as_another_user("train_gpt.py", option, str(path), "--check"), cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        return path, SimpleNamespace(status=proc.returncode, out=proc.stdout.splitlines(),
                                     err=proc.stderr.splitlines())
    yield check_unreadable
    shutil.rmtree(folder, ignore_errors=True)


def test_a_config_without_read_permission_is_refused_in_one_line(unreadable):
    config, refused = unreadable("--config", "config.json", b"{}")
    assert_refused(refused, f"config {config} cannot be read: permission denied")


def test_data_without_read_permission_is_refused_in_one_line(unreadable):
    data, refused = unreadable("--data", "tokens.bin", tokens(*range(256)) * 2)
    assert_refused(refused, f"--data {data}: cannot be read: permission denied")


# -----------------------------------------------------------------------------
# a real process: the error reaches the terminal as one line, with no traceback


@pytest.mark.parametrize("argv, message", [
    (["--lr", "nan"], "argument --lr: must be a positive number up to 3.4e+38, not nan"),
    (["--config", "run.sh"], "config run.sh is not valid JSON"),
    (["--config", "{tmp}/offload.json"], "DeepSpeed refuses it:"),
    (["--data", "{tmp}/tokens.bin"], "token ids reach 299, outside the vocabulary of 256"),
], ids=["an option", "a config that is not JSON", "a config DeepSpeed refuses", "token ids beyond the vocabulary"])
def test_a_launch_with_bad_input_prints_one_line_and_no_traceback(argv, message, tmp_path):
    (tmp_path / "offload.json").write_text(json.dumps({"zero_optimization": {"stage": 3,
                                                                             "offload_param": {"device": "gpu"}}}))
    (tmp_path / "tokens.bin").write_bytes(tokens(*range(300)))
    proc = subprocess.run([sys.executable, "train_gpt.py", *(a.format(tmp=tmp_path) for a in argv)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith("train_gpt.py: error: ") and message in line


def test_a_launch_as_rank_1_with_bad_input_prints_its_line():
    """The variables a PyTorchJob pod sets for its second process: rank 1 is not silenced."""
    env = {**os.environ, "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29500"}
    proc = subprocess.run([sys.executable, "train_gpt.py", "--lr", "nan", "--check"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == ["train_gpt.py: error: rank 1: argument --lr: must be a positive number up to "
                                        "3.4e+38, not nan"]


# -----------------------------------------------------------------------------
# valid input: --check says how the inputs were read, in one line, and exits 0


def test_a_valid_check_prints_how_it_reads_the_inputs_and_the_predicted_memory_and_exits_0(check):
    result = check()
    assert result.status == 0 and result.err == []
    [line, prediction] = result.out
    assert prediction.startswith("predicted per rank at 1 rank(s): model states 7.1 MiB, activations ")
    assert line.startswith("stage 3, bf16 (from the config), micro batch 2 per rank (from "
                           "train_micro_batch_size_per_gpu) x 1 rank(s), lr 0.001 (from the preset; ")
    assert line.endswith("), optimizer torch AdamW, config " + str(stages.ROOT / "ds_config_stage3.json"))


def test_at_stage_1_the_check_predicts_the_rank_that_peaks_highest(check):
    from zero3bench.accounting import shapes
    from zero3bench.accounting.memory import Counts, Seat, rank_memory
    result = check("--config", stages.config_path(1), "--check", "4")
    zero = json.loads(stages.config_path(1).read_text())["zero_optimization"]
    tiny = shapes.PRESETS["tiny"]
    run = options.run_from({"stage": 1, "dtype": "bf16", "micro_batch": 2, "seq": tiny.context, "checkpoint": True})
    ranks = [rank_memory(run, tiny, Counts.of_shape(tiny), zero, Seat(4, rank, on_gpu=False)) for rank in range(4)]
    highest = max(ranks, key=lambda m: m.peak)
    assert len({m.states for m in ranks}) > 1  # each rank keeps other gradients
    assert result.out[-1].startswith(f"predicted per rank at 4 rank(s): model states {size(highest.states)}, ")
    assert result.out[-1].endswith(f"peak {size(highest.peak)}, and a CPU process's runtime besides")


def test_a_valid_check_exits_0_as_a_process(tmp_path):
    proc = subprocess.run([sys.executable, "train_gpt.py", "--check", "2"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr[-2000:]
    how, prediction = proc.stdout.splitlines()[-2:]
    assert how.startswith("stage 3, bf16 (from the config), micro batch 2 per rank (from "
                          "train_micro_batch_size_per_gpu) x 2 rank(s)")
    assert prediction.startswith("predicted per rank at 2 rank(s): model states 3.5 MiB")


def test_train_batch_size_sets_the_micro_batch_over_the_ranks(check, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"train_batch_size": 8}))
    result = check("--config", config, "--check", "2")
    assert result.status == 0, result
    [line, _] = result.out
    assert "micro batch 4 per rank (from train_batch_size) x 2 rank(s)" in line


@pytest.mark.parametrize("sections, argv, reads", [
    ({"bf16": {"enabled": True}}, [], "bf16 (from the config)"),
    ({}, [], "fp32 (from the config)"),
    ({"bf16": {"enabled": False}, "fp16": {"enabled": False}}, [], "fp32 (from the config)"),
    ({"bf16": {"enabled": True}}, ["--dtype", "fp32"], "fp32 (from --dtype)"),
    ({"fp16": {"enabled": True}}, ["--dtype", "bf16"], "bf16 (from --dtype)"),
], ids=["bf16 section", "no section", "both disabled", "--dtype over bf16", "--dtype over fp16"])
def test_the_config_decides_the_dtype_unless_dtype_is_given(sections, argv, reads, check, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(sections))
    result = check("--config", config, *argv)
    assert result.status == 0, result
    [line, _] = result.out
    assert line.startswith(f"stage 0, {reads}, ")


# -----------------------------------------------------------------------------
# run.sh refuses before launching anything, and leaves no results folder


@pytest.fixture(scope="module")
def comments_only_hostfile(tmp_path_factory):
    path = tmp_path_factory.mktemp("hostfile") / "hostfile"
    path.write_text("# worker-1 slots=8\n\n   # worker-2 slots=8\n")
    return path


RUN_SH_CASES = {
    "0 ranks": (["--ranks", "0"], {}, "run.sh", "--ranks takes positive whole numbers, not '0'"),
    "ranks that are not a number": (["--ranks", "abc"], {}, "run.sh",
                                    "--ranks takes positive whole numbers, not 'abc'"),
    "a stage without a config": (["--stages", "7"], {}, "run.sh",
                                 "no config for stage '7'; there are: 0 1 2 3 3_deepcompile 3_infinity 3_offload"),
    "an unknown model, train_gpt.py's own check": (["--model", "13b"], {}, "train_gpt.py",
                                                   "--model 13b: no such preset"),
    "a missing hostfile": ([], {"HOSTFILE": "/no/such/file"}, "run.sh",
                           "HOSTFILE /no/such/file is not a readable file"),
    "a hostfile of comments only": ([], {"HOSTFILE": "{hostfile}"}, "run.sh",
                                    "HOSTFILE {hostfile} names no host with slots=N"),
    "--stage": (["--stage", "3"], {}, "run.sh", "--stage is run.sh's to set"),
    "--check": (["--check"], {}, "run.sh", "run.sh checks every input before it launches; --check is not needed"),
    "--ranks with no value": (["--ranks"], {}, "run.sh", "--ranks needs a value"),
    "--ranks empty": (["--ranks", " "], {}, "run.sh", "--ranks is empty"),
    "a stage twice": (["--stages", "3 3"], {}, "run.sh", "stage3 would run twice"),
    "a number of ranks twice": (["--ranks", "2 2"], {}, "run.sh", "stage0_2ranks stage3_2ranks would run twice"),
    "more ranks than any cluster": (["--ranks", "99999999999999999999"], {}, "run.sh",
                                    f"--ranks takes at most {options.MAX_RANKS:,} ranks a run"),
}


@pytest.mark.parametrize("case", RUN_SH_CASES)
def test_run_sh_refuses_bad_input_before_launching_anything(case, tmp_path, comments_only_hostfile):
    args, env, prog, message = RUN_SH_CASES[case]
    results = tmp_path / "results"
    env = {name: value.format(hostfile=comments_only_hostfile) for name, value in env.items()}
    proc = subprocess.run(["bash", "run.sh", *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**{k: v for k, v in os.environ.items() if k not in ("HOSTFILE", "RANKS")}, **env,
                               "RESULTS": str(results)})
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"{prog}: error: ") and message.format(hostfile=comments_only_hostfile) in line, line
    assert not results.exists() or not any(results.iterdir())


def test_report_without_a_folder_says_what_to_give(capsys):
    assert report.main([]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "report.py: error: give a results folder (results/<timestamp>), or --compare A B"]

