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
from swapgate.control.routing.key_limits import WINDOW, Limit, Verdict

BUCKET = 5  # seconds a rate bucket covers
_BUCKETS = int(WINDOW) // BUCKET
_TTL_MS = (_BUCKETS + 1) * BUCKET * 1000  # a bucket outlives the window it counts in
# What refused a request, by _ADMIT's first answer
_REFUSED_BY: tuple[Limit | None, ...] = (None, "rpm", "tpm", "concurrency")

# A request admitted under every limit its key has, or under none, in one round trip.
# KEYS: the key's rate bucket prefix, its token bucket prefix, its slots hash. ARGV: this
# bucket's number, buckets per window, rpm, tpm, concurrency (0: none), this replica, the
# replicas' key prefix, a rate bucket's ttl in ms. Answers {0, 0} when admitted (counted and a
# slot taken, as its limits ask); else what refused it: {1, the number of the bucket whose
# leaving frees one request}, {2, the same for tokens}, {3, 0} (no slot free).
_ADMIT = """
local now, n = tonumber(ARGV[1]), tonumber(ARGV[2])
local rpm, tpm, limit = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local function window(prefix)
  local counts, total = {}, 0
  for i = n - 1, 0, -1 do
    local count = tonumber(redis.call('get', prefix .. (now - i)) or '0')
    counts[#counts + 1] = {now - i, count}
    total = total + count
  end
  return counts, total
end
local function freed(counts, total, cap)
  for _, bucket in ipairs(counts) do
    total = total - bucket[2]
    if total < cap then return bucket[1] + n end
  end
  return now + n
end
if rpm > 0 then
  local counts, total = window(KEYS[1])
  if total >= rpm then return {1, freed(counts, total, rpm)} end
end
if tpm > 0 then
  local counts, total = window(KEYS[2])
  if total >= tpm then return {2, freed(counts, total, tpm)} end
end
if limit > 0 then
  local held = 0
  local fields = redis.call('hgetall', KEYS[3])
  for i = 1, #fields, 2 do
    if fields[i] == ARGV[6] or redis.call('exists', ARGV[7] .. fields[i]) == 1 then
      held = held + tonumber(fields[i + 1])
    else
      redis.call('hdel', KEYS[3], fields[i])
    end
  end
  if held >= limit then return {3, 0} end
  redis.call('hincrby', KEYS[3], ARGV[6], 1)
end
if rpm > 0 then
  redis.call('incr', KEYS[1] .. now)
  redis.call('pexpire', KEYS[1] .. now, ARGV[8])
end
return {0, 0}
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
        self._admit = redis.register_script(_ADMIT)
        self._settle = redis.register_script(_SETTLE)
        # Slots whose return Redis did not take (it was down): given back with the next one.
        self._owed: dict[str, int] = {}

    async def admit(
        self, name: str, rpm: int | None, tpm: int | None, concurrency: int | None
    ) -> Verdict | None:
        now = time.time()
        bucket = int(now // BUCKET)
        prefixes = [_rate(name), _tokens(name), _slots(name)]
        limits = [rpm or 0, tpm or 0, concurrency or 0]
        args: list[str | int] = [bucket, _BUCKETS, *limits, self._cluster.replica]
        args += [f"{PREFIX}replica:", _TTL_MS]
        answer = await self._cluster.call(self._admit(prefixes, args))
        if answer is None:
            return None
        refused, freed_bucket = (int(part) for part in answer)
        wait = max(0.0, freed_bucket * BUCKET - now) if freed_bucket else 0.0
        return Verdict(_REFUSED_BY[refused], wait)

    async def forget(self, names: list[str]) -> None:
        """At start: what an earlier run under this replica's id held is gone (a replica_id set
        by hand outlives its process)."""
        for name in names:
            await self._cluster.call(self._cluster.redis.hdel(_slots(name), self._cluster.replica))

    async def settle(self, name: str, tokens: int, slot: bool) -> None:
        # A slot whose return Redis did not take (it was down) goes back with the next one;
        # tokens it did not take are not counted in the cluster (its own count has them).
        count = 1 + self._owed.pop(name, 0) if slot else 0
        bucket = f"{_tokens(name)}{int(time.time() // BUCKET)}"
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
            pipe.mget([f"{_rate(name)}{bucket - i}" for i in range(_BUCKETS)])
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


def _rate(name: str) -> str:
    """The prefix of the key's request buckets (a bucket's number follows)."""
    return f"{PREFIX}rate:{name}:"


def _tokens(name: str) -> str:
    """The prefix of the key's token buckets (a bucket's number follows)."""
    return f"{PREFIX}tokens:{name}:"
