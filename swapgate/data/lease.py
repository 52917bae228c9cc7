"""What the router hands the data plane: a ``Lease`` on an instance or relay, the ``Upstream``
it points at, and the ``Progress`` of a request still waiting (which keep-alives tell)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the SDK is imported only when tracing is on (swapgate/tracing/)
    from opentelemetry.trace import SpanContext


@dataclass(frozen=True, slots=True)
class Upstream:
    """Where requests go: an instance's server root, or a relay's OpenAI base URL (``.../v1``)."""

    url: str
    api_key: str | None
    is_relay: bool = False
    read_timeout: float | None = None
    key_env: str | None = None  # where api_key came from, for messages that must not show it
    protocols: frozenset[str] = frozenset({"openai"})
    query: str = ""  # query parameters every request carries (a llama-router's autoload=false)

    def url_for(self, path: str) -> str:
        return self.url + (path.removeprefix("/v1") if self.is_relay else path)


@dataclass(slots=True)
class Pulse:
    """When an instance's answers last moved: a byte of any of them arrived. A poll that times
    out while they move means a busy server, not a dead one (llama-cpp-python answers no poll
    while it generates)."""

    clock: Callable[[], float] = time.monotonic  # the registry's
    last: float = 0.0

    def beat(self) -> None:
        self.last = self.clock()


@dataclass(slots=True)
class Progress:
    """Where a waiting request stands: what keep-alive messages tell the client."""

    instance: str | None = None
    state: str = "placing"  # loading | queued | waiting (for the upstream's answer)
    route: str | None = None  # where the request was sent (``instance/NAME``), once it was
    # How it found its model (the activity log): warm, swap, queued or full; and the swap it
    # waited for, by its id in the swap log
    placement: str = "warm"
    swap_id: int | None = None
    # While tracing: (state, epoch ns, instance) at each change of what it waits for, and the
    # context of the swap span it waited for last (swapgate/tracing/)
    trail: list[tuple[str, int, str | None]] | None = None
    swap_span: SpanContext | None = None

    def moved(self, instance: str, state: str) -> None:
        """It waits on ``instance`` now, in ``state`` (queued, loading, waking, waiting)."""
        self.instance, self.state = instance, state
        trail = self.trail
        if trail is not None and (not trail or trail[-1][0::2] != (state, instance)):
            trail.append((state, time.time_ns(), instance))


@dataclass(frozen=True, slots=True)
class Lease:
    """A request's claim on an instance with its model warm, or on a relay.

    Give it back with ``Router.release``.
    """

    kind: str  # "instance" | "relay"
    name: str
    model: str
    upstream_model: str
    upstream: Upstream
    waited: float
    pulse: Pulse = field(default_factory=Pulse)  # the instance's: beats as the answer arrives
    priority: int = 0  # its request's class (docs/keys.md)
    slot: int | None = (
        None  # the engine's slot it is sent to (kv_keep: swapgate/control/memory/kv/)
    )

    @property
    def route(self) -> str:
        return f"{self.kind}/{self.name}"
