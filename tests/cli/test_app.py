"""lit_icl.cli.app: what ``--help`` calls the program."""

from __future__ import annotations

import re

import pytest

from lit_icl.cli import main


@pytest.mark.parametrize(("argv0", "prog"), [("/site/lit_icl/__main__.py", "python -m lit_icl"),
                                             ("/venv/bin/lit-icl", "lit-icl")])
def test_help_names_the_program_as_it_was_started(monkeypatch, capsys, argv0: str, prog: str) -> None:
    """``python -m lit_icl fit --help`` used to print ``usage: __main__.py [options] fit``, a name no one can run."""
    monkeypatch.setattr("sys.argv", [argv0, "fit", "--help"])
    with pytest.raises(SystemExit) as info:
        main(["fit", "--help"])
    assert info.value.code in (0, None)
    assert capsys.readouterr().out.startswith(f"usage: {prog} [options] fit ")


def help_text(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """What ``python -m lit_icl <argv...>`` prints (``argv`` ends in ``--help``)."""
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    assert info.value.code in (0, None)
    return capsys.readouterr().out


def option_help(text: str, option: str) -> str:
    """The help of one option in a ``--help`` text: from its line to the next option's, on one line."""
    block = re.search(rf"^  {re.escape(option)}\b.*?(?=^  -)", text, flags=re.MULTILINE | re.DOTALL)
    assert block is not None, f"{option} is not in the help"
    return " ".join(block.group(0).split())


@pytest.mark.parametrize("subcommand", ["fit", "test", "validate", "predict"])
def test_ckpt_path_help_says_what_this_cli_does_with_it(capsys, subcommand: str) -> None:
    """Lightning's help for ``--ckpt_path`` described its ``last`` as the running trainer's previous fit and offered
    its model registry; this CLI resolves ``last`` and ``best`` against the config's earlier runs
    (``resolve_ckpt_path``) and downloads nothing."""
    text = option_help(help_text(capsys, subcommand, "--help"), "--ckpt_path")
    newest_run = "the newest run of this config" if subcommand == "fit" else "this config's newest run"
    assert newest_run in text
    assert "best" in text and ".ckpt file" in text
    assert "registry" not in text


def test_help_lists_the_early_stopping_options_together(capsys) -> None:
    """``--early_stopping.wait_for_score`` was listed after the ``--compile.*`` options, apart from the rule it sets."""
    options = re.findall(r"^  (--(?:early_stopping|compile)\.\w+)", help_text(capsys, "fit", "--help"), re.MULTILINE)
    assert options == [
        "--early_stopping.patience", "--early_stopping.monitor", "--early_stopping.mode", "--early_stopping.min_delta",
        "--early_stopping.wait_for_score", "--compile.mode", "--compile.backend", "--compile.fullgraph",
    ]


def test_top_level_help_says_what_the_program_runs(capsys) -> None:
    text = help_text(capsys, "--help")
    assert "Lightning Trainer command line tool" not in text  # Lightning's default, which names no experiment
    assert "python -m lit_icl fit --config configs/" in " ".join(text.split())
