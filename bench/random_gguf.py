"""A Llama-shaped GGUF with random weights, of a real size, written without a download.

For timing loads, swaps and streams, what a model says does not matter; its size and shape do.
The weights are one small random block tiled over every tensor, written tensor by tensor (an
8B model in f16, ~15 GB, takes the memory of its largest tensor, ~120 MB). The vocabulary is
the 256 bytes (SentencePiece byte tokens) and three control tokens, so any text tokenizes.

    python -m bench.random_gguf OUT.gguf --shape 8b|tiny
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFWriter, TokenType

BLOCK = 1 << 16  # the random block every tensor repeats (values)


@dataclass(frozen=True, slots=True)
class Shape:
    layers: int
    embedding: int
    feed_forward: int
    heads: int
    kv_heads: int
    context: int = 8192

    @property
    def head_dim(self) -> int:
        return self.embedding // self.heads


SHAPES = {
    # Llama-3-8B's shape: ~7.5 G parameters with this vocabulary, ~15 GB in f16
    "8b": Shape(layers=32, embedding=4096, feed_forward=14336, heads=32, kv_heads=8),
    # seconds to write and to load on a CPU: what the benchmark's own test runs
    "tiny": Shape(layers=2, embedding=256, feed_forward=512, heads=4, kv_heads=2, context=2048),
}


def vocabulary() -> tuple[list[bytes], list[float], list[int]]:
    tokens = [b"<unk>", b"<s>", b"</s>"] + [f"<0x{b:02X}>".encode() for b in range(256)]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
    return tokens, [0.0] * len(tokens), [int(t) for t in types]


def tensors(shape: Shape, vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    """Every tensor of a Llama model, by name and shape (rows, columns as numpy holds them)."""
    e, f, kv = shape.embedding, shape.feed_forward, shape.kv_heads * shape.head_dim
    named: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (vocab, e))]
    for i in range(shape.layers):
        named += [
            (f"blk.{i}.attn_norm.weight", (e,)),
            (f"blk.{i}.attn_q.weight", (e, e)),
            (f"blk.{i}.attn_k.weight", (kv, e)),
            (f"blk.{i}.attn_v.weight", (kv, e)),
            (f"blk.{i}.attn_output.weight", (e, e)),
            (f"blk.{i}.ffn_norm.weight", (e,)),
            (f"blk.{i}.ffn_gate.weight", (f, e)),
            (f"blk.{i}.ffn_up.weight", (f, e)),
            (f"blk.{i}.ffn_down.weight", (e, f)),
        ]
    return [*named, ("output_norm.weight", (e,)), ("output.weight", (vocab, e))]


def write(path: Path, shape: Shape, seed: int = 0) -> int:
    """Write the model to ``path``; returns its size in bytes."""
    tokens, scores, types = vocabulary()
    writer = GGUFWriter(str(path), "llama")
    writer.add_name("random-llama")
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.embedding)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.feed_forward)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_file_type(1)  # mostly f16
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    named = tensors(shape, len(tokens))
    for name, dims in named:
        dtype = np.float32 if len(dims) == 1 else np.float16  # norms stay f32, as converters do
        writer.add_tensor_info(name, dims, np.dtype(dtype), int(np.prod(dims)) * dtype().itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    block = np.random.default_rng(seed).normal(0, 0.02, BLOCK)
    for _, dims in named:
        writer.write_tensor_data(_tiled(block, dims))
    writer.close()
    return path.stat().st_size


def _tiled(block: np.ndarray, dims: tuple[int, ...]) -> np.ndarray:
    if len(dims) == 1:
        return np.ones(dims, dtype=np.float32)  # RMS norm weights of one: a stable forward pass
    count = int(np.prod(dims))
    reps = -(-count // block.size)
    return np.tile(block.astype(np.float16), reps)[:count].reshape(dims)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--shape", choices=SHAPES, default="tiny")
    args = parser.parse_args()
    size = write(args.out, SHAPES[args.shape])
    print(f"{args.out}: {size / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
