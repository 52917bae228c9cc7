"""The slot books of ``kv_keep`` instances, shared by the replicas on one Redis (docs/kv-keep.md,
"Replicas"): a hash per loaded model, a field per slot holding the conversation it has, until
when it is busy, and when its last turn ended. A claim is one Redis script, so that no two
conversations get one slot whichever replicas they come through, and the replica that unloads
a model saves every replica's conversations.

A busy mark expires (``BUSY_TTL``): a replica that dies mid-turn does not hold its slot for
good. Redis down: every call answers None and the replica keeps its own book.
"""

from __future__ import annotations

import json
import time

from swapgate.cluster.store import PREFIX, Cluster
from swapgate.control.memory.kv.book import NO_SLOT

BUSY_TTL = 900.0  # seconds a turn may hold its slot, in case its replica never says it ended
KEPT = 86400 * 1000  # ms a model's book outlives its last claim (a model unloaded unseen)

# KEYS[1]: the model's book; ARGV: the conversation, the slot count, now, the busy mark's ttl.
# Answers slot * 2 + 1 for a slot taken from another conversation (or none), slot * 2 for its
# own slot, -1 when its own slot is busy or none is idle.
_CLAIM = """
local key, count, now = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local slots = {}
for n = 0, count - 1 do
  local raw = redis.call('hget', KEYS[1], n)
  slots[n] = raw and cjson.decode(raw) or {k = '', b = 0, f = 0}
end
redis.call('pexpire', KEYS[1], ARGV[5])
for n = 0, count - 1 do
  local s = slots[n]
  if s.k == key then
    if s.b > now then return -1 end
    s.b = now + tonumber(ARGV[4])
    redis.call('hset', KEYS[1], n, cjson.encode(s))
    return n * 2
  end
end
local best, rank = -1, nil
for n = 0, count - 1 do
  local s = slots[n]
  if s.b <= now then
    local r = (s.k == '' and 0 or 1) * 1e12 + s.f
    if rank == nil or r < rank then best, rank = n, r end
  end
end
if best < 0 then return -1 end
local s = {k = key, b = now + tonumber(ARGV[4]), f = slots[best].f}
redis.call('hset', KEYS[1], best, cjson.encode(s))
return best * 2 + 1
"""
# KEYS[1]: the model's book; ARGV: the slot, its conversation, now.
_FINISH = """
local raw = redis.call('hget', KEYS[1], ARGV[1])
if not raw then return 0 end
local s = cjson.decode(raw)
if s.k ~= ARGV[2] then return 0 end
s.b, s.f = 0, tonumber(ARGV[3])
redis.call('hset', KEYS[1], ARGV[1], cjson.encode(s))
return 1
"""


class SharedSlots:
    def __init__(self, cluster: Cluster) -> None:
        self._cluster = cluster
        self._claim = cluster.redis.register_script(_CLAIM)
        self._finish = cluster.redis.register_script(_FINISH)

    async def claim(
        self, instance: str, model: str, count: int, key: str
    ) -> tuple[int, bool] | None:
        args: list[str | int | float] = [key, count, time.time(), BUSY_TTL, KEPT]
        answer = await self._cluster.call(self._claim([_book(instance, model)], args))
        if answer is None:
            return None
        code = int(answer)
        return NO_SLOT if code < 0 else (code // 2, bool(code % 2))

    async def finish(self, instance: str, model: str, slot: int, key: str) -> None:
        book = _book(instance, model)
        await self._cluster.call(self._finish([book], [slot, key, time.time()]))

    async def held(self, instance: str, model: str) -> list[tuple[int, str]] | None:
        raw = await self._cluster.call(self._cluster.redis.hgetall(_book(instance, model)))
        if raw is None:
            return None
        slots = [(int(n), json.loads(value)) for n, value in raw.items()]
        slots = [(n, s) for n, s in slots if s.get("k")]
        slots.sort(key=lambda pair: pair[1].get("f", 0), reverse=True)
        return [(n, str(s["k"])) for n, s in slots]

    async def clear(self, instance: str, model: str) -> None:
        await self._cluster.call(self._cluster.redis.delete(_book(instance, model)))


def _book(instance: str, model: str) -> str:
    return f"{PREFIX}kv:{instance}:{model}"
