"""
The measured parts of a rank's result that its RESULT line carries as records of their own, typed: where it ran
(Environment). A log of an older version lacks some of their keys, and a CPU run records no driver; a part
writes back the keys it was made with, in their order, so that its record reads back as it was written.
"""
from dataclasses import dataclass, field, fields
from typing import Any, Self


@dataclass(frozen=True)
class Part:
    recorded: tuple[str, ...] = field(default=(), repr=False, compare=False, kw_only=True)  # its record's keys

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Self:
        """The part a record holds; keys it does not know (a newer version's) are passed over."""
        known = [key for key in d if key in {f.name for f in fields(cls)} - {"recorded"}]
        return cls(**{key: d[key] for key in known}, recorded=tuple(known))

    def as_dict(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in self.recorded}


@dataclass(frozen=True)
class Environment(Part):
    """What a rank ran on (machine.environment): its host, its software's versions, its device."""
    host: str | None = None
    python: str | None = None
    torch: str | None = None
    deepspeed: str | None = None
    cuda: str | None = None  # the CUDA that torch was built with
    gpus_on_host: int | None = None
    device: str | None = None  # the GPU's name, or without one the CPU's
    driver: str | None = None  # NVIDIA's, on a GPU; None where nvidia-smi did not say


def of(d: dict[str, Any]) -> dict[str, Any]:
    """The typed parts of a RESULT line's record, by its keys, where it holds them."""
    return {"env": Environment.from_dict(d["env"]) if d.get("env") else None}
