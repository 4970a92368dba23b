#!/usr/bin/env bash
# One H200, one device call (up to 500 s of runs): parameter offload's predicted memory on rehearsed ranks (issue
# 47, item 2), which was fitted on world-1 runs alone. 40-heldout measured the 350m model's optimizer offload on 2
# rehearsed ranks; its 3_infinity, given 110 s, had not started. Here 3_infinity alone: 350m on 2 ranks, and the
# 1.3b on 4 (the rehearsal that 5-stages-offload-cap ran before records kept their config).
# Results folders as results.tgz.   bash benchmarks/h200_heldout.sh OUT_DIR
source "$(dirname "${BASH_SOURCE[0]}")/preamble.sh" "$1"
LIMIT_S=200 timed infinity_350m_r2 bash run.sh --model 350m --ranks 2 --stages 3_infinity
LIMIT_S=280 timed infinity_1.3b_r4 bash run.sh --ranks 4 --stages 3_infinity
tar czf "$out/results.tgz" -C "$out" results
