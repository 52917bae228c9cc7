"""What a model takes in memory (docs/memory.md): given, computed from its numbers, or read from its
GGUF.

    memory = (weights + kv_per_token × context × max_seqs) × (1 + memory_overhead)
    kv_per_token = layers × kv_heads × head_dim × 2 (K and V) × bytes per element

The KV cache is allocated per sequence, up to ``context`` tokens each, for as many sequences as
the engine runs at once (vLLM's ``--max-num-seqs``, llama.cpp's ``-np``): a 70B whose context
was left at 32k takes 10 GiB per sequence, 320 GiB at 32 of them. The figures are an upper
bound: engines that window some layers' attention (Gemma 3) or page the cache allocate less.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import (
    BaseModel,
    BeforeValidator,
    ByteSize,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from swapgate.config.gguf import KvDtype, read_gguf

_SIZES = TypeAdapter(ByteSize)  # pydantic's parser: binary (GiB) and decimal (GB) units


def parse_size(value: object) -> object:
    """Accept ``20GiB``, ``1.5GB``, ``512 MiB`` or a plain number of bytes."""
    hint = "use e.g. 512MiB, 20GiB or a number of bytes"
    if isinstance(value, bool):
        raise ValueError(f"not a size: {hint}")
    if isinstance(value, str | int):
        try:
            return int(_SIZES.validate_python(value))
        except ValidationError:
            raise ValueError(f"not a size: {value!r}; {hint}") from None
    return value


Bytes = Annotated[int, BeforeValidator(parse_size), Field(gt=0)]


def _weights(value: object) -> object:
    """``weights``: a size (``14GiB``), or the weight files (a path with a ``/``, a folder, or
    a list of them), whose sizes add up to it."""
    if isinstance(value, list | tuple):
        if not value or not all(isinstance(v, str) and v for v in value):
            raise ValueError("weights: a size (14GiB), or weight files: a path or a list of paths")
        return tuple(value)
    if isinstance(value, str) and ("/" in value or value.startswith("~")):
        return (value,)
    return parse_size(value)


WeightFiles = tuple[str, ...]
Weights = Annotated[Annotated[int, Field(gt=0)] | WeightFiles, BeforeValidator(_weights)]


def weight_files(paths: WeightFiles) -> list[Path]:
    """The files ``paths`` name: each file, and every file under each folder (sorted)."""
    found: list[Path] = []
    for name in paths:
        path = Path(name).expanduser()
        if path.is_dir():
            found += sorted(p for p in path.rglob("*") if p.is_file())
        elif path.is_file():
            found.append(path)
    return found


class SizeConfig(BaseModel):
    """A model's memory keys: ``memory``; or ``weights`` with ``kv_per_token``, ``context``
    and ``max_seqs``; or ``gguf`` (whose file gives weights, KV per token and context)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    memory: Bytes | None = None
    # a size, or the weight files (host_cache keeps them in RAM: docs/host-cache.md)
    weights: Weights | None = None
    kv_per_token: Bytes | None = None
    context: Annotated[int, Field(ge=1)] | None = None  # max-model-len, -c
    max_seqs: Annotated[int, Field(ge=1)] = 1  # max-num-seqs, -np
    memory_overhead: Annotated[float, Field(ge=0, le=10, allow_inf_nan=False)] = 0.1
    gguf: str | None = None
    kv_cache_dtype: KvDtype = "f16"

    @model_validator(mode="after")
    def _one_way(self) -> SizeConfig:
        if self.memory is not None and (self.weights or self.kv_per_token or self.gguf):
            raise ValueError("memory is the whole size: drop weights, kv_per_token and gguf")
        if self.gguf and self.weights:
            raise ValueError("gguf gives the weights: drop weights (or gguf)")
        if self.kv_per_token and not (self.context or self.gguf):
            raise ValueError("kv_per_token needs context (max-model-len), the tokens per sequence")
        if self.kv_per_token and not (self.weights or self.gguf):
            raise ValueError("kv_per_token needs weights too (or memory for the whole size)")
        return self

    @property
    def sized(self) -> bool:
        return bool(self.memory or self.weights or self.gguf)


@dataclass(frozen=True, slots=True)
class Size:
    """A model's memory, and the arithmetic behind it (``swapgate plan`` prints it)."""

    weights: int
    kv_per_token: int = 0
    context: int = 0
    max_seqs: int = 1
    overhead: float = 0.0
    given: int | None = None  # ``memory`` as configured: the whole size, no arithmetic

    @property
    def kv_per_seq(self) -> int:
        return self.kv_per_token * self.context

    @property
    def kv(self) -> int:
        return self.kv_per_seq * self.max_seqs

    @property
    def total(self) -> int:
        if self.given is not None:
            return self.given
        return round((self.weights + self.kv) * (1 + self.overhead))

    def at(self, context: int, max_seqs: int) -> int:
        """The total with another context or number of sequences."""
        return round((self.weights + self.kv_per_token * context * max_seqs) * (1 + self.overhead))


def size_of(conf: SizeConfig) -> Size | None:
    """The model's size, or None when its config gives none; a GGUF that cannot be read
    raises ``ValueError`` saying why."""
    if conf.memory is not None:
        return Size(conf.memory, given=conf.memory)
    if conf.gguf:
        try:
            facts = read_gguf(conf.gguf)
        except (OSError, ValueError, KeyError, struct.error) as exc:
            raise ValueError(f"cannot read {conf.gguf}: {exc}") from None
        return Size(
            facts.weights,
            facts.kv_per_token(conf.kv_cache_dtype),
            conf.context or facts.context,
            conf.max_seqs,
            conf.memory_overhead,
        )
    if conf.weights:
        kv = conf.kv_per_token or 0
        weights = conf.weights
        if not isinstance(weights, int):
            files = weight_files(weights)
            if not files:
                raise ValueError(f"cannot read {', '.join(weights)}: no such file or folder")
            weights = sum(f.stat().st_size for f in files)
        return Size(weights, kv, conf.context or 0, conf.max_seqs, conf.memory_overhead)
    return None


def sizes(models: Mapping[str, SizeConfig]) -> tuple[dict[str, Size], list[str]]:
    """Every sized model's size, and the problems (by YAML path) of the ones that cannot be."""
    found: dict[str, Size] = {}
    problems: list[str] = []
    for name, conf in models.items():
        try:
            size = size_of(conf)
        except ValueError as exc:
            key = "gguf" if conf.gguf else "weights"
            problems.append(f"models.{name}.{key}: {exc}")
            continue
        if size is not None:
            found[name] = size
    return found, problems


def human(size: float) -> str:
    """``320 KiB``, ``10 GiB``, ``131.4 GiB``: binary units, one decimal unless whole."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(size) >= scale:
            value = size / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{size:.0f} B"
