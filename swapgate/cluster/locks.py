"""The swap locks replicas on one Redis share (docs/deploy.md): a swap is claimed with two keys
at once, its instance's and its model's, so that two replicas can neither swap one instance nor
load one model on two instances at the same time. Each is a key with an expiry its live holder
renews: a holder that dies frees it within ``LEASE_TTL``. Redis down: a claim answers that this
replica may swap (alone, its own single flight holds), and who holds a lock cannot be said.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import redis.asyncio as redis

T = TypeVar("T")
LEASE_TTL = 5.0  # a dead holder's swap lock (or scheduler lease) lasts at most this long

_CLAIM = """
local held = redis.call('get', KEYS[1]) or redis.call('get', KEYS[2])
if held then return held end
redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('set', KEYS[2], ARGV[1], 'PX', ARGV[2])
return false
"""
_RENEW = """
local renewed = 0
for _, key in ipairs(KEYS) do
  if redis.call('get', key) == ARGV[1] then
    redis.call('pexpire', key, ARGV[2]); renewed = renewed + 1
  end
end
return renewed
"""
_RELEASE = """
for _, key in ipairs(KEYS) do
  if redis.call('get', key) == ARGV[1] then redis.call('del', key) end
end
return 1
"""


@dataclass(frozen=True, slots=True)
class Holder:
    """Who swaps what where, as the lock's value says."""

    replica: str
    instance: str
    model: str

    def encode(self) -> str:
        return json.dumps({"replica": self.replica, "instance": self.instance, "model": self.model})

    @classmethod
    def decode(cls, raw: str | bytes) -> Holder:
        data = json.loads(raw)
        return cls(str(data["replica"]), str(data["instance"]), str(data["model"]))


class Connection(Protocol):
    """The replica's connection (swapgate/cluster/store.py's ``Cluster``)."""

    replica: str
    up: bool

    @property
    def redis(self) -> redis.Redis: ...

    async def call(self, work: Awaitable[T]) -> T | None: ...


class SwapLocks:
    def __init__(self, connection: Connection, prefix: str) -> None:
        self._connection = connection
        self._prefix = prefix
        client = connection.redis
        self._claim, self._renew = client.register_script(_CLAIM), client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._held: dict[str, tuple[Holder, asyncio.Task[None]]] = {}

    def lock_key(self, instance: str) -> str:
        return f"{self._prefix}lock:{instance}"

    async def claim(self, instance: str, model: str) -> Holder | None:
        """None when this replica may swap ``model`` onto ``instance`` (it holds both locks,
        or Redis is down); else the swap another replica runs there or for that model."""
        connection = self._connection
        mine = Holder(connection.replica, instance, model)
        keys = [self.lock_key(instance), f"{self._prefix}loading:{model}"]
        held = await connection.call(self._claim(keys=keys, args=[mine.encode(), _ms(LEASE_TTL)]))
        if isinstance(held, str):
            return Holder.decode(held)
        if held is None and not connection.up:
            return None  # alone: its own single flight holds
        self._held[instance] = (mine, asyncio.create_task(self._keep(keys, mine)))
        return None

    async def release(self, instance: str) -> None:
        held = self._held.pop(instance, None)
        if held is None:
            return
        mine, renewing = held
        renewing.cancel()
        keys = [self.lock_key(instance), f"{self._prefix}loading:{mine.model}"]
        await self._connection.call(self._release(keys=keys, args=[mine.encode()]))

    async def release_all(self) -> None:
        """Every lock this replica holds, given back (before its connection closes: else the
        others wait up to ``LEASE_TTL`` for its instances)."""
        for instance in list(self._held):
            await self.release(instance)

    async def holder(self, instance: str) -> Holder | bool | None:
        """Who holds ``instance``'s swap lock; None if nobody, False if Redis cannot say."""
        connection = self._connection
        raw = await connection.call(connection.redis.get(self.lock_key(instance)))
        if not connection.up:
            return False
        return Holder.decode(raw) if isinstance(raw, str) else None

    async def _keep(self, keys: list[str], mine: Holder) -> None:
        while True:
            await asyncio.sleep(LEASE_TTL / 3)
            await self._connection.call(
                self._renew(keys=keys, args=[mine.encode(), _ms(LEASE_TTL)])
            )


def _ms(seconds: float) -> int:
    return int(seconds * 1000)
