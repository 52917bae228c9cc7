"""The keys' limits counted across replicas (docs/keys.md, docs/deploy.md): one Redis script
per admission, so that two replicas cannot both take the last slot.

- Requests per minute: a counter per key and ``BUCKET`` seconds; a request is admitted while
  the last minute's buckets sum below the key's rpm. The window moves in steps of ``BUCKET``.
- Tokens per minute: a counter per key and ``BUCKET`` seconds that each answer adds its tokens
  to; a request is admitted while the last minute's buckets sum below the key's tpm.
- Requests at once: a hash per key, a field per replica with its count. A replica that dies
  stops counting once its heartbeat's key expires (``REPLICA_TTL``): its field is dropped.

Redis down: every call answers None and the caller counts on its own
(swapgate/control/routing/key_limits.py).
"""

from __future__ import annotations

import time

from swapgate.cluster.store import PREFIX, Cluster
from swapgate.control.routing.key_limits import WINDOW

BUCKET = 5  # seconds a rate bucket covers
_BUCKETS = int(WINDOW) // BUCKET
_TTL_MS = (_BUCKETS + 1) * BUCKET * 1000  # a bucket outlives the window it counts in

# KEYS[1]: the key's bucket prefix. ARGV: this bucket's number, buckets per window, rpm, ttl ms.
# Answers 0 when admitted, else the milliseconds until the oldest counted bucket leaves.
_TAKE_RATE = """
local now, n, rpm = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local total, oldest = 0, nil
for i = n - 1, 0, -1 do
  local count = tonumber(redis.call('get', KEYS[1] .. (now - i)) or '0')
  if count > 0 and oldest == nil then oldest = now - i end
  total = total + count
end
if total >= rpm then return (oldest + n) end
redis.call('incr', KEYS[1] .. now)
redis.call('pexpire', KEYS[1] .. now, ARGV[4])
return 0
"""
# KEYS[1]: the key's token bucket prefix. ARGV: this bucket's number, buckets per window, tpm.
# Answers 0 while under tpm, else the number of the bucket whose leaving puts it under.
_TOKENS_WAIT = """
local now, n, tpm = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local counts, total = {}, 0
for i = n - 1, 0, -1 do
  local count = tonumber(redis.call('get', KEYS[1] .. (now - i)) or '0')
  counts[#counts + 1] = {now - i, count}
  total = total + count
end
if total < tpm then return 0 end
for _, bucket in ipairs(counts) do
  total = total - bucket[2]
  if total < tpm then return bucket[1] + n end
end
return now + n
"""
# KEYS[1]: the key's slots hash; ARGV: this replica, the limit, the replicas' key prefix.
# Answers 1 when a slot was taken, else 0.
_TAKE_SLOT = """
local total = 0
local fields = redis.call('hgetall', KEYS[1])
for i = 1, #fields, 2 do
  if fields[i] == ARGV[1] or redis.call('exists', ARGV[3] .. fields[i]) == 1 then
    total = total + tonumber(fields[i + 1])
  else
    redis.call('hdel', KEYS[1], fields[i])
  end
end
if total >= tonumber(ARGV[2]) then return 0 end
redis.call('hincrby', KEYS[1], ARGV[1], 1)
return 1
"""
# A request settled (swapgate/control/routing/key_limits.py), in one round trip. KEYS[1]: the
# key's slots hash, KEYS[2]: its token bucket. ARGV: this replica, how many slots it gives back,
# the tokens it spent, their bucket's ttl in ms.
_SETTLE = """
local slots, tokens = tonumber(ARGV[2]), tonumber(ARGV[3])
if slots > 0 and tonumber(redis.call('hincrby', KEYS[1], ARGV[1], -slots)) <= 0 then
  redis.call('hdel', KEYS[1], ARGV[1])
end
if tokens > 0 then
  redis.call('incrby', KEYS[2], tokens)
  redis.call('pexpire', KEYS[2], ARGV[4])
end
return 1
"""


class SharedCounts:
    def __init__(self, cluster: Cluster) -> None:
        self._cluster = cluster
        redis = cluster.redis
        self._take_rate = redis.register_script(_TAKE_RATE)
        self._take_slot = redis.register_script(_TAKE_SLOT)
        self._settle = redis.register_script(_SETTLE)
        self._tokens_wait = redis.register_script(_TOKENS_WAIT)
        # Slots whose return Redis did not take (it was down): given back with the next one.
        self._owed: dict[str, int] = {}

    async def take_rate(self, name: str, rpm: int) -> float | None:
        now = time.time()
        bucket = int(now // BUCKET)
        keys = [f"{PREFIX}rate:{name}:"]
        answer = await self._cluster.call(self._take_rate(keys, [bucket, _BUCKETS, rpm, _TTL_MS]))
        if answer is None:
            return None
        freed_bucket = int(answer)
        return 0.0 if freed_bucket == 0 else max(0.0, freed_bucket * BUCKET - now)

    async def tokens_wait(self, name: str, tpm: int) -> float | None:
        now = time.time()
        keys = [f"{PREFIX}tokens:{name}:"]
        answer = await self._cluster.call(
            self._tokens_wait(keys, [int(now // BUCKET), _BUCKETS, tpm])
        )
        if answer is None:
            return None
        freed_bucket = int(answer)
        return 0.0 if freed_bucket == 0 else max(0.0, freed_bucket * BUCKET - now)

    async def take_slot(self, name: str, limit: int) -> bool | None:
        args: list[str | int] = [self._cluster.replica, limit, f"{PREFIX}replica:"]
        answer = await self._cluster.call(self._take_slot([_slots(name)], args))
        return None if answer is None else bool(answer)

    async def forget(self, names: list[str]) -> None:
        """At start: what an earlier run under this replica's id held is gone (a replica_id set
        by hand outlives its process)."""
        for name in names:
            await self._cluster.call(self._cluster.redis.hdel(_slots(name), self._cluster.replica))

    async def settle(self, name: str, tokens: int, slot: bool) -> None:
        # A slot whose return Redis did not take (it was down) goes back with the next one;
        # tokens it did not take are not counted in the cluster (its own count has them).
        count = 1 + self._owed.pop(name, 0) if slot else 0
        bucket = f"{PREFIX}tokens:{name}:{int(time.time() // BUCKET)}"
        args: list[str | int] = [self._cluster.replica, count, tokens, _TTL_MS]
        answer = await self._cluster.call(self._settle([_slots(name), bucket], args))
        if answer is None and count:
            self._owed[name] = count

    async def use(
        self, rated: list[str], slotted: list[str], live: set[str]
    ) -> dict[str, dict[str, int]]:
        """What the cluster counts of each key, as its limits see it: ``last_minute`` for the
        keys in ``rated`` (those with an rpm), ``in_flight`` for those in ``slotted`` (with a
        concurrency), held by the ``live`` replicas. Empty when Redis does not answer."""
        bucket = int(time.time() // BUCKET)
        pipe = self._cluster.redis.pipeline(transaction=False)  # one round trip for them all
        for name in rated:
            pipe.mget([f"{PREFIX}rate:{name}:{bucket - i}" for i in range(_BUCKETS)])
        for name in slotted:
            pipe.hgetall(_slots(name))
        answers = await self._cluster.call(pipe.execute()) if rated or slotted else []
        if answers is None:
            return {}
        use: dict[str, dict[str, int]] = {}
        for name, counts in zip(rated, answers, strict=False):
            use.setdefault(name, {})["last_minute"] = sum(int(c) for c in counts if c)
        for name, held in zip(slotted, answers[len(rated) :], strict=True):
            in_flight = sum(int(n) for replica, n in held.items() if replica in live)
            use.setdefault(name, {})["in_flight"] = in_flight
        return use


def _slots(name: str) -> str:
    return f"{PREFIX}slots:{name}"
