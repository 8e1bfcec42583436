"""Lightning callback that scores the representations a LightningModule returns from its eval steps.

Logs the IC-SSL representation analysis (App. F.5 separation score; Table 1 mNN / Cycle / LCS alignment)
without the module owning any metric: the module only returns its embeddings.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor
from torchmetrics import Metric

from lit_icl.core.errors import ConfigError
from lit_icl.core.results import result_row
from lit_icl.core.validation import check_bool
from lit_icl.metrics.functional import knn_indices, validate_k
from lit_icl.metrics.representation import LCSKNN, CycleKNN, MutualKNN, SeparationScore

__all__ = ["RepresentationMetrics"]


class RepresentationMetrics(Callback):
    """Separation and k-NN alignment scores of the embeddings returned by ``validation_step`` / ``test_step``.

    **Contract with the LightningModule.** ``validation_step`` (and ``test_step``) return a dict that may
    contain

    * ``"embeddings"``: a dict ``name -> Tensor`` of shape ``(B, n, D_name)`` (``B`` episodes of ``n`` points)
      or ``(N, D_name)`` (one set); all entries embed the same points, feature dims may differ;
    * ``"labels"``: ``(B, n)`` or ``(N,)`` class ids of those points (needed for the separation score only).

    A step that returns ``None``, a non-dict, or a dict without ``"embeddings"`` is ignored. Scores are
    computed per set (episode) and averaged over all sets of the epoch (pooled over dataloaders); see
    :mod:`lit_icl.metrics.representation`.

    **Logged** at the end of each validation / test epoch (the prefix is ``val`` or ``test``):

    * ``<prefix>/separation/<name>`` for each embedding (if ``"labels"`` is given);
    * ``<prefix>/mnn/<a>~<b>``, ``<prefix>/cycle_knn/<a>~<b>``, ``<prefix>/lcs_knn/<a>~<b>`` for each pair.

    Undefined values (NaN: e.g. no set with two classes) are not logged.

    **Metrics are created on the first batch that carries embeddings**, because only then are the names
    known. Under DDP, every rank must therefore return the *same* embedding names (and all ranks must see at
    least one such batch, which Lightning's DistributedSampler guarantees): epoch-end ``compute()`` is a
    collective, and ranks holding different metric sets would hang. A later batch with different names raises.
    Lightning's DistributedSampler pads the last batches with repeated samples, so a repeated episode is
    counted twice; size eval sets to a multiple of ``world_size * batch_size`` for exact means.

    **Other trained models** (``compare_checkpoints``, test only): each checkpoint is loaded with the running
    module's class (``load_from_checkpoint``) at the start of ``test``, and on every test batch its
    representation, ``pl_module.representation(batch, other.net)``, joins the embeddings under its name. The
    module must define that method (IC-SSL's does), which is how Table 1 of the IC-SSL paper aligns the model,
    the Transformer baseline and EIG on the same episodes.

    With ``rows=True`` the test-epoch scores are also handed to the shared results writer as tidy rows (see
    :func:`lit_icl.core.results.collect_test_rows`): metric ``separation`` / ``mnn`` / ``cycle_knn`` /
    ``lcs_knn``, coordinate ``embeddings`` (``<name>`` or ``<a>~<b>``) and ``k``, method = the module's ``method``
    attribute (its class name if it has none).

    Args:
        k: neighbours per point for the alignment scores (``1 <= k <= n - 1`` for every set).
        pairs: ordered ``(a, b)`` embedding-name pairs to align. ``None`` means every unordered pair of names,
            each in sorted order (``a < b``). Order matters only for ``cycle_knn`` (first hop in ``b``).
        rows: also write the test scores into ``results.json`` (off by default).
        compare_checkpoints: ``{name: checkpoint path}`` of other trained models to embed in ``test``.
    """

    def __init__(
        self,
        k: int = 10,
        pairs: list[tuple[str, str]] | None = None,
        rows: bool = False,
        compare_checkpoints: dict[str, str] | None = None,
    ) -> None:
        super().__init__()
        self.k = validate_k(k)
        check_bool("rows", rows)
        self.rows = rows
        #: Result rows of the last test epoch (filled only with ``rows=True``).
        self.test_rows: list[dict[str, Any]] = []
        self.compare_checkpoints = dict(compare_checkpoints or {})
        for name, path in self.compare_checkpoints.items():
            if not isinstance(path, str) or not path:
                raise ConfigError(f"compare_checkpoints[{name!r}] must be a checkpoint path, got {path!r}")
        self._others: dict[str, pl.LightningModule] = {}
        self.pairs: list[tuple[str, str]] | None = None
        if pairs is not None:
            self.pairs = [tuple(p) for p in pairs]  # type: ignore[misc]
            bad = [p for p in self.pairs if len(p) != 2 or p[0] == p[1]]
            if bad:
                raise ConfigError(f"pairs must be (a, b) with two different embedding names, got {bad}")
        # Per stage: the embedding names of the first batch, and log name -> (metric, first, second input
        # name); second is None for the separation score, whose second input is the labels.
        self._names: dict[str, tuple[str, ...]] = {}
        self._metrics: dict[str, dict[str, tuple[Metric, str, str | None]]] = {}

    def check_config(self, *, model: Any = None, datamodule: Any = None, **_: Any) -> None:
        """Before a run: ``k`` neighbours need sets of more than ``k`` points, and ``pairs`` must name
        embeddings the module returns.

        Uses the data module's ``n_points`` (points per episode) and the module's ``embedding_names`` (a dict
        ``stage -> names`` returned by its ``validation_step`` / ``test_step``) when they exist; otherwise the
        same checks run at the first evaluation step.
        """
        if self.compare_checkpoints:
            declared_test = getattr(model, "embedding_names", {}).get("test", ("model",))
            clash = sorted(set(self.compare_checkpoints) & set(declared_test))
            if clash:
                raise ConfigError(
                    f"RepresentationMetrics compare_checkpoints names {clash} are taken by the module's own "
                    "embeddings; rename them"
                )
            if model is not None and not callable(getattr(model, "representation", None)):
                raise ConfigError(
                    f"RepresentationMetrics compare_checkpoints needs {type(model).__name__}.representation(batch, "
                    "net); this module has none"
                )
            missing = [p for p in self.compare_checkpoints.values() if not Path(p).is_file()]
            if missing:
                raise ConfigError(f"RepresentationMetrics compare_checkpoints: no checkpoint file at {missing}")
        n = getattr(datamodule, "n_points", None)
        if isinstance(n, int) and self.k > n - 1:
            raise ConfigError(
                f"RepresentationMetrics k={self.k} but episodes have only {n} points; choose k <= {n - 1}"
            )
        declared = getattr(model, "embedding_names", None)
        if self.pairs is not None and isinstance(declared, Mapping):
            for stage, names in declared.items():
                missing = sorted({name for p in self.pairs for name in p} - set(names))
                if missing:
                    raise ConfigError(
                        f"RepresentationMetrics pairs name embeddings {missing} that the {stage} step does not "
                        f"return (it returns {sorted(names)})"
                    )

    # ---------------------------------------------------------------- construction

    def _build(self, stage: str, names: tuple[str, ...], pl_module: pl.LightningModule) -> None:
        if self.pairs is None:
            pairs = list(itertools.combinations(sorted(names), 2))
        else:
            missing = sorted({n for p in self.pairs for n in p} - set(names))
            if missing:
                raise ConfigError(
                    f"RepresentationMetrics pairs name embeddings {missing} that the {stage} step does not "
                    f"return (it returns {sorted(names)})"
                )
            pairs = self.pairs
        # The set of metrics depends on the names only (not on whether this batch has labels), so every rank
        # that returns the same names builds the same metrics, as the collective compute() requires.
        metrics: dict[str, tuple[Metric, str, str | None]] = {}
        for name in names:
            metrics[f"{stage}/separation/{name}"] = (SeparationScore(), name, None)
        for a, b in pairs:
            metrics[f"{stage}/mnn/{a}~{b}"] = (MutualKNN(k=self.k), a, b)
            metrics[f"{stage}/cycle_knn/{a}~{b}"] = (CycleKNN(k=self.k), a, b)
            metrics[f"{stage}/lcs_knn/{a}~{b}"] = (LCSKNN(k=self.k), a, b)
        # Callback-owned metrics are not submodules of the LightningModule, so Lightning won't move them.
        for metric, _, _ in metrics.values():
            metric.to(pl_module.device)
        self._names[stage] = names
        self._metrics[stage] = metrics

    # ---------------------------------------------------------------- update / log

    def _update(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, stage: str) -> None:
        # Sanity-check batches come from an untrained model and would pollute the first epoch's values.
        if trainer.sanity_checking or not isinstance(outputs, Mapping):
            return
        embeddings = outputs.get("embeddings")
        if not embeddings:
            return
        labels: Tensor | None = outputs.get("labels")
        names = tuple(sorted(embeddings))
        if stage not in self._metrics:
            self._build(stage, names, pl_module)
        elif names != self._names[stage]:
            raise ValueError(
                f"the {stage} step returned embeddings {list(names)} but earlier batches returned "
                f"{list(self._names[stage])}; every batch (and every DDP rank) must return the same names"
            )
        # Each embedding's neighbour lists are found once per batch and shared by its three alignment scores:
        # the top-k search is most of their cost, so this makes them about three times cheaper, same values.
        neighbours: dict[str, Tensor] = {}

        def knn(name: str) -> Tensor:
            if name not in neighbours:
                neighbours[name] = knn_indices(embeddings[name].detach().float(), self.k)
            return neighbours[name]

        for metric, first, second in self._metrics[stage].values():
            if metric.device != pl_module.device:  # e.g. fit on one device, test on another
                metric.to(pl_module.device)
            if second is not None:
                metric.update(embeddings[first], embeddings[second], neighbours=(knn(first), knn(second)))
            elif labels is not None:
                metric.update(embeddings[first], labels)

    def _log_and_reset(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if trainer.sanity_checking:
            return
        if stage == "test":
            self.test_rows = []
        for log_name, (metric, _, _) in self._metrics.get(stage, {}).items():
            # compute() all-gathers the states: it runs on every rank, and the value is already global; sync_dist
            # only averages identical values, and stops Lightning's warning under DDP that it is not accumulated
            # across devices. NaN is identical on all ranks, so skipping it stays consistent.
            with warnings.catch_warnings():
                # A metric with no data this epoch (e.g. no labels returned) is expected: it gives NaN, which
                # is not logged, so torchmetrics' "compute before update" warning would only be noise.
                warnings.filterwarnings("ignore", message=r".*was called before the ``update`` method")
                value = metric.compute()
            if not math.isnan(value.item()):
                pl_module.log(log_name, value, sync_dist=True)
                if stage == "test" and self.rows:
                    _, kind, names = log_name.split("/", 2)
                    method = getattr(pl_module, "method", None)
                    self.test_rows.append(result_row(
                        kind, value, method=method if isinstance(method, str) else type(pl_module).__name__,
                        embeddings=names, k=self.k,
                    ))
            metric.reset()

    # ---------------------------------------------------------------- Lightning hooks

    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._update(trainer, pl_module, outputs, "val")

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._log_and_reset(trainer, pl_module, "val")

    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for name, path in self.compare_checkpoints.items():
            if name not in self._others:
                other = type(pl_module).load_from_checkpoint(path, map_location=pl_module.device)
                self._others[name] = other.eval().requires_grad_(False)

    def on_test_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self._others and isinstance(outputs, Mapping) and outputs.get("embeddings"):
            embeddings = dict(outputs["embeddings"])
            with torch.no_grad():
                for name, other in self._others.items():
                    other.to(pl_module.device)
                    embeddings[name] = pl_module.representation(batch, other.net)
            outputs = {**outputs, "embeddings": embeddings}
        self._update(trainer, pl_module, outputs, "test")

    def on_test_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._log_and_reset(trainer, pl_module, "test")
