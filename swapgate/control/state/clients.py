"""Who sends the requests, as the traffic shows it (docs/configuration.md, "Residency that knows
who is waiting"): for each client (a client key's name; without keys, one anonymous client),
how many requests it has open at once, which of them are in flight, and which models it used
lately.

Coding agents are closed loops: an agent sends its next request only once its last one was
answered. A client whose open requests are as many as it ever has at once (its learned
concurrency, held steady over a while), none of them in flight (they wait for a swap, a slot, a
queue), cannot send anything else until one of them is served. A model that only such clients
used lately is held by its residency for nobody: the requests that could come for it are the
ones queued for the model it keeps out. ``unheld`` names those models; placement evicts them
without waiting out their residency.

Independent traffic keeps its protection: a client whose concurrency still grows (arrivals that
do not wait for answers) is never taken as closed, nor is one with a request in flight (it will
be answered and may ask for anything next), nor one that has nothing open (it may come back).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

WINDOW = 120.0  # seconds over which a client's concurrency and the models it used are learned
STEADY = 1  # a concurrency is learned once as many requests as it came again without a rise
ANONYMOUS = ""  # the one client there is where no client keys are configured


@dataclass(slots=True)
class _Client:
    open: int = 0  # requests begun and not ended: placed, waiting, or in flight
    flying: int = 0  # of those, in flight (leased): they will be answered
    pending: Counter[str] = field(default_factory=Counter)  # the others, per model
    # (when, open): the window's maximum first, each later one smaller (a sliding maximum, so
    # that a request costs O(1) however many came in the window)
    peaks: deque[tuple[float, int]] = field(default_factory=deque)
    since_rise: int = 0  # requests begun since its concurrency last rose
    used: dict[str, float] = field(default_factory=dict)  # model -> when it last asked for it

    def concurrency(self, now: float) -> int:
        """The most requests it had open at once within the window."""
        while self.peaks and self.peaks[0][0] < now - WINDOW:
            self.peaks.popleft()
        return self.peaks[0][1] if self.peaks else 0

    def opened(self, now: float) -> None:
        """It has ``open`` requests open at ``now``: older peaks no higher never count again."""
        while self.peaks and self.peaks[-1][1] <= self.open:
            self.peaks.pop()
        self.peaks.append((now, self.open))

    def closed(self, now: float, model: str) -> bool:
        """Every request it can have open is open, none in flight, none for ``model``: it sends
        nothing (for ``model`` or else) until one of them is served."""
        learned = self.concurrency(now)
        steady = self.since_rise >= STEADY * learned
        idle = not self.flying and not self.pending[model]
        return learned > 0 and steady and self.open >= learned and idle


@dataclass(slots=True)
class Ticket:
    """One request, open for its client from ``Clients.began`` to ``Clients.ended``."""

    client: _Client
    model: str
    flying: bool = False
    ended: bool = False


class Clients:
    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._clients: dict[str, _Client] = {}

    def began(self, client: str | None, model: str) -> Ticket:
        """A request of ``client`` for ``model`` arrived; give its ticket to ``ended``."""
        now = self._clock()
        c = self._clients.setdefault(client or ANONYMOUS, _Client())
        learned = c.concurrency(now)
        c.open += 1
        c.pending[model] += 1
        c.used[model] = now
        c.since_rise += 1
        if c.open > learned:
            c.since_rise = 0  # still growing: not (yet) a closed loop
        if c.open >= learned:
            c.opened(now)
        return Ticket(c, model)

    def flying(self, ticket: Ticket, flying: bool) -> None:
        """``ticket``'s request holds a lease (it will be answered), or gave it back."""
        if ticket.ended or ticket.flying == flying:
            return
        c, model = ticket.client, ticket.model
        c.flying += 1 if flying else -1
        c.pending[model] += -1 if flying else 1
        ticket.flying = flying

    def ended(self, ticket: Ticket) -> None:
        if ticket.ended:
            return
        self.flying(ticket, False)
        c = ticket.client
        c.open -= 1
        c.pending[ticket.model] -= 1
        if c.pending[ticket.model] <= 0:
            del c.pending[ticket.model]
        ticket.ended = True

    def unheld(self) -> frozenset[str]:
        """The models that no client able to send a request now used lately: every client that
        asked for one within the window has all it can open, none in flight, none for it."""
        now = self._clock()
        users: dict[str, list[_Client]] = {}
        for c in self._clients.values():
            for model, when in c.used.items():
                if when >= now - WINDOW:
                    users.setdefault(model, []).append(c)
        return frozenset(
            model for model, clients in users.items() if all(c.closed(now, model) for c in clients)
        )
