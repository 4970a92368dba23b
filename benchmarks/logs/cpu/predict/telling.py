import json, sys, time
sys.path.insert(0, '.')
from zero3bench.accounting import predict, moments
from zero3bench.accounting.shapes import PRESETS, LOSS_CHUNK
from zero3bench import stages
bad = 0; n = 0
for model in ("tiny", "125m", "350m", "1.3b", "2.7b"):
    shape = PRESETS[model]
    for stage in (1, 2):
        zero = json.loads(stages.config_path(stage).read_text())["zero_optimization"]
        for world in (1, 2, 3, 5, 8, 13, 64, 100, 257):
            def m(rank):
                return predict.rank_memory(stage, "deepspeed", "bf16", world, shape.params, zero, shape, micro_batch=2,
                                           seq=1024, checkpoint=True, loss_chunk=LOSS_CHUNK, rank=rank)["peak"]
            full = max(m(r) for r in range(world))
            tell = max(m(r) for r in moments.telling_ranks(stage, "deepspeed", world, shape.params, shape,
                                                            {"optimizer": None, "param": None}))
            n += 1
            if full != tell: bad += 1; print("MISMATCH", model, stage, world, full, tell)
print(n, "cases,", bad, "mismatches")
