"""IC-SSL: in-context semi-supervised learning on manifolds.

Implements Jiashuo Fan, Paul Rosu, Aaron T. Wang, Michael Li, Lawrence Carin and Xiang Cheng, *In-Context
Semi-Supervised Learning*, 2025, arXiv:2512.15934: a Transformer that computes a Laplacian eigenmap of all the
context's points in its forward pass (TF^L then TF^phi) and classifies the unlabeled ones with a functional-GD
ICL head, trained end to end on the cross-entropy of the unlabeled points (Eq. 4).

Files: ``manifolds.py`` (the synthetic manifolds and their geodesic-ball labels), ``data.py`` (episodes on them:
:class:`ManifoldDataModule`), ``image_manifolds.py`` and ``features.py`` (the image-manifold and
pretrained-feature data modules), ``nets.py`` (the paper's model), ``baselines.py`` (EIG+LR, RBF-LR and the
Transformer of App. G), ``module.py`` (:class:`ICSSLModule`: the objective and the label-ratio protocol) and
``contracts.py`` (what the module reads from its data module and expects of its net).

Configs name the classes by the public names below (``lit_icl.icssl.SemiSupervisedICL``), so files can move;
checkpoints that name a file (``lit_icl.icssl.nets.SemiSupervisedICL``) load too.
"""

from typing import Any

from lit_icl.icssl.baselines import (
    ICLTransformerBaseline,
    KernelLogisticRegressionHead,
    LogisticRegressionHead,
)
from lit_icl.icssl.contracts import ICSSLDataModule, ICSSLNet, TwoStageNet
from lit_icl.icssl.data import EpisodeChunks, ManifoldDataModule
from lit_icl.icssl.module import ICSSLModule
from lit_icl.icssl.nets import (
    GDICLHead,
    InContextEigenmap,
    LaplacianEigenmap,
    ProjectedRepresentation,
    RawCoordinates,
    SemiSupervisedICL,
)

# The two data modules of files that also run as scripts (`python -m lit_icl.icssl.features standin`) load on
# first use: importing them here would import those files before runpy executes them as __main__.
_LAZY = {
    "FeatureEpisodeDataModule": "lit_icl.icssl.features",
    "ImageManifoldDataModule": "lit_icl.icssl.image_manifolds",
}

__all__ = [
    "EpisodeChunks",
    "FeatureEpisodeDataModule",
    "GDICLHead",
    "ICLTransformerBaseline",
    "ICSSLDataModule",
    "ICSSLModule",
    "ICSSLNet",
    "ImageManifoldDataModule",
    "InContextEigenmap",
    "KernelLogisticRegressionHead",
    "LaplacianEigenmap",
    "LogisticRegressionHead",
    "ManifoldDataModule",
    "ProjectedRepresentation",
    "RawCoordinates",
    "SemiSupervisedICL",
    "TwoStageNet",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lit_icl.icssl' has no attribute {name!r}")
