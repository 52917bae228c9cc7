"""The command line's kinds of value, one parser each, so every command reads a duration, a
size or a list of per-model durations the same way as the config does (docs/configuration.md)
and refuses a bad one with argparse's usage line."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from swapgate.config.durations import parse_duration


def duration(text: str) -> float:
    """``5s``, ``500ms``, ``10h`` or plain seconds."""
    value = _parsed(parse_duration, text)
    assert isinstance(value, float)
    return value


def duration_text(text: str) -> str:
    """A duration checked here and passed on as written (to the admin API, which says it back)."""
    duration(text)
    return text


def size(text: str) -> int:
    """``20MiB``, ``4GB`` or plain bytes."""
    from swapgate.config.sizes import parse_size  # pydantic's: loaded by the commands that ask

    value = _parsed(parse_size, text)
    assert isinstance(value, int)
    return value


def load_times(text: str) -> dict[str, float]:
    """``a=2,b=30s``: each model's load time."""
    times: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        model, sep, seconds = item.partition("=")
        if not sep or not model:
            raise argparse.ArgumentTypeError(f"{item!r}: expected MODEL=DURATION, e.g. a=2s")
        times[model.strip()] = duration(seconds)
    return times


def port_list(text: str) -> tuple[int, ...]:
    """``9001,9002``: ports, each once, each from 1 to 65535."""
    ports: list[int] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        if not item.isdigit() or not 0 < int(item) < 65536:
            raise argparse.ArgumentTypeError(f"{item!r}: expected a port, 1 to 65535")
        if int(item) in ports:
            raise argparse.ArgumentTypeError(f"port {item} given twice")
        ports.append(int(item))
    return tuple(ports)


def _parsed(parse: Callable[[object], object], text: str) -> object:
    """The config's parser on ``text``; its complaint becomes argparse's."""
    try:
        return parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
