"""
The classes of issue 56's held-out battery, each as a case of its own: a config that train_gpt.py must refuse
before anything starts (`--check 2`: exit status 2, one line on stderr, the first transformers would have logged
among them), and a valid tiny Llama of width 64, every block matrix under the persistence threshold, through run.sh
at --ranks 1 (NOT OBSERVABLE or PASS, never FAIL). Prints each case's exit status, its stderr's lines and the last.

    python3 benchmarks/hf_refusals.py OUT_DIR > benchmarks/logs/cpu/hf-heldout/refusals-<commit>.txt
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LLAMA = json.loads((ROOT / "tests" / "models" / "tiny-llama.json").read_text())
STARCODER2 = json.loads((ROOT / "tests" / "models" / "tiny-starcoder2.json").read_text())
REFUSED = {
    "quantized (GPTQ, 4 bits)": {**LLAMA, "quantization_config": {"quant_method": "gptq", "bits": 4}},
    "quantized (bitsandbytes)": {**LLAMA, "quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True}},
    "a context of 0": {**LLAMA, "max_position_embeddings": 0},
    "a context of -1": {**LLAMA, "max_position_embeddings": -1},
    "an MLP width of 0": {**LLAMA, "intermediate_size": 0},
    "a head width of 0": {**LLAMA, "head_dim": 0},
    "a sliding window of 0": {**LLAMA, "model_type": "mistral", "sliding_window": 0},
    "bos and eos outside the vocabulary, and a context of 0": {**STARCODER2, "bos_token_id": 50256,
                                                               "eos_token_id": 50256, "max_position_embeddings": 0},
}
WIDTH_64 = {**LLAMA, "hidden_size": 64, "intermediate_size": 128}


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for i, (case, fields) in enumerate(REFUSED.items()):
        path = out / f"case{i}.json"
        path.write_text(json.dumps(fields))
        done = subprocess.run([sys.executable, "train_gpt.py", "--check", "2", "--model", str(path)], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        lines = done.stderr.splitlines()
        print(f"{case}: exit {done.returncode}, {len(lines)} line(s) on stderr: {lines[-1] if lines else ''}")
    path = out / "llama-width-64.json"
    path.write_text(json.dumps(WIDTH_64))
    done = subprocess.run(["bash", "run.sh", "--model", str(path), "--ranks", "1"], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "RESULTS": str(out / "results")}, timeout=900)
    for line in re.findall(r"^ *(?:PASS|FAIL|NOT OBSERVABLE) +\(d\).*$|^VERDICT: .*$", done.stdout, re.M):
        print(f"tiny Llama of width 64 at --ranks 1: {line.strip()}")


if __name__ == "__main__":
    main()
