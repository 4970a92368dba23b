"""
How far stage 3's prefetch gathers ahead in backward (issue 33): DeepSpeed's own coordinator on 2 CPU ranks, with
train_gpt.py's model shaped as 1.3b at d_model 64 (24 blocks, the tied embedding about 2 blocks) and every bucket
and cap scaled from 1.3b's block to this one's, its elements gathered (available and in flight) after each fetch
and release. One case per launch; each writes CASE.json (the settings, the peak in step 3, the rows) into OUT, and
the cases on one rank into OUT/one-rank.
every case of benchmarks/logs/cpu/prefetch:   python3 benchmarks/prefetch_probe.py OUT
"""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from zero3bench.accounting import shapes  # noqa: E402

D_MODEL, CONTEXT = 64, 32
# name: layers, vocab, stage3_max_live_parameters and stage3_prefetch_bucket_size in a preset's elements, scaled by
# its block's matrices (the elements stage 3 partitions; its LayerNorms and biases persist) to this model's, so
# that a prefetch takes the same share of a block: at 1.3b 5e7 is a block's less 0.7%; at 2.7b, 64% of one (qkv,
# its projection and fc); at 350m, 4 blocks
CASES = {
    "live1e8": (24, 1536, 1e8, 5e7, "1.3b"), "live5e8": (24, 1536, 5e8, 5e7, "1.3b"),
    "live1e9": (24, 1536, 1e9, 5e7, "1.3b"), "uncapped_l12": (12, 1536, 1e12, 5e7, "1.3b"),
    "uncapped_l24": (24, 1536, 1e12, 5e7, "1.3b"), "uncapped_l32": (32, 1536, 1e12, 5e7, "1.3b"),
    "uncapped_root4": (24, 3072, 1e12, 5e7, "1.3b"), "uncapped_root1.7": (24, 1280, 1e12, 5e7, "1.3b"),
    "uncapped_prefetch2": (24, 1536, 1e12, 2 * 12 * 2048**2 - 4e5, "1.3b"),
    "prefetch10_live1e9": (24, 1536, 1e9, 5e8, "1.3b"),
    "as_2.7b_live1e9": (32, 1280, 1e9, 5e7, "2.7b"), "as_2.7b_l16": (16, 1280, 1e12, 5e7, "2.7b"),
    "as_2.7b_l48": (48, 1280, 1e12, 5e7, "2.7b"), "as_350m_live1e9": (24, 3072, 1e9, 5e7, "350m"),
    "third_of_a_block": (32, 1280, 1e12, 0.3 * 12 * 2048**2, "1.3b"),
}
# One rank whose partitions live in host memory (configs/ds_config_stage3_infinity.json, scaled as live1e9), with
# checkpointing and without: each fetch there copies each tensor to the device (partition_parameters.py:
# NoGatherHandle), so what the coordinator holds fetched is what the device holds. name: train_gpt.py's flags
ONE_RANK = {"infinity": [], "infinity_no_checkpoint": ["--no-checkpoint"]}


def scaled(elements: float, preset: str) -> int:
    """A preset's count of elements, as the same share of a block's matrices here."""
    return int(elements * 12 * D_MODEL**2 / (12 * shapes.PRESETS[preset].d_model**2))


def config(live: float, prefetch: float, preset: str, source: str = "ds_config_stage3.json") -> dict:
    """A config's section (ds_config_stage3.json's unless source says) at this scale; the persistence threshold keeps
    the LayerNorms and biases whole and partitions every matrix, as 1e4 does at 1.3b."""
    section = json.loads((ROOT / source).read_text())
    zero = section["zero_optimization"]
    zero.update(stage3_max_live_parameters=scaled(live, preset), stage3_prefetch_bucket_size=scaled(prefetch, preset),
                reduce_bucket_size=scaled(5e7, preset), stage3_param_persistence_threshold=1000)
    return section


def probe(out: Path, case: str, layers: int, vocab: int, flags: list[str]) -> None:
    from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator as Coordinator

    import train_gpt
    shape = shapes.ModelShape(layers, 4, D_MODEL, vocab, CONTEXT, 1e-3)
    shapes.PRESETS["tiny"] = shape
    rows = []

    def watched(name):
        original = getattr(Coordinator, name)

        def wrapped(self, module, *args, **kwargs):
            result = original(self, module, *args, **kwargs)
            rows.append([name.split("_")[0], type(module).__name__,
                         self._PartitionedParameterCoordinator__n_available_params])
            return result
        setattr(Coordinator, name, wrapped)
    watched("fetch_sub_module")
    watched("release_sub_module")
    path = out / f"{case}.config.json"  # run_all wrote it before the launch
    section = json.loads(path.read_text())
    train = train_gpt.train

    def probed(engine, run, *rest):
        train(engine, run, *rest)
        if os.environ.get("RANK") == "0":
            starts = [i for i, r in enumerate(rows) if r[:2] == ["fetch", "GPT"]]
            step3 = rows[starts[-2]:]  # the root is fetched twice a step, in forward and backward
            (out / f"{case}.json").write_text(json.dumps({
                "layers": layers, "vocab": vocab, "zero": section["zero_optimization"], "flags": flags,
                "block": 12 * D_MODEL**2, "root": (shape.padded_vocab + CONTEXT) * D_MODEL,
                "peak": max(r[2] for r in step3), "rows": step3}))
    train_gpt.train = probed
    sys.argv = [sys.argv[0], "--model", "tiny", "--config", str(path), "--steps", "3", *flags]
    train_gpt.main()


def launch(out: Path, case: str, section: dict, ranks: int, layers: int, vocab: int, flags: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{case}.config.json").write_text(json.dumps(section))
    with open(out / f"{case}.out", "w") as log:  # not .log: report.py would read the folder as its own
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks),
                        "--master_port", "29841", __file__, str(out), case, str(layers), str(vocab), *flags],
                       check=True, stdout=log, stderr=subprocess.STDOUT)
    print(case, json.loads((out / f"{case}.json").read_text())["peak"], flush=True)


def run_all(out: Path) -> None:
    for case, (layers, vocab, live, prefetch, preset) in CASES.items():
        launch(out, case, config(live, prefetch, preset), 2, layers, vocab, [])
    layers, vocab, live, prefetch, preset = CASES["live1e9"]
    infinity = config(live, prefetch, preset, "configs/ds_config_stage3_infinity.json")
    for case, flags in ONE_RANK.items():
        launch(out / "one-rank", case, infinity, 1, layers, vocab, flags)


if __name__ == "__main__":
    if len(sys.argv) == 2:
        run_all(Path(sys.argv[1]))
    else:
        out, case, layers, vocab, *flags = sys.argv[1:]
        probe(Path(out), case, int(layers), int(vocab), flags)
