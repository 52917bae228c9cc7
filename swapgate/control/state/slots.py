"""The mutable state of one instance and of each model on it, as the registry keeps it, and
the frozen views of them that snapshots hand to placement."""

from __future__ import annotations

from dataclasses import dataclass, field

from swapgate.config.settings import InstanceConfig
from swapgate.control.state.copies import Copies, Mover
from swapgate.data.footprint import Measured
from swapgate.data.lease import Pulse
from swapgate.data.snapshot import InstanceView, ModelView
from swapgate.data.warm import WarmState

NO_COUNT_LIMIT = 1 << 30  # an instance whose memory alone limits what is resident
# ``closing_until`` of a model being evicted: no new request goes to it until it is gone.
LEAVING = float("inf")


@dataclass(slots=True)
class ModelSlot:
    state: WarmState = WarmState.COLD
    since: float = 0.0
    last_used: float = 0.0
    inflight: int = 0
    pinned_until: float = 0.0
    waiting: int = 0
    for_slot: int = 0  # of ``waiting``: those waiting for a free slot, not for a swap
    closing_until: float = 0.0
    unwanted: bool = False  # loaded by a swap abandoned by every request: the first victim
    classes: dict[int, int] = field(default_factory=dict)  # in flight, by priority class
    backoff_until: float = 0.0  # its load failed: none here until then (policy/backoff.py)
    failure: str = ""  # why, as clients may read it
    down: str = ""  # why its own server does not answer (vllm-sleep), while it does not
    limit: int | None = None  # what the instance takes at once of it, learned from a 429
    limit_until: float = 0.0  # ... until then (then it is tried higher again)
    # Told of each change of state: the registry's index of copies by model (copies.py)
    moved: Mover | None = field(default=None, repr=False, compare=False)

    def set_state(self, state: WarmState, now: float) -> None:
        if self.state is not state:
            old = self.state
            self.state, self.since = state, now
            self.closing_until = 0.0
            self.unwanted = False
            if self.moved is not None:
                self.moved(old, state)

    def view(self, now: float, elsewhere: int = 0) -> ModelView:
        return ModelView(
            self.state,
            self.since,
            self.last_used,
            self.inflight + elsewhere,
            self.pinned_until,
            self.waiting,
            self.closing_until > now,
            self.unwanted,
            max(self.classes) if self.classes else None,
            self.for_slot,
            self.backoff_until,
            self.failure,
            self.down,
            self.limit if self.limit_until > now else None,
        )


@dataclass(slots=True)
class InstanceSlot:
    config: InstanceConfig
    serves: frozenset[str]
    up: bool = False
    drained: bool = False
    backoff_until: float = 0.0
    inflight: int = 0
    swapping: str | None = None
    swap_done_by: float = 0.0
    generation: int = 0
    reserved_for: str | None = None
    reserved_until: float = 0.0
    slots: dict[str, ModelSlot] = field(default_factory=dict)
    learned: dict[str, int] = field(default_factory=dict)  # sizes its backend reported
    # What each model took here since its last load, measured (control/state/polls.py)
    measured: dict[str, Measured] = field(default_factory=dict)
    warned: dict[str, float] = field(default_factory=dict)  # measured above declared: the load
    reported_capacity: int | None = None  # what its backend said it runs at once
    pulse: Pulse = field(default_factory=Pulse)  # when its answers last moved
    downs: list[float] = field(default_factory=list)  # when it last went down: its flaps
    # Where each model has a copy: the registry's, shared by its instances; its own if alone
    copies: Copies = field(default_factory=Copies, repr=False, compare=False)

    @property
    def capacity(self) -> int:
        """Models resident at once by count: the config's, else what the backend reports,
        else none at all where memory alone limits (docs/memory.md)."""
        if self.reported_capacity is not None and not self.config.capacity_set:
            return self.reported_capacity
        count = self.config.count_limit
        return count if count is not None else NO_COUNT_LIMIT

    def slot(self, model: str) -> ModelSlot:
        slot = self.slots.get(model)
        if slot is None:
            slot = self.slots[model] = ModelSlot(moved=self.copies.mover(self.config.name, model))
        return slot

    def view(
        self, now: float, estimates: dict[str, int], elsewhere: dict[str, int] | None = None
    ) -> InstanceView:
        """``estimates``: the configured sizes; ``elsewhere``: what other replicas have in
        flight here, per model."""
        others = elsewhere or {}
        memory = self.config.memory
        return InstanceView(
            name=self.config.name,
            up=self.up,
            drained=self.drained,
            capacity=self.capacity,
            weight=self.config.weight,
            inflight=self.inflight + sum(others.values()),
            serves=self.serves,
            models={name: slot.view(now, others.get(name, 0)) for name, slot in self.slots.items()},
            swapping=self.swapping,
            swap_done_by=self.swap_done_by,
            backoff_until=self.backoff_until,
            reserved_for=self.reserved_for if self.reserved_until > now else None,
            memory=memory,
            # models leaving it: no swap may start meanwhile
            evicting=any(slot.closing_until == LEAVING for slot in self.slots.values()),
            sizes=self.sizes(estimates) if memory is not None else {},
        )

    def sizes(self, estimates: dict[str, int]) -> dict[str, int]:
        """Each model's size for placement: learned over estimated, and the larger of that
        and what it was measured to take here."""
        sizes = {**estimates, **self.learned}
        for model, figure in self.measured.items():
            if figure.bytes > sizes.get(model, 0):
                sizes[model] = figure.bytes
        return sizes
