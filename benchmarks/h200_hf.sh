#!/usr/bin/env bash
# One H200: Hugging Face configs' predicted peaks against measured ones (issue 46), in groups that fit one device
# call each (<= 560 s with setup):   bash benchmarks/h200_hf.sh OUT_DIR GROUP ...
# GROUP: llama (Llama 3.2 1B: one rank at stages 0 to 3 and 3_offload, checkpointing on and off; 4 rehearsed
# ranks), others (Qwen2.5 1.5B the same, less stages 1, 2 and offload; Mistral 7B cut to 4 layers, which keeps
# its layer whole and lets 4 ranks of 16 bytes a parameter share one GPU), rest (what issue 46's matrix still lacks
# after 39-hf: Qwen2.5 1.5B at stages 1, 2 and 3_offload, Mistral's 4 layers with optimizer offload, and 4 rehearsed
# ranks without checkpointing). Results folders as results.tgz. Its wheels: benchmarks/device_wheels.sh.
set -uo pipefail
source "$(dirname "$0")/preamble.sh" "$@"; shift
mistral=benchmarks/models/mistral-7b-v0.1-4layers.json
for group in "$@"; do
  case $group in
    llama)
      LIMIT_S=260 timed llama_ranks1 bash run.sh --model llama-3.2-1b --ranks 1 --stages "0 1 2 3 3_offload"
      LIMIT_S=100 timed llama_ranks1_nock bash run.sh --model llama-3.2-1b --ranks 1 --no-checkpoint
      LIMIT_S=170 timed llama_ranks4 bash run.sh --model llama-3.2-1b --ranks 4 ;;
    others)
      LIMIT_S=100 timed qwen_ranks1 bash run.sh --model qwen2.5-1.5b --ranks 1
      LIMIT_S=100 timed qwen_ranks1_nock bash run.sh --model qwen2.5-1.5b --ranks 1 --no-checkpoint
      LIMIT_S=170 timed qwen_ranks4 bash run.sh --model qwen2.5-1.5b --ranks 4
      LIMIT_S=100 timed mistral_ranks1_nock bash run.sh --model "$mistral" --ranks 1 --no-checkpoint --stages "0 1 2 3"
      LIMIT_S=150 timed mistral_ranks4 bash run.sh --model "$mistral" --ranks 4 ;;
    rest)
      LIMIT_S=200 timed qwen_s12_offload_r1 bash run.sh --model qwen2.5-1.5b --ranks 1 --stages "1 2 3_offload"
      LIMIT_S=150 timed mistral_offload_r1 bash run.sh --model "$mistral" --ranks 1 --stages "0 3_offload"
      LIMIT_S=170 timed llama_ranks4_nock bash run.sh --model llama-3.2-1b --ranks 4 --no-checkpoint ;;
    *) echo "unknown group $group"; exit 2 ;;
  esac
done
tar czf "$out/results.tgz" -C "$out" results
