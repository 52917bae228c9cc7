"""What a GGUF file's header says about its model's size: the weights' bytes, and the numbers
the KV cache is computed from (docs/memory.md). Only the header is read, never the tensors."""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

# Bytes per cached K or V element: ggml's quantized blocks hold 32 elements in 34 or 18 bytes.
KV_BYTES = {"f16": 2.0, "bf16": 2.0, "fp8": 1.0, "q8_0": 34 / 32, "q4_0": 18 / 32}
KvDtype = Literal["f16", "bf16", "fp8", "q8_0", "q4_0"]


@dataclass(frozen=True, slots=True)
class GgufFacts:
    """What a GGUF file says about a model's size."""

    architecture: str
    weights: int
    layers: int
    kv_heads: int
    key_length: int
    value_length: int
    context: int

    def kv_per_token(self, dtype: KvDtype) -> int:
        width = self.kv_heads * (self.key_length + self.value_length)
        return round(self.layers * width * KV_BYTES[dtype])


@cache
def read_gguf(path: str) -> GgufFacts:
    """What the file's header says (its tensors are not read)."""
    meta, weights = _gguf_header(Path(path).expanduser())
    arch = str(meta.get("general.architecture", ""))

    def number(key: str, default: int | None = None) -> int:
        value = meta.get(f"{arch}.{key}", default)
        if not isinstance(value, int):
            raise ValueError(f"its metadata has no {arch}.{key}")
        return value

    heads = number("attention.head_count")
    head_dim = number("embedding_length") // heads
    return GgufFacts(
        architecture=arch,
        weights=weights,
        layers=number("block_count"),
        kv_heads=number("attention.head_count_kv", heads),
        key_length=number("attention.key_length", head_dim),
        value_length=number("attention.value_length", head_dim),
        context=number("context_length", 0),
    )


# GGUF's scalar value types (gguf.GGUFValueType) as struct formats; 8 is a string, 9 an array.
_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}


def _gguf_header(path: Path) -> tuple[dict[str, object], int]:
    """The metadata's scalars and strings, and the tensors' total size in bytes.

    A walk of the header rather than ``gguf.GGUFReader``, which builds every array (a
    tokenizer's 262,144 tokens) and takes 11 s on a 250 MB file where this takes 0.1 s; the
    quantization block sizes are the gguf package's own."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != b"GGUF":
            raise ValueError("not a GGUF file")
        version, tensors, kvs = struct.unpack_from("<IQQ", data, 4)
        if version < 2:
            raise ValueError(f"GGUF version {version} is too old (2 or later)")
        at = 24
        meta: dict[str, object] = {}

        def string(at: int) -> tuple[str, int]:
            (length,) = struct.unpack_from("<Q", data, at)
            return bytes(data[at + 8 : at + 8 + length]).decode("utf-8", "replace"), at + 8 + length

        def value(kind: int, at: int) -> tuple[object, int]:
            if kind == 8:
                return string(at)
            if kind == 9:  # an array: skipped, item by item for strings
                item, count = struct.unpack_from("<IQ", data, at)
                at += 12
                if item in _SCALARS:
                    return None, at + count * struct.calcsize(_SCALARS[item])
                for _ in range(count):
                    at = value(item, at)[1]
                return None, at
            fmt = "<" + _SCALARS[kind]
            return struct.unpack_from(fmt, data, at)[0], at + struct.calcsize(fmt)

        for _ in range(kvs):
            key, at = string(at)
            (kind,) = struct.unpack_from("<I", data, at)
            meta[key], at = value(kind, at + 4)
        weights = 0
        for _ in range(tensors):
            _, at = string(at)
            (dims,) = struct.unpack_from("<I", data, at)
            shape = struct.unpack_from(f"<{dims}Q", data, at + 4)
            (kind,) = struct.unpack_from("<I", data, at + 4 + 8 * dims)
            at += 4 + 8 * dims + 4 + 8  # the dims, the type, the offset
            block, size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
            weights += math.prod(shape) // block * size
        return meta, weights
