"""The vocabulary shared by drivers, the registry and placement."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from swapgate.data.footprint import Footprint


class WarmState(StrEnum):
    COLD = "cold"
    ASLEEP = "asleep"  # resident but not awake (vLLM's sleep mode): it wakes in seconds
    LOADING = "loading"
    WARM = "warm"


@dataclass(frozen=True, slots=True)
class InstanceReport:
    """What one poll of an instance said, in the instance's own (upstream) model names.

    ``running`` is None when the backend cannot tell (swapgate then tracks warm state itself);
    ``available`` is None when the driver does not discover which models the instance serves;
    ``all_warm`` says every model the instance serves is warm (fixed-model servers);
    ``sizes`` is the memory each resident model takes, where the backend reports it (Ollama);
    ``capacity`` is how many models the backend runs at once, where it says (llama-server's
    router): the instance's capacity when the config sets none; ``unreachable``: models whose
    own server does not answer, and why.
    """

    running: Mapping[str, WarmState] | None
    available: frozenset[str] | None
    all_warm: bool = False
    sizes: Mapping[str, int] | None = None  # what each model really takes, where it says
    capacity: int | None = None  # models it runs at once, where it says (a router's --models-max)
    # Models whose own server does not answer (vLLM's sleep mode: a server per model), and why:
    # each is down alone; the instance serves its others.
    unreachable: Mapping[str, str] | None = None
    # What each ready model takes, measured (kind: process: its group's RSS or GPU memory)
    measured: Mapping[str, Footprint] | None = None


@dataclass(frozen=True, slots=True)
class Stage:
    """A load's stage as its engine reports it: ``number`` of ``count`` (named ``name``), and
    how far into it, 0 to 1."""

    number: int
    count: int
    name: str
    value: float
