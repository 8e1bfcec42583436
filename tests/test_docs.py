"""The documentation holds together: every relative link in the README, data/README.md, docs/ and
experiments/results/ points at a file that exists, and every ``#anchor`` into a Markdown file at one of its
headings; every dotted code name they cite (``coqe.omniglot.nets.CoQEClassifier``) exists; every
``python -m lit_icl <subcommand> ...`` command the pages give parses, and every ``python experiments|benchmarks/...``
command names a script that exists and options that script defines; the README stays short and keeps the set-up
commands CI runs."""

from __future__ import annotations

import contextlib
import importlib
import io
import re
import shlex
from pathlib import Path

import pytest

from lit_icl.cli import main

ROOT = Path(__file__).parents[1]
PAGES = sorted(
    [ROOT / "README.md", ROOT / "data/README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("experiments/results/*.md")]
)
CODE_BLOCK = re.compile(r"```.*?```", flags=re.DOTALL)
LINK = re.compile(r"\]\(([^)\s]+)\)")
# A code name the docs cite, with or without the package: `coqe.regression.nets.CoQERegressor`, `lit_icl.core.figures`.
PACKAGES = ("callbacks", "cli", "coqe", "core", "i2cl", "icssl", "metrics", "mmca", "report")
CODE_NAME = re.compile(rf"`(?:lit_icl\.)?((?:{'|'.join(PACKAGES)})(?:\.\w+)+)`")


def heading_anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+ (.*)$", CODE_BLOCK.sub("", page.read_text()), flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(CODE_BLOCK.sub("", page.read_text())):
        if re.match(r"[a-z]+://|mailto:", target):
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page.resolve()
        if not resolved.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in heading_anchors(resolved):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


def resolve(dotted: str) -> bool:
    """Whether ``lit_icl.<dotted>`` names a module or an attribute reached from the longest importable module."""
    parts = f"lit_icl.{dotted}".split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cited_code_name_exists(page: Path) -> None:
    missing = sorted({name for name in CODE_NAME.findall(page.read_text()) if not resolve(name)})
    assert not missing, f"{page.relative_to(ROOT)} cites code that does not exist: {missing}"


def test_readme_is_short_and_keeps_the_set_up_commands() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    assert "## Set up" in text
    assert "pip install -e '.[test]' && python -m pytest" in text  # the command .ci/run executes
    assert "python -m lit_icl fit --config configs/coqe_omniglot.yaml" in text  # the main job, offline default


#: The pages a user copies commands from (the results pages record commands that were run, not instructions).
COMMAND_PAGES = sorted([ROOT / "README.md", ROOT / "data/README.md", *ROOT.glob("docs/*.md")])
FENCED_BLOCK = re.compile(r"```(\w*)\n(.*?)```", flags=re.DOTALL)  # (language, text)
INLINE_CODE = re.compile(r"`([^`]+)`")
SHELL_LOOP = re.compile(r"^\s*for (\w+) in ([^;]+); do", flags=re.MULTILINE)
SHELL_ASSIGNMENT = re.compile(r"^\s*(\w+)=\"([^\"]*)\"\s*$", flags=re.MULTILINE)
COMMAND_START = re.compile(r"python (?:-m lit_icl |(?:experiments|benchmarks)/\w+\.py)")
#: What the pages write for a value the user fills in, and a value that parses in its place.
PLACEHOLDERS = {"<run>": "runs/tiny/version_0", "<ckpt>": "runs/tiny/version_0/checkpoints/last.ckpt"}
#: A fit's own ``config.yaml`` that a command passes as ``--config``, and the shipped config it is the resolved form of.
RUN_CONFIGS = {"runs/icssl_manifolds/version_0/config.yaml": "configs/icssl/manifolds.yaml"}


def documented_commands() -> dict[str, list[str]]:
    """Every ``python -m lit_icl ...`` / ``python experiments|benchmarks/<script>.py ...`` command the pages give,
    with the pages that give it: the lines of their shell blocks (continuation lines joined, ``# comments`` dropped,
    each value of a ``for`` loop's variable and a ``NAME="..."`` assignment's value substituted) and their inline
    code spans that are a whole command. A command with ``...`` in it elides arguments and is left out."""
    found: dict[str, list[str]] = {}
    for page in COMMAND_PAGES:
        text = page.read_text()
        lines: list[str] = []
        for block in (body for language, body in FENCED_BLOCK.findall(text) if language in ("", "bash", "sh")):
            loops = {var: values.split() for var, values in SHELL_LOOP.findall(block)}
            loops |= {var: [value] for var, value in SHELL_ASSIGNMENT.findall(block)}
            for line in re.sub(r"\\\n\s*", " ", block).splitlines():
                start = COMMAND_START.search(line)
                if start is None:
                    continue
                line = " ".join(re.split(r"\s#", line[start.start():])[0].split())
                expanded = [line]
                for var, values in loops.items():
                    if f"${var}" in line:
                        expanded = [c.replace(f"${var}", value) for c in expanded for value in values]
                lines += expanded
        prose = CODE_BLOCK.sub("", text).replace("\n", " ")
        lines += [" ".join(span.split()) for span in INLINE_CODE.findall(prose) if COMMAND_START.match(span)]
        for line in lines:
            if "..." not in line:
                found.setdefault(line, []).append(str(page.relative_to(ROOT)))
    return found


COMMANDS = documented_commands()
CLI_COMMANDS = sorted(c for c in COMMANDS if c.startswith("python -m lit_icl ") and "--help" not in c)
SCRIPT_COMMANDS = sorted(c for c in COMMANDS if not c.startswith("python -m lit_icl "))


def test_the_pages_give_commands_of_every_kind() -> None:
    """The extraction finds what the pages hold, so the tests below cannot pass by finding nothing."""
    assert len(CLI_COMMANDS) >= 30 and len(SCRIPT_COMMANDS) >= 30
    assert any(" test " in c for c in CLI_COMMANDS) and any(" predict " in c for c in CLI_COMMANDS)
    assert "python -m lit_icl fit --config configs/i2cl/offline.yaml --config configs/i2cl/offline/tweets.yaml" in (
        CLI_COMMANDS), "a for loop's values are substituted"


@pytest.mark.parametrize("command", CLI_COMMANDS)
def test_every_documented_cli_command_parses(command: str) -> None:
    """The command, as a page gives it, parses (``--print_config``: every config file read, every option and value
    known to the CLI, the configs' classes and their arguments), so a renamed option or config shows up here."""
    filled = command
    for placeholder, value in PLACEHOLDERS.items():
        filled = filled.replace(placeholder, value)
    argv = shlex.split(filled)[3:]  # after "python -m lit_icl"
    for i, arg in enumerate(argv[:-1]):
        if arg == "--config" and argv[i + 1].startswith("runs/"):
            assert argv[i + 1] in RUN_CONFIGS, f"add {argv[i + 1]} to RUN_CONFIGS with the config it comes from"
            argv[i + 1] = RUN_CONFIGS[argv[i + 1]]
    if "--print_config" not in argv:
        argv.append("--print_config")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code in (0, None), f"{COMMANDS[command]}: {command}\n{err.getvalue().strip()}"


def script_sources(script: Path) -> str:
    """A script's source with that of the modules of its own folder it imports (a driver's options are partly
    ``experiments/runner.py``'s and ``experiments/cluster.py``'s, a benchmark's partly ``bench_options.py``'s)."""
    sources, todo, seen = [], [script], set()
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        text = path.read_text()
        sources.append(text)
        todo += [script.parent / f"{name}.py" for name in re.findall(r"^\s*(?:from|import) (\w+)", text, re.MULTILINE)]
    return "\n".join(sources)


@pytest.mark.parametrize("command", SCRIPT_COMMANDS)
def test_every_documented_script_exists_with_its_options(command: str) -> None:
    """The script a page names exists, and each ``--option`` the command passes is one its parser defines (its name
    as a string literal in the script's sources), so a renamed driver or option shows up here."""
    words = shlex.split(command.replace("|", " "))
    script = ROOT / words[1]
    assert script.is_file(), f"{COMMANDS[command]}: {command}: no script {words[1]}"
    source = script_sources(script)
    unknown = sorted({w for w in words[2:] if re.fullmatch(r"--[a-z][\w-]*", w) and f'"{w}"' not in source})
    assert not unknown, f"{COMMANDS[command]}: {command}: {words[1]} defines no option {unknown}"


#: The ``python -m lit_icl.<module>`` entry points the pages name (the CLI itself, ``python -m lit_icl``, apart).
MODULE_ENTRY_POINTS = sorted({
    name for page in COMMAND_PAGES for name in re.findall(r"python -m (lit_icl\.[\w.]+)", page.read_text())
})


def test_the_pages_name_the_module_entry_points() -> None:
    assert {"lit_icl.report", "lit_icl.mmca.avmnist.build", "lit_icl.coqe.omniglot.glyphs"} <= set(MODULE_ENTRY_POINTS)


@pytest.mark.parametrize("module", MODULE_ENTRY_POINTS)
def test_each_documented_entry_point_names_itself_in_its_help(capsys, module: str) -> None:
    """``python -m lit_icl.report --help`` printed ``usage: report.py ...``: a name the pages never give and no one can
    run from the repository root. Each entry point's usage line names the command the pages give."""
    with pytest.raises(SystemExit) as info:
        importlib.import_module(module).main(["--help"])
    assert info.value.code in (0, None)
    assert capsys.readouterr().out.startswith(f"usage: python -m {module} ")
