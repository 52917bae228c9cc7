"""``swapgate plan CONFIG``: what each model takes, what fits where, and what would fit
(docs/memory.md).

Read before a model OOMs under real prompts: per model its weights, KV cache per token, per
sequence at its context and at ``max_seqs`` sequences, and its total; per instance which models
fit at once; and a warning, with values that would fit, for every model too large for the
instances that serve it. With ``--measured``, what a running gateway measured each loaded model
to take (its ``/admin/state``) beside the declared figure, each instance's fits by the larger,
as the gateway places (docs/memory.md, "Measured memory").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from swapgate.config.catalog import weight_paths
from swapgate.config.settings import InstanceConfig, Settings
from swapgate.config.sizes import Size, human, sizes, weight_files
from swapgate.data.footprint import WARN_ABOVE, above_declared

# What a gateway measured: per instance, per model, in bytes (``measured_from``)
Measurements = Mapping[str, Mapping[str, int]]

CONTEXT_STEP = 1024  # suggested contexts are rounded down to this


@dataclass(frozen=True, slots=True)
class Plan:
    models: dict[str, Size]
    instances: list[dict[str, Any]]
    warnings: list[str]
    # host_cache (docs/host-cache.md): its budget, and each model's weight files and bytes
    budget: int | None = None
    weights: dict[str, tuple[list[str], int]] = field(default_factory=dict)
    # Each model's largest measured figure, where a gateway measured it (``--measured``)
    measured: dict[str, int] | None = None


def measured_from(state: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """Per instance, per model, the bytes a gateway's ``/admin/state`` says it measured."""
    return {
        inst["name"]: {
            model: sizes["measured"]
            for model, sizes in (inst.get("model_sizes") or {}).items()
            if isinstance(sizes.get("measured"), int)
        }
        for inst in state.get("instances", [])
    }


def make_plan(settings: Settings, measured: Measurements | None = None) -> Plan:
    """The plan of ``settings``; with ``measured`` (``measured_from``), each model counted by
    the larger of its declared and its measured figure on each instance."""
    found, problems = sizes(settings.models)
    warnings = list(problems)
    instances = [
        _instance(inst, _placed(found, (measured or {}).get(inst.name, {})), settings)
        for inst in settings.instances
    ]
    largest = _largest(measured) if measured is not None else None
    warnings += _measured_above(found, largest or {})
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
    return Plan(found, instances, warnings, budget, weights, largest)


def _placed(found: dict[str, Size], measured: Mapping[str, int]) -> dict[str, Size]:
    """Each size as placement counts it on one instance: the measured figure where larger."""
    placed = dict(found)
    for model, taken in measured.items():
        size = found.get(model)
        if size is None or taken > size.total:
            placed[model] = Size(taken, given=taken)
    return placed


def _largest(measured: Measurements) -> dict[str, int]:
    largest: dict[str, int] = {}
    for models in measured.values():
        for model, taken in models.items():
            largest[model] = max(largest.get(model, 0), taken)
    return largest


def _measured_above(found: dict[str, Size], largest: Mapping[str, int]) -> list[str]:
    """A warning per model measured more than WARN_ABOVE over its declared size."""
    return [
        f"{model}: measured at {human(taken)}, more than {round(WARN_ABOVE * 100)}% above its "
        f"declared {human(found[model].total)}; the gateway places it by the measured figure: "
        f"raise models.{model}.memory to at least {human(taken)} (or its memory_overhead, "
        "where its size is computed)"
        for model, taken in largest.items()
        if model in found and above_declared(taken, found[model].total)
    ]


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

    out = [table(_model_rows(plan)), ""]
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


def _model_rows(plan: Plan) -> list[tuple[str, ...]]:
    """The models' table; with measured figures, a MEASURED column (``-``: not measured)."""
    head = ("MODEL", "WEIGHTS", "KV/TOKEN", "CONTEXT", "KV/SEQUENCE", "SEQS", "KV", "TOTAL")
    rows: list[tuple[str, ...]] = [head]
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
    if plan.measured is None:
        return rows
    taken = plan.measured
    return [rows[0] + ("MEASURED",)] + [
        (*row, human(taken[row[0]]) if row[0] in taken else "-") for row in rows[1:]
    ]


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
                "measured": (plan.measured or {}).get(model),  # the largest, where measured
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
