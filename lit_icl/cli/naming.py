"""Run folders named after their config files (``runs/<base>_<overlay>/version_N``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

#: The logger name the CLI sets; a run that keeps it is named after its config files.
DEFAULT_RUN_NAME = "lit_icl"


def run_name(config_paths: list[Any]) -> str:
    """The run folder's name for a base config and its overlays, e.g. ``coqe_omniglot_cpu_transformer``.

    The base is named by its path under ``configs/`` (``configs/coqe/omniglot.yaml`` -> ``coqe_omniglot``, a
    file elsewhere by its stem); each overlay adds its stem (``configs/coqe/omniglot/cpu.yaml`` -> ``_cpu``).
    """
    parts: list[str] = []
    named: list[Path] = []
    for path in map(_as_given, config_paths):
        path = _alias_target(path) or path
        if not named or named[-1] != path:  # the CLI lists an alias's target before the alias itself
            named.append(path)
    for i, path in enumerate(named):
        if i == 0 and "configs" in path.parts[:-1]:
            under = path.parts[len(path.parts) - path.parts[::-1].index("configs") :]
            parts.append("_".join([*under[:-1], path.stem]))
        else:
            parts.append(path.stem)
    return "_".join(parts) or DEFAULT_RUN_NAME

def _as_given(raw: Any) -> Path:
    """A config file's path as the command line would give it: a file included by another (``config:
    coqe/omniglot.yaml`` in ``configs/coqe_omniglot.yaml``) is recorded relative to the including file, and is
    named here from the working folder (``configs/coqe/omniglot.yaml``)."""
    relative = Path(str(getattr(raw, "relative", raw)))
    absolute = getattr(raw, "absolute", None)
    if absolute is None or relative.is_absolute() or relative.exists():
        return relative
    try:
        return Path(absolute).relative_to(Path.cwd())
    except ValueError:
        return relative


def _alias_target(path: Path) -> Path | None:
    """The file that ``path`` stands for when it holds nothing but ``config: <another file>``
    (``configs/coqe_omniglot.yaml``), which names the run as that file does; else ``None``."""
    import yaml

    try:
        content = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    if not (isinstance(content, dict) and set(content) == {"config"} and isinstance(content["config"], str)):
        return None
    target = path.parent / content["config"]
    return Path(os.path.normpath(target))


def name_run_from_configs(config: Any) -> None:
    """Name the TensorBoard run after the ``--config`` files, unless a config or the command line names it.

    Configs therefore need no logger block, and a base with overlays gets a folder of its own
    (``runs/coqe_omniglot_cpu/`` for ``--config configs/coqe/omniglot.yaml --config configs/coqe/omniglot/cpu.yaml``).
    With several loggers (``--trainer.logger+=lightning.pytorch.loggers.CSVLogger``), each that still has the CLI's
    name is named so; without that, every experiment that added a logger shared ``runs/lit_icl/``, and
    ``--ckpt_path last`` resumed whichever ran last.
    """
    logger = config.get("trainer", {}).get("logger") if hasattr(config, "get") else None
    paths = config.get("config") or []
    loggers = logger if isinstance(logger, list) else [logger]
    for one in loggers:
        init_args = getattr(one, "init_args", None) if one is not None else None
        if init_args is not None and paths and getattr(init_args, "name", None) == DEFAULT_RUN_NAME:
            init_args.name = run_name(list(paths))
