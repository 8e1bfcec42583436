"""IC-SSL: in-context semi-supervised learning on manifolds.

Implements Jiashuo Fan, Paul Rosu, Aaron T. Wang, Michael Li, Lawrence Carin and Xiang Cheng, *In-Context
Semi-Supervised Learning*, 2025, arXiv:2512.15934: a Transformer that computes a Laplacian eigenmap of all the
context's points in its forward pass (TF^L then TF^phi) and classifies the unlabeled ones with a functional-GD
ICL head, trained end to end on the cross-entropy of the unlabeled points (Eq. 4).

Files:

- data: ``manifolds.py`` (the synthetic manifolds, their geodesics, label thresholds and random pose),
  ``sampling.py`` (product manifolds, the spec parser and the episode sampler), ``data.py`` (episodes on them:
  :class:`ManifoldDataModule`), ``image_manifolds.py`` and ``features.py`` (reading and caching the image
  sequences and feature files: :class:`ImageManifoldDataModule`, :class:`FeatureEpisodeDataModule`) and
  ``build.py`` (what writes those: the offline stand-ins, the Stable Diffusion generator and VGG feature
  extraction, ``python -m lit_icl.icssl.build {image-standin,stable-diffusion,features,features-standin}``);
- ``nets/``: the paper's model (``laplacian.py`` TF^L, ``eigenmap.py`` TF^phi, ``representations.py``,
  ``heads.py`` the GD head, ``model.py`` :class:`SemiSupervisedICL`) and ``baselines.py`` (EIG+LR, RBF-LR and
  the Transformer of App. G);
- ``module.py`` (:class:`ICSSLModule`: the objective and the label-ratio protocol) and ``contracts.py`` (what
  the module reads from its data module and expects of its net).

The dataset-size sweep of Fig. 3 is a script, ``experiments/icssl_sweep.py``. Configs name the classes by the
public names below (``lit_icl.icssl.SemiSupervisedICL``), so files can move; checkpoints that name a file
(``lit_icl.icssl.nets.SemiSupervisedICL``) load too, as ``nets`` exports every class it held as one file.
"""

from lit_icl.icssl.contracts import ICSSLDataModule, ICSSLNet, TwoStageNet
from lit_icl.icssl.data import EpisodeChunks, ManifoldDataModule
from lit_icl.icssl.features import FeatureEpisodeDataModule
from lit_icl.icssl.image_manifolds import ImageManifoldDataModule
from lit_icl.icssl.module import ICSSLModule
from lit_icl.icssl.nets import (
    GDICLHead,
    ICLTransformerBaseline,
    InContextEigenmap,
    KernelLogisticRegressionHead,
    LaplacianEigenmap,
    LogisticRegressionHead,
    ProjectedRepresentation,
    RawCoordinates,
    SemiSupervisedICL,
)

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
