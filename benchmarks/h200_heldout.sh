#!/usr/bin/env bash
# One H200, one device call (about 400 s of runs): a held-out check of parameter offload's predicted memory
# (issue 47, item 2), which was fitted on world-1 runs alone: the 350m model on 2 rehearsed ranks, beside
# optimizer offload. At a limit of 110 s (40-heldout) 3_infinity's engine had not started on 2 ranks.
# Results folders as results.tgz.   bash benchmarks/h200_heldout.sh OUT_DIR
source "$(dirname "${BASH_SOURCE[0]}")/preamble.sh" "$1"
LIMIT_S=400 timed offload_350m_r2 bash run.sh --model 350m --ranks 2 --stages "3_offload 3_infinity"
tar czf "$out/results.tgz" -C "$out" results
