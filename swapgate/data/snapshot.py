"""The frozen views of live state that placement reads: one ``Snapshot`` of every instance and
the models on it, taken at one instant. Nothing here changes state; the registry (or another
store behind the same verbs) makes them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from swapgate.data.demand import Arrivals
from swapgate.data.warm import WarmState

AWAKE = frozenset({WarmState.WARM, WarmState.LOADING})


@dataclass(frozen=True, slots=True)
class ModelView:
    state: WarmState
    since: float
    last_used: float  # 0.0: never served through swapgate
    inflight: int
    pinned_until: float
    waiting: int = 0  # requests waiting for this model's swap here: it serves them first
    closing: bool = False  # no new requests: it makes room for a request waiting too long
    unwanted: bool = False  # its swap was abandoned by every request: the first victim
    top_class: int | None = None  # the highest priority class among its requests in flight
    for_slot: int = 0  # of ``waiting``: those that wait for a free slot (``max_concurrency``)
    backoff_until: float = 0.0  # its load failed here: no load of it here until then
    failure: str = ""  # why its last load here failed, as clients may read it
    down: str = ""  # why it cannot be reached here now (its own server does not answer)
    limit: int | None = None  # its requests at once here, as the instance showed (a 429)


@dataclass(frozen=True, slots=True)
class InstanceView:
    name: str
    up: bool
    drained: bool
    capacity: int
    weight: float
    inflight: int
    serves: frozenset[str]
    models: Mapping[str, ModelView]
    swapping: str | None
    swap_done_by: float
    backoff_until: float
    reserved_for: str | None = None  # the starvation rule makes room here for this model only
    memory: int | None = None  # what its models may take at once (docs/memory.md); None: no limit
    sizes: Mapping[str, int] = field(default_factory=dict)  # each model's, learned or estimated
    evicting: bool = False  # models are leaving it (put to sleep beyond capacity): busy

    def state_of(self, model: str) -> WarmState:
        view = self.models.get(model)
        return view.state if view else WarmState.COLD

    def available(self, now: float) -> bool:
        return self.up and not self.drained and now >= self.backoff_until

    def reachable(self, model: str) -> bool:
        """Whether ``model``'s own server here answers (vLLM's sleep mode: one per model)."""
        view = self.models.get(model)
        return view is None or not view.down

    def backing_off(self, model: str, now: float) -> bool:
        """Whether a load of ``model`` here failed lately: no load of it here until later."""
        view = self.models.get(model)
        return view is not None and now < view.backoff_until

    @property
    def resident(self) -> int:
        """Models taking a place (``capacity``): warm or loading; asleep ones take none."""
        return sum(1 for m in self.models.values() if m.state in AWAKE)

    @property
    def used(self) -> int:
        """The memory its resident (warm or loading) models take, those with a known size."""
        return sum(self.sizes.get(name, 0) for name, m in self.models.items() if m.state in AWAKE)

    def fits(self, model: str, freed: int = 0) -> bool:
        """Whether ``model`` fits beside what is resident, once ``freed`` bytes are evicted."""
        if self.memory is None:
            return True
        return self.used - freed + self.sizes.get(model, 0) <= self.memory

    @property
    def load(self) -> float:
        return self.inflight / self.weight


@dataclass(frozen=True, slots=True)
class Snapshot:
    now: float
    instances: tuple[InstanceView, ...]
    # Each model's requests so far (gateway-wide), for those requested since the start.
    arrivals: Mapping[str, Arrivals] = field(default_factory=dict)
    # For each model with requests queued (not yet sure of a swap), when the oldest one arrived.
    queued: Mapping[str, float] = field(default_factory=dict)
    # For each model with requests queued, the highest priority class among them.
    classes: Mapping[str, int] = field(default_factory=dict)
    # Models whose residency holds them for nobody: every client that used them lately waits,
    # with all it can have open, for other models (swapgate/control/state/clients.py).
    unheld: frozenset[str] = frozenset()
    # Each instance by name, filled at the first ``instance()``: later ones look it up.
    _by_name: dict[str, InstanceView] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def instance(self, name: str) -> InstanceView:
        """The instance called ``name``; StopIteration if the snapshot holds none (as the
        scan it replaced raised)."""
        by_name = self._by_name
        if not by_name:
            by_name.update((i.name, i) for i in self.instances)
        found = by_name.get(name)
        if found is None:
            raise StopIteration(name)
        return found
