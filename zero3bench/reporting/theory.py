"""
What theory expects of a run, for the verdict to judge its measurements against: memory.rank_memory at the
run's own settings (world size, dtype, model, batch, its config's zero_optimization as DeepSpeed read it), the
formula that train_gpt.py --check, the plan and each RESULT's predicted peak use.
"""
from zero3bench.accounting import host, predict
from zero3bench.accounting.memory import Counts, rank_memory
from zero3bench.finishing import partition, seat
from zero3bench.result import RankResult, shape_of

# (b) expects stage 3's peak to fall against stage 0's as memory.rank_memory predicts for the two runs, and stage
# 3's peak may exceed its predicted share of stage 0's by this factor, for what theory leaves out. At the default
# (1.3b, bf16, micro batch 2, 4 ranks) theory predicts 3.95x, so (b) expects 3.44x or better, above the acceptance
# check's "about 3-4x lower with 4 GPUs". The committed H200 pairs measured 1.01 of the predicted ratio at the
# default and 0.97 to 0.99 on the tiny model (benchmarks/logs/cpu/verdict/peak-theory-2.txt). A stage 3 that held
# every block's weights whole (2.25 GiB in bf16 at 1.3b) would fail the peak: 2.92x at 4 ranks against 3.44x, 1.85x
# at 2 against 1.92x (theory's 2.21x less the slack).
PEAK_SLACK = 1.15

# A record from before the zero_optimization section was recorded: DeepSpeed's defaults stand for its settings,
# but its config capped the weights gathered ahead (1e8 in ds_config_stage3.json since e2f8cf7) rather than leave
# DeepSpeed's 1e9, and released each module's weights after use (stage3_max_reuse_distance 0 in every config since
# 144abf2), where DeepSpeed's 1e9 keeps them. A cap of 0 here had taken backward's first prefetch away with the
# prefetch moment: rehearsal-sweep's stage 3 on 8 ranks -6.3% against -3.7% at 1e8.
UNRECORDED = {"stage3_max_live_parameters": 1e8, "stage3_max_reuse_distance": 0}


def predictable(r: RankResult) -> bool:
    """A GPU rank that stepped and records what the prediction reads: the census of its tensors and the
    zero_optimization section as DeepSpeed read it (FSDP2 reads none). Older logs hold neither, or only the
    census, and were made with configs that have since changed (git log ds_config_stage*.json): what they ran
    cannot be predicted from the record."""
    config = r.zero_config or r.run.engine == "fsdp2"
    return bool(r.mem_kind == "cuda" and r.steps and not r.oom and r.model_state_breakdown and config)


def predicted_peak(r: RankResult) -> float | None:
    """One rank's peak as memory.rank_memory gives it for the run's settings alone (what train_gpt.py --check
    says), not from what the rank counted; None for a model of no known shape, or whose activations are not
    predicted."""
    shape = shape_of(r)
    if shape is None:
        return None
    return rank_memory(r.run, shape, Counts.of_shape(shape), r.zero_config or UNRECORDED, seat(r)).peak


def predicted_host_peak(r: RankResult) -> float | None:
    """A GPU rank's peak resident set on the host where it offloads its optimizer at stage 3 (host.host_peak_bytes,
    at its partition and its config as DeepSpeed read it); None otherwise, or where the record lacks them."""
    shape = shape_of(r)
    if shape is None or not r.zero_config or r.mem_kind != "cuda" or r.shards.params_total is None:
        return None
    return host.host_peak_bytes(r.run.stage, predict.WIDTH[r.run.dtype], r.world_size, partition(r), r.zero_config,
                                shape, r.shards.params_total, bool(r.rehearsal))
