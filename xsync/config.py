"""Configuration: the one module that reads ``XSYNC_*`` environment variables.

Every option has a typed spec (:class:`Option`): its Python name, its environment
variable, how a value is parsed and validated and its default. Values come from, in order of
precedence:

    1. ``with xsync.options(name=value, ...):``   (innermost block wins; per thread/task)
    2. ``@xs.kernel(options={...})``               (defaults of one kernel)
    3. the environment (``XSYNC_<NAME>``)
    4. the option's default

A bad value is an error that names the variable (or keyword), the value and the valid
ones; nothing else in xsync looks at ``os.environ``. ``python -m xsync config`` prints
the resolved configuration.

Backend options are data: each backend declares frozen ``LowerOptions`` (read by its passes
and allocator) and ``RenderOptions`` (read by its renderer and launch) whose fields name the
option feeding them (:func:`xsync.backends.base.option_field`). :func:`lower_options` and
:func:`render_options` build them here, at the entry points (``Kernel.lower/compile``,
``compile_ptx``, the CLI), and nothing below calls :func:`current`. The compile cache key
is those objects (plus ``verify`` and ``accept_bounded``). The generic options (backend, verify,
accept_bounded, dump, cache_dir, cpu_timeout, check_inputs, ascend_cores) are read at the entry
points and passed down.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable

from xsync.errors import XSyncError


class ConfigError(XSyncError):
    """An XSYNC_* variable or an xsync.options(...) keyword has an invalid value."""


_TRUE = ("1", "true", "on", "yes")
_FALSE = ("0", "false", "off", "no")


@dataclass(frozen=True)
class Option:
    name: str                     # Python keyword: xsync.options(name=...)
    env: str                      # environment variable
    kind: str                     # bool | int | float | choice | path
    default: Any
    doc: str
    choices: tuple | Callable[[], tuple] = ()
    low: float | None = None
    high: float | None = None
    multiple_of: int | None = None
    aliases: dict = field(default_factory=dict)   # accepted spellings -> canonical choice

    def valid(self) -> str:
        if self.kind == "bool":
            return "one of " + ", ".join(_TRUE + _FALSE)
        if self.kind == "choice":
            return "one of " + ", ".join(self.valid_choices())
        if self.kind in ("int", "float"):
            rng = []
            if self.low is not None:
                rng.append(f">= {self.low:g}")
            if self.high is not None:
                rng.append(f"<= {self.high:g}")
            what = "an integer" if self.kind == "int" else "a finite number"
            extra = f", a multiple of {self.multiple_of}" if self.multiple_of else ""
            return what + (" " + " and ".join(rng) if rng else "") + extra
        return "a directory path"

    def parse(self, raw: Any, source: str) -> Any:
        """The validated value of ``raw`` (text from the environment or a Python value)."""
        def bad(reason: str = "") -> ConfigError:
            why = f": {reason}" if reason else ""
            if source.endswith("=)"):      # a keyword: xsync.options(name=value)
                return ConfigError(f"{source[:-1]}{raw!r}) is not valid{why}",
                                   fix=f"{self.name} ({self.doc}) takes {self.valid()}; leave it "
                                       f"out for the default ({self.default_text()})")
            head = f"{source}={raw if isinstance(raw, str) else repr(raw)}"
            return ConfigError(f"{head} is not valid{why}",
                               fix=f"{self.env} ({self.doc}) takes {self.valid()}; unset it for the "
                                   f"default ({self.default_text()})")
        if raw is None:
            return None
        if self.kind == "bool":
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in _TRUE:
                return True
            if text in _FALSE:
                return False
            raise bad()
        if self.kind == "choice":
            text = str(raw).strip().lower() if not isinstance(raw, bool) else ("1" if raw else "0")
            text = self.aliases.get(text, text)
            if text not in self.valid_choices():
                raise bad()
            return text
        if self.kind == "path":
            text = os.fspath(raw) if not isinstance(raw, str) else raw
            if not text.strip():
                raise bad("empty")
            return text
        # numbers
        if isinstance(raw, bool):
            raise bad()
        try:
            value = float(raw) if self.kind == "float" else int(str(raw).strip(), 10) \
                if isinstance(raw, str) else raw
        except (TypeError, ValueError):
            raise bad() from None
        if self.kind == "int" and (not isinstance(value, int) or isinstance(value, bool)):
            raise bad()
        if self.kind == "float":
            value = float(value)
            if not math.isfinite(value):
                raise bad("not finite")
        if self.low is not None and value < self.low:
            raise bad("too small")
        if self.high is not None and value > self.high:
            raise bad("too large")
        if self.multiple_of and value % self.multiple_of:
            raise bad(f"not a multiple of {self.multiple_of}")
        return value

    def valid_choices(self) -> tuple:
        """The choices; a callable ``choices`` is asked (the backend option asks the registry)."""
        return self.choices() if callable(self.choices) else self.choices

    def default_text(self) -> str:
        if self.default is None:
            return "off" if self.kind == "path" else "automatic"
        return str(self.default)


def _backend_choices() -> tuple:
    """auto and every registered backend's name (xsync.backends registers them)."""
    from xsync.backends import names

    return ("auto",) + names()


def _cache_default() -> str:
    return os.path.join(os.path.expanduser("~"), ".cache", "xsync")


OPTIONS: tuple[Option, ...] = (
    Option("backend", "XSYNC_BACKEND", "choice", "auto",
           "where kernels run: auto picks nvidia on a Hopper GPU, ascend on an NPU, else cpu",
           choices=_backend_choices,
           aliases={"": "auto", "ascend_sim": "ascend-sim", "sim": "ascend-sim"}),
    Option("verify", "XSYNC_VERIFY", "bool", True,
           "run the protocol verifier before compiling"),
    Option("accept_bounded", "XSYNC_ACCEPT_BOUNDED", "bool", False,
           "lower, compile and launch a kernel whose verdict is bounded (checked up to bounds, "
           "not proven for every trip count); its report says NOT PROVEN"),
    Option("dump", "XSYNC_DUMP", "path", None,
           "directory that receives every generated source and its allocation table"),
    Option("cache_dir", "XSYNC_CACHE_DIR", "path", None,
           "where generated modules are written (default ~/.cache/xsync)"),
    Option("check_inputs", "XSYNC_CHECK_INPUTS", "bool", False,
           "read attention_varlen's cu_seqlens on the host and check the varlen contract on "
           "GPU/NPU too (costs a device-to-host copy and a sync; the CPU backend always checks)"),
    Option("cpu_timeout", "XSYNC_CPU_TIMEOUT", "float", 600.0,
           "seconds a CPU-emulated or simulated launch may run before it is reported",
           low=1e-3, high=1e7),
    Option("cpu_mode", "XSYNC_CPU_MODE", "choice", "threads",
           "CPU emulator scheduler: threads (one per agent) or cooperative (generators in one "
           "thread, deterministic, faster for sync-heavy kernels)",
           choices=("threads", "cooperative")),
    Option("debug_hang", "XSYNC_DEBUG_HANG", "bool", False,
           "Hopper: report a stuck mbarrier wait as StallError instead of hanging"),
    Option("hang_timeout_ms", "XSYNC_HANG_TIMEOUT_MS", "int", 2000,
           "Hopper hang debug mode: how long one wait may poll", low=1, high=3_600_000),
    Option("nv_producer_regs", "XSYNC_NV_PRODUCER_REGS", "int", None,
           "Hopper: registers per thread of the producer partition (setmaxnreg)",
           low=24, high=256, multiple_of=8),
    Option("nv_consumer_regs", "XSYNC_NV_CONSUMER_REGS", "int", None,
           "Hopper: registers per thread of each consumer partition (setmaxnreg)",
           low=24, high=256, multiple_of=8),
    Option("nv_maxnreg", "XSYNC_NV_MAXNREG", "int", None,
           "Hopper: the launch option maxnreg", low=24, high=255),
    Option("nv_merge_pipes", "XSYNC_NV_MERGE_PIPES", "bool", None,
           "Hopper pass: one ring for two pipes filled and taken together (default on)"),
    Option("nv_fuse_mma", "XSYNC_NV_FUSE_MMA", "bool", None,
           "Hopper pass: fuse the split PV product into the accumulating wgmma (default on)"),
    Option("nv_defer_mma_wait", "XSYNC_NV_DEFER_MMA_WAIT", "bool", None,
           "Hopper pass: keep one wgmma in flight across K steps (default on)"),
    Option("nv_overlap", "XSYNC_NV_OVERLAP", "bool", None,
           "Hopper pass: overlap the softmax with the running PV wgmma (default on)"),
    Option("nv_pingpong", "XSYNC_NV_PINGPONG", "choice", None,
           "Hopper pass: ping-pong turns between two consumer warpgroups",
           choices=("0", "1", "each", "first", "wrap"),
           aliases={"off": "0", "false": "0", "no": "0", "on": "1", "true": "1", "yes": "1"}),
    Option("nv_tma_store", "XSYNC_NV_TMA_STORE", "bool", None,
           "Hopper: a consumer's xs.store of a whole tile goes through shared memory and a TMA "
           "store where shared memory has room (default on)"),
    Option("nv_prefetch_tile_scalars", "XSYNC_NV_PREFETCH_TILE_SCALARS", "bool", None,
           "Hopper: a consumer's persistent tile loop issues its table reads (xs.load_scalar) "
           "tiles ahead of the tile that uses them (default off until measured)"),
    Option("nv_exp2_fma", "XSYNC_NV_EXP2_FMA", "choice", "0",
           "Hopper: the share (1/4, 1/2) of an accumulator tile's exp2 computed by a polynomial on "
           "the FMA pipe instead of the special-function unit (default 0 until measured)",
           choices=("0", "1/4", "1/2")),
    Option("attn_fused_dq", "XSYNC_ATTN_FUSED_DQ", "bool", None,
           "attention backward: dQ reduce-added by the dK/dV kernel instead of its own kernel "
           "(default: the backward schedule's choice, on for the CPU)"),
    Option("ascend_form", "XSYNC_ASCEND_FORM", "choice", "auto",
           "Ascend source form: release (one body, triton-ascend 3.2.0) or scope (al.scope, "
           "triton-ascend 3.2.1+)", choices=("auto", "release", "scope")),
    Option("ascend_event_ids", "XSYNC_ASCEND_EVENT_IDS", "int", None,
           "Ascend: cap on cross-core event IDs (default: the range the CANN version documents)", low=1, high=16),
    Option("ascend_cores", "XSYNC_ASCEND_CORES", "int", None,
           "Ascend: AI cores a launch may keep resident (default: ask the device, else 20)",
           low=1, high=4096),
)
BY_NAME = {o.name: o for o in OPTIONS}
BY_ENV = {o.env: o for o in OPTIONS}


@dataclass(frozen=True)
class Settings:
    """The resolved configuration: ``settings.verify``, ``settings["nv_fuse_mma"]``."""

    values: tuple[tuple[str, Any], ...]

    def __post_init__(self):
        # read on every launch: look-ups computed once, each backend's options built once
        object.__setattr__(self, "_map", dict(self.values))
        object.__setattr__(self, "_stage_options", {})

    def __getattr__(self, name):
        if name.startswith("_") or name == "values":
            raise AttributeError(name)
        try:
            return self._map[name]
        except KeyError:
            raise AttributeError(f"xsync has no option {name!r}") from None

    def __getitem__(self, name):
        return getattr(self, name)

    def as_dict(self) -> dict:
        return dict(self.values)

    def backend_options(self, backend) -> tuple:
        """(LowerOptions, RenderOptions) of ``backend`` under these settings (built once)."""
        hit = self._stage_options.get(backend)
        if hit is None:
            # an xsync.options block makes new Settings per launch: equal ones share the objects
            key = (backend, self.values)
            hit = _options_memo.get(key)
            if hit is None:
                if len(_options_memo) > 256:
                    _options_memo.clear()
                hit = _options_memo[key] = (lower_options(backend, settings=self),
                                            render_options(backend, settings=self))
            self._stage_options[backend] = hit
        return hit

    def describe(self) -> str:
        lines = []
        for o in OPTIONS:
            v = dict(self.values)[o.name]
            shown = o.default_text() if v is None else v
            lines.append(f"{o.env:<24} {o.name:<18} = {shown!s:<12} {o.doc}")
        return "\n".join(lines)


_overrides: contextvars.ContextVar[tuple] = contextvars.ContextVar("xsync_options", default=())
_kernel_layer: contextvars.ContextVar[dict] = contextvars.ContextVar("xsync_kernel_options", default={})
_env_cache: dict = {}
_plain_cache: dict = {}      # environment -> Settings (no kernel options, no overrides)
_options_memo: dict = {}     # (backend, settings values) -> (LowerOptions, RenderOptions)


def _check_keywords(kwargs: dict, where: str) -> dict:
    out = {}
    for name, value in kwargs.items():
        opt = BY_NAME.get(name)
        if opt is None:
            raise ConfigError(f"{where}: unknown option {name!r}",
                              fix="valid options: " + ", ".join(BY_NAME))
        out[name] = opt.parse(value, f"{where}({name}=)")
    return out


# The process environment as bytes (POSIX): one dict lookup per variable instead of an
# encode-and-decode per os.environ.get; every launch reads the configuration.
_ENV_DATA = getattr(os.environ, "_data", None) if os.name == "posix" else None
_ENV_KEYS = tuple(o.env.encode() for o in OPTIONS)


def _raw_environment() -> tuple:
    if _ENV_DATA is not None:
        return tuple(map(_ENV_DATA.get, _ENV_KEYS))
    return tuple(os.environ.get(o.env) for o in OPTIONS)


def _from_environment(raw: tuple | None = None) -> dict:
    raw = _raw_environment() if raw is None else raw
    hit = _env_cache.get(raw)
    if hit is not None:
        return hit
    out = {}
    for opt, text in zip(OPTIONS, raw):
        if isinstance(text, bytes):
            text = os.fsdecode(text)
        if text is None or (text.strip() == "" and opt.kind != "path"):
            continue
        if opt.kind == "path" and text == "":
            continue
        out[opt.name] = opt.parse(text, opt.env)
    if len(_env_cache) > 64:
        _env_cache.clear()
    _env_cache[raw] = out
    return out


def current() -> Settings:
    """The configuration in effect here: context overrides, kernel options, environment."""
    raw = _raw_environment()
    kernel_layer, overrides = _kernel_layer.get(), _overrides.get()
    if not kernel_layer and not overrides:
        hit = _plain_cache.get(raw)       # the common case: the environment alone
        if hit is not None:
            return hit
    values = {o.name: o.default for o in OPTIONS}
    values.update(_from_environment(raw))
    values.update(kernel_layer)
    for layer in overrides:
        values.update(layer)
    settings = Settings(tuple(values.items()))
    if not kernel_layer and not overrides:
        if len(_plain_cache) > 64:
            _plain_cache.clear()
        _plain_cache[raw] = settings
    return settings


@contextlib.contextmanager
def options(**kwargs):
    """``with xsync.options(verify=False, nv_fuse_mma=False): ...`` — validated overrides
    for launches and compiles inside the block (this thread or task only)."""
    layer = _check_keywords(kwargs, "xsync.options")
    token = _overrides.set(_overrides.get() + (layer,))
    try:
        yield current()
    finally:
        _overrides.reset(token)


def kernel_options(kwargs: dict | None, kernel_name: str) -> dict:
    """Validate ``@xs.kernel(options={...})``."""
    return _check_keywords(dict(kwargs or {}), f"@xs.kernel(options=...) of {kernel_name!r}")


@contextlib.contextmanager
def kernel_scope(kernel_opts: dict):
    """While compiling/launching one kernel: its options sit between the environment and
    any ``xsync.options`` block of the caller."""
    if not kernel_opts:
        yield
        return
    token = _kernel_layer.set(dict(kernel_opts))
    try:
        yield
    finally:
        _kernel_layer.reset(token)


def set_by(name: str) -> str:
    """Where option ``name`` got its value here, as the user wrote it: the innermost
    ``xsync.options(...)`` block, the kernel's ``@xs.kernel(...)``, the environment, or the
    default."""
    opt = BY_NAME[name]
    for layer in reversed(_overrides.get()):
        if name in layer:
            return f"xsync.options({name}={layer[name]!r})"
    layer = _kernel_layer.get()
    if name in layer:
        return f"@xs.kernel({name}={layer[name]!r})"
    raw = _raw_environment()[OPTIONS.index(opt)]
    if raw is not None and name in _from_environment():
        return f"{opt.env}={os.fsdecode(raw) if isinstance(raw, bytes) else raw}"
    return f"the default {name}={opt.default!r}"


def cache_dir(*parts: str) -> str:
    root = current().cache_dir or _cache_default()
    return os.path.join(root, *parts)


def environment_names() -> tuple[str, ...]:
    return tuple(o.env for o in OPTIONS)


def parse_value(name: str, raw: Any) -> Any:
    """Validate one value for option ``name`` (used by tools that take NAME=VALUE)."""
    return BY_NAME[name].parse(raw, name)



# ---------------------------------------------------------------- backend option objects
def lower_options(backend, given=None, settings: Settings | None = None,
                  where: str = "kernel.lower(options=...)"):
    """``backend.LowerOptions``: ``given`` (a dict of its fields, or the object itself) over
    ``settings`` (default: :func:`current`)."""
    return _stage_options(backend, backend.LowerOptions, backend.RenderOptions, given, settings, where)


def render_options(backend, given=None, settings: Settings | None = None,
                   where: str = "compile options=..."):
    """``backend.RenderOptions``: ``given`` (a dict of its fields, or the object itself) over
    ``settings`` (default: :func:`current`)."""
    return _stage_options(backend, backend.RenderOptions, backend.LowerOptions, given, settings, where)


def _stage_options(backend, cls, other, given, settings, where):
    if isinstance(given, cls):
        return given
    if isinstance(given, other):
        owner = "kernel.lower(..., options=)" if other is backend.LowerOptions else \
            "compile_kernel / compile_ptx options="
        raise ConfigError(f"{where}: the {other.STAGE} options ({other.__name__}) of the {backend.name} "
                          f"backend, given at {cls.STAGE}",
                          fix=f"pass a {cls.__name__} (or a dict of its fields) here; {other.__name__} "
                              f"go to {owner}")
    if given is not None and not isinstance(given, dict):
        raise ConfigError(f"{where}: {type(given).__name__} is not an option set of the {backend.name} backend",
                          fix=f"pass a dict of {cls.__name__} fields or a {cls.__module__}.{cls.__name__}")
    given = {k: v for k, v in (given or {}).items() if v is not None}
    for key in given:
        if key not in cls.field_names():
            raise (_wrong_stage(backend, other, cls, key, where) if key in other.field_names()
                   else _unknown(backend, cls, key, where))
    settings = current() if settings is None else settings
    values = {name: settings[option] for name, option in cls.config_names().items()}
    feeds = cls.config_names()
    for key, value in given.items():
        option = BY_NAME.get(feeds.get(key))
        values[key] = option.parse(value, f"{where.split('(')[0]}({key}=)") if option else value
    return cls(**values)


def _how_to_pass(backend, cls, key) -> str:
    option = BY_NAME.get(cls.config_names().get(key))
    ambient = f" or set {option.env} / xsync.options({option.name}=...)" if option else ""
    if cls is backend.LowerOptions:
        return (f"pass it when the kernel is lowered: kernel.lower({backend.name!r}, ..., "
                f"options={{{key!r}: ...}}){ambient}")
    return f"pass it when the kernel is compiled (compile_kernel / compile_ptx options=...){ambient}"


def _wrong_stage(backend, owner, cls, key, where) -> ConfigError:
    return ConfigError(f"{where}: {key!r} is a {owner.STAGE} option of the {backend.name} backend, "
                       f"given at {cls.STAGE}",
                       fix=_how_to_pass(backend, owner, key))


def _unknown(backend, cls, key, where) -> ConfigError:
    from xsync.backends import registry

    elsewhere = [b.name for b in registry.backends() if b is not backend
                 and key in b.LowerOptions.field_names() + b.RenderOptions.field_names()]
    owners = f" (an option of the {', '.join(elsewhere)} backend)" if elsewhere else ""
    lower, render = backend.LowerOptions, backend.RenderOptions
    return ConfigError(f"{where}: unknown {cls.STAGE} option {key!r} for the {backend.name} "
                       f"backend{owners}",
                       fix=f"lowering options of {backend.name}: {', '.join(lower.field_names()) or 'none'}; "
                           f"rendering options: {', '.join(render.field_names()) or 'none'}")
