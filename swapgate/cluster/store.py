"""Several replicas on one Redis (docs/deploy.md): leases, heartbeats and the events they share.

Redis holds what must be one for all replicas: a lock per instance and per loading model while
a swap runs (single flight across replicas: swapgate/cluster/locks.py), the scheduler's lease
(each preload run happens on one replica), each replica's heartbeat, the pins and drains an
operator set, and the demand by time of day that auto preloads learn
(swapgate/cluster/demand.py). Everything else travels as events on one pub/sub channel and is
applied to each replica's own registry (swapgate/cluster/swaps.py), so that the warm path reads
no Redis at all.

The scheduler's lease, like a swap lock, is a key with an expiry that its live holder renews: a
holder that dies frees it within ``LEASE_TTL``. Redis down or restarting is not an error for
anyone: every call here answers as if this replica were alone (it swaps under its own single
flight, runs its own schedule), ``swapgate_cluster_up`` goes to 0 and one line is logged; when
Redis answers again the replica reads the shared pins and drains back and carries on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable
from typing import Any, Protocol, TypeVar

import redis.asyncio as redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeout

from swapgate.cluster.locks import LEASE_TTL, Holder, SwapLocks
from swapgate.cluster.messages import Beat, Event, Heard, decode, encode
from swapgate.control.state.peer_load import REPLICA_TTL
from swapgate.metrics import Metrics
from swapgate.tasks import stop

log = logging.getLogger("swapgate.cluster")
T = TypeVar("T")
PREFIX = "swapgate:"
CHANNEL = PREFIX + "events"
HEARTBEAT = 0.5  # in-flight counts others see are at most this old (plus one pub/sub hop)
RETRY = 0.5  # how soon a replica tries Redis again after losing it

# The scheduler's lease: taken when free, renewed when ours; answers who holds it.
_LEAD = """
local holder = redis.call('get', KEYS[1])
if not holder or holder == ARGV[1] then
  redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2]); return ARGV[1]
end
return holder
"""


class Listener(Protocol):
    """What a replica does with what the others tell it (swapgate/cluster/swaps.py's
    ``SharedSwaps``)."""

    def apply(self, heard: Heard) -> None:
        """Another replica's event."""

    async def resync(self) -> None:
        """Redis answers (again): what it missed is told, what it holds read back."""

    def in_flight(self) -> dict[str, dict[str, int]]:
        """This replica's requests in flight, per instance and model, for its heartbeat."""


class Cluster:
    """This replica's side of the shared state; its listener (given at ``start``) gets the
    others' events."""

    def __init__(self, url: str, replica: str, metrics: Metrics) -> None:
        self.replica = replica
        self.up = False
        self.leader: str | None = None  # who holds the scheduler, as last seen
        self._listener: Listener | None = None
        # One retry, on a fresh connection: after Redis restarts, the first command on each
        # pooled connection fails although Redis answers again.
        self._redis = redis.Redis.from_url(
            url,
            socket_timeout=1.0,
            socket_connect_timeout=1.0,
            decode_responses=True,
            retry=Retry(NoBackoff(), 1),
            retry_on_error=[RedisConnectionError, RedisTimeout],
        )
        self._lead = self._redis.register_script(_LEAD)
        self.locks = SwapLocks(self, PREFIX)  # each swap's, across replicas
        self._tasks: list[asyncio.Task[None]] = []
        self._synced = False  # the shared pins and drains were read since Redis last answered
        self._resyncing: asyncio.Future[None] | None = None
        self._told_down = False
        self._up_gauge = metrics.cluster_up()
        self._up_gauge.set(0)

    async def start(self, listener: Listener) -> None:
        self._listener = listener
        await self._sync()
        self._tasks = [
            asyncio.create_task(self._beat(), name="cluster heartbeat"),
            asyncio.create_task(self._listen(), name="cluster events"),
        ]

    async def aclose(self) -> None:
        await self.locks.release_all()
        await stop(*self._tasks, self._resyncing)
        with contextlib.suppress(RedisError, OSError):
            await self._redis.delete(_replica_key(self.replica))
        await self._redis.aclose()

    # -- the schedule --------------------------------------------------------------------------

    async def leads(self) -> bool:
        """Whether this replica runs the scheduled preloads now: it holds the lease, or Redis
        is down and it cannot know (a preload twice is harmless; one missed is not)."""
        holder = await self.call(
            self._lead(keys=[PREFIX + "scheduler"], args=[self.replica, _ms(LEASE_TTL)])
        )
        if not self.up:
            return True
        self.leader = str(holder)
        return holder == self.replica

    # -- events and shared operator state ------------------------------------------------------

    async def publish(self, event: Event) -> bool:
        """Tell the others (those listening now); False if Redis did not take it."""
        message = encode(event, self.replica)
        return await self.call(self._redis.publish(CHANNEL, message)) is not None

    async def share(self, key: str, field: str, value: str | None) -> bool:
        """Keep an operator's pin or drain in Redis, for replicas that start later; False if
        Redis did not take it."""
        name = PREFIX + key
        done = await self.call(
            self._redis.hdel(name, field) if value is None else self._redis.hset(name, field, value)
        )
        return done is not None

    async def shared(self, key: str) -> dict[str, str]:
        found = await self.call(self._redis.hgetall(PREFIX + key))
        return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}

    async def describe(self) -> dict[str, Any]:
        """The replicas and their heartbeats, every swap lock's holder, the scheduler's."""
        replicas, locks = [], {}
        async for key in self._scan(f"{PREFIX}replica:*"):
            raw = await self.call(self._redis.get(key))
            if isinstance(raw, str):
                beat = json.loads(raw)
                replicas.append({"id": beat["replica"], "last_heartbeat": beat["at"]})
        async for key in self._scan(f"{PREFIX}lock:*"):
            raw = await self.call(self._redis.get(key))
            if isinstance(raw, str):
                holder = Holder.decode(raw)
                locks[key.removeprefix(f"{PREFIX}lock:")] = {
                    "replica": holder.replica,
                    "model": holder.model,
                }
        return {
            "replica": self.replica,
            "redis_up": self.up,
            "replicas": sorted(replicas, key=lambda r: str(r["id"])),
            "swap_locks": locks,
            "scheduler": self.leader,
        }

    async def _scan(self, pattern: str) -> Any:
        try:
            async for key in self._redis.scan_iter(match=pattern, count=100):
                yield key
        except (RedisError, OSError) as exc:
            self._lost(exc)

    # -- keeping in touch ----------------------------------------------------------------------

    async def _beat(self) -> None:
        """Say this replica lives and what it has in flight; keep or take the scheduler."""
        while True:
            inflight = self._listener.in_flight() if self._listener else {}
            beat = {"replica": self.replica, "at": time.time(), "inflight": inflight}
            await self.call(
                self._redis.set(_replica_key(self.replica), json.dumps(beat), px=_ms(REPLICA_TTL))
            )
            await self.publish(Beat(inflight))
            await self.leads()
            await asyncio.sleep(HEARTBEAT)

    async def _listen(self) -> None:
        while True:
            try:
                async with self._redis.pubsub(ignore_subscribe_messages=True) as pubsub:
                    await pubsub.subscribe(CHANNEL)
                    await self._sync()
                    async for message in pubsub.listen():
                        self._apply(message.get("data"))
            except (RedisError, OSError) as exc:
                self._lost(exc)
                await asyncio.sleep(RETRY)

    def _apply(self, data: object) -> None:
        heard = decode(data)
        if heard is not None and heard.replica != self.replica and self._listener:
            self._listener.apply(heard)

    async def _sync(self) -> None:
        """Once Redis answers again, read back what the replicas share (pins, drains)."""
        if self._synced or not await self.call(self._redis.ping()):
            return
        if self._listener is not None:
            await self._listener.resync()
        self._synced = True

    @property
    def redis(self) -> redis.Redis:
        """The connection, for the parts of the shared state kept beside their kin
        (swapgate/cluster/demand.py); their calls go through ``call``."""
        return self._redis

    async def call(self, work: Awaitable[T]) -> T | None:
        """Redis's answer, or None if it gives none: down or restarting is logged once."""
        try:
            answer = await work
        except (RedisError, OSError) as exc:
            self._lost(exc)
            return None
        if not self.up:
            self.up, self._told_down = True, False
            self._up_gauge.set(1)
            log.info("redis answers: replica %s shares state with the others", self.replica)
            if self._tasks:  # running: read back (and write what it could not) at once
                self._resyncing = asyncio.ensure_future(self._sync())
        return answer

    def _lost(self, exc: Exception) -> None:
        if not self._told_down:
            log.warning(
                "redis does not answer (%s): replica %s serves from its own view until it does",
                exc,
                self.replica,
            )
            self._told_down = True
        self.up = self._synced = False
        self._up_gauge.set(0)


def _replica_key(replica: str) -> str:
    return f"{PREFIX}replica:{replica}"


def url_problem(env_name: str, url: str | None) -> str | None:
    """What is wrong with the Redis URL in ``env_name``, or None (also when it is unset)."""
    if url is None:
        return None
    try:
        redis.connection.parse_url(url)
    except ValueError as exc:
        return f"${env_name} is not a Redis URL ({exc}); set it like redis://host:6379/0"
    return None


def _ms(seconds: float) -> int:
    return int(seconds * 1000)
