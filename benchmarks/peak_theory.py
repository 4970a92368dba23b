"""(b)'s peak against theory over the committed GPU logs: for every results folder with a stage-0 and a stage-3
run at one number of ranks, the measured ratio of the peaks, the ratio that memory.rank_memory gives for the
runs' settings (reporting.theory), and the measured ratio as a share of the predicted one.

    python3 benchmarks/peak_theory.py benchmarks/logs/h200 benchmarks/logs/h200x2
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from zero3bench.reporting import reading, theory  # noqa: E402


def rows(top):
    for folder in sorted({log.parent for log in Path(top).rglob("stage3.log")}):
        for world, (dense, zero3) in reading.pairs(reading.load_runs(folder)).items():
            if not dense or not zero3 or reading.failed(dense) or reading.failed(zero3) or world == 1:
                continue
            d, z = dense[0], zero3[0]
            if d.mem_kind != "cuda" or not (d.zero_config and z.zero_config):
                continue  # CPU peaks are not judged; logs before zero_config was recorded predict other buckets
            measured = (reading.most(r.peaks.peak_mem_bytes for r in dense)
                        / reading.most(r.peaks.peak_mem_bytes for r in zero3))
            predicted = theory.predicted_peak(d) / theory.predicted_peak(z)
            run = d.run
            yield (f"{folder}  {run.model} {run.dtype} mb{run.micro_batch} ckpt={run.checkpoint} {world} ranks  "
                   f"measured {measured:.2f}x  predicted {predicted:.2f}x  measured/predicted {measured / predicted:.3f}")


if __name__ == "__main__":
    for top in sys.argv[1:]:
        for row in rows(top):
            print(row)
