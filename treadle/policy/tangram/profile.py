"""Duration profiles: historical averages and elasticity fitted from measured samples (§4.1, §4.2).

The paper profiles ``T_ori`` and ``E(m)`` "in advance" for CPU reward runs and reward-model
inference, and uses historical averages for every other action, without saying how. Ours:

* ``Average``: the mean of the last ``window`` observations of an action type, kept as a running
  mean whose weight is ``1 / min(count, window)`` (bounded memory; a plain mean until ``window``
  samples, an exponential average after, so the profile follows drift).
* ``fit``: Amdahl's law ``dur(m) = a + b / m`` fitted by least squares to samples ``(m, duration /
  T_ori)`` (durations normalised by the action's own one-unit estimate, so runs of different sizes
  share one curve), with ``a, b >= 0``. Then ``E(m) = (a + b) / (a m + b)``, which lies in (0, 1]
  for every m >= 1. Samples at fewer than two distinct amounts cannot show elasticity: ``None``
  (the action then runs at its minimum, as Alg. 1 line 6 does for unknown elasticity).

Called by the simulator (from its probe runs) and by the live shell (from finished actions).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from treadle.errors import SpecError
from treadle.policy.tangram import model

DEFAULT_WINDOW = 256


@dataclasses.dataclass(frozen=True)
class Average:
    """A running average of one action type's duration."""

    mean: float = 0.0
    count: int = 0
    window: int = DEFAULT_WINDOW

    def observe(self, value: float) -> Average:
        if value < 0:
            raise SpecError("a duration is >= 0", field="value", value=value)
        count = self.count + 1
        weight = 1.0 / min(count, self.window)
        return dataclasses.replace(self, mean=self.mean + weight * (value - self.mean), count=count)


def fit(samples: Sequence[tuple[int, float]], max_units: int) -> model.Elasticity | None:
    """``E(m)``, ``m = 1 .. max_units``, from ``(units, normalised duration)`` samples (module doc)."""
    if max_units < 1:
        raise SpecError("must be >= 1", field="max_units", value=max_units)
    if any(m < 1 or d <= 0 for m, d in samples):
        raise SpecError("samples are (units >= 1, duration > 0)", field="samples")
    if len({m for m, _ in samples}) < 2:
        return None
    a, b = _least_squares([1.0 / m for m, _ in samples], [d for _, d in samples])
    if a + b <= 0:
        return None
    return model.Elasticity(tuple((a + b) / (a * m + b) for m in range(1, max_units + 1)))


def _least_squares(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """``(a, b) >= 0`` minimising ``Σ (a + b x - y)²`` (clamped to the boundary when negative)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    a = my - b * mx
    if b < 0:  # no speed-up at all: a flat line
        return max(my, 0.0), 0.0
    if a < 0:  # better than linear in the samples: through the origin
        return 0.0, sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs)
    return a, b
