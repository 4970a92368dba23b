"""
What stage 3 holds at its peak on rehearsed ranks (issue 46): train_gpt.py on CPU ranks over gloo, each model cut to
an eighth of its widths, vocabulary and tokens, so that every tensor of weights, gradients and activations is 1/64 of
the H200 run's (benchmarks/logs/h200/24-peaks, 39-hf), with every bucket and cap of ds_config_stage3.json scaled alike.
A dispatch mode counts each storage that an op makes until it is freed; for step 3, the most held above the step's
start and the tensors live then, by the op that made them and the autograd node running. One case per launch; each
writes CASE.json into OUT. Times 64, each case's peak is its H200 run's above what that run holds, within 0.2%
(benchmarks/logs/cpu/backward-probe: 1.3b, Llama 3.2 1B, Qwen2.5 1.5B and Mistral 7B cut to 4 layers on 4 ranks,
Llama on 1).
every case:   python3 benchmarks/backward_probe.py OUT      (2.5 minutes on 2 cores)
"""
import collections
import json
import os
import subprocess
import sys
import weakref
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SCALE = 8  # widths, vocabulary and tokens; weights, gradients and activations shrink by SCALE**2
# name: ranks, and a bundled Hugging Face config (configs/models/, benchmarks/models/) or 1.3b's preset
CASES = {"1.3b_r4": (4, "1.3b"), "llama_r4": (4, "configs/models/llama-3.2-1b.json"),
         "qwen_r4": (4, "configs/models/qwen2.5-1.5b.json"),
         "mistral_r4": (4, "benchmarks/models/mistral-7b-v0.1-4layers.json"),
         "llama_r1": (1, "configs/models/llama-3.2-1b.json")}


def scaled_config(path: Path) -> dict:
    """A Hugging Face config at 1/SCALE of its widths and vocabulary, its heads as many fewer; its depth kept."""
    d = json.loads(path.read_text())
    heads, kv = max(1, d["num_attention_heads"] // SCALE), max(1, d["num_key_value_heads"] // SCALE)
    d.update(hidden_size=d["hidden_size"] // SCALE, intermediate_size=d["intermediate_size"] // SCALE,
             vocab_size=d["vocab_size"] // SCALE, num_attention_heads=heads, num_key_value_heads=kv,
             head_dim=d["hidden_size"] // SCALE // heads, max_position_embeddings=1024, bos_token_id=1, eos_token_id=2)
    return d


def zero_section() -> dict:
    """ds_config_stage3.json with its buckets and caps in elements at 1/SCALE**2; the persistence threshold keeps the
    norms and biases whole and partitions every matrix, as 1e4 does at full size."""
    section = json.loads((ROOT / "ds_config_stage3.json").read_text())
    zero = section["zero_optimization"]
    for key in ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_max_live_parameters", "sub_group_size"):
        zero[key] = int(float(zero[key]) / SCALE**2)
    zero["stage3_param_persistence_threshold"] = 1100
    return section


class Live:
    """The storages that ops make, until each is freed, and the most held: a TorchDispatchMode's hook."""

    def __init__(self):
        self.made, self.held, self.most, self.at_most, self.before = {}, 0, 0, {}, set()

    def freed(self, key):
        self.held -= self.made.pop(key)[0]

    def add(self, inputs, outputs, op):
        node = torch._C._current_autograd_node()
        for t in outputs:
            storage = t.untyped_storage()
            key = storage._cdata
            if key in inputs or key in self.made or storage.nbytes() == 0:
                continue  # a view or an in-place op: no new storage
            by = type(node).__name__ if node is not None else ""
            self.made[key] = (storage.nbytes(), op, tuple(t.shape), str(t.dtype)[6:], by)
            self.held += storage.nbytes()
            weakref.finalize(storage, self.freed, key)
            if self.held > self.most:
                self.most, self.at_most = self.held, dict(self.made)

    def restart(self):
        self.most, self.at_most, self.before = self.held, {}, set(self.made)

    def peak(self, start):
        """The most above start, and the tensors made since the step began that were live then, largest first."""
        rows = collections.Counter()
        for key, (size, *made) in self.at_most.items():
            rows[tuple(made)] += 0 if key in self.before else size
        return {"above_start": self.most - start, "live": [[n, *k] for k, n in rows.most_common(16) if n]}


def probe(out: Path, case: str, model: str) -> None:
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    import model as gpt
    import train_gpt
    from zero3bench.accounting import shapes
    live, steps = Live(), []

    class Counting(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            flat = [t for t in tree_flatten((args, kwargs or {}))[0] if isinstance(t, torch.Tensor)]
            result = func(*args, **(kwargs or {}))
            live.add({t.untyped_storage()._cdata for t in flat},
                     [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)], func.__name__)
            return result

    gpt.LOSS_CHUNK //= SCALE  # the loss's chunks keep their share of the tokens
    p = shapes.PRESETS["1.3b"]
    shapes.PRESETS["tiny"] = shapes.ModelShape(p.layers, p.heads // SCALE, p.d_model // SCALE,
                                               p.padded_vocab // SCALE, p.context // SCALE, p.lr, vocab_multiple=16)
    timed = train_gpt.timed_step

    def counted_step(engine, run, step, *rest):
        live.restart()
        start = live.held
        with Counting():
            result = timed(engine, run, step, *rest)
        steps.append({"step": step, **live.peak(start)})
        if os.environ.get("RANK") == "0":
            (out / f"{case}.json").write_text(json.dumps({"scale": SCALE, "model": model, "steps": steps}, indent=1))
        return result
    train_gpt.timed_step = counted_step
    sys.argv = [sys.argv[0], "--model", "tiny" if model == "1.3b" else str(out / f"{case}.config.json"),
                "--config", str(out / f"{case}.zero.json"), "--seq", str(1024 // SCALE), "--micro-batch", "2",
                "--steps", "3"]
    train_gpt.main()


def run_all(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for case, (ranks, model) in CASES.items():
        if model != "1.3b":
            (out / f"{case}.config.json").write_text(json.dumps(scaled_config(ROOT / model), indent=1))
        (out / f"{case}.zero.json").write_text(json.dumps(zero_section(), indent=1))
        with open(out / f"{case}.out", "w") as log:  # not .log: report.py would read the folder as its own
            subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks),
                            "--master_port", "29843", __file__, str(out), case, model],
                           check=True, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
        print(case, json.loads((out / f"{case}.json").read_text())["steps"][-1]["above_start"], flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 2:
        run_all(Path(sys.argv[1]))
    else:
        probe(Path(sys.argv[1]), sys.argv[2], sys.argv[3])
