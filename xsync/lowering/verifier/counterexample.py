"""A deadlock the verifier found, as data for tools that draw it (``xsync trace``)."""
from __future__ import annotations

from dataclasses import dataclass

from xsync.lowering.ir import Verb


@dataclass(frozen=True)
class CounterexampleStep:
    lane: int
    verb: str                 # acquire commit wait release signal evwait sync arrive
    obj: str
    role: str
    line: int
    iters: tuple[tuple[str, int], ...]
    enabled_by: tuple[int, ...]   # indices of earlier steps that let this one through


@dataclass(frozen=True)
class StuckLane:
    lane: int
    verb: str
    obj: str
    role: str
    line: int
    iters: tuple[tuple[str, int], ...]
    why: str
    waits_on: tuple[int, ...]     # lanes it waits for


@dataclass(frozen=True)
class Counterexample:
    """A deadlock the verifier found, for tools that draw it (``xsync trace``)."""

    backend: str
    lanes: tuple[str, ...]
    lane_info: tuple[str, ...]
    scalars: str
    steps: tuple[CounterexampleStep, ...]
    stuck: tuple[StuckLane, ...]
    finished: tuple[int, ...]

    @staticmethod
    def of(run, state, path, why_blocked, scalar_note: str) -> "Counterexample":
        """``why_blocked(i)``: why lane i cannot move in ``state``; ``scalar_note``: the scalar values."""
        skel = run.skel
        index: dict[tuple, int] = {}
        steps = []
        for n, (i, k) in enumerate(path):
            st = run.progs[i][k]
            a = st.action
            by = []
            for j, t in run.reqs[i][k]:
                src = index.get((j, t - (0 if a.meeting else 1)))
                if src is not None:
                    by.append(src)
            index[(i, k)] = n
            steps.append(CounterexampleStep(i, _draw_verb(a), a.obj, a.endpoint.role, a.loc.line,
                                            st.iters, tuple(by)))
        stuck = []
        for i in range(len(run.ids)):
            if state[i] >= run.lens[i]:
                continue
            st = run.progs[i][state[i]]
            a = st.action
            waits = tuple(sorted({j for j, t in run.reqs[i][state[i]] if state[j] < t and j != i}))
            stuck.append(StuckLane(i, _draw_verb(a), a.obj, a.endpoint.role, a.loc.line, st.iters,
                                   why_blocked(i), waits))
        finished = tuple(i for i in range(len(run.ids)) if state[i] >= run.lens[i])
        info = tuple(f"{inst.hardware}: {', '.join(inst.roles)}" for inst in skel.instances)
        return Counterexample(skel.backend, tuple(i.label for i in skel.instances), info,
                              scalar_note.strip().removeprefix("with "), tuple(steps),
                              tuple(stuck), finished)


def _draw_verb(a) -> str:
    """The verb as ``xsync trace`` draws it (an event's wait is ``evwait``; an event's verbs,
    a meeting's, are plain strings)."""
    if a.meeting:
        return "sync" if a.waits else "arrive"
    if a.event:
        return "evwait" if a.verb is Verb.WAIT else a.verb.value
    return a.verb
