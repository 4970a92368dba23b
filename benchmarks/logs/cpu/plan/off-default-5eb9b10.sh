cd /work/main
H=$(git rev-parse --short HEAD)
echo "# plan.py off the default path at $H, after this stop's changes to message_bytes (stages 1 and 2), host staging and one_node: each command's exit status and its first row per setup"
MB2=benchmarks/logs/h200/36-step-time/1-default-mb2/results/20261203-125222-92vQ
LINK=benchmarks/logs/h200x2/13-fsdp2/5-levers/r/20261130-165102-GEmI
for args in "--stages 0 1 2 3 --gpus 1 2 8 64 1024" \
            "--stages 1 2 3 --offload --gpus 2 8 64" \
            "--stages 3 --offload-param --gpus 1 8 512" \
            "--model llama-3.2-1b --stages 1 2 3 --gpus 8 64" \
            "--model qwen2.5-1.5b --stages 1 2 3 --offload --gpus 8" \
            "--model mistral-7b-v0.1 --stages 2 3 --gpus 8 64" \
            "--model llama-3.1-8b --stages 3 --offload-param --gpus 8 1024" \
            "--model tests/models/tiny-qwen2.json --stages 1 2 --gpus 2" \
            "--preset 2.7b --stages 1 2 fsdp2 --from $MB2 --gpus 1 2 8" \
            "--preset 1.3b --stages 1 2 3 --from $LINK --gpus 2 --gpus-per-node 2" \
            "--model tests/models/tiny-gpt-neox.json"; do
  echo "\$ python3 plan.py $args --json"
  python3 plan.py $args --json > /tmp/offd/p.json 2> /tmp/offd/err; s=$?
  echo "exit $s $(tail -1 /tmp/offd/err | grep -v WARNING)"
  [ $s = 0 ] && python3 -c "
import json; p = json.load(open('/tmp/offd/p.json'))
for r in p['rows']:
    ag = [c for c in r['comm'] if c['kind'] == 'all_gather']
    print(f\"  {r['setup']:>6} {r['gpus']:>5} GPUs link {r['link']:>5} fits {r['fits']!s:>5} peak {r['peak']/2**30:8.2f} GiB host/node {r['host_per_node']/1e9:8.1f} GB step {r['step_s']['overlapped']:.3f} s all_gather calls {[c['calls'] for c in ag]}\")"
done
