"""One small registry per component kind, plus entry-point plugin discovery.

    from dspark_lightning.registry import register, create, names

    @register("seq_head", "my_head")
    class MyHead(SeqHead): ...

    create("seq_head", "my_head", geometry, rank=128)

Third-party packages expose a module (or a callable) under the entry-point group
``dspark_lightning.plugins``; importing it is expected to call :func:`register`. Entry points
are discovered once per process; ``$DSPARK_PLUGINS`` turns them off (``none``) or restricts them
(``name1,name2``). A plugin that fails to load (an exception, or ``sys.exit``) is reported with its traceback
summary, never fatal. A plugin whose import hangs is skipped and reported after ``$DSPARK_PLUGIN_TIMEOUT_S``
seconds (default 30); its import thread is left behind as a daemon.

The built-in components register themselves when their modules are imported; the first :func:`get`, :func:`create`
or :func:`names` imports every module of the package whose source registers one (:func:`builtin_modules`, found by
walking the package: a new file with ``@register`` is loaded without being listed anywhere). That lazy load is the
one import that points up the package's floors (this module is a leaf the components import), and the only one
tests/unit/test_layering.py allows.

Kinds: ``backbone``, ``seq_head``, ``conf_head``, ``drafter`` (models, ``drafters/``), ``scheduler``, ``verifier``,
``proposer`` (the runtime, ``infer/``: a proposer factory ``(drafter, batching=, confidence=)`` named by a
drafter class's ``proposer_name``), ``acceptance`` (verification rules, ``infer/``), ``prompt_source``
(``data/prompts/sources.py``), ``regen_backend`` (how the target's answers are made,
:class:`~dspark_lightning.data.regen.backend.RegenBackend`; ``data/regen/``), ``layout`` (readers of serving
directories for ``checkpoint.load_drafter``: ``claims(cfg)``, ``read(path, cfg, target)``; ``export/layouts.py``) and
``server`` (programs that load an export, :class:`~dspark_lightning.export.servers.Server`: their rules and the files
they read beyond the generic layout; ``export/servers.py``) and ``features`` (how training reads the target's
features, ``data/features/modes.py``).
"""

from __future__ import annotations

import importlib
import inspect
import logging
import numbers
import os
import re
import threading
import traceback
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from .checks import UsageError

log = logging.getLogger(__name__)

KINDS = (
    "backbone", "seq_head", "conf_head", "drafter", "scheduler", "verifier", "proposer", "acceptance",
    "prompt_source", "regen_backend", "layout", "server", "features",
)  # fmt: skip
_REGISTERS = re.compile(r"^[ \t]*@?register\(", re.M)  # a decorator line, or a call at the start of a line


def builtin_modules(package: Path | None = None) -> tuple[str, ...]:
    """The dotted names of the package's modules whose source registers a component (a line starting with
    ``@register(`` or ``register(``), in path order: what the first lookup imports."""
    root = Path(__file__).resolve().parent if package is None else Path(package)
    out = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "registry.py" and path.parent == root:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if _REGISTERS.search(text):
            parts = list(path.relative_to(root.parent).with_suffix("").parts)
            out.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return tuple(out)


ENTRY_POINT_GROUP = "dspark_lightning.plugins"

# kind -> name -> object (a class or a factory function)
_REGISTRY: dict[str, dict[str, Any]] = {kind: {} for kind in KINDS}
_BUILTINS_LOADED = False
_PLUGINS_LOADED = False
plugin_errors: dict[str, str] = {}  # entry point name -> error summary
loaded_plugins: dict[str, str] = {}  # entry point name -> "module:attr"


class RegistryError(UsageError, KeyError):
    """Unknown kind or name, or a name registered twice by different objects: a usage error (one line at the console
    script) that is still a ``KeyError`` for the callers that catch one."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it plain
        return str(self.args[0]) if self.args else ""


def _check_kind(kind: str) -> dict[str, Any]:
    if kind not in _REGISTRY:
        raise RegistryError(f"unknown registry kind {kind!r}; kinds are: {', '.join(KINDS)}")
    return _REGISTRY[kind]


def register(kind: str, name: str) -> Callable[[Any], Any]:
    """Decorator: register a class or factory under ``kind/name``.

    Registering the same object twice is a no-op (module reloads); a name taken by a
    different object is an error.
    """
    table = _check_kind(kind)

    def deco(obj: Any) -> Any:
        old = table.get(name)
        if old is not None and _qualname(old) != _qualname(obj):
            raise RegistryError(
                f"{kind} name {name!r} is already registered to {_qualname(old)}; cannot register {_qualname(obj)}"
            )
        table[name] = obj
        obj.registry_name = name  # lets exported configs record the name
        return obj

    return deco


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


def _ensure_loaded() -> None:
    global _BUILTINS_LOADED
    if not _BUILTINS_LOADED:
        _BUILTINS_LOADED = True
        for module in builtin_modules():  # importing them runs their @register decorators
            importlib.import_module(module)
        load_plugins()


PLUGINS_ENV = "DSPARK_PLUGINS"  # unset/"all": every plugin; "none"/"0": none; "a,b": only those entry points
TIMEOUT_ENV = "DSPARK_PLUGIN_TIMEOUT_S"  # seconds a plugin may take to import before it is skipped


def plugin_selection() -> set[str] | None:
    """The entry-point names allowed by ``$DSPARK_PLUGINS`` (None = all)."""
    raw = os.environ.get(PLUGINS_ENV, "").strip()
    if raw in ("", "all", "*"):
        return None
    if raw.lower() in ("none", "0", "off", "false"):
        return set()
    return {x.strip() for x in raw.split(",") if x.strip()}


def _traceback_summary(exc: BaseException, frames: int = 3) -> str:
    """``Type: message`` plus the last few frames as ``file:line in func`` (enough to find the bug)."""
    tb = traceback.extract_tb(exc.__traceback__)[-frames:]
    where = " <- ".join(f"{Path(f.filename).name}:{f.lineno} in {f.name}" for f in reversed(tb))
    return f"{type(exc).__name__}: {exc}" + (f" (at {where})" if where else "")


def load_plugins(force: bool = False) -> dict[str, str]:
    """Import the entry points of group ``dspark_lightning.plugins`` once per process.

    ``$DSPARK_PLUGINS`` disables plugin loading (``none``) or restricts it to named entry points
    (``name1,name2``). A plugin that raises is skipped and reported (name, error and the last
    frames of its traceback) in the returned ``{entry point name: error}`` dict and as a warning.
    """
    global _PLUGINS_LOADED
    if _PLUGINS_LOADED and not force:
        return dict(plugin_errors)
    _PLUGINS_LOADED = True
    allowed = plugin_selection()
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if allowed is not None and ep.name not in allowed:
            continue
        error = _load_with_timeout(ep)
        if error is None:
            loaded_plugins[ep.name] = getattr(ep, "value", ep.name)
        else:
            plugin_errors[ep.name] = error
            log.warning("dspark_lightning plugin %r failed to load and was skipped: %s", ep.name, error)
    return dict(plugin_errors)


def _load_with_timeout(ep) -> str | None:
    """Import (and call) plugin ``ep`` in a daemon thread; None when it registered, else why it was skipped.

    A plugin that raises or calls ``sys.exit`` is reported. One whose import hangs cannot be interrupted from
    Python: after ``$DSPARK_PLUGIN_TIMEOUT_S`` seconds (default 30) it is reported and skipped, its thread left
    behind (a daemon: it never keeps the process alive), and the program goes on without it."""
    try:
        timeout = float(os.environ.get(TIMEOUT_ENV, "30"))
    except ValueError:
        timeout = 30.0
    outcome: list[str | None] = []

    def run() -> None:
        try:
            obj = ep.load()
            if callable(obj) and not isinstance(obj, type):
                obj()
            outcome.append(None)
        except (Exception, SystemExit) as exc:  # a broken plugin (even one calling sys.exit) must not end the program
            outcome.append(_traceback_summary(exc))

    thread = threading.Thread(target=run, name=f"dspark-plugin-{ep.name}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        return (
            f"still importing after {timeout:g} s (a hang?); skipped. Set {PLUGINS_ENV}=none or list the plugins "
            f"to load ({PLUGINS_ENV}=name1,name2), or raise {TIMEOUT_ENV}"
        )
    return outcome[0] if outcome else "the plugin thread ended without a result"


def get(kind: str, name: str) -> Any:
    """The registered object for ``kind/name``; an unknown name lists the available ones."""
    _ensure_loaded()
    table = _check_kind(kind)
    if name not in table:
        avail = ", ".join(sorted(table)) or "(none registered)"
        raise RegistryError(f"unknown {kind} {name!r}; available: {avail}")
    return table[name]


def create(kind: str, name: str, *args: Any, **kwargs: Any) -> Any:
    """Instantiate (or call) the object registered under ``kind/name``. Its keyword arguments come from users
    (recipes, config.json, Python): one it does not take is a :class:`~dspark_lightning.checks.UsageError` naming
    it, and so is a ``TypeError`` of the call when an argument is not the plain type its parameter declares
    (``num_layers="two"`` for an ``int``), with the ``TypeError`` as its cause. The object's own checks run first."""
    obj = get(kind, name)
    what = f"{kind} {name!r}"
    unknown_arguments(what, obj, kwargs)
    return _call(what, obj, args, kwargs)


def build(kind: str, spec: Any, *args: Any, **given: Any) -> Any:
    """A component from its one spelling, the same in a recipe, on the command line (a YAML value) and in Python:
    a registered name (``"static"``) or ``{"class_path": name, "init_args": {...}}``, where ``name`` is a registered
    name or the dotted import path of a class (``my_pkg.rules.MyRule``, which need not be registered). ``args`` and
    ``given`` are arguments the caller supplies (a geometry, a batching); ``init_args`` are the user's."""
    obj, what, init = resolve(kind, spec)
    taken = sorted(set(init) & set(given))
    if taken:
        raise UsageError(f"{what}: init_args may not set {', '.join(taken)} (the caller sets it)")
    return _call(what, obj, args, {**init, **given})


def _call(what: str, obj: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
    """``obj(*args, **kwargs)``; a ``TypeError`` from an argument of the wrong plain type, or a missing one, is one
    line naming it (the ``TypeError`` its cause); any other ``TypeError`` is a bug and propagates."""
    try:
        return obj(*args, **kwargs)
    except TypeError as exc:
        wrong = mistyped_argument(obj, args, kwargs)
        if wrong is None:
            raise
        raise UsageError(f"{what}: {wrong}") from exc


def resolve(kind: str, spec: Any) -> tuple[Any, str, dict[str, Any]]:
    """What ``spec`` names, unbuilt: (the registered or imported object, how errors name it, its ``init_args``), its
    arguments checked against the object's signature. An unknown name or argument is one line."""
    spec = Component.unwrap(Component(spec)) if isinstance(spec, str) else spec
    keys = {"class_path", "init_args"}
    if isinstance(spec, str):
        path, init = spec, {}
    elif isinstance(spec, dict) and isinstance(spec.get("class_path"), str) and spec.keys() <= keys:
        path, init = spec["class_path"], spec.get("init_args") or {}
        if not isinstance(init, dict):
            raise UsageError(f"{kind} {path!r}: init_args must be a mapping, got {init!r}")
    else:
        raise UsageError(f"a {kind} is a registered name or {{class_path: NAME, init_args: {{...}}}}, got {spec!r}")
    if "." not in path:
        obj, what = get(kind, path), f"{kind} {path!r}"
    else:
        module, _, attr = path.rpartition(".")
        try:
            obj = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise UsageError(f"{kind} class_path {path!r} cannot be imported ({type(exc).__name__}: {exc})") from None
        what = f"{kind} {path!r}"
    unknown_arguments(what, obj, init)
    return obj, what, init


class Component:
    """A component as a recipe names it (a registered name or ``{class_path, init_args}``), kept whole: the type of a
    recipe field that :func:`build` resolves, so the component's own constructor checks its settings. jsonargparse
    passes it through unparsed (lightning/datamodule.py registers the type; a YAML text on the command line is read
    as YAML); the field's owner unwraps :attr:`spec`."""

    def __init__(self, spec: Any) -> None:
        if isinstance(spec, str) and spec.lstrip().startswith("{"):
            import yaml

            try:
                spec = yaml.safe_load(spec)
            except yaml.YAMLError as exc:
                raise UsageError(f"a component is a registered name or {{class_path: NAME, init_args: {{...}}}}; "
                                 f"{spec!r} is not YAML ({str(exc).splitlines()[0]})") from None  # fmt: skip
        if not isinstance(spec, str | dict):
            raise UsageError(
                f"a component is a registered name or {{class_path: NAME, init_args: {{...}}}}, got {spec!r}"
            )
        self.spec = spec

    @staticmethod
    def unwrap(value: Any) -> Any:
        return value.spec if isinstance(value, Component) else value


_PLAIN_TYPES: dict[str, tuple[type, ...]] = {
    "int": (numbers.Integral,), "float": (numbers.Real,), "bool": (bool, numbers.Integral), "str": (str,),
}  # fmt: skip
_ARTICLE = {"int": "an int", "float": "a number", "bool": "a bool", "str": "a string"}


def _plain_type(annotation: Any) -> tuple[str, bool] | None:
    """``(type name, None allowed)`` of an annotation that is one plain type, alone or with None (``int``,
    ``float | None``, ``Optional[str]``); None for anything else (unions of types, containers, specs)."""
    if annotation is inspect.Parameter.empty:
        return None
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", None)
    if text is None:
        text = str(annotation).replace("typing.", "").replace("NoneType", "None")
    text = text.replace(" ", "")
    if text.startswith("Optional[") and text.endswith("]"):
        text = f"{text[9:-1]}|None"
    parts = text.split("|")
    plain = [p for p in parts if p != "None"]
    if len(plain) != 1 or plain[0] not in _PLAIN_TYPES:
        return None
    return plain[0], len(parts) > 1


def _signature(obj: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(obj)
    except (TypeError, ValueError):
        return None


def _accepted(obj: Any) -> list[inspect.Parameter] | None:
    """The keyword parameters ``obj`` takes; a class whose ``__init__`` passes ``**kwargs`` on adds its bases' (as
    jsonargparse reads them). None when they cannot be known (a function with ``**kwargs``, no signature)."""
    sig = _signature(obj)
    if sig is None:
        return None
    params = list(sig.parameters.values())
    if not any(p.kind is p.VAR_KEYWORD for p in params):
        return params
    if not isinstance(obj, type):
        return None
    out: dict[str, inspect.Parameter] = {}
    for cls in obj.__mro__[1:]:
        for p in params:
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                out.setdefault(p.name, p)
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            return list(out.values())
        if "__init__" not in cls.__dict__ or cls is object:
            continue
        base = _signature(cls.__init__)
        params = [] if base is None else list(base.parameters.values())[1:]
    return None


def unknown_arguments(what: str, obj: Any, kwargs: dict[str, Any]) -> None:
    """Refuse, in one line listing the parameters ``obj`` takes, a keyword argument it does not take."""
    params = _accepted(obj)
    if params is None:
        return
    named = {p.name: p for p in params}
    unknown = [k for k in kwargs if k not in named or named[k].kind is inspect.Parameter.POSITIONAL_ONLY]
    if unknown:
        takes = ", ".join(p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))
        raise UsageError(f"{what} takes no argument {', '.join(map(repr, unknown))}; it takes {takes or 'none'}")


def mistyped_argument(obj: Any, args: tuple, kwargs: dict[str, Any]) -> str | None:
    """The first argument that is not the plain type (int, float, bool, str, or that or None) its parameter is
    annotated with, said in words (``num_layers must be an int, got 'two' (str)``), or the required ones not given
    (``missing model``); None when every one fits (or the signature cannot be read)."""
    sig = _signature(obj)
    try:
        bound = sig.bind_partial(*args, **kwargs).arguments if sig is not None else {}
    except TypeError:
        return None
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    params = sig.parameters.values() if sig is not None else ()
    missing = [q.name for q in params if q.default is q.empty and q.kind in named and q.name not in bound]
    if missing:
        return f"missing {', '.join(missing)}"
    for key, value in bound.items():
        p = sig.parameters[key]
        plain = _plain_type(p.annotation)
        if plain is None or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        typ, optional = plain
        if value is None and (optional or p.default is None):
            continue
        ok = isinstance(value, _PLAIN_TYPES[typ]) and (typ == "bool" or not isinstance(value, bool))
        ok = ok and (typ != "bool" or isinstance(value, bool) or value in (0, 1))
        if not ok:
            none = " or null" if optional else ""
            return f"{key} must be {_ARTICLE[typ]}{none}, got {value!r} ({type(value).__name__})"
    return None


def names(kind: str) -> list[str]:
    """Sorted registered names of one kind."""
    _ensure_loaded()
    return sorted(_check_kind(kind))


def name_of(obj_or_cls: Any) -> str:
    """The registered name of a component class or instance."""
    cls = obj_or_cls if isinstance(obj_or_cls, type) else type(obj_or_cls)
    name = cls.__dict__.get("registry_name")
    if name is None:
        raise RegistryError(f"{_qualname(cls)} is not registered; decorate it with @register(kind, name)")
    return name
