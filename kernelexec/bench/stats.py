"""Summaries of timing samples and the ratios the benchmark publishes.

Pure functions over numbers (no processes), so the report logic is unit-tested with fixed inputs.
Percentiles are ``statistics.quantiles(..., method="inclusive")``: linear interpolation between
closest ranks (numpy's default), so a p50 of an even-length sample is the mean of the two middle
values.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any

# ``percentile``'s q is taken to 1/100 of a percent: quantiles() cuts the sample into at most
# this many equal parts.
_MAX_PARTS = 10_000


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values``, linearly interpolated."""
    if not values:
        raise ValueError("percentile of an empty sample")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within 0..100, got {q}")
    share = (Fraction(q) / 100).limit_denominator(_MAX_PARTS)
    if share == 0:
        return min(values)
    if share == 1 or len(values) == 1:  # quantiles() wants two points before Python 3.13
        return max(values)
    cuts = statistics.quantiles(values, n=share.denominator, method="inclusive")
    return cuts[share.numerator - 1]


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
        # p10, p20, ..., p90 in one pass (a single value is every percentile of itself)
        deciles = (
            statistics.quantiles(values, n=10, method="inclusive")
            if len(values) > 1
            else [values[0]] * 9
        )
        return cls(
            n=len(values),
            p10=deciles[0],
            p50=deciles[4],
            p90=deciles[8],
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
    unit: str = "x"  # "x": a ratio; "s": seconds; "MiB": memory; "n": a count

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
        if self.unit == "MiB":
            return "-" if value is None else f"{value:.1f} MiB"
        if self.unit == "n":
            return "-" if value is None else f"{value:.0f}"
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
