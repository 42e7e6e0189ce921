"""What the scalar enumeration observes and hands out: ``Observation`` (a trip count,
condition or raw value the protocol can depend on), ``LoopFacts`` (what a loop's body does
with its counter), ``Assignment`` (values of the free scalars for one run) and the
observation values of one assignment (``ObsValues``)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Observation:
    kind: str            # "trip" | "cond" | "raw"
    form: object         # symbolic form (trip: (start, stop, step))
    guard: tuple         # ((cond form, polarity), ...) of enclosing counter-free branches
    loop_line: int = 0   # trip: the loop
    uses_var: bool = False


@dataclass
class LoopFacts:
    """What the body of one loop does with its counter (for the trip-count bound)."""

    line: int
    key: str
    period: int = 1
    threshold: int = 0
    periodic: bool = True      # False: a bound/condition grows with the counter
    why: str = ""              # why not periodic
    objects: set = field(default_factory=set)


@dataclass(frozen=True)
class Assignment:
    """Values of the free scalars for one verification run."""

    values: tuple[tuple[str, object], ...]      # atom key / cut name / opaque key -> value
    overrides: tuple[tuple[tuple[str, int], object], ...] = ()   # (name, line) -> value

    def get(self, key, default=None):
        return dict(self.values).get(key, default)


def trip_of(v) -> int:
    if v is None:
        return 0
    return v[0] if isinstance(v, tuple) else v


def magnitude(obs, values) -> tuple:
    """Order assignments: fewer / shorter loops first (smallest counterexamples)."""
    total, biggest = 0, 0
    for o, v in zip(obs, values):
        if o.kind == "trip" and v is not None:
            t = v[0] if isinstance(v, tuple) else v
            total += t
            biggest = max(biggest, t)
    return (biggest, total)


class ObsValues:
    """The observation values of one assignment (a mapping Observation -> value)."""

    def __init__(self, sc: "xsync.lowering.verifier.candidates.Scalars", values: tuple):
        self.sc, self.values = sc, values

    def items(self):
        return zip(self.sc.obs_list, self.values)

    def get(self, o, default=None):
        k = self.sc.obs_index.get(o)
        return default if k is None else self.values[k]
