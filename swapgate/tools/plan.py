"""``swapgate plan CONFIG``: what each model takes, what fits where, and what would fit
(docs/memory.md).

Read before a model OOMs under real prompts: per model its weights, KV cache per token, per
sequence at its context and at ``max_seqs`` sequences, and its total; per instance which models
fit at once; and a warning, with values that would fit, for every model too large for the
instances that serve it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from swapgate.config.catalog import weight_paths
from swapgate.config.settings import InstanceConfig, Settings
from swapgate.config.sizes import Size, human, sizes, weight_files

CONTEXT_STEP = 1024  # suggested contexts are rounded down to this


@dataclass(frozen=True, slots=True)
class Plan:
    models: dict[str, Size]
    instances: list[dict[str, Any]]
    warnings: list[str]
    # host_cache (docs/host-cache.md): its budget, and each model's weight files and bytes
    budget: int | None = None
    weights: dict[str, tuple[list[str], int]] = field(default_factory=dict)


def make_plan(settings: Settings) -> Plan:
    found, problems = sizes(settings.models)
    warnings = list(problems)
    instances = [_instance(inst, found, settings) for inst in settings.instances]
    for model, size in found.items():
        warning = _too_large(model, size, _serving(model, settings))
        if warning:
            warnings.append(warning)
    for inst in settings.instances:
        if inst.memory is None:
            continue
        unsized = [m for m in _served(inst, settings) if m not in found]
        if unsized:
            warnings.append(
                f"{', '.join(unsized)} on {inst.name}: no size given, so placement counts"
                " nothing for them against its memory; give memory, weights or gguf"
            )
    weights: dict[str, tuple[list[str], int]] = {}
    for model, paths in weight_paths(settings).items():
        found_files = weight_files(paths)
        total = sum(f.stat().st_size for f in found_files)
        weights[model] = ([str(f) for f in found_files] or list(paths), total)
    budget = settings.host_cache.budget
    for model, (files, total) in weights.items():
        if budget is not None and total > budget:
            warnings.append(
                f"{model}'s weights ({human(total)}) are larger than host_cache.budget "
                f"({human(budget)}): they are never kept in RAM; raise the budget"
            )
        if not total:
            warnings.append(f"{model}'s weights: no file at {', '.join(files)}")
    return Plan(found, instances, warnings, budget, weights)


def _served(inst: InstanceConfig, settings: Settings) -> list[str]:
    """The configured models ``inst`` serves: its ``models``, or (discovered) any of them."""
    return [m for m in settings.models if inst.models is None or m in inst.models]


def _serving(model: str, settings: Settings) -> list[InstanceConfig]:
    return [i for i in settings.instances if model in _served(i, settings)]


def _instance(inst: InstanceConfig, found: dict[str, Size], settings: Settings) -> dict[str, Any]:
    served = [m for m in _served(inst, settings) if m in found]
    fitting = [m for m in served if inst.memory is None or found[m].total <= inst.memory]
    together: list[str] = []  # the most models at once: the smallest first
    used = 0
    for model in sorted(fitting, key=lambda m: found[m].total):
        if (inst.count_limit is None or len(together) < inst.count_limit) and (
            inst.memory is None or used + found[model].total <= inst.memory
        ):
            together.append(model)
            used += found[model].total
    return {
        "name": inst.name,
        "memory": inst.memory,
        "capacity": inst.count_limit,
        "limited_by": inst.limited_by,
        "fits_alone": fitting,
        "fits_at_once": together,
        "too_large": [m for m in served if m not in fitting],
    }


def _too_large(model: str, size: Size, serving: list[InstanceConfig]) -> str | None:
    limits = [i for i in serving if i.memory is not None]
    if not limits or any(size.total <= i.memory for i in limits if i.memory is not None):
        return None
    largest = max(limits, key=lambda i: i.memory or 0)
    room = largest.memory or 0
    where = f"{largest.name} {human(room)}"
    said = f"{model}: {human(size.total)} fits no instance that serves it (largest: {where})"
    if size.given is not None or not size.kv_per_token:
        return f"{said}; it needs a larger instance or a smaller quantization"
    budget = room / (1 + size.overhead) - size.weights  # bytes left for the KV cache
    if budget <= 0:
        return f"{said}; its weights alone do not fit: a larger instance, or quantize it"
    context = int(budget // (size.kv_per_token * size.max_seqs)) // CONTEXT_STEP * CONTEXT_STEP
    seqs = int(budget // size.kv_per_seq) if size.kv_per_seq else 0
    options = []
    if context >= CONTEXT_STEP:
        options.append(f"context (max-model-len, -c) {context} at max_seqs {size.max_seqs}")
    if seqs >= 1:
        options.append(f"max_seqs (max-num-seqs, -np) {seqs} at context {size.context}")
    if not options:
        return f"{said}; even one short sequence does not fit beside its weights"
    return (
        f"{said} at context {size.context} × max_seqs {size.max_seqs}"
        f" ({human(size.kv_per_seq)} of KV per sequence); it fits with " + ", or ".join(options)
    )


def render(plan: Plan) -> str:
    from swapgate.tools.admin_cli import table

    rows = [("MODEL", "WEIGHTS", "KV/TOKEN", "CONTEXT", "KV/SEQUENCE", "SEQS", "KV", "TOTAL")]
    for model, size in plan.models.items():
        if size.given is not None:
            rows.append((model, "-", "-", "-", "-", "-", "-", human(size.total) + " (given)"))
            continue
        rows.append(
            (
                model,
                human(size.weights),
                human(size.kv_per_token),
                str(size.context or "-"),
                human(size.kv_per_seq),
                str(size.max_seqs),
                human(size.kv),
                human(size.total),
            )
        )
    out = [table(rows), ""]
    places = [("INSTANCE", "LIMITED BY", "FITS AT ONCE", "TOO LARGE")]
    for inst in plan.instances:
        places.append(
            (
                inst["name"],
                inst["limited_by"],
                " + ".join(inst["fits_at_once"]) or "-",
                ", ".join(inst["too_large"]) or "-",
            )
        )
    out.append(table(places))
    if plan.weights:
        budget = human(plan.budget) if plan.budget is not None else "off"
        cache = [("MODEL", "WEIGHT FILES", "BYTES")]
        cache += [(m, ", ".join(files), human(total)) for m, (files, total) in plan.weights.items()]
        out += ["", f"host cache (budget {budget}): weights it can keep in RAM", table(cache)]
    out += ["", *(f"warning: {w}" for w in plan.warnings)] if plan.warnings else []
    return "\n".join(out)


def as_json(plan: Plan) -> dict[str, Any]:
    return {
        "models": {
            model: {
                "weights": size.weights if size.given is None else None,
                "kv_per_token": size.kv_per_token,
                "context": size.context,
                "kv_per_sequence": size.kv_per_seq,
                "max_seqs": size.max_seqs,
                "kv": size.kv,
                "overhead": size.overhead,
                "total": size.total,
                "given": size.given is not None,
            }
            for model, size in plan.models.items()
        },
        "instances": plan.instances,
        "host_cache": {
            "budget": plan.budget,
            "weights": {m: {"files": f, "bytes": b} for m, (f, b) in plan.weights.items()},
        },
        "warnings": plan.warnings,
    }
