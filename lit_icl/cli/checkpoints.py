"""``--ckpt_path``: ``last`` and ``best`` resolved against a config's earlier runs, and a checkpoint refused
before anything is written when it is not one, was written by another experiment, or holds model settings that
would silently replace the config's."""

from __future__ import annotations

import contextlib
import importlib
import os
import re
from pathlib import Path
from typing import Any

import torch

from lit_icl.core.checkpoint_io import complete_checkpoints, is_cut_short
from lit_icl.core.errors import ConfigError
from lit_icl.core.legacy import current_class_path
from lit_icl.core.resume import check_resumed_ranks as check_ranks

#: ``ckpt_path`` values that Lightning resolves itself (``last`` and ``best`` are resolved by :func:`resolve_ckpt_path`).
SPECIAL_CKPT_PATHS = ("last", "best", "hpc")


def check_ckpt_path(ckpt_path: str | None) -> dict[str, Any] | None:
    """Refuse a ``ckpt_path`` that is neither a special value nor an existing Lightning checkpoint.

    Returns the loaded checkpoint (on the CPU, tensors only) for a file, ``None`` for a special value.
    """
    if ckpt_path is None or ckpt_path in SPECIAL_CKPT_PATHS or str(ckpt_path).startswith("registry"):
        return None
    path = Path(ckpt_path)
    if path.is_dir():
        found = _checkpoints_in(path)
        example = (f"e.g. {quote(found[0])}" if found else
                   "it holds none; a fit writes runs/<name>/version_N/checkpoints/last.ckpt")
        raise ConfigError(f"--ckpt_path {ckpt_path} is a folder, not a checkpoint file; pass a .ckpt file ({example})")
    if not path.is_file():
        raise ConfigError(
            f"--ckpt_path {ckpt_path} does not exist; pass an existing .ckpt file, or 'last' to resume the "
            "newest run of this config"
        )
    try:
        # Lightning reads the checkpoint with weights_only=True as well, so this is the same test it applies.
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any failure means Lightning could not read it either
        if is_cut_short(path) or "PytorchStreamReader failed" in str(err):
            raise ConfigError(damaged_message(ckpt_path, path, err)) from None
        raise ConfigError(
            f"--ckpt_path {ckpt_path} is not a PyTorch checkpoint ({type(err).__name__}); "
            "pass a .ckpt written by `python -m lit_icl fit`"
        ) from None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise ConfigError(
            f"--ckpt_path {ckpt_path} is a torch file but not a Lightning checkpoint (no 'state_dict'); "
            "pass a .ckpt written by `python -m lit_icl fit`"
        )
    return ckpt

def damaged_message(ckpt_path: Any, path: Path, err: BaseException) -> str:
    """The refusal of a checkpoint file that is cut short or damaged (written by an earlier version that a full disk
    or a killed copy interrupted), with the newest complete checkpoint beside it to resume from instead."""
    size = path.stat().st_size
    what = "empty (0 bytes)" if size == 0 else f"damaged or truncated ({size} bytes; torch: {type(err).__name__})"
    others = complete_checkpoints(path.parent, besides=path)
    fix = (f"pass the newest complete checkpoint in its folder, --ckpt_path {quote(others[0])}" if others else
           "its folder holds no other complete checkpoint, so start the run again without --ckpt_path")
    return f"--ckpt_path {ckpt_path} is {what}, probably cut short by a full disk or an interrupted copy; {fix}"

def _checkpoints_in(folder: Path) -> list[Path]:
    """The ``.ckpt`` files under ``folder``, ``last.ckpt`` of the newest run first (what a user most likely means)."""
    found = [p for p in folder.rglob("*.ckpt") if p.is_file()]
    return sorted(found, key=lambda p: (p.name != "last.ckpt", -p.stat().st_mtime))


def import_class(path: Any) -> Any:
    """The object a dotted class path names (an old path of a moved class: where it lives now), or ``None``."""
    path = current_class_path(path)
    if not isinstance(path, str) or "." not in path:
        return None
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None

def _same_class(a: str, b: str) -> bool:
    """Whether two class paths name the same class (an old path of a moved class included)."""
    cls_a, cls_b = import_class(a), import_class(b)
    return cls_a is cls_b if cls_a is not None and cls_b is not None else a == b

def _run_config(ckpt_path: Any) -> Path | None:
    """The ``config.yaml`` of the run that wrote ``<run>/checkpoints/<file>.ckpt``, if it is there."""
    path = Path(ckpt_path).resolve().parent.parent / "config.yaml"
    return path if path.is_file() else None

def check_ckpt_classes(ckpt_path: Any, ckpt: dict[str, Any], config: Any, subcommand: str = "fit") -> None:
    """Refuse a checkpoint that another experiment wrote: its module class (or, to resume a ``fit``, its data
    class) is not the config's.

    LightningCLI records the classes in the checkpoint (``hyper_parameters._class_path``,
    ``datamodule_hyper_parameters._class_path``) and would replace the config's model with the checkpoint's,
    ending in an unrelated error much later (or, worse, running). Paths are compared as the classes they name,
    so a checkpoint written before a module moved (an old path, :mod:`lit_icl.core.legacy`) still loads. ``test`` / ``validate`` /
    ``predict`` of the same module on another data module is a transfer evaluation (IC-SSL's Table 5 tests
    models trained on synthetic manifolds zero-shot on image manifolds) and is allowed; the model settings are
    still checked against the checkpoint's (:func:`check_ckpt_hparams`) and against the data before the run.
    """
    pairs = []
    for what, ckpt_key, config_key in (("module", "hyper_parameters", "model"), ("data", "datamodule_hyper_parameters", "data")):
        saved = (ckpt.get(ckpt_key) or {}).get("_class_path") if isinstance(ckpt.get(ckpt_key), dict) else None
        wanted = getattr(config.get(config_key), "class_path", None) if config.get(config_key) is not None else None
        if saved is None or wanted is None:
            continue
        pairs.append((what, saved, wanted, _same_class(saved, wanted)))
    if all(same for what, *_, same in pairs if what == "module" or subcommand == "fit"):
        return
    written = " with ".join(saved for _, saved, _, _ in pairs)
    built = " with ".join(wanted for _, _, wanted, _ in pairs)
    run_config = _run_config(ckpt_path)
    verb = "resume it" if subcommand == "fit" else f"{subcommand} it"
    fix = f"{verb} with --config {quote(run_config)}" if run_config else "pass the config of the experiment that wrote it"
    raise ConfigError(
        f"--ckpt_path {ckpt_path} was written by another experiment ({written}), but this config builds {built}; "
        f"{fix}, or a checkpoint of this config"
    )

def _differences(saved: Any, wanted: Any, key: str) -> list[tuple[str, Any, Any]]:
    """``(key, saved, wanted)`` for every leaf where a checkpoint's hyper-parameters and the config disagree.

    Only keys present on both sides are compared: a checkpoint of older code lacks today's new options (the
    config's default then applies) and the config spells out defaults the checkpoint may omit. ``class_path``
    values are compared as the classes they name, so old paths of moved classes match.
    """
    if hasattr(wanted, "as_dict"):  # a jsonargparse Namespace
        wanted = wanted.as_dict()
    if isinstance(saved, dict) and isinstance(wanted, dict):
        if "class_path" in saved and "class_path" in wanted and not _same_class(saved["class_path"], wanted["class_path"]):
            return [(f"{key}.class_path", saved["class_path"], wanted["class_path"])]
        found = []
        for name in saved:
            if name in wanted and name != "class_path" and not str(name).startswith("_"):
                found += _differences(saved[name], wanted[name], f"{key}.{name}")
        return found
    if isinstance(saved, (list, tuple)) and isinstance(wanted, (list, tuple)):
        if len(saved) != len(wanted):
            return [(key, saved, wanted)]
        return [d for i, (a, b) in enumerate(zip(saved, wanted)) for d in _differences(a, b, f"{key}[{i}]")]
    if isinstance(saved, float) or isinstance(wanted, float):
        # 3e-4 and 0.0003 are the same setting; a float against a non-number falls through to ==.
        with contextlib.suppress(TypeError, ValueError):
            return [] if float(saved) == float(wanted) else [(key, saved, wanted)]
    return [] if saved == wanted else [(key, saved, wanted)]

def check_ckpt_hparams(ckpt_path: Any, ckpt: dict[str, Any], config: Any) -> None:
    """Refuse a config whose module hyper-parameters disagree with the checkpoint's.

    LightningCLI re-parses the model from the checkpoint's ``hyper_parameters`` (``_parse_ckpt_path``), so a
    value the config or the command line sets (``--model.init_args.net.init_args.width 128`` on a width-64
    checkpoint) would be silently replaced by the checkpoint's; on ``fit --ckpt_path last`` the weights would
    not fit. The error names each disagreement and the config that wrote the checkpoint.
    """
    saved = ckpt.get("hyper_parameters")
    wanted = config.get("model")
    if not isinstance(saved, dict) or wanted is None or not hasattr(wanted, "init_args"):
        return
    found = _differences(saved, wanted.init_args, "model.init_args")
    if not found:
        return
    shown = "; ".join(f"--{key} is {value!r} here but {old!r} in the checkpoint" for key, old, value in found[:3])
    more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
    run_config = _run_config(ckpt_path)
    fix = f"use the config that wrote it (--config {quote(run_config)})" if run_config else "use the config that wrote it"
    raise ConfigError(
        f"--ckpt_path {ckpt_path} was trained with other model settings, which would silently replace the config's: "
        f"{shown}{more}; {fix}, or give the checkpoint's values"
    )

def _recorded_run_config(ckpt_path: Any) -> tuple[dict[str, Any], Path | None]:
    """The ``config.yaml`` of the run that wrote ``<run>/checkpoints/<file>.ckpt`` as a dict, and its path, or
    ``({}, None)`` when the checkpoint is not in such a folder or the file cannot be read. LightningCLI writes there
    what checkpoints do not hold: the seed it used and the ``--optimizer`` / ``--lr_scheduler`` it built."""
    run_config = _run_config(ckpt_path)
    if run_config is None or Path(ckpt_path).resolve().parent.name != "checkpoints":
        return {}, None  # a --checkpoint.dirpath of its own: the folder above it is not known to be the run's
    import yaml

    try:
        recorded = yaml.safe_load(run_config.read_text())
    except (OSError, yaml.YAMLError):
        return {}, None
    return (recorded, run_config) if isinstance(recorded, dict) else ({}, None)


#: The options that build the optimizer and its schedule in place of the module's ``configure_optimizers``.
OPTIMIZER_KEYS = ("optimizer", "lr_scheduler")


def _optimizer_differences(recorded: dict[str, Any], config: Any) -> list[tuple[str, Any, Any]]:
    """``(key, recorded, wanted)`` for each of ``--optimizer`` / ``--lr_scheduler`` that differs from the run's
    ``config.yaml``. Lightning restores the optimizer's and the scheduler's state from the checkpoint, learning
    rate and step size included, so a new value would be ignored (or, for another class, fail at the first step
    on the restored state) while the rewritten ``config.yaml`` says the run used it. A ``config.yaml`` that does
    not record the option (older code) is not checked for it."""
    found = []
    for key in OPTIMIZER_KEYS:
        if key not in recorded:
            continue
        saved, wanted = recorded[key], config.get(key)
        if hasattr(wanted, "as_dict"):  # a jsonargparse Namespace
            wanted = wanted.as_dict()
        if saved is None or wanted is None:  # one side builds its own, the other the module's: name the classes
            names = [v.get("class_path") if isinstance(v, dict) else v for v in (saved, wanted)]
            if names[0] != names[1]:
                found.append((key, names[0], names[1]))
            continue
        found += _differences(saved, wanted, key)
    return found

def check_resume_settings(ckpt_path: Any, ckpt: dict[str, Any], config: Any) -> None:
    """Refuse ``fit --ckpt_path`` with another seed, other data settings or another ``--optimizer`` /
    ``--lr_scheduler`` than the run it resumes.

    Lightning restores the weights, the optimizer and the loops, but builds the data module from the config and
    seeds from ``seed_everything`` as given, so the rest of the run would train on other data (or, where a module
    draws from the global RNG, as avMNIST's dropout does, other noise) while the run's ``config.yaml``, rewritten
    on resume, would say the whole run used them. The data module's recorded arguments
    (``datamodule_hyper_parameters``) are compared as :func:`check_ckpt_hparams` compares the model's, less those
    its class declares free (:func:`lit_icl.core.data.args_free_on_resume`: data location, workers, stand-in
    building, test-only sets); the seed and the optimizer options against the run folder's ``config.yaml``
    (:func:`_optimizer_differences`). A checkpoint of older code
    without data hyper-parameters, or away from its run folder, is not checked for what it lacks. ``test`` and
    ``validate`` are not resumes and may use other data.
    """
    found = []
    recorded, run_config = _recorded_run_config(ckpt_path)
    seed = recorded.get("seed_everything")
    wanted_seed = config.get("seed_everything")
    if wanted_seed is True:  # Lightning seeds PL_GLOBAL_SEED or 0 (no random draw), which config.yaml records
        wanted_seed = int(os.environ.get("PL_GLOBAL_SEED", "0"))
    # True draws a random seed and False seeds nothing: neither is the run's seed (True == 1 would pass ==).
    if seed is not None and (seed != wanted_seed or isinstance(seed, bool) != isinstance(wanted_seed, bool)):
        found.append(("seed_everything", seed, wanted_seed))
    saved = ckpt.get("datamodule_hyper_parameters")
    wanted = config.get("data")
    if isinstance(saved, dict) and wanted is not None and hasattr(wanted, "init_args"):
        from lit_icl.core.data import args_free_on_resume

        free = args_free_on_resume(import_class(getattr(wanted, "class_path", None)))
        init_args = wanted.init_args.as_dict() if hasattr(wanted.init_args, "as_dict") else dict(wanted.init_args or {})
        found += _differences({k: v for k, v in saved.items() if k not in free},
                              {k: v for k, v in init_args.items() if k not in free}, "data.init_args")
    found += _optimizer_differences(recorded, config)
    if not found:
        return

    def recorded_in(key: str) -> str:
        """Where the run's value of ``key`` was read: its config.yaml (the seed, the optimizer) or the checkpoint."""
        in_yaml = key == "seed_everything" or key.split(".")[0] in OPTIMIZER_KEYS
        return "the run's config.yaml" if in_yaml else "the checkpoint"

    shown = "; ".join(f"--{key} is {value!r} here but {old!r} in {recorded_in(key)}" for key, old, value in found[:3])
    more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
    keys = [key for key, *_ in found]
    kinds = [kind for kind, present in (
        ("another seed", "seed_everything" in keys),
        ("other data settings", any(k.startswith("data.") for k in keys)),
        ("another optimizer or learning-rate scheduler", any(k.split(".")[0] in OPTIMIZER_KEYS for k in keys)),
    ) if present]
    what = " and ".join(kinds) if len(kinds) < 3 else f"{kinds[0]}, {kinds[1]} and {kinds[2]}"
    run_config = run_config or _run_config(ckpt_path)
    # The values may come from the config files, not the command line: the run's own config is the sure fix.
    same = f"resume with the run's own config (--config {quote(run_config)}) or " if run_config else "resume "
    raise ConfigError(
        f"--ckpt_path {ckpt_path} was trained with {what}, which a resumed run cannot change (it would go on with "
        f"them while its config.yaml says the whole run did): {shown}{more}; {same}with the checkpoint's values, "
        "or start a new run without --ckpt_path"
    )


def check_resume_length(ckpt_path: Any, ckpt: dict[str, Any], config: Any) -> None:
    """Refuse ``fit --ckpt_path`` with a ``trainer.max_steps`` (or ``max_epochs``) below what the checkpoint has
    already trained. Lightning restores it, trains nothing and exits 0, and the run's ``config.yaml``, rewritten on
    resume, then gives the smaller length for weights trained longer (a later ``test`` records that length as the
    fit's). A length equal to the trained one (resuming a finished run) is a no-op and stays allowed."""
    trainer = config.get("trainer")
    if trainer is None:
        return
    # An epoch's own checkpoint is written before Lightning counts the epoch complete: its 0-based "epoch" is the
    # last epoch trained (all of it, or part of it for a checkpoint written inside the epoch).
    epoch = ckpt.get("epoch")
    reached = {"max_steps": (ckpt.get("global_step"), "step"),
               "max_epochs": (epoch + 1 if isinstance(epoch, int) else None, "epoch")}
    for flag, (done, unit) in reached.items():
        limit = trainer.get(flag)
        if (isinstance(limit, int) and not isinstance(limit, bool) and limit >= 0 and isinstance(done, int)
                and limit < done):
            raise ConfigError(
                f"--ckpt_path {ckpt_path} has reached {unit} {done}, beyond --trainer.{flag} {limit}: the resume "
                f"would train nothing and its config.yaml would say {limit}; give --trainer.{flag} {done} or more "
                "to go on, or `test` the checkpoint"
            )


def check_resumed_data(ckpt_path: Any, ckpt: dict[str, Any], datamodule: Any) -> None:
    """Refuse ``fit --ckpt_path`` when the data module resolves its arguments to other data than the run it
    resumes. Equal arguments (:func:`check_resume_settings`) can still mean other data where a module resolves one
    from what it finds on disk: Omniglot's ``source: auto`` picks Omniglot or the glyphs stand-in by what ``root``
    holds, and ``root`` may move on resume. Such a module records what it resolved in its ``state_dict``, which
    Lightning saves in every checkpoint, and names those keys in ``resolved_on_resume``; each must resolve the same
    now (the rest of a module's state, such as a position, is its own to restore). Checked once the data module is
    built, before anything is built or written; a checkpoint without the record (older code) is not checked.
    """
    keys = getattr(datamodule, "resolved_on_resume", ())
    saved = ckpt.get(type(datamodule).__qualname__) if keys else None
    if not isinstance(saved, dict):
        return
    now = datamodule.state_dict()
    changed = [(key, saved[key], now[key]) for key in keys if key in saved and key in now and now[key] != saved[key]]
    if not changed:
        return
    key, old, new = changed[0]
    folder = getattr(datamodule, "folder", None)
    found = f" (found {folder})" if folder is not None else ""
    raise ConfigError(
        f"--ckpt_path {ckpt_path} was trained with data {key} {old!r}, but this run's data settings resolve it to "
        f"{new!r}{found}, which a resumed run cannot change; resume with --data.init_args.{key} {old} and the "
        "location of that data, or start a new run without --ckpt_path"
    )


def check_resumed_ranks(ckpt_path: Any, ckpt: dict[str, Any], trainer: Any) -> None:
    """Refuse ``fit --ckpt_path`` on another number of DDP ranks than the run it resumes
    (:func:`lit_icl.core.resume.check_resumed_ranks`), checked once the trainer knows its ranks and before anything is
    written; a fit started from Python is checked where the checkpoint is loaded, with the same message."""
    check_ranks(ckpt_path, ckpt, trainer.world_size)


def check_resumed_rule(ckpt_path: Any, ckpt: dict[str, Any], trainer: Any) -> None:
    """Refuse ``fit --ckpt_path`` whose ``--early_stopping.*`` rule cannot go on from the checkpoint's.

    Lightning restores a callback's state by its ``state_key``, which for the rule names its monitor and mode: with
    another monitor or mode the saved state would be dropped and the rule would count from zero, mid-run. The other
    settings are compared by :meth:`lit_icl.callbacks.StopWhenConverged.resume_refusal` (a higher patience is
    allowed). Checked once the trainer holds its callbacks, before anything is written; a checkpoint without a rule,
    or a resume without one (the run goes on to its cap), is not checked.
    """
    from lit_icl.callbacks.stopping import StopWhenConverged

    rule = next((cb for cb in trainer.callbacks if isinstance(cb, StopWhenConverged)), None)
    states = ckpt.get("callbacks") or {}
    saved = [key for key in states if isinstance(key, str) and key.startswith(StopWhenConverged.__qualname__ + "{")]
    if rule is None or not saved:
        return
    if rule.state_key in states:
        refusal = rule.resume_refusal(states[rule.state_key])
    else:
        was = saved[0].removeprefix(StopWhenConverged.__qualname__)
        refusal = (f"the rule monitors {rule.monitor!r} ({rule.mode}) here but {was} in the checkpoint, whose "
                   "rounds without improvement counted another metric")
    if refusal is None:
        return
    run_config = _run_config(ckpt_path)
    same = f" (--config {quote(run_config)})" if run_config else ""
    raise ConfigError(
        f"--ckpt_path {ckpt_path} counted its early-stopping rounds under other settings, which a resumed run cannot "
        f"change: {refusal}; resume with the checkpoint's settings{same}, or start a new run without --ckpt_path"
    )


def check_evaluated_shapes(ckpt_path: Any, ckpt: dict[str, Any], model: Any, config: Any) -> None:
    """Refuse ``test`` / ``validate`` / ``predict`` of a checkpoint whose weights do not fit the model this config
    builds.

    The model settings are the checkpoint's (:func:`check_ckpt_hparams`), but a module takes some sizes from its data
    module once bound to it (CoQE Omniglot's class count from the data's training classes), so other data settings
    at test time build other shapes; Lightning then failed to load the weights with a ``state_dict`` traceback,
    after the run folder existed. Checked once the model is bound to its data, before anything is written. The data
    settings that differ from the checkpoint's are named as the likely cause. Weights the checkpoint leaves out
    (I2CL's frozen language model) are not compared.
    """
    saved = ckpt.get("state_dict")
    if not isinstance(saved, dict) or not hasattr(model, "state_dict"):
        return
    wrong = [(key, tuple(saved[key].shape), tuple(value.shape)) for key, value in model.state_dict().items()
             if isinstance(saved.get(key), torch.Tensor) and saved[key].shape != value.shape]
    if not wrong:
        return
    key, old, new = wrong[0]
    more = f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
    cause = ""
    data_saved, data = ckpt.get("datamodule_hyper_parameters"), config.get("data")
    if isinstance(data_saved, dict) and data is not None and hasattr(data, "init_args"):
        if not _same_class(str(data_saved.get("_class_path")), str(getattr(data, "class_path", ""))):
            cause = f" (this config's data module is {data.class_path}, not {data_saved.get('_class_path')})"
        else:
            from lit_icl.core.data import args_free_on_resume

            # Where the data lives, the loaders and the test-only sets set no size of a model: not named.
            free = args_free_on_resume(import_class(getattr(data, "class_path", None)))
            init_args = data.init_args.as_dict() if hasattr(data.init_args, "as_dict") else dict(data.init_args or {})
            found = _differences({k: v for k, v in data_saved.items() if k not in free},
                                 {k: v for k, v in init_args.items() if k not in free}, "data.init_args")
            if found:
                cause = " ({})".format("; ".join(f"--{k} is {v!r} here but {o!r} in the checkpoint"
                                                 for k, o, v in found[:3]))
    run_config = _run_config(ckpt_path)
    fix = f" (--config {quote(run_config)})" if run_config else ""
    raise ConfigError(
        f"--ckpt_path {ckpt_path} does not fit the model this config builds: {key} is {old} in the checkpoint but "
        f"{new} here{more}; the model takes that size from its data settings{cause}; use the data settings it was "
        f"trained with{fix}, or a checkpoint trained on this data"
    )


def quote(path: Any) -> str:
    """A path as it can be pasted into a shell."""
    import shlex

    return shlex.quote(str(path))

def _logger_root(config: Any) -> Path | None:
    """``save_dir/name`` of the run's (first) logger, or ``None`` when there is none to read."""
    logger = config.trainer.get("logger") if config.get("trainer") is not None else None
    if isinstance(logger, list):
        logger = logger[0] if logger else None
    if logger is None or isinstance(logger, bool) or not hasattr(logger, "init_args"):
        return None
    init = logger.init_args
    return Path(init.get("save_dir") or ".") / (init.get("name") or "lightning_logs")

def _newest_run_with_last(root: Path) -> Path | None:
    """The ``version_N`` folder under ``root`` with the largest N that holds ``checkpoints/last.ckpt``."""
    candidates = []
    for run in root.glob("version_*"):
        match = re.fullmatch(r"version_(\d+)", run.name)
        if match and (run / "checkpoints" / "last.ckpt").is_file():
            candidates.append((int(match.group(1)), run))
    return max(candidates)[1] if candidates else None

def pinned_run_folder(config: Any) -> Path | None:
    """The run folder ``save_dir/name/version`` when the config names the logger's version, else ``None``."""
    root = _logger_root(config)
    if root is None or isinstance(config.trainer.logger, list):
        return None
    version = config.trainer.logger.init_args.get("version")
    if version is None:
        return None
    return root / (version if isinstance(version, str) else f"version_{version}")

def where_last(config: Any) -> tuple[Path | None, str]:
    """The ``last.ckpt`` a ``--ckpt_path last`` of this config means (``None`` if there is none), and where
    it was looked for (for the error). ``(None, "")`` when the CLI cannot tell (a logger it cannot read)."""
    dirpath = config.checkpoint.get("dirpath") if config.get("checkpoint") is not None else None
    if dirpath:
        path = Path(dirpath) / "last.ckpt"
        return (path if path.is_file() else None), str(path)
    root = _logger_root(config)
    if root is None:
        if config.get("trainer") is None or config.trainer.get("logger") not in (False, []):
            return None, ""
        # No logger (--trainer.logger false): Lightning's checkpoint folder is default_root_dir/checkpoints. Left to
        # Lightning, `last` with nothing there trained (or tested) from scratch after a warning, and an existing
        # last.ckpt was resumed without the checks of its seed and settings.
        path = Path(config.trainer.get("default_root_dir") or ".") / "checkpoints" / "last.ckpt"
        return (path if path.is_file() else None), str(path)
    run = pinned_run_folder(config)
    if run is not None:
        path = run / "checkpoints" / "last.ckpt"
        return (path if path.is_file() else None), str(path)
    run = _newest_run_with_last(root)
    return (run / "checkpoints" / "last.ckpt" if run is not None else None), str(root / "version_*/checkpoints/last.ckpt")

def resolve_ckpt_path(subcommand: str, config: Any) -> Any:
    """``--ckpt_path last`` / ``best`` of a fresh CLI process, resolved against this config's earlier runs.

    Lightning resolves both from the checkpoint callback of the *running* trainer, which in a new process has
    saved nothing: ``last`` would silently start from scratch (and ``test`` score an untrained model), ``best``
    fails with an unrelated error. Here:

    - ``last`` with no earlier run is an error that says where it looked; ``fit`` keeps ``last`` (the logger is
      pinned to that run's folder, :func:`pin_logger_version_for_resume`, so it resumes in place), other
      subcommands get the file's path (their results go to a new folder, as with an explicit path);
    - ``best`` is the best checkpoint that the newest run's checkpoint callback recorded in its ``last.ckpt``
      (a callback that monitors a metric before one that only keeps the latest epochs), an error when there is
      none.
    """
    ckpt_path = config.get("ckpt_path")
    if ckpt_path == "hpc":
        _check_hpc_checkpoint(config)
    if ckpt_path not in ("last", "best"):
        return ckpt_path
    last, looked = where_last(config)
    if not looked:  # no logger and no checkpoint dirpath: leave it to Lightning
        return ckpt_path
    if ckpt_path == "last":
        if last is None:
            fix = ("drop --ckpt_path to start a fresh run" if subcommand == "fit"
                   else "run `python -m lit_icl fit` with this config first")
            raise ConfigError(
                f"--ckpt_path last: no earlier run of this config (looked for {looked}); {fix}, or pass a .ckpt file"
            )
        return ckpt_path if subcommand == "fit" else str(last)
    best = _best_recorded(last) if last is not None else None
    if best is None:
        raise ConfigError(
            f"--ckpt_path best: no best checkpoint of this config (looked for the checkpoint callback's best path "
            f"in {looked}); run fit first, or pass a .ckpt file"
        )
    return str(best)


def _check_hpc_checkpoint(config: Any) -> None:
    """Refuse ``--ckpt_path hpc`` when there is no ``hpc_ckpt_N.ckpt`` (what Lightning saves on SLURM's requeue
    signal) in ``trainer.default_root_dir``, where Lightning looks for one. Lightning raised a ``ValueError`` with a
    traceback and status 1 for it."""
    trainer = config.get("trainer")
    root = Path((trainer.get("default_root_dir") if trainer is not None else None) or os.getcwd())
    if not any(root.glob("hpc_ckpt_*.ckpt")):
        raise ConfigError(
            f"--ckpt_path hpc: no HPC checkpoint (hpc_ckpt_N.ckpt, saved by Lightning on SLURM's requeue signal) in "
            f"{root}; use --ckpt_path last to resume the newest run of this config, or pass a .ckpt file"
        )


def _best_recorded(last: Path) -> Path | None:
    """The existing ``best_model_path`` a ``ModelCheckpoint`` recorded in the checkpoint ``last``, if any."""
    try:
        ckpt = torch.load(last, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - an unreadable last.ckpt has no best path to offer
        return None
    states = ckpt.get("callbacks") if isinstance(ckpt, dict) else None
    records = [state for key, state in (states or {}).items()
               if str(key).startswith("ModelCheckpoint") and isinstance(state, dict) and state.get("best_model_path")]
    # A run keeps its latest epochs with the CLI's checkpoint callback (no monitor: its "best" is the newest file) and
    # may keep its best model by a metric with another (IC-SSL's configs); the metric's record names the best.
    records.sort(key=lambda state: state.get("best_model_score") is None)
    for state in records:
        path = Path(state["best_model_path"])
        # The run's own folder first: a run folder moved or copied since keeps its files beside last.ckpt, while the
        # recorded path names where the run was written, which for a copy is still the original run's folder.
        for candidate in (last.parent / path.name, path):
            if candidate.is_file():
                return candidate
    return None

def pin_logger_version_for_resume(config: Any) -> str | None:
    """Point the logger at the newest existing run folder that has ``checkpoints/last.ckpt``.

    With an auto-incremented version Lightning would open ``version_N+1`` and find no ``last`` checkpoint
    there; pinning the version resumes the run in the folder it was written to. Nothing changes when the user
    pinned a version or a checkpoint ``dirpath`` already, or when there is nothing to resume.

    Returns:
        The version pinned here, or ``None`` when nothing was pinned. The CLI unpins it again once the logger is
        built (:func:`unpin_logger_version`), so the run's saved ``config.yaml`` keeps ``version: null``: a
        ``test --config <that file>`` then writes a folder of its own instead of the training run's.
    """
    if config.get("checkpoint") is not None and config.checkpoint.get("dirpath"):
        return None
    root = _logger_root(config)
    if root is None:
        return None
    logger = config.trainer.logger
    init = (logger[0] if isinstance(logger, list) else logger).init_args
    if init.get("version") is not None:
        return None
    run = _newest_run_with_last(root)
    if run is None:
        return None
    init.version = run.name
    return run.name


def unpin_logger_version(config: Any) -> None:
    """Undo :func:`pin_logger_version_for_resume` in the config (the built logger keeps its folder)."""
    logger = config.trainer.logger
    (logger[0] if isinstance(logger, list) else logger).init_args.version = None
