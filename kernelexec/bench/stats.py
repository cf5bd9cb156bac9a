"""Summaries of timing samples and the ratios the benchmark publishes.

Pure functions over numbers (no processes), so the report logic is unit-tested with fixed inputs.
Percentiles use linear interpolation between closest ranks (numpy's default), so a p50 of an
even-length sample is the mean of the two middle values.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values``, linearly interpolated."""
    if not values:
        raise ValueError("percentile of an empty sample")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within 0..100, got {q}")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = math.ceil(position)
    if low == high:
        return ordered[low]
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True, kw_only=True)
class Summary:
    """Distribution of one set of samples (seconds unless said otherwise)."""

    n: int
    p10: float
    p50: float
    p90: float
    max: float
    min: float
    mean: float
    stdev: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Summary:
        if not values:
            raise ValueError("summary of an empty sample")
        return cls(
            n=len(values),
            p10=percentile(values, 10),
            p50=percentile(values, 50),
            p90=percentile(values, 90),
            max=max(values),
            min=min(values),
            mean=statistics.fmean(values),
            stdev=statistics.stdev(values) if len(values) > 1 else 0.0,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(values: Sequence[float]) -> Summary | None:
    """``Summary.of`` that answers None for an empty sample (a row that never ran)."""
    return Summary.of(values) if values else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``, or None when either side is missing or the floor is zero."""
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


@dataclass(frozen=True, kw_only=True)
class TargetCheck:
    """One published target: the measured ratio against its threshold.

    ``met`` is None when the target could not be evaluated in this run (a row was unavailable,
    or the run was not at the size the target is defined for); ``note`` says why.
    """

    name: str
    description: str
    value: float | None
    threshold: float
    higher_is_better: bool
    met: bool | None
    note: str = ""
    unit: str = "x"  # "x": a ratio; "s": seconds

    @classmethod
    def evaluate(
        cls,
        *,
        name: str,
        description: str,
        value: float | None,
        threshold: float,
        higher_is_better: bool = False,
        note: str = "",
        applicable: bool = True,
        unit: str = "x",
    ) -> TargetCheck:
        met: bool | None = None
        if value is not None and applicable:
            met = value >= threshold if higher_is_better else value <= threshold
        if value is None and not note:
            note = "not measured in this run"
        return cls(
            name=name,
            description=description,
            value=value,
            threshold=threshold,
            higher_is_better=higher_is_better,
            met=met,
            note=note,
            unit=unit,
        )

    @property
    def verdict(self) -> str:
        if self.met is None:
            return "n/a"
        return "met" if self.met else "NOT met"

    def format(self, value: float | None) -> str:
        return format_seconds(value) if self.unit == "s" else format_ratio(value)

    @property
    def threshold_text(self) -> str:
        return ("≥ " if self.higher_is_better else "≤ ") + self.format(self.threshold)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "verdict": self.verdict}


def format_seconds(value: float | None) -> str:
    """Human units for a duration: µs / ms / s, three significant-ish digits."""
    if value is None:
        return "-"
    if value < 1e-3:
        return f"{value * 1e6:.0f} µs"
    if value < 1:
        return f"{value * 1e3:.1f} ms"
    return f"{value:.2f} s"


def format_bytes(value: int | None) -> str:
    if value is None:
        return "-"
    return f"{value / (1024 * 1024):.0f} MiB"


def format_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"
