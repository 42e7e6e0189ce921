"""Sliding-window (local) attention: flash-attn's ``window_size=(left, right)``.

Query i of a sequence (Sq queries, Sk keys) sees keys j with

    i + Sk - Sq - left <= j <= i + Sk - Sq + right

bottom-right aligned as flash-attn; -1 leaves that side unbounded, and ``causal=True`` sets
``right = 0``. A row whose window holds no key gives O = 0 and LSE = +inf (as a causal row
before the first key), and gradients 0.

The kernels take the window as the WINDOW constexpr (the non-window specializations are
unchanged: their WINDOW arms fold away) and two run-time extents, ``win_left`` and
``win_right``, an unbounded side passed as a bound no sequence reaches (``extents``). The
key loops start at the first block any row of a tile sees and end after the last, so the work
is proportional to the window, not to the sequence.
"""
from __future__ import annotations

from xsync.compiler import caller_loc
from xsync.errors import LaunchError

NONE = (-1, -1)


def sides(window_size, entry: str = "attention") -> tuple[int, int]:
    """(left, right) of a window given as two ints, each >= -1; else a LaunchError naming
    ``window_size``."""
    try:
        left, right = window_size
    except (TypeError, ValueError):
        left = right = None
    for side in (left, right):
        if isinstance(side, bool) or not isinstance(side, int) or side < -1:
            raise LaunchError(
                f"{entry}: window_size={window_size!r} is not a window; each side is an int >= 0, "
                f"or -1 for no bound on that side", loc=caller_loc(), objects=("window_size",),
                fix="pass window_size=(left, right) as two ints (e.g. (128, 0): each query sees "
                    "itself and the 128 keys before it), -1 for an unbounded side, (-1, -1) for none")
    return int(left), int(right)


def normalize(window_size, causal: bool, entry: str = "attention"):
    """(causal, window): the mask the kernels run. ``window`` is None without a window (also for
    (-1, -1), and for (-1, 0) under causal, which is the causal mask), else (left, right) with
    -1 for an unbounded side and right = 0 under causal; ``causal`` is False when a window runs
    (the window carries it). Bad values raise LaunchError naming ``window_size``."""
    if window_size is None:
        return bool(causal), None
    left, right = sides(window_size, entry)
    if causal:
        right = 0
    if left == -1 and right == -1:
        return bool(causal), None
    if left == -1 and right == 0:
        return True, None
    return False, (left, right)


def extents(window, max_q: int, max_k: int) -> tuple[int, int]:
    """``win_left``, ``win_right`` for the kernels: -1 (and any extent past every sequence) as
    max_q + max_k, which no query's window reaches past (and which keeps int32 arithmetic
    exact)."""
    far = int(max_q) + int(max_k)
    return tuple(far if side < 0 else min(side, far) for side in window)


def constexprs(window, max_q: int, max_k: int) -> dict:
    """The keyword arguments a windowed launch adds: WINDOW=1 and the two extents (none
    without a window, so the non-window launches are as they were)."""
    if window is None:
        return {}
    left, right = extents(window, max_q, max_k)
    return dict(WINDOW=1, win_left=left, win_right=right)
