import json, math
from zero3bench.accounting import host, moments
from zero3bench.accounting.predict import zero_setting
from zero3bench import stages
from plan import hf_shape, PRESETS
print("\n# host.staging_bytes (gloo's pinned staging on rehearsed ranks, 3_offload's config) before and after cd4c099, bf16")
zero = json.loads(stages.config_path("3_offload").read_text())["zero_optimization"]
def old(width, world, zero, shape, params):
    twelfths, ahead = moments.prefetch_reach(zero, shape, params)
    gather = twelfths * shape.d_model**2 if twelfths <= 12 else zero_setting(zero, "stage3_prefetch_bucket_size")
    return math.ceil(ahead / gather) * (host.pinned(width * gather) + host.pinned(width * gather / world))
for name in ("1.3b", "2.7b", "llama-3.2-1b", "qwen2.5-1.5b", "mistral-7b-v0.1"):
    shape = PRESETS[name] if name in PRESETS else hf_shape(name)
    for world in (2, 4):
        a, b = old(2, world, zero, shape, shape.params), host.staging_bytes(2, world, zero, shape, shape.params)
        print(f"{name:>16} {world} ranks: {a/1e9:6.3f} GB before, {b/1e9:6.3f} GB after ({(b-a)/1e9:+.3f})")
