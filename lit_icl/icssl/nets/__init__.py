"""Networks of IC-SSL (in-context semi-supervised learning): plain ``nn.Module``s, no Lightning.

Every model of Sec. 4.1 is written ``[Data + Model]``: a *representation* ``phi(X)`` computed from all ``n``
points of an episode, followed by a *classifier* that sees the ``m`` labels. Here that is literally
:class:`SemiSupervisedICL` ``(representation, head)``:

=================  =================================  =========================
paper name         representation                     head
=================  =================================  =========================
ORIG+E2E-ICL       :class:`InContextEigenmap`         :class:`GDICLHead`
EIG+ICL            :class:`LaplacianEigenmap`         :class:`GDICLHead`
ORIG+ICL           :class:`RawCoordinates`            :class:`GDICLHead`
=================  =================================  =========================

Layouts are token-major: a batch of episodes is ``(B, n, features)`` and token ``i`` is row ``i``. The paper
writes tokens as *columns* (``Z in R^{(d+n) x n}``), so a paper matrix ``Z`` is our ``Z^T`` per episode.

The representation modules compute distances, Gram matrices and a power iteration; they run in float32 with
autocast disabled, as those lose their meaning in bf16. Only the head's MLP follows autocast.

Files: ``laplacian.py`` (TF^L: :class:`RBFAttentionLayer`, :class:`LaplacianTransformer`, and the distance
helpers), ``eigenmap.py`` (TF^phi: :class:`LinearAttentionLayer`, :class:`EigenmapTransformer` and the
iterations' autograd Function), ``representations.py`` (:class:`InContextEigenmap`, :class:`LaplacianEigenmap`,
:class:`RawCoordinates`, :class:`ProjectedRepresentation`), ``heads.py`` (:class:`GDICLHead`), ``model.py``
(:class:`SemiSupervisedICL`, :class:`ICSSLOutput`) and ``baselines.py`` (EIG+LR, ORIG+RBF-LR and the
Transformer of App. G). Checkpoints written before the files were split name this package
(``lit_icl.icssl.nets.SemiSupervisedICL``), so it exports every public class.
"""

from lit_icl.icssl.nets.baselines import (
    INTERCEPT_RIDGE,
    ICLTransformerBaseline,
    KernelLogisticRegressionHead,
    LogisticRegressionHead,
    fit_penalized_logistic,
    logistic_logits,
    penalized_logistic_objective,
    transformer_baseline_parameters,
)
from lit_icl.icssl.nets.eigenmap import EffectiveWeights, EigenmapTransformer, LinearAttentionLayer
from lit_icl.icssl.nets.heads import GDICLHead
from lit_icl.icssl.nets.laplacian import LaplacianTransformer, RBFAttentionLayer
from lit_icl.icssl.nets.model import ICSSLOutput, SemiSupervisedICL
from lit_icl.icssl.nets.representations import (
    InContextEigenmap,
    LaplacianEigenmap,
    ProjectedRepresentation,
    RawCoordinates,
    check_input_dim,
)

__all__ = [
    "INTERCEPT_RIDGE",
    "EffectiveWeights",
    "EigenmapTransformer",
    "GDICLHead",
    "ICLTransformerBaseline",
    "ICSSLOutput",
    "InContextEigenmap",
    "KernelLogisticRegressionHead",
    "LaplacianEigenmap",
    "LaplacianTransformer",
    "LinearAttentionLayer",
    "LogisticRegressionHead",
    "ProjectedRepresentation",
    "RBFAttentionLayer",
    "RawCoordinates",
    "SemiSupervisedICL",
    "check_input_dim",
    "fit_penalized_logistic",
    "logistic_logits",
    "penalized_logistic_objective",
    "transformer_baseline_parameters",
]
