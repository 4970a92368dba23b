#!/usr/bin/env bash
# The wheels that a device call carries for the Hugging Face runs (benchmarks/h200_hf.sh, h200_families.sh) and the
# README's test command (benchmarks/h200_suite.sh): the working tree and ../shared/device/make_wheels.sh's
# wheels with transformers and accelerate (32 MiB) pass the 64 MiB a call carries. So transformers' models are cut
# to those that the configs and tests name. Every dependency the image lacks stays: the test command's pip resolves
# the dependencies of what is installed, and the device has no network.
#   bash benchmarks/device_wheels.sh      then run(..., carry=[".whl"]) with "source .whl/device-setup.sh && ..."
set -euo pipefail
cd "$(dirname "$0")/.."
pins=$(sed -n 's/^\(transformers\|accelerate\)>=[0-9.]*,<=\([0-9.]*\)$/\1==\2/p' requirements-hf.txt | tr '\n' ' ')
EXTRA="$pins" bash ../shared/device/make_wheels.sh > /dev/null
python3 - .whl/transformers-*.whl <<'PY'
import re, subprocess, sys, zipfile
from pathlib import Path
from transformers.models.auto.configuration_auto import model_type_to_module_name
# every model type that a config or a test names (a family left out fails the suite there: tiny-phimoe in h200/9-suite)
# (not benchmarks/families.json's 74 families, which only benchmarks/heldout_saved.py reads, on a CPU)
named = subprocess.run(["git", "grep", "-ohE", r'"model_type": *"\w+"', "--", "*.json", "tests/*.py",
                        ":!benchmarks/logs", ":!benchmarks/families.json"], capture_output=True, text=True,
                       check=True).stdout
KEEP = {"auto"} | {model_type_to_module_name(t) for t in re.findall(r'"(\w+)"$', named, re.M)}
print("transformers' models kept:", " ".join(sorted(KEEP)))
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
# The image's transformers 5.17.0 and huggingface_hub 1.33.0 ask for these at the same bounds as 5.24.0 and 2.5.0 do
# (their METADATA), so the image's own copies serve. transformers 5.24.0 asks for huggingface_hub>=1.31 and
# tokenizers>=0.23.1,<0.24, which the image's 1.33.0 and 0.23.2 meet: huggingface_hub 2.5.0 stays behind with what
# only it needs (httpx2 and theirs), and so does tokenizers 0.23.3, carried only because the image's 0.23.2 asks for
# huggingface_hub<2. The tree (52 MB of logs by now, 2,979 files) and the wheels stay under the 64 MiB a call carries
for image_has in hf_xet regex safetensors pyyaml pygments rich markdown_it_py mdurl typer shellingham click tqdm \
                 filelock fsspec packaging huggingface_hub tokenizers httpx2 httpcore2 h11 truststore anyio idna \
                 annotated_doc; do rm -f .whl/$image_has-*.whl; done
du -sh .whl
