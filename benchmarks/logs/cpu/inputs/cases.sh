# each case of issue 32 items 2-4 and 6 (report.py) that this branch answers, in the folder given as $1
cd "$1"
unset RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT
c() { echo "\$ $*"; env "$@" 2>&1 | grep -v "real_accelerator.py" | cut -c1-400 | tail -4; echo "exit ${PIPESTATUS[0]}"; echo; }
echo '{"zero_optimization": {"stage": 3}, "bf16": {"enabled": true}, "gradient_clipping": "auto"}' > /tmp/i32b/clip_auto.json
echo '{"zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto"}}' > /tmp/i32b/buckets_auto.json
echo '{"zero_optimization": {"stage": 3, "reduce_bucket_size": "500000000"}}' > /tmp/i32b/quoted.json
c RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 python3 train_gpt.py --lr nan --check
c RANK=0 python3 train_gpt.py --check
c RANK=2 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 python3 train_gpt.py --check
c RANK=one WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 python3 train_gpt.py --check
c python3 train_gpt.py --timeout-s 1e15 --check
c python3 train_gpt.py --max-mem-gib 1e10 --check
c python3 train_gpt.py --steps 100000000 --check
c python3 train_gpt.py --micro-batch 99999999999 --check
c python3 train_gpt.py --check 99999999999999999999
c python3 train_gpt.py --config /tmp/i32b/clip_auto.json --check
c python3 train_gpt.py --config /tmp/i32b/buckets_auto.json --check
c python3 train_gpt.py --config /tmp/i32b/quoted.json --check
echo "\$ python3 report.py benchmarks/logs/cpu/20261201-132528-s0xf | true"
python3 report.py benchmarks/logs/cpu/20261201-132528-s0xf | true; echo "exit ${PIPESTATUS[0]}"
