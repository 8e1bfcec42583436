"""Where moved classes live now and what renamed arguments are called now: the one registry of old names, read
when an old checkpoint is loaded.

A checkpoint records its classes by import path (``hyper_parameters._class_path`` and each net's ``class_path``,
as the config named them), and files have moved since some checkpoints were written (``lit_icl/mmca/nets.py``
became ``lit_icl/mmca/synthetic/nets.py``). Loading rewrites such paths to today's (:func:`upgrade_checkpoint`):
the CLI's ``--ckpt_path`` (:class:`lit_icl.cli.LitICLCLI`) and ``<Module>.load_from_checkpoint``
(:class:`lit_icl.core.module.ICLModule`). Nothing else knows the old names, and importing them fails as for
any module that does not exist. New configs name each paper's public names (``lit_icl.mmca.DeepCrossAttention``),
which do not depend on files; a move adds its old module names here, with a checkpoint written before it under
``tests/data/legacy/``.

Constructor arguments that were renamed, grouped or moved (CoQE's five ``noise_*`` values became one ``noise``
schedule; IC-SSL's label ratios now live in the data module alone) are rewritten the same way (:data:`RENAMED_ARGUMENTS`), so the constructors take only today's
arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: Module names before a move -> the module that holds the same classes now.
MOVED_MODULES: dict[str, str] = {
    # CoQE, before one folder per experiment
    "lit_icl.coqe.data": "lit_icl.coqe.omniglot.data",
    "lit_icl.coqe.nets": "lit_icl.coqe.omniglot.nets",
    "lit_icl.coqe.module": "lit_icl.coqe.omniglot.module",
    "lit_icl.coqe.glyphs": "lit_icl.coqe.omniglot.glyphs",
    "lit_icl.coqe.regression_data": "lit_icl.coqe.regression.data",
    "lit_icl.coqe.regression_nets": "lit_icl.coqe.regression.nets",
    "lit_icl.coqe.regression_module": "lit_icl.coqe.regression.module",
    # the multi-modal paper, before its split into synthetic/ and avmnist/
    "lit_icl.mmca.data": "lit_icl.mmca.synthetic.data",
    "lit_icl.mmca.nets": "lit_icl.mmca.synthetic.nets",
    "lit_icl.mmca.module": "lit_icl.mmca.synthetic.module",
    "lit_icl.mmca.diagnostics": "lit_icl.mmca.synthetic.diagnostics",
    "lit_icl.mmca.figures": "lit_icl.mmca.synthetic.figures",
    "lit_icl.mmca.avmnist_data": "lit_icl.mmca.avmnist.data",
    "lit_icl.mmca.avmnist_nets": "lit_icl.mmca.avmnist.nets",
    "lit_icl.mmca.avmnist_module": "lit_icl.mmca.avmnist.module",
}

#: The keys under which Lightning and jsonargparse record a class's import path.
CLASS_PATH_KEYS = ("class_path", "_class_path")


def current_class_path(path: Any) -> Any:
    """Today's import path of a class named by an old one (``lit_icl.mmca.nets.DeepCrossAttention`` ->
    ``lit_icl.mmca.synthetic.nets.DeepCrossAttention``); any other value is returned as it is."""
    if not isinstance(path, str):
        return path
    module, _, name = path.rpartition(".")
    moved = MOVED_MODULES.get(module)
    return f"{moved}.{name}" if moved else path


def upgrade_class_paths(tree: Any) -> tuple[Any, bool]:
    """``tree`` with every recorded class path made current (dicts and lists rebuilt, nothing changed in place),
    and whether any was old."""
    if isinstance(tree, dict):
        changed = False
        out = {}
        for key, value in tree.items():
            if key in CLASS_PATH_KEYS and current_class_path(value) != value:
                out[key], changed = current_class_path(value), True
            else:
                out[key], moved = upgrade_class_paths(value)
                changed |= moved
        return out, changed
    if isinstance(tree, list):
        items = [upgrade_class_paths(v) for v in tree]
        return [v for v, _ in items], any(moved for _, moved in items)
    return tree, False


#: CoQE's loose noise arguments (before one ``NoiseSchedule``) -> their field in ``noise``.
_COQE_NOISE = {"noise_mean0": "mean0", "noise_std0": "std0", "noise_increment": "increment",
               "noise_interval": "interval", "noise_delay": "delay"}


def _group_coqe_noise(hparams: dict[str, Any]) -> dict[str, Any]:
    """``noise_mean0: 5, noise_std0: 1, ...`` -> ``noise: {mean0: 5, std0: 1, ...}``; ``noise_mean0: null``
    (noise-free training) -> ``noise: null``."""
    out = {k: v for k, v in hparams.items() if k not in _COQE_NOISE}
    if hparams.get("noise_mean0", 0.0) is None:
        out["noise"] = None
    else:
        out["noise"] = {new: hparams[old] for old, new in _COQE_NOISE.items() if old in hparams}
    return out


def _drop_icssl_label_ratios(hparams: dict[str, Any]) -> dict[str, Any]:
    """``ICSSLModule`` no longer takes ``label_ratios``: the data module's ``eval_label_ratios`` (saved beside it,
    and required to agree with a model copy when the checkpoint was written) are the ratios."""
    return {k: v for k, v in hparams.items() if k != "label_ratios"}


#: Class name -> (an argument that only old hyper-parameters hold, the rewrite to today's arguments). Keyed by
#: the class's name, not its path, since a class's recorded path has had several spellings.
RENAMED_ARGUMENTS: dict[str, tuple[str, Callable[[dict[str, Any]], dict[str, Any]]]] = {
    "CoQEClassificationModule": ("noise_mean0", _group_coqe_noise),
    "ICSSLModule": ("label_ratios", _drop_icssl_label_ratios),
}


def upgrade_arguments(hparams: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """A class's saved hyper-parameters (``_class_path`` and its arguments) with renamed arguments made current
    (a new dict), and whether any was old."""
    name = str(hparams.get("_class_path", "")).rpartition(".")[2]
    marker, rewrite = RENAMED_ARGUMENTS.get(name, (None, None))
    if rewrite is None or marker not in hparams:
        return hparams, False
    return rewrite(hparams), True


def upgrade_hparams(hparams: Any) -> tuple[Any, bool]:
    """Saved hyper-parameters with class paths and argument names made current, and whether any was old."""
    hparams, moved = upgrade_class_paths(hparams)
    if not isinstance(hparams, dict):
        return hparams, moved
    hparams, renamed = upgrade_arguments(hparams)
    return hparams, moved or renamed


def upgrade_checkpoint(checkpoint: dict[str, Any]) -> bool:
    """Make the class paths and argument names of a loaded checkpoint's module and data hyper-parameters
    current, in place; returns whether any was old."""
    changed = False
    for key in ("hyper_parameters", "datamodule_hyper_parameters"):
        if isinstance(checkpoint.get(key), dict):
            checkpoint[key], old = upgrade_hparams(checkpoint[key])
            changed |= old
    return changed
