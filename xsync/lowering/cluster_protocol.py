"""The protocol of a cluster kernel (``xs.cluster(n)`` with a multicast pipe): the skeleton of
its ``n`` programs together, which the verifier checks and the CPU emulator runs.

A multicast pipe's slot holds the same tile in every program of the cluster (on Hopper one
TMA multicast of the lead CTA delivers it to all of them), so a slot is
free for any program's producer only once every program's consumers released it, and a
consumer's wait needs the commits of every program's producer. Every other pipe, event and
barrier stays inside its program. :func:`expand` builds that as a :class:`ClusterSkeleton`:

* every instance and endpoint copied per program rank ``p`` (instance ``p * I + i``; labels
  name the program: ``load (program 1 of the cluster)``);
* in copy ``p``, ``xs.program_id(0)`` is ``n * C + p`` and ``xs.num_programs(0)`` is ``n * P``,
  with ``C`` and ``P`` the free values ``xs.program_id(0)`` / ``xs.num_programs(0)`` of the
  skeleton (shared by the copies): so ``xs.cluster_rank()`` (spelled ``program_id(0) % n``) is
  ``p``, ``xs.cluster_id()`` is ``C`` and ``xs.num_clusters()`` is ``P`` in every copy; a value
  computed from the rank is a name of its own in each copy p > 0 (``off_m@program1``);
* a non-multicast link gets its channels once per program; a multicast link one channel per
  channel of the single-program link, joining that channel's producers and consumers of every
  program (the verifier's rule, "the k-th acquire needs release k - capacity of every consumer
  of the channel, the k-th wait the k-th commit of every producer", is then the cluster's);
* each barrier is one membership per program (``Skeleton.membership``).

A kernel without a cluster, or whose cluster has no multicast pipe, keeps its skeleton: its
programs are independent.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from xsync.lowering import cluster, ir
from xsync.lowering.ir import TileOp, Verb
from xsync.lowering.passes.dataflow import map_expr, substitute
from xsync.lowering.protocol import (Act, BarrierMembership, Branch, Channel, Endpoint, Instance, Let, Link,
                                     Loop, Note, NotConstant, Skeleton, evaluate)


def is_cluster(kernel: ir.KernelIR) -> bool:
    """Its programs depend on each other: a cluster of several programs and a multicast pipe."""
    return kernel.cluster > 1 and any(p.multicast for p in kernel.pipes)


def program_text(p: int) -> str:
    return f"program {p} of the cluster"


@dataclass(frozen=True)
class ClusterInstance(Instance):
    """An instance of one program of the cluster."""

    program: int = 0

    @property
    def label(self) -> str:
        return f"{super().label} ({program_text(self.program)})"


@dataclass(frozen=True)
class ClusterSkeleton(Skeleton):
    """The skeleton of the ``cluster`` programs of a cluster together (see the module docstring)."""

    cluster: int = 1
    base: Skeleton | None = None          # one program's skeleton
    multicast: tuple[str, ...] = ()       # the multicast pipes (one link across the programs)

    def program_of(self, instance: int) -> int:
        return instance // len(self.base.instances)

    def base_endpoint(self, ep: Endpoint) -> Endpoint:
        return Endpoint(ep.role, ep.replica, ep.instance % len(self.base.instances))

    def who(self, ep: Endpoint) -> str:
        return f"{self.base.who(self.base_endpoint(ep))} ({program_text(self.program_of(ep.instance))})"

    def replica_name(self, ep: Endpoint) -> str:
        return f"{self.base.replica_name(self.base_endpoint(ep))} ({program_text(self.program_of(ep.instance))})"

    def endpoint_label(self, ep: Endpoint) -> str:
        return f"{self.base.endpoint_label(self.base_endpoint(ep))} ({program_text(self.program_of(ep.instance))})"

    def endpoint(self, role: str, replica: int) -> Endpoint:
        """The endpoint in program 0 (the one program's numbering)."""
        return self.base.endpoint(role, replica)


def expand(kernel: ir.KernelIR, skel: Skeleton) -> Skeleton:
    """The cluster's skeleton where the programs of a cluster depend on each other
    (:func:`is_cluster`), else ``skel``."""
    if not is_cluster(kernel) or isinstance(skel, ClusterSkeleton):
        return skel
    n, size = kernel.cluster, len(skel.instances)
    multicast = tuple(p.name for p in kernel.pipes if p.multicast)
    instances = tuple(ClusterInstance(p * size + i.index, i.agent, i.replica, i.replicas, i.roles, i.serial,
                                      i.hardware, i.unit, program=p)
                      for p in range(n) for i in skel.instances)

    def ep_in(ep: Endpoint, p: int) -> Endpoint:
        return Endpoint(ep.role, ep.replica, p * size + ep.instance)

    endpoints = tuple(ep_in(e, p) for p in range(n) for e in skel.endpoints)
    links = []
    for link in skel.links:
        if link.obj in multicast:
            channels = tuple(Channel(ch.obj, ch.ring, tuple(ep_in(e, p) for p in range(n) for e in ch.producers),
                                     tuple(ep_in(e, p) for p in range(n) for e in ch.consumers))
                             for ch in link.channels)
        else:
            channels = tuple(Channel(ch.obj, ch.ring, tuple(ep_in(e, p) for e in ch.producers),
                                     tuple(ep_in(e, p) for e in ch.consumers))
                             for p in range(n) for ch in link.channels)
        links.append(dataclasses.replace(link, channels=channels))
    barriers = tuple(dataclasses.replace(b, members=tuple(p * size + m for m in b.members))
                     for p in range(n) for b in skel.barriers)
    programs = tuple(_copy(prog, p, n, size) for p in range(n) for prog in skel.programs)
    notes = skel.notes + tuple(
        Note((pipe.name, pipe.src, pipe.dst),
             f"pipe '{pipe.name}' is multicast in a cluster of {n} programs (xs.cluster({n})): a slot "
             f"is free for any program's '{pipe.src}' only once '{pipe.dst}' of every program "
             f"released it, and a wait needs the commit of every program's '{pipe.src}'")
        for pipe in kernel.pipes if pipe.multicast)
    return ClusterSkeleton(skel.kernel, skel.target, instances, endpoints, tuple(links), barriers,
                           skel.points, programs, notes, skel.env, cluster=n, base=skel,
                           multicast=multicast)


# ---------------------------------------------------------------- one program's copy
def _copy(nodes, p: int, n: int, size: int, names: dict | None = None) -> tuple:
    """Program ``p``'s copy of one instance's program. A value whose definition reads the
    program (its rank, directly or through another such value) gets a name of its own in copies
    p > 0 (``off_m@program1``): the verifier must not take one value for both programs (a tile's
    coordinates are free values of the tile-by-tile check, one per name)."""
    names = {} if names is None else names      # renamed in this copy: name -> its name here
    out = []
    for node in nodes:
        if isinstance(node, Act):
            ep = node.endpoint
            out.append(dataclasses.replace(node, endpoint=Endpoint(ep.role, ep.replica, p * size + ep.instance)))
        elif isinstance(node, Let):
            value = _renamed(program_expr(node.value, p, n), names)
            if p and value != program_expr(node.value, 0, n):
                names.update({t: f"{t}@program{p}" for t in node.targets})
            else:
                for t in node.targets:
                    names.pop(t, None)
            out.append(dataclasses.replace(node, targets=tuple(names.get(t, t) for t in node.targets), value=value))
        elif isinstance(node, Loop):
            here = lambda e: _renamed(program_expr(e, p, n), names)  # noqa: E731
            start, stop, step = here(node.start), here(node.stop), here(node.step)
            out.append(dataclasses.replace(node, start=start, stop=stop, step=step,
                                           body=_copy(node.body, p, n, size, names)))
        elif isinstance(node, Branch):
            cond = _renamed(program_expr(node.cond, p, n), names)
            out.append(dataclasses.replace(node, cond=cond, body=_copy(node.body, p, n, size, names),
                                           orelse=_copy(node.orelse, p, n, size, names)))
        else:
            out.append(node)
    return tuple(out)


def _renamed(e, names: dict):
    """``e`` reading the names of this copy."""
    return substitute(e, {old: ir.Name(new) for old, new in names.items()}) if names else e


def program_expr(e, p: int, n: int):
    """``e`` as program ``p`` of a cluster of ``n`` evaluates it: ``program_id(0)`` is
    ``n * C + p`` and ``num_programs(0)`` ``n * P`` (C, P: the free ``program_id(0)`` and
    ``num_programs(0)`` of the copies); the frontend's spellings of the cluster ops
    (``program_id(0) % n``, ``// n``, ``num_programs(0) // n``) become ``p``, C and P."""
    spelled = cluster.spelling(n)

    def spell(x):
        if x == spelled[TileOp.CLUSTER_RANK]:
            return ir.Const(p)
        if isinstance(x, ir.BinOp) and x in (spelled[TileOp.CLUSTER_ID], spelled[TileOp.NUM_CLUSTERS]):
            return x.left
        if x == cluster.PROGRAM:
            scaled = ir.BinOp("*", ir.Const(n), x)
            return ir.BinOp("+", scaled, ir.Const(p)) if p else scaled
        if x == cluster.PROGRAMS:
            return ir.BinOp("*", ir.Const(n), x)
        return None

    def fold(x):
        if isinstance(x, ir.BinOp) and x.op in ("+", "-") and x.right == ir.Const(0):
            return x.left          # `n + xs.cluster_rank()` in program 0
        # a condition on the rank alone is a constant of the copy (`xs.cluster_rank() == 0`)
        if isinstance(x, (ir.BinOp, ir.Compare)) and isinstance(x.left, ir.Const) and isinstance(x.right, ir.Const):
            try:
                return ir.Const(evaluate(x, {}))
            except (ArithmeticError, TypeError, KeyError, NotConstant):
                return x
        return x

    return map_expr(e, spell, fold)


# ---------------------------------------------------------------- messages
def cluster_loop_text(skel, forms) -> str:
    """A loop's bounds as one program of a cluster evaluates them (``range(0, (n + 1), 1)`` in
    program 1 of ``range(n + xs.cluster_rank())``), from the verifier's symbolic ``(start, stop,
    step)``; "" outside a cluster's skeleton (the source text names the loop there)."""
    from xsync.lowering.verifier.forms import to_python

    if not isinstance(skel, ClusterSkeleton) or not (isinstance(forms, tuple) and len(forms) == 3):
        return ""
    try:
        parts = [to_python(f, lambda a: cluster_text(skel, getattr(a, "key", None) or a.name)) for f in forms]
    except (TypeError, AttributeError):
        return ""
    return f"range({', '.join(parts)})"


def cluster_text(skel, text: str) -> str:
    """``text`` (a loop's bounds, a scalar's name) with the free program id and count named as
    the cluster's, in a cluster's skeleton."""
    if isinstance(skel, ClusterSkeleton):
        return text.replace("xs.program_id(0)", "xs.cluster_id()").replace("xs.num_programs(0)", "xs.num_clusters()")
    return text


def cluster_blame(run, state, stuck) -> str:
    """For a deadlock of a cluster's programs: which program keeps a multicast slot from which
    (``program 1 of the cluster never releases slot 0 of multicast pipe 'ring'; program 0's
    'load' waits for it``), or "" where no multicast pipe crosses programs in the deadlock.
    "Never" is over the whole run: a program that releases the slot later, once something
    else unblocks it, is stuck for another reason (its own placement), not the cluster's."""
    skel = run.skel
    if not isinstance(skel, ClusterSkeleton):
        return ""
    for i in stuck:
        a = run.progs[i][state[i]].action
        if a.obj not in skel.multicast or a.event:
            continue
        me, ch = skel.program_of(i), run.links[a.obj].channel_of(a.endpoint)
        mine = run.count((a.endpoint, a.verb, a.obj), state)
        if a.verb is Verb.ACQUIRE:
            cap = run.links[a.obj].capacity
            late = [d for d in ch.consumers if run.total((d, Verb.RELEASE, a.obj)) <= mine - cap
                    and skel.program_of(d.instance) != me]
            if late:
                d = late[0]
                return (f"{program_text(skel.program_of(d.instance))} never releases slot {mine - cap} "
                        f"of multicast pipe '{a.obj}' ('{d.role}' releases "
                        f"{run.total((d, Verb.RELEASE, a.obj))} of its {run.total((d, Verb.WAIT, a.obj))} "
                        f"waits); program {me}'s '{a.endpoint.role}' waits for it to fill the slot again")
        elif a.verb is Verb.WAIT:
            late = [q for q in ch.producers if run.total((q, Verb.COMMIT, a.obj)) <= mine
                    and skel.program_of(q.instance) != me]
            if late:
                q = late[0]
                return (f"{program_text(skel.program_of(q.instance))} never commits slot {mine} of "
                        f"multicast pipe '{a.obj}' ('{q.role}' commits {run.total((q, Verb.COMMIT, a.obj))} "
                        f"time(s)); program {me}'s '{a.endpoint.role}' waits for it")
    return ""


CLUSTER_FIX = ("every program of the cluster must wait and release (and acquire and commit) each "
               "multicast pipe as often as the others: no branch or trip count on xs.cluster_rank() "
               "around those verbs")
