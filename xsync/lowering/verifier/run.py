"""One scalar assignment checked: the unrolled programs run greedily to their end
(deadlock, leftovers), held back one instance at a time (the leads the target bounds), and
their slots read in order (``Run``); optionally every interleaving of a small run."""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import deque

from xsync.errors import XSyncError
from xsync.lowering.ir import Verb
from xsync.lowering.protocol import Skeleton
from xsync.lowering.verifier import diagnosis
from xsync.lowering.verifier.candidates import Scalars
from xsync.lowering.verifier.observations import Assignment
from xsync.lowering.verifier.tables import INF, MEETING, Lead, Leads, Tables
from xsync.lowering.verifier.unroll import Step

MAX_STATES = 200_000        # exhaustive cross-check: state cap per run
CROSS_CHECK_STATES = 20_000  # exhaustive cross-check: runs with at most this many states


class Run:
    def __init__(self, skel: Skeleton, sc: Scalars, assignment: Assignment, obs: dict,
                 leads: Leads, tables: Tables, ids: list[list[int]] | None = None):
        self.skel, self.sc, self.assignment, self.obs, self.leads = skel, sc, assignment, obs, leads
        self.tables = tables
        self.ids: list[list[int]] = sc.unroll(assignment) if ids is None else ids
        self.lens = [len(p) for p in self.ids]
        self.links = {x.obj: x for x in skel.links}
        self.bars = {b.obj: b for b in skel.barriers}
        self.steps = 0
        self._progs = None
        self._max_lead: dict = {}
        self.cross_checked = 0
        # pos[counter] = positions of its actions; occ[i][k] = which occurrence of its counter
        # the k-th action of instance i is (what it waits for follows from these)
        kid = tables.kid
        pos: list[list[int]] = [[] for _ in range(tables.nkeys)]
        occ = []
        for prog in self.ids:
            mine = []
            for k, aid in enumerate(prog):
                at = pos[kid[aid]]
                mine.append(len(at))
                at.append(k)
            occ.append(mine)
        self.pos, self.occ = pos, occ

    def req(self, i, k) -> tuple:
        """(instance j, position t): action k of instance i waits until j has reached t."""
        c, pos = self.occ[i][k], self.pos
        out = []
        for pk, pi, off, shift in self.tables.tpl[self.ids[i][k]]:
            idx = c - shift
            if idx < 0:
                continue
            at = pos[pk]
            out.append((pi, at[idx] + off) if idx < len(at) else (pi, INF))
        return tuple(out)

    @property
    def reqs(self):
        return _Reqs(self)

    @property
    def progs(self) -> list[list[Step]]:
        """Steps with their loop iterations (for messages; unrolled again on demand)."""
        if self._progs is None:
            self._progs = self.sc.unroll(self.assignment, iters=True)
        return self._progs

    def act(self, i, k):
        return self.sc.acts[self.ids[i][k]]

    @property
    def max_lead(self) -> dict:
        return self._max_lead

    # ------------------------------------------------------------ counting
    def count(self, key, state) -> int:
        """Actions of ``key`` done in ``state`` (meetings: arrived, i.e. reached)."""
        kid = self.tables.key(key)
        if kid is None:
            return 0
        at = self.pos[kid]
        if not at:
            return 0
        inst = self.tables.key_inst[kid]
        if key[1] is MEETING:
            return bisect_right(at, state[inst]) if state[inst] < self.lens[inst] else len(at)
        return bisect_left(at, state[inst])

    def total(self, key) -> int:
        kid = self.tables.key(key)
        return 0 if kid is None else len(self.pos[kid])

    def enabled(self, i, state) -> bool:
        k = state[i]
        if k >= self.lens[i]:
            return False
        for j, t in self.req(i, k):
            if state[j] < t:
                return False
        return True

    def greedy(self, state: list, hold=None, path=None):
        """Advance every instance except ``hold`` while any can move."""
        self.waiters = [[] for _ in self.ids]
        self.propagate(state, [i for i in range(len(self.ids)) if i != hold], hold, path)
        return state

    def propagate(self, state, work, hold, path):
        """Worklist form of the greedy run: an instance blocked on j is looked at again only
        when j moves (``self.waiters``). Without a path it is ``_propagate``, a copy of this
        loop with the path's bookkeeping left out (the verifier's innermost loop)."""
        lens, waiters, pos, tpl = self.lens, self.waiters, self.pos, self.tables.tpl
        if path is None:
            return self._propagate(state, work, hold)
        while work:
            i = work.pop()
            if i == hold:
                continue
            k, size, ids, occ = state[i], lens[i], self.ids[i], self.occ[i]
            start = k
            while k < size:
                blocked = -1
                for pk, pi, off, shift in tpl[ids[k]]:
                    idx = occ[k] - shift
                    if idx < 0:
                        continue
                    at = pos[pk]
                    if state[pi] < (at[idx] + off if idx < len(at) else INF):
                        blocked = pi
                        break
                if blocked >= 0:
                    waiters[blocked].append(i)
                    break
                path.append((i, k))
                k += 1
                state[i] = k
            if k != start:
                self.steps += k - start
                if waiters[i]:
                    work.extend(waiters[i])
                    waiters[i] = []

    def _propagate(self, state, work, hold):
        """``propagate`` without a path: the same moves in the same order."""
        lens, waiters, pos, tpl = self.lens, self.waiters, self.pos, self.tables.tpl
        steps = 0
        while work:
            i = work.pop()
            if i == hold:
                continue
            k, size, ids, occ = state[i], lens[i], self.ids[i], self.occ[i]
            start = k
            while k < size:
                for pk, pi, off, shift in tpl[ids[k]]:
                    idx = occ[k] - shift
                    if idx < 0:
                        continue
                    at = pos[pk]
                    if state[pi] < (at[idx] + off if idx < len(at) else INF):
                        waiters[pi].append(i)
                        break
                else:
                    k += 1
                    state[i] = k
                    continue
                break
            if k != start:
                steps += k - start
                if waiters[i]:
                    work.extend(waiters[i])
                    waiters[i] = []
        self.steps += steps

    # ------------------------------------------------------------ the check
    def check(self, exhaustive=False) -> XSyncError | None:
        """The worst bug of this assignment, as an error (None: none)."""
        found = self.find(4, exhaustive)
        return None if found is None else self.error(found)

    def find(self, below: int, exhaustive=False):
        """(severity, run, build) of the worst bug of severity < ``below``, or None. The
        message is built only for the finding that gets reported (``error``)."""
        final = self.greedy([0] * len(self.ids))
        if final != self.lens:
            return (0, self, lambda: diagnosis.deadlock_error(self, final))
        if below > 1:
            hit = self.limits()
            if hit is not None:
                return (1, self, lambda: diagnosis.limit_error(self, *hit))
        if below > 2:
            bad = self.slot_order()
            if bad is not None:
                return (2, self, lambda: diagnosis.slot_order_error(self, *bad))
        if below > 3:
            left = self.leftovers(final)
            if left:
                return (3, self, lambda: diagnosis.leftover_error(self, left))
        if exhaustive:
            self.cross_check()
        return None

    def error(self, found) -> XSyncError:
        err = found[2]()
        # the scalar values of the counterexample (free scalar / named value -> value)
        err.scalars = dict(self.assignment.values)
        return err

    def slot_order(self):
        """(instance, position) of a commit without a slot from acquire or a release without a
        slot from wait, or None."""
        if self.tables.local:
            # the j-th give-back (commit, release) needs the j-th take (acquire, wait) before
            # it: the first one without is where a scan of the program would stop
            first = [INF] * len(self.ids)
            pos = self.pos
            for inst, take, give in self.tables.slot_pairs:
                took, gave = (pos[take] if take is not None else ()), pos[give]
                bad = gave[len(took)] if len(gave) > len(took) else INF
                for t, g in zip(took, gave):
                    if g < t:
                        bad = g
                        break
                if bad < first[inst]:
                    first[inst] = bad
            for i, k in enumerate(first):
                if k < INF:
                    return i, k
            return None
        slot = self.tables.slot
        for i, prog in enumerate(self.ids):
            held = [0] * self.tables.nkeys
            for k, aid in enumerate(prog):
                op = slot[aid]
                if op is None:
                    continue
                key, d = op
                if d < 0 and held[key] == 0:
                    return i, k
                held[key] += d
        return None

    # ------------------------------------------------------------ limits
    def limits(self):
        """Largest leads: hold the subtrahend's instance h back; the others run as far as they
        can. A lead only grows while h stands still, so it is measured where h is about to
        take a counted action (or finished), with every other instance at its fixpoint."""
        T = self.tables
        for h in self.leads.holds:
            specs = T.holds[h]
            counted = {sp[3] for sp in specs}
            stops = [k for k, aid in enumerate(self.ids[h]) if T.kid[aid] in counted]
            state = [0] * len(self.ids)
            path: list = []
            size = self.lens[h]
            self.greedy(state, hold=h, path=path)
            for stop in stops + [size]:
                while self.advance(state, h, stop, path):
                    work, self.waiters[h] = self.waiters[h], []
                    self.propagate(state, work, h, path)
                count, best = self.count_kid, self._max_lead
                for idx, spec, mins, sub, use_min, limit in specs:
                    if len(mins) == 1:
                        top = count(mins[0], state)
                    else:
                        counts = [count(k, state) for k in mins]
                        top = min(counts) if use_min else max(counts)
                    lead = top - count(sub, state)
                    if lead > best.get(idx, -INF):
                        best[idx] = lead
                    if lead > limit:
                        return spec, list(state), list(path), lead
                if state[h] < stop or state[h] >= size:
                    break          # h is blocked before the counted action, or finished
        return None

    def advance(self, state, i, stop, path) -> bool:
        """Move instance ``i`` alone up to position ``stop`` (exclusive) while it can."""
        k, moved = state[i], False
        while k < stop:
            for j, t in self.req(i, k):
                if state[j] < t:
                    state[i] = k
                    return moved
            if path is not None:
                path.append((i, k))
            k += 1
            self.steps += 1
            moved = True
        state[i] = k
        return moved

    def count_kid(self, kid, state) -> int:
        at = self.pos[kid]
        if not at:
            return 0
        inst = self.tables.key_inst[kid]
        if self.tables.meet_key[kid]:
            return bisect_right(at, state[inst]) if state[inst] < self.lens[inst] else len(at)
        return bisect_left(at, state[inst])

    def lead(self, s: Lead, state) -> int:
        counts = [self.count(k, state) for k in s.minuends]
        top = min(counts) if s.use_min else max(counts)
        return top - self.count(s.subtrahend, state)

    # ------------------------------------------------------------ leftovers
    def leftovers(self, state) -> list[tuple]:
        """(object, message, (line, iteration) of the first unconsumed action) at the end."""
        out = []
        label = self.skel.who
        for link in self.skel.links:
            for ch in link.channels:
                if link.kind == "pipe":
                    for d in ch.consumers:
                        w = self.total((d, Verb.WAIT, link.obj))
                        r = self.total((d, Verb.RELEASE, link.obj))
                        for p in ch.producers:
                            c = self.total((p, Verb.COMMIT, link.obj))
                            if c > w:
                                out.append((link.obj, f"pipe '{link.obj}': {c - w} committed slot(s) of "
                                                      f"{label(p)} never waited by {label(d)}"
                                            if link.gather_pipe else
                                            f"pipe '{link.obj}': {c - w} committed slot(s) never "
                                            f"waited by {label(d)}", self.site((p, Verb.COMMIT, link.obj), w)))
                        if w > r:
                            out.append((link.obj, f"pipe '{link.obj}': {w - r} slot(s) waited by "
                                                  f"{label(d)} never released (a missing release)",
                                        self.site((d, Verb.WAIT, link.obj), r)))
                    for p in ch.producers:
                        c = self.total((p, Verb.COMMIT, link.obj))
                        a = self.total((p, Verb.ACQUIRE, link.obj))
                        if a > c:
                            out.append((link.obj, f"pipe '{link.obj}': {a - c} slot(s) acquired by "
                                                  f"{label(p)} never committed",
                                        self.site((p, Verb.ACQUIRE, link.obj), c)))
                else:
                    for d in ch.consumers:
                        w = self.total((d, Verb.WAIT, link.obj))
                        for s in ch.producers:
                            n = self.total((s, Verb.SIGNAL, link.obj))
                            if n > w:
                                out.append((link.obj, f"event '{link.obj}': {n - w} signal(s) never "
                                                      f"waited by {label(d)} (sent by {label(s)})",
                                            self.site((s, Verb.SIGNAL, link.obj), w)))
        for b in self.skel.barriers:
            counts = {j: self.total((j, MEETING, b.obj)) for j in b.members}
            if counts and len(set(counts.values())) > 1:
                lo = min(counts.values())
                ahead = [j for j, n in counts.items() if n > lo]
                behind = [j for j, n in counts.items() if n == lo]
                out.append((b.obj, f"barrier '{b.obj}': meeting {lo + 1} is left incomplete: "
                                   f"{', '.join(self.skel.instances[j].label for j in ahead)} arrived "
                                   f"{max(counts.values())} time(s), "
                                   f"{', '.join(self.skel.instances[j].label for j in behind)} {lo}",
                            self.site((ahead[0], MEETING, b.obj), lo)))
        return out

    def site(self, key, index):
        """The Step of the index-th action of ``key``."""
        kid = self.tables.key(key)
        if kid is None or index >= len(self.pos[kid]):
            return None
        return self.progs[self.tables.key_inst[kid]][self.pos[kid][index]]

    # ------------------------------------------------------------ cross-check
    def cross_check(self):
        """Every interleaving (small runs): one terminal state, the greedy one."""
        n = len(self.ids)
        size = 1
        for k in self.lens:
            size *= k + 1
        if size > CROSS_CHECK_STATES:
            return
        self.cross_checked = 1
        start = tuple([0] * n)
        seen = {start}
        queue = deque([start])
        ends = set()
        while queue:
            st = queue.popleft()
            moved = False
            for i in range(n):
                if self.enabled(i, st):
                    moved = True
                    nxt = st[:i] + (st[i] + 1,) + st[i + 1:]
                    if nxt not in seen:
                        seen.add(nxt)
                        queue.append(nxt)
            if not moved:
                ends.add(st)
            if len(seen) > MAX_STATES:
                return
        assert ends == {tuple(self.lens)}, f"interleavings end in {ends}, greedy in {self.lens}"


class _Reqs:
    """``run.reqs[i][k]``: what action k of instance i waits for (computed on demand)."""

    def __init__(self, run):
        self.run = run

    def __getitem__(self, i):
        run = self.run
        return _ReqRow(run, i)


class _ReqRow:
    def __init__(self, run, i):
        self.run, self.i = run, i

    def __getitem__(self, k):
        return self.run.req(self.i, k)
