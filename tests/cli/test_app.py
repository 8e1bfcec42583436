"""lit_icl.cli.app: what ``--help`` calls the program."""

from __future__ import annotations

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
