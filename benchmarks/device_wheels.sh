#!/usr/bin/env bash
# The wheels that a device call carries for the Hugging Face runs (benchmarks/h200_hf.sh): the working tree (41 MiB)
# and ../shared/device/make_wheels.sh's wheels with transformers and accelerate (32 MiB) pass the 64 MiB a call
# carries. Less what no import here needs: tokenizers (transformers checks it only where installed), hf_xet and the
# hub's command line (downloads), and transformers' models but those the runs build (about 12 MiB in all). Checked
# on this machine with those packages moved aside: the bundled configs counted, tiny Llama built.
#   bash benchmarks/device_wheels.sh      then run(..., carry=[".whl"]) with "source .whl/device-setup.sh && ..."
set -euo pipefail
cd "$(dirname "$0")/.."
pins=$(sed -n 's/^\(transformers\|accelerate\)>=[0-9.]*,<=\([0-9.]*\)$/\1==\2/p' requirements-hf.txt | tr '\n' ' ')
EXTRA="$pins" bash ../shared/device/make_wheels.sh > /dev/null
rm -f .whl/{tokenizers,hf_xet,typer,click,rich,pygments,markdown_it_py,mdurl,shellingham}-*.whl
python3 - .whl/transformers-*.whl <<'PY'
import re, sys, zipfile
from pathlib import Path
KEEP = {"auto", "llama", "qwen2", "mistral", "gpt_neox"}  # the families of configs/models and tests/models
wheel = Path(sys.argv[1])
dropped = re.compile(r"transformers/models/(?!(?:%s)/)[^/]+/" % "|".join(KEEP))
source = zipfile.ZipFile(wheel)
with zipfile.ZipFile(wheel.with_suffix(".slim"), "w", zipfile.ZIP_DEFLATED) as slim:
    for entry in source.infolist():
        if dropped.match(entry.filename):
            continue
        data = source.read(entry.filename)
        if entry.filename.endswith(".dist-info/RECORD"):
            data = "".join(line for line in data.decode().splitlines(True) if not dropped.match(line)).encode()
        slim.writestr(entry, data)
wheel.with_suffix(".slim").replace(wheel)
PY
du -sh .whl
