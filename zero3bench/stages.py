"""
The ZeRO stages in one table: what each one partitions across the ranks, and the config file that selects
it. The rest of the benchmark asks these names rather than compare stage numbers. torch-free.
"""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # train_gpt.py's folder
# What each stage partitions over the ranks (the ZeRO paper's Pos, Pos+g and Pos+g+p); everything else stays
# whole on every rank. Every check, prediction and explanation reads this table.
PARTITIONS = {0: frozenset(), 1: frozenset({"optimizer"}), 2: frozenset({"optimizer", "grads"}),
              3: frozenset({"optimizer", "grads", "params"})}
DENSE = next(stage for stage, kinds in PARTITIONS.items() if not kinds)  # stage 0: the reference, nothing sharded
ZERO3 = next(stage for stage, kinds in PARTITIONS.items() if "params" in kinds)  # stage 3: everything sharded
# Stage N trains with ds_config_stageN.json; a variant of a stage adds to its name (ds_config_stage3_offload.json:
# "3_offload"). Stages 0 and 3, which run.sh compares, keep theirs beside train_gpt.py, the others in configs/.
CONFIG_NAME = "ds_config_stage{}.json"
CONFIG_FOLDERS = (ROOT, ROOT / "configs")


def shards_params(stage: int) -> bool:
    return "params" in PARTITIONS[stage]


def shards_nothing(stage: int) -> bool:
    return not PARTITIONS[stage]


def splits_one_buffer(stage: int) -> bool:
    """Stages 1 and 2 partition one flat buffer of every parameter's state; stage 3 partitions each tensor."""
    return bool(PARTITIONS[stage]) and not shards_params(stage)


def config_path(name: int | str) -> Path:
    """The config of a stage (a number) or of a variant ("3_offload"), the first of CONFIG_FOLDERS that has it;
    where none does, the path it would have in configs/."""
    paths = [folder / CONFIG_NAME.format(name) for folder in CONFIG_FOLDERS]
    return next((path for path in paths if path.exists()), paths[-1])


def config_names() -> list[str]:
    """The names that run.sh's --stages takes: every config in CONFIG_FOLDERS."""
    prefix, suffix = CONFIG_NAME.split("{}")
    return sorted({p.name[len(prefix):-len(suffix)] for folder in CONFIG_FOLDERS
                   for p in folder.glob(CONFIG_NAME.format("*"))})


def is_own_config(path: str | Path | None, stage: int) -> bool:
    """Whether a config is its stage's own, rather than a variant of it."""
    return path is not None and Path(path).name == CONFIG_NAME.format(stage)
