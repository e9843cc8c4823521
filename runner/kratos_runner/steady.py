"""Where a repeating program's GPU time goes: the steady state, found from a one-metric first pass.

The first pass (``ncu --metrics gpu__time_duration.sum`` over a window of launches) gives each launch's
kernel (name, grid, block) and duration. The warm-up ends where the kernel sequence starts to repeat:
the earliest launch from which every launch equals the one a period later, to the end of the window,
over at least two whole periods and a quarter of the window (so that a kernel repeated at the window's
end is not taken for a step), with the shortest such period. The steady state is the whole periods
after the warm-up. Its distinct kernels are chosen by their total time until the coverage target is
met (at most ``max_kernels`` of them); the second pass profiles the shortest run of consecutive
launches of one period that holds every chosen kernel (at most ``max_launches``), selected with
ncu's own ``--launch-skip``/``--launch-count``, which every ncu version has and which count every
launch, so each profiled result is known by its position. Each profiled kernel then weighs its
first-pass share of the steady state's time.
"""

from __future__ import annotations

import re
from typing import NamedTuple, Sequence, Tuple

from kratos_runner.parse import Kernel

Key = Tuple[str, str, str]  # (name with namespaces removed, grid, block)

# ncu 2025 prints names simplified (``native::<unnamed>::``), older versions in full (``at::native::``):
# the qualifiers are dropped so that both passes' names compare equal whatever the version prints
_QUALIFIER = re.compile(r"(?:\(anonymous namespace\)|<unnamed>|[A-Za-z_]\w*)::")


def kernel_key(kernel: Kernel) -> Key:
    name = " ".join(_QUALIFIER.sub("", kernel.name).split())
    return name, "".join(kernel.grid.split()), "".join(kernel.block.split())


class Plan(NamedTuple):
    """What the first pass found and what the second pass profiles."""

    window: int  # launches the first pass saw
    warmup: int  # launches before the steady state
    period: int  # launches in one repetition (a step)
    step_ns: float  # GPU time of one step
    totals: dict[Key, float]  # each distinct kernel's GPU time over the whole steady periods
    chosen: list[Key]  # the kernels chosen by their time, largest first
    skip: int  # second pass: --launch-skip
    span: int  # second pass: --launch-count
    expected: list[Key]  # the kernel of each launch the second pass profiles, in order


def repetition(keys: Sequence[Key]) -> tuple[int, int] | None:
    """(warm-up launches, period) of the sequence: the earliest start, then the shortest period, from
    which each launch equals the one a period later to the end, over at least two whole periods and a
    quarter of the sequence; None when no period repeats so."""
    n = len(keys)
    best: tuple[int, int] | None = None
    for period in range(1, n // 2 + 1):
        i = n - period - 1
        while i >= 0 and keys[i] == keys[i + period]:
            i -= 1
        start = i + 1
        if n - start >= max(2 * period, n // 4) and (best is None or start < best[0]):
            best = (start, period)
    return best


def plan(
    keys: Sequence[Key],
    durations: Sequence[float],
    *,
    target: float,
    max_kernels: int,
    max_launches: int,
) -> tuple[Plan | None, str]:
    """The second pass for a first pass's launches, or (None, why the first launches are kept)."""
    n = len(keys)
    if len(set(keys)) < 2:
        return None, f"one kernel in the first {n} launches: nothing to choose among"
    found = repetition(keys)
    if found is None:
        return None, f"the kernel sequence does not repeat within the first {n} launches"
    warmup, period = found
    whole = (n - warmup) // period
    totals: dict[Key, float] = {}
    for index in range(warmup, warmup + whole * period):
        totals[keys[index]] = totals.get(keys[index], 0.0) + durations[index]
    steady = sum(totals.values())
    if steady <= 0:
        return None, "the first pass measured no GPU time in the steady state"
    chosen: list[Key] = []
    covered = 0.0
    for key in sorted(totals, key=lambda k: (-totals[k], k)):
        if covered >= target * steady or len(chosen) >= max_kernels:
            break
        chosen.append(key)
        covered += totals[key]
    step = list(keys[warmup : warmup + period])
    skip, count = _shortest_span(step, chosen, totals, max_launches)
    expected = [step[(skip + i) % period] for i in range(count)]
    return (
        Plan(n, warmup, period, steady / whole, totals, chosen, warmup + skip, count, expected),
        "",
    )


def _shortest_span(
    step: list[Key], chosen: list[Key], totals: dict[Key, float], max_launches: int
) -> tuple[int, int]:
    """(offset in the step, length) of the shortest run of consecutive launches (wrapping into the next
    step) that holds every chosen kernel; where none fits in ``max_launches``, the run of that length
    that covers the most chosen time."""
    wanted = set(chosen)
    period = len(step)
    limit = min(max_launches, period)
    best: tuple[float, int, int] | None = None  # (-covered time, length, offset)
    for offset in range(period):
        seen: set[Key] = set()
        covered = 0.0
        length = 0
        while length < limit and len(seen) < len(wanted):
            key = step[(offset + length) % period]
            length += 1
            if key in wanted and key not in seen:
                seen.add(key)
                covered += totals[key]
        candidate = (-covered, length, offset)
        if best is None or candidate < best:
            best = candidate
    assert best is not None
    return best[2], best[1]


def weights_for(profiled: Sequence[Kernel], chosen_plan: Plan) -> tuple[list[float], float]:
    """Each profiled kernel's weight (its kernel's steady-state time, split among the results of that
    kernel) and the coverage: the share of the steady state's time the profiled kernels hold. A result
    is known by its position; one whose kernel is not the expected one (the run went otherwise) is
    known by its key, and weighs nothing when the steady state has no such kernel."""
    keys: list[Key] = []
    for index, kernel in enumerate(profiled):
        key = kernel_key(kernel)
        expected = chosen_plan.expected[index] if index < len(chosen_plan.expected) else None
        keys.append(expected if expected is not None and _same_kernel(expected, key) else key)
    results: dict[Key, int] = {}
    for key in keys:
        if key in chosen_plan.totals:
            results[key] = results.get(key, 0) + 1
    weights = [chosen_plan.totals[key] / results[key] if key in results else 0.0 for key in keys]
    steady = sum(chosen_plan.totals.values())
    return weights, sum(chosen_plan.totals[key] for key in results) / steady


def _same_kernel(expected: Key, key: Key) -> bool:
    """Whether a result is the expected launch: the same key, or the same grid and block where the
    second pass's name is empty (an export whose name the parser could not read)."""
    return expected == key or (expected[1:] == key[1:] and not key[0])


def describe(chosen_plan: Plan, coverage: float) -> dict[str, object]:
    """The summary's ``steadyState``: what the first pass found and what the second profiled."""
    return {
        "window": chosen_plan.window,
        "warmupLaunches": chosen_plan.warmup,
        "period": chosen_plan.period,
        "stepGpuTimeNs": str(round(chosen_plan.step_ns)),
        "distinctKernels": len(chosen_plan.totals),
        "kernelsChosen": len(chosen_plan.chosen),
        "launchSkip": chosen_plan.skip,
        "launchCount": chosen_plan.span,
        "coverage": f"{coverage:.2f}",
    }
