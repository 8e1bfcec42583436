"""Errors as one line: the :class:`ConfigError` behind a wrapped exception, jsonargparse's nested parse errors
condensed to ``<option>: <problem>``, Lightning's trainer errors with the flag to fix."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from lit_icl.cli.checkpoints import import_class
from lit_icl.core.errors import ConfigError
from lit_icl.core.memory import TOO_LARGE, gib

E = TypeVar("E", bound=BaseException)


def trainer_error_message(err: BaseException, option: str = "--trainer") -> str:
    """One line from Lightning's error about a trainer (or checkpoint) flag, with a pointer to the flags."""
    text = " ".join(str(err).split()) or type(err).__name__
    text = re.sub(r" Find a complete list of options in our documentation at \S+", "", text)
    hint = f"fix that {option} option (python -m lit_icl fit --help lists them)"
    if re.search(r"backend|can ?not run|not available|no (gpu|cuda|mps|tpu)", text, re.IGNORECASE):
        hint = "use --trainer.accelerator auto (what this machine has) or cpu"
    if text.endswith(".") and not text.endswith(".."):
        text = text[:-1]
    what = "checkpoint" if option == "--checkpoint" else "trainer"
    return f"invalid {what} configuration: {text}; {hint}"

def precisions() -> list[str]:
    """Every ``--trainer.precision`` value Lightning accepts, as typed on the command line."""
    import typing

    from lightning.fabric.connector import _PRECISION_INPUT

    def flat(t: Any) -> list[Any]:
        args = typing.get_args(t)
        return [x for a in args for x in (flat(a) if typing.get_args(a) else [a])] if args else [t]

    return list(dict.fromkeys(str(v) for v in flat(_PRECISION_INPUT)))

def find_config_error(err: BaseException) -> ConfigError | None:
    """The :class:`ConfigError` behind ``err``, if any.

    jsonargparse re-raises errors from class constructors inside nested (sub)class arguments as a long
    multi-line ``ValueError`` chained ``from`` the original one; the original holds the one-line message.
    """
    return find_error(err, ConfigError)

def find_error(err: BaseException, kind: type[E]) -> E | None:
    """The exception of type ``kind`` that is ``err`` or behind it (its cause or context, recursively), if any."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


#: How torch says an allocation failed: the CPU allocator, CUDA's caching allocator, or Python itself.
_NO_MEMORY = re.compile(r"can't allocate memory|CUDA out of memory|out of memory", re.IGNORECASE)


def out_of_memory_message(err: BaseException) -> str | None:
    """One line for a build of the model or the data that ran out of memory (a size option far too large), or
    ``None`` when ``err`` is something else. jsonargparse re-raises a constructor's error as a union error of many
    lines, with the allocator's message inside its text, so the text is searched as well as the chain."""
    texts = []
    current: BaseException | None = err
    seen: set[int] = set()
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        texts.append(str(current))
        if isinstance(current, MemoryError):
            texts.append("out of memory")
        current = current.__cause__ or current.__context__
    text = " ".join(texts)
    if not _NO_MEMORY.search(text):
        return None
    wanted = re.search(r"tried to allocate (\d+) bytes", text)
    size = f" ({gib(int(wanted.group(1)))} in one tensor)" if wanted else ""
    return (f"building the model and data ran out of memory{size}: {TOO_LARGE}; check the sizes (widths, points, "
            "lengths) that python -m lit_icl fit --config ... --print_config shows")


#: Lines of a jsonargparse error that only describe the union machinery, not the user's mistake.
_PARSER_NOISE = re.compile(
    r"^(- )?(Does not validate against any of the Union subtypes|Subtypes: |Errors:|Expected a <class 'NoneType'>"
    r"|Given value type: |Given value: )"
)


def config_paths(args: Sequence[Any]) -> list[str]:
    """The ``--config`` files of a command line, in order (``--config F`` and ``--config=F``)."""
    paths: list[str] = []
    for i, arg in enumerate(args):
        if not isinstance(arg, str):
            continue
        if arg == "--config" and i + 1 < len(args) and isinstance(args[i + 1], str):
            paths.append(args[i + 1])
        elif arg.startswith("--config="):
            paths.append(arg.split("=", 1)[1])
    return paths


#: How jsonargparse names the base classes when an option comes before any ``class_path`` has chosen a class.
_NO_CLASS = re.compile(r"is not accepted \(in lightning\.(?:pytorch\.)?(?:LightningModule|LightningDataModule)\)$")


def overlay_hint(message: str, args: Sequence[Any]) -> str:
    """``message`` and what to do, when it says an option came before any model or data class was chosen.

    That happens when an overlay (``configs/<paper>/<experiment>/<variant>.yaml``, which holds only what it changes)
    is given without its base, or before it: the overlay's options reach LightningModule itself.
    """
    if not _NO_CLASS.search(message):
        return message
    configs = config_paths(args)
    for i, raw in enumerate(configs):
        base = Path(raw).parent.with_suffix(".yaml")
        if base.is_file() and Path(raw).is_file():
            later = any(Path(c).resolve() == base.resolve() for c in configs[i + 1:])
            return (f"{message}: {raw} is an overlay, given {'before' if later else 'without'} its base; give the base "
                    f"first: --config {base} --config {raw}")
    return (f"{message}: no --config file chose the model and data classes before it; start with an experiment's "
            f"base config (configs/<paper>/<experiment>.yaml), then its overlays")


#: The options LightningCLI gives a subcommand other than ``fit``, which a run's saved ``config.yaml`` then holds.
_SUBCOMMAND_ONLY = {"verbose": "test or validate", "return_predictions": "predict"}
_NOT_ACCEPTED = re.compile(r"Subcommand '(\w+)' does not accept option '(\w+)'")


def saved_config_hint(message: str, args: Sequence[Any]) -> str:
    """``message`` and what to do, when it refuses an option that a ``test``, ``validate`` or ``predict`` run wrote
    into the ``config.yaml`` of its folder, and that ``--config`` file was given to another subcommand (``fit
    --config runs/<name>/version_1/config.yaml`` of a test's folder). The fix names the config of the fit that
    wrote the tested checkpoint, which the saved file's ``ckpt_path`` points to."""
    match = _NOT_ACCEPTED.search(message)
    if match is None or match.group(2) not in _SUBCOMMAND_ONLY:
        return message
    import yaml

    sub, option = match.groups()
    for raw in config_paths(args):
        try:
            saved = yaml.safe_load(Path(raw).read_text())
        except (OSError, yaml.YAMLError):
            continue
        if not isinstance(saved, dict) or option not in saved:
            continue
        ckpt = saved.get("ckpt_path")
        fit_config = Path(ckpt).parent.parent / "config.yaml" if isinstance(ckpt, str) else None
        fix = (f"give {sub} the config of the fit that wrote its checkpoint, --config {fit_config}"
               if fit_config is not None and fit_config.is_file() else f"remove the line '{option}: ...' from it")
        return f"{message}: {raw} was saved by a {_SUBCOMMAND_ONLY[option]} run, whose options {sub} does not take; {fix}"
    return message


def one_line_parser_error(message: str) -> str:
    """Condense a (nested, multi-line) jsonargparse error into ``<option path>: <innermost problem>``.

    jsonargparse reports a bad value deep inside ``model.init_args.net.init_args...`` as an indented tree of
    union alternatives; the user needs the path of keys and the innermost message (e.g. "Expected a
    typing.Literal['rbf', 'linear']. Got value: poly"), plus the class whose option it was.
    """
    raw_lines = message.splitlines()
    lines = [ln.strip() for ln in raw_lines]
    keys: list[str] = []
    classes: list[str] = []
    problems: list[str] = []
    given: dict[int, str] = {}  # problem index -> the value reported right after it
    # Each "Problem with given class_path" line opens a block holding the problems nested under it (by indentation):
    # (indent, class, indices into problems). A union reports its other alternatives after the class the user named
    # ("Expected a <class 'bool'>", "does not correspond to a subclass of ReduceLROnPlateau"), and the last problem
    # then says nothing about that class: the problem shown is the last of the deepest block (the class nested
    # innermost, e.g. a net inside the model), the first such block among alternatives of equal depth.
    blocks: list[tuple[int, str, list[int]]] = []
    open_blocks: list[tuple[int, str, list[int]]] = []
    for raw, ln in zip(raw_lines, lines):
        indent = len(raw) - len(raw.lstrip())
        if ln:
            open_blocks = [b for b in open_blocks if b[0] < indent]  # blocks this line is no longer inside
        value = re.fullmatch(r"Given value: (.*)", ln)
        if value and problems and len(problems) - 1 not in given:
            given[len(problems) - 1] = value.group(1)
        if not ln or _PARSER_NOISE.match(ln):
            continue
        key = re.fullmatch(r'Parser key "([^"]+)":(.*)', ln)
        cls = re.fullmatch(r"- Problem with given class_path '([^']+)':", ln)
        if key:
            keys.append(key.group(1))
            found = key.group(2).strip()  # the whole problem on one line, e.g. a --config file that does not exist
        elif cls:
            classes.append(cls.group(1))
            block = (indent, cls.group(1), [])
            blocks.append(block)
            open_blocks.append(block)
            continue
        else:
            found = ln.removeprefix("- ")
        if found:
            problems.append(found)
            if open_blocks:
                open_blocks[-1][2].append(len(problems) - 1)
    if not problems:
        return " ".join(ln for ln in lines if ln)
    named = [b for b in blocks if b[2]]
    block = max(named, key=lambda b: b[0]) if named else None  # max keeps the first of equal depth
    at = block[2][-1] if block else len(problems) - 1
    about = block[1] if block else (classes[-1] if classes else None)  # the class the problem is about
    problem = problems[at]
    if problem.startswith("Expected a") and "Got value" not in problem and at in given:
        problem += f". Got value: {given[at]}"
    non_finite = re.fullmatch(r"Expected a <class 'float'>(?: \| None)?\. Got value: ([+-]?(?:nan|inf|infinity))", problem,
                              re.IGNORECASE)
    if non_finite:  # jsonargparse refuses nan/inf as "not a float", which they are; say what is wrong
        problem = f"{non_finite.group(1)} is not a finite number; give a finite value"
    if keys == ["trainer.precision"] and "Got value" in problem:
        problem = f"{problem.rsplit('Got value: ', 1)[1]} is not a precision; use one of {', '.join(precisions())}"
    # A class's options sit under its init_args; a dataclass's fields (CoQE's noise schedule) directly under it.
    path = keys[0] if keys else ""
    for i, key in enumerate(keys[1:]):
        grouped = i < len(classes) and dataclasses.is_dataclass(import_class(classes[i]))
        path += f"{'.' if grouped else '.init_args.'}{key}"
    where = f" (in {about})" if about and about.rsplit(".", 1)[-1] not in problem else ""
    return f"{'--' + path + ': ' if path else ''}{problem}{where}{_nested_null_hint(path, problem)}"


def _nested_null_hint(path: str, problem: str) -> str:
    """The way round a jsonargparse limit: ``null`` given on the command line to an option two classes deep
    (``--model.init_args.net.init_args.resnet_channels null``) reaches the check as the text "None" and is refused,
    while the same ``null`` given through the enclosing class's ``init_args`` (or in a YAML file) is accepted."""
    if not problem.endswith("Got value: None") or path.count(".init_args.") < 2:
        return ""
    parent, leaf = path.rsplit(".init_args.", 1)
    return (f"; a null this deep is lost on the command line, so give it through the class above it: "
            f"--{parent} '{{\"init_args\": {{\"{leaf}\": null}}}}' (or in a --config file)")
