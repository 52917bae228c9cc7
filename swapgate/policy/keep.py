"""Which models' weights the host cache keeps in RAM (docs/host-cache.md): a pure function of
what is wanted next and what fits.

Most wanted first: models with requests queued for them (oldest first), then the next
scheduled and learned preloads (soonest first), then by the chance of a request soon (likeliest
first). Models loaded now are left out: their weights are the engine's. Then, in that order,
each whose weights fit what is left of the budget.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping


def wanted(
    queued: Mapping[str, float],
    upcoming: Iterable[tuple[float, str]],
    chances: Mapping[str, float],
    loaded: Collection[str],
) -> list[str]:
    """Models by how soon they are likely to load: ``queued`` (model: when its oldest waiting
    request arrived), ``upcoming`` preloads ((when, model)), then ``chances`` (model: the chance
    of a request soon; none under 0 counts). ``loaded`` ones are left out."""
    order = [m for m, _ in sorted(queued.items(), key=lambda item: item[1])]
    order += [m for _, m in sorted(upcoming)]
    order += [m for m, c in sorted(chances.items(), key=lambda item: -item[1]) if c > 0]
    seen: set[str] = set()
    chosen = []
    for model in order:
        if model not in seen and model not in loaded:
            seen.add(model)
            chosen.append(model)
    return chosen


def keep(order: Iterable[str], sizes: Mapping[str, int], budget: int) -> list[str]:
    """Of ``order`` (most wanted first), those whose weights (``sizes``) fit ``budget``
    together, taken in that order; one that does not fit is passed over for smaller ones."""
    kept, used = [], 0
    for model in order:
        size = sizes.get(model)
        if size is None or used + size > budget:
            continue
        kept.append(model)
        used += size
    return kept
