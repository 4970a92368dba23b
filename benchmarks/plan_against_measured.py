"""plan.py, from the one-GPU run at micro batch 2 of benchmarks/logs/h200/24-peaks, against the 4-rank rehearsal
and the one-rank run at micro batch 16 that it measured: model states and peak per rank (issue 33, item 4;
tests/test_plan.py holds the same to 1% and 5%).    python3 benchmarks/plan_against_measured.py
"""
import json
import subprocess
G = 2**30
ONE = "benchmarks/logs/h200/24-peaks/results/20261201-134338-xPdh"
print("planned from", ONE, "(1 rank, micro batch 2, checkpointing) against the run measured:")
print("measured run  setup  states planned  measured  peak planned  measured")
for folder, argv in [("20261201-134046-6F1B", ["--gpus", "4", "--gpus-per-node", "4"]), ("20261201-134434-1cTy", ["--gpus", "1", "--micro-batch", "16"])]:
    p = json.loads(subprocess.run(["python3", "plan.py", "--from", ONE, "--stages", "0", "3", "--json", *argv], capture_output=True, text=True).stdout)
    runs = json.load(open(f"benchmarks/logs/h200/24-peaks/results/{folder}/summary.json"))["results"]
    for name in ("stage0", "stage3"):
        r = runs[name][0]; [row] = [x for x in p["rows"] if x["setup"] == name[-1]]
        states = r["model_state_bytes"]; peak = max(s["peak_mem_bytes"] for s in r["steps"])
        print(f"{folder} G{r['world_size']} mb{r['micro_batch']}  {name}  {row['states']/G:.2f}  {states/G:.2f} ({row['states']/states-1:+.1%})  {row['peak']/G:.2f}  {peak/G:.2f} ({row['peak']/peak-1:+.1%})")
