"""Shared assertion for bad-input tables: every paper's test file imports :func:`assert_rejected`.

A paper adds its own table of rows ``(config, extra CLI args, expected message substring)`` in its own test
file (``tests/icssl/test_bad_input.py``, ``tests/coqe/omniglot/test_cli.py`` ...; the paper-agnostic rows are in
``tests/test_cli.py`` and ``tests/test_bad_input_cli.py``) and runs each row through
``assert_rejected``. Rows must fail while parsing or constructing (no training), so a table stays fast.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lit_icl.cli import main

ERROR_PREFIX = "lit_icl: error:"


def assert_rejected(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], needle: str,
                    *, runs_exist: bool = False, status: int = 2) -> str:
    """``lit_icl.cli.main(args)`` exits with status 2 (or ``status``) and prints only one ``lit_icl: error:`` line containing ``needle``.

    ``args`` is the full command line after ``python -m lit_icl`` (subcommand first) and must log under
    ``tmp_path / "runs"``; nothing may be written anywhere under ``tmp_path`` (inputs a test put there before
    the call stay as they were; with ``runs_exist`` a ``runs/`` folder from an earlier run may be there too).
    Returns the error line.
    """
    before = _tree(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == status, f"exit status {info.value.code}, expected {status}"
    captured = capsys.readouterr()
    err = captured.err
    lines = [ln for ln in err.splitlines() if ln.startswith(ERROR_PREFIX)]
    assert len(lines) == 1, f"expected exactly one '{ERROR_PREFIX}' line, got:\n{err}"
    # Alone: no "Seed set to 0", no GPU/TPU lines or tips before it, nothing on stdout.
    assert err.splitlines() == lines and not captured.out, f"the refusal was not alone:\n{captured.out}{err}"
    assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    if not runs_exist:
        assert not (tmp_path / "runs").exists(), "nothing may be written before the input is checked"
    assert "Traceback" not in err, f"a traceback was printed:\n{err}"
    created = sorted(set(_tree(tmp_path)) - set(before))
    assert not created, f"files or folders were created before the input was refused: {created}"
    return lines[0]


def _tree(root: Path) -> list[str]:
    """Every path under ``root`` (files and folders), relative to it."""
    return [str(p.relative_to(root)) for p in root.rglob("*")] if root.exists() else []
