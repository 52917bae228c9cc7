"""A Llama-shaped GGUF with random weights, of a real size, written without a download.

For timing loads, swaps and streams, what a model says does not matter; its size and shape do.
The weights are one small random block tiled over every tensor, written tensor by tensor (an
8B model in f16, ~15 GB, takes the memory of its largest tensor, ~120 MB). The vocabulary is
the 256 bytes (SentencePiece byte tokens) and three control tokens, so any text tokenizes; or,
with ``--vocabulary-of``, another GGUF's whole tokenizer, so that a prompt is as many tokens as
that model would read (the tests' engines: testbed/engines.py, ``tiny_weights``).

    python -m testbed.random_gguf OUT.gguf --shape 8b|tiny|test [--vocabulary-of GGUF]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFWriter, TokenType

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
    # the tests' engines: a 4,000-token prompt is read in a quarter of a second on one core
    "test": Shape(layers=2, embedding=64, feed_forward=128, heads=2, kv_heads=2, context=32768),
}
# The tokenizer's settings carried over from a GGUF given with --vocabulary-of.
TOKENIZER_SETTINGS = (
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_eos_token",
    "tokenizer.ggml.add_space_prefix",
    "tokenizer.chat_template",
)


@dataclass(frozen=True, slots=True)
class Vocabulary:
    tokens: list[bytes]
    scores: list[float]
    types: list[int]
    settings: dict[str, object]  # tokenizer.ggml.* keys and their values


def text_only() -> dict[str, int]:
    """A request's ``logit_bias`` that bars the byte tokens above 0x7F, so that everything the
    bytes vocabulary generates is ASCII: random bytes are seldom valid UTF-8, and llama-server
    streams no content until they are (``bytes_vocabulary``)."""
    return {str(3 + byte): -100 for byte in range(0x80, 0x100)}


def bytes_vocabulary() -> Vocabulary:
    """The 256 bytes (SentencePiece byte tokens, byte ``b`` is token ``3 + b``) after three
    control tokens: any text tokenizes."""
    tokens = [b"<unk>", b"<s>", b"</s>"] + [f"<0x{b:02X}>".encode() for b in range(256)]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
    settings: dict[str, object] = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
    }
    return Vocabulary(tokens, [0.0] * len(tokens), [int(t) for t in types], settings)


def vocabulary_of(gguf: Path) -> Vocabulary:
    """The tokenizer of the GGUF ``gguf``: its tokens, scores, types and settings."""
    fields = GGUFReader(gguf).fields

    def parts(name: str) -> list[np.ndarray]:
        field = fields[name]
        return [field.parts[i] for i in field.data]

    tokens = [bytes(part) for part in parts("tokenizer.ggml.tokens")]
    scores = [float(part[0]) for part in parts("tokenizer.ggml.scores")]
    types = [int(part[0]) for part in parts("tokenizer.ggml.token_type")]
    settings = {name: fields[name].contents() for name in TOKENIZER_SETTINGS if name in fields}
    return Vocabulary(tokens, scores, types, settings)


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


def write(path: Path, shape: Shape, seed: int = 0, vocab: Vocabulary | None = None) -> int:
    """Write the model to ``path`` (with ``vocab``, by default the bytes); returns its size in
    bytes."""
    vocab = vocab or bytes_vocabulary()
    tokens, scores, types = vocab.tokens, vocab.scores, vocab.types
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
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    for key, value in vocab.settings.items():
        _add(writer, key, value)
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


def _add(writer: GGUFWriter, key: str, value: object) -> None:
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    else:
        writer.add_string(key, str(value))


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
    parser.add_argument("--vocabulary-of", type=Path, help="a GGUF whose tokenizer to take")
    args = parser.parse_args()
    vocab = vocabulary_of(args.vocabulary_of) if args.vocabulary_of else None
    size = write(args.out, SHAPES[args.shape], vocab=vocab)
    print(f"{args.out}: {size / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
