#!/usr/bin/env bash
# torch 2.15.0 with DeepSpeed 0.19.8 (the newest on PyPI) in a venv of its own, on 2 CPU cores
set -x
cd /work/wt/i30
export PATH=/tmp/t215/venv/bin:$PATH TORCH_EXTENSIONS_DIR=/tmp/t215/torch_extensions
git log --oneline -1
python3 -c 'import sys, torch, deepspeed; print("python", sys.version.split()[0], "torch", torch.__version__, "deepspeed", deepspeed.__version__)'
time RESULTS=$(mktemp -d) bash run.sh
echo "run.sh: exit $?"
time python3 -m pytest -q tests/test_bad_input.py tests/test_sharding.py
echo "pytest: exit $?"
