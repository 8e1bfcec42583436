"""core.compat: an old module name imports the module that replaced it (configs and checkpoints keep loading)."""

from __future__ import annotations

import importlib
import pickle
import sys

from lit_icl.core.compat import alias_modules


def test_old_name_imports_the_new_module_for_import_from_and_pickle(monkeypatch) -> None:
    monkeypatch.delitem(sys.modules, "lit_icl.core.old_results_name", raising=False)
    alias_modules({"lit_icl.core.old_results_name": "lit_icl.core.results"})
    new = importlib.import_module("lit_icl.core.results")
    assert importlib.import_module("lit_icl.core.old_results_name") is new
    from lit_icl.core import old_results_name  # type: ignore[attr-defined]

    assert old_results_name is new
    # A pickle that names the old module (a checkpoint written before a move) loads the new module's object.
    blob = pickle.dumps(new.result_row, protocol=0).replace(  # protocol 0: names as plain text lines
        b"lit_icl.core.results", b"lit_icl.core.old_results_name")
    assert pickle.loads(blob) is new.result_row
    alias_modules({"lit_icl.core.old_results_name": "lit_icl.core.results"})  # idempotent
    assert sys.modules["lit_icl.core.old_results_name"] is new
    monkeypatch.delitem(sys.modules, "lit_icl.core.old_results_name")
    monkeypatch.delattr(sys.modules["lit_icl.core"], "old_results_name")
