"""Every shipped config, for every paper: each base alone and each overlay on its base parses with
``--print_config``, resolves every class path, names classes by the papers' public names, carries no logger block
but a run name, says in its header how to run it, and gets a run folder of its own.

Layout (docs/development.md, "Adding an experiment"): ``configs/<paper>/<experiment>.yaml`` is a complete base;
``configs/<paper>/<experiment>/<variant>.yaml`` holds only what a variant changes and is stacked after its base.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import io
from pathlib import Path
from typing import Any

import pytest
import yaml

from lit_icl.cli import DEFAULT_RUN_NAME, main, run_name

ROOT = Path(__file__).parents[1]
BASES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "configs").glob("*/*.yaml"))
OVERLAYS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "configs").glob("*/*/*.yaml"))
#: Every combination a user runs: a base alone, each overlay on its base, and the documented two-overlay stacks.
COMBINATIONS: list[tuple[str, ...]] = [
    *((base,) for base in BASES),
    *((str(Path(o).parent) + ".yaml", o) for o in OVERLAYS),
    ("configs/coqe/omniglot.yaml", "configs/coqe/omniglot/cpu.yaml", "configs/coqe/omniglot/transformer.yaml"),
    ("configs/coqe/regression.yaml", "configs/coqe/regression/cpu.yaml", "configs/coqe/regression/transformer.yaml"),
    ("configs/coqe/regression.yaml", "configs/coqe/regression/cpu.yaml", "configs/coqe/regression/transformer.yaml",
     "configs/coqe/regression/curriculum.yaml"),
]


def print_config(files: tuple[str, ...]) -> dict[str, Any]:
    """The merged config ``python -m lit_icl fit --config <files...> --print_config`` prints, parsed (a fresh copy of
    the one printout per combination: several tests read each, and parsing all of them takes most of a minute)."""
    return copy.deepcopy(_printed_config(tuple(files)))


@functools.cache
def _printed_config(files: tuple[str, ...]) -> dict[str, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as info:
        main(["fit", *(arg for f in files for arg in ("--config", f)), "--print_config"])
    assert info.value.code in (0, None), f"--print_config exited with {info.value.code}"
    return yaml.safe_load(out.getvalue())


def class_paths(node: Any) -> list[str]:
    """Every ``class_path`` value in a parsed config, depth first."""
    if isinstance(node, dict):
        found = [node["class_path"]] if isinstance(node.get("class_path"), str) else []
        return found + [p for v in node.values() for p in class_paths(v)]
    if isinstance(node, list):
        return [p for v in node for p in class_paths(v)]
    return []


def effective_run_name(files: tuple[str, ...], merged: dict[str, Any]) -> str:
    """The run folder's name: the one a config gives, else the one the CLI derives from the config files."""
    name = merged["trainer"]["logger"]["init_args"]["name"]
    return run_name(list(files)) if name == DEFAULT_RUN_NAME else name


def combo_id(files: tuple[str, ...]) -> str:
    return "+".join(f.removeprefix("configs/").removesuffix(".yaml") for f in files)


def test_every_paper_has_its_folder_and_no_flat_configs_remain() -> None:
    assert {Path(b).parts[1] for b in BASES} == {"coqe", "i2cl", "icssl", "mmca"}
    flat = sorted(p.name for p in (ROOT / "configs").glob("*.yaml"))
    assert flat == ["coqe_omniglot.yaml"], "only the main command's config sits at the top (it loads its base)"
    main = ROOT / "configs/coqe_omniglot.yaml"
    # A plain file (a link does not survive every checkout or archive) whose one value is its base, so the values
    # have one home; the main command then runs exactly the base config, under its own run name.
    assert not main.is_symlink() and yaml.safe_load(main.read_text()) == {"config": "coqe/omniglot.yaml"}
    assert print_config(("configs/coqe_omniglot.yaml",)) == print_config(("configs/coqe/omniglot.yaml",))
    assert effective_run_name(("configs/coqe_omniglot.yaml",), print_config(("configs/coqe_omniglot.yaml",))) \
        == "coqe_omniglot"
    for overlay in OVERLAYS:
        assert (ROOT / (str(Path(overlay).parent) + ".yaml")).is_file(), f"{overlay} has no base"


@pytest.mark.parametrize("files", COMBINATIONS, ids=combo_id)
def test_config_parses_and_every_class_path_resolves(files: tuple[str, ...]) -> None:
    merged = print_config(files)
    paths = class_paths(merged)
    assert {"model", "data"} <= merged.keys() and len(paths) >= 3
    for path in paths:
        module, _, name = path.rpartition(".")
        assert callable(getattr(importlib.import_module(module), name)), path


def test_every_combination_has_a_run_folder_of_its_own() -> None:
    names = [effective_run_name(files, print_config(files)) for files in COMBINATIONS]
    repeated = sorted({n for n in names if names.count(n) > 1})
    assert not repeated, f"run names used by more than one config combination: {repeated}"


@pytest.mark.parametrize("path", BASES + OVERLAYS, ids=lambda p: p.removeprefix("configs/"))
def test_config_file_names_public_classes_no_logger_block_and_its_command(path: str) -> None:
    text = (ROOT / path).read_text()
    raw = yaml.safe_load(text) or {}
    for class_path in class_paths(raw):
        package, _, name = class_path.rpartition(".")
        if package.startswith("lightning."):  # Lightning's own callbacks
            continue
        # lit_icl.<package>.<Name>: a name the package exports, not a file inside it, so files can move.
        assert package.count(".") == 1 and package.startswith("lit_icl."), class_path
        assert name in importlib.import_module(package).__all__, class_path
    logger = (raw.get("trainer") or {}).get("logger")
    assert logger is None or (set(logger) == {"init_args"} and set(logger["init_args"]) == {"name"}), (
        "the CLI provides the TensorBoard logger; a config may only name the run"
    )
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    assert text.startswith("# ") and f"--config {path}" in header, "the header gives the command that runs it"


@pytest.mark.parametrize("path", BASES + OVERLAYS, ids=lambda p: p.removeprefix("configs/"))
def test_checkpoint_callbacks_survive_a_moved_run_folder(path: str) -> None:
    """A config's own checkpoint callbacks are ``RunCheckpoint``: Lightning's ModelCheckpoint forgets its best score
    and files when a run folder is moved and resumed, and then keeps a second best file
    (tests/icssl/test_cli.py shows the moved run)."""
    raw = yaml.safe_load((ROOT / path).read_text()) or {}
    assert "lightning.pytorch.callbacks.ModelCheckpoint" not in class_paths(raw)


@pytest.mark.parametrize("path", BASES + OVERLAYS, ids=lambda p: p.removeprefix("configs/"))
def test_only_cpu_overlays_pin_the_cpu(path: str) -> None:
    """A researcher on a GPU machine runs a shipped config on the GPU (with CUDA graphs, by ``--compile.mode auto``);
    only an overlay named ``cpu.yaml`` (a CPU-scale run) pins the CPU."""
    if path in BASES:
        assert print_config((path,))["trainer"]["accelerator"] == "auto"
    elif Path(path).stem != "cpu":
        raw = yaml.safe_load((ROOT / path).read_text()) or {}
        assert "accelerator" not in (raw.get("trainer") or {}), f"{path} pins trainer.accelerator"
