"""A random-weight GGUF takes another GGUF's tokenizer whole (the tests' tiny Llama)."""

from __future__ import annotations

from pathlib import Path

from swapgate.config.gguf import read_gguf
from testbed.random_gguf import SHAPES, Vocabulary, bytes_vocabulary, vocabulary_of, write


def test_a_model_written_with_a_vocabulary_reads_back_with_it(tmp_path: Path) -> None:
    theirs = bytes_vocabulary()
    vocab = Vocabulary(
        [*theirs.tokens, b"<end_of_turn>"],
        [*theirs.scores, -1.5],
        [*theirs.types, 3],
        {**theirs.settings, "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.pre": "x"},
    )
    write(tmp_path / "m.gguf", SHAPES["tiny"], vocab=vocab)
    assert vocabulary_of(tmp_path / "m.gguf") == vocab
    facts = read_gguf(str(tmp_path / "m.gguf"))
    assert (facts.architecture, facts.layers) == ("llama", SHAPES["tiny"].layers)
