"""Multi-modal ICL with deep linear cross-attention (``shared/papers/mmca_multimodal_cross_attention_icl.md``).

Synthetic latent-factor prompts (Sec. 3, App. H): :class:`LatentFactorDataModule`, the nets of
:mod:`lit_icl.mmca.nets` and :class:`LatentFactorICLModule`.
"""

from lit_icl.mmca.data import LatentFactorDataModule
from lit_icl.mmca.diagnostics import WhiteningDiagnostic
from lit_icl.mmca.module import LatentFactorICLModule
from lit_icl.mmca.nets import BayesOptimal, DeepCrossAttention, SampleMean, SingleLayerLSA

__all__ = [
    "BayesOptimal",
    "DeepCrossAttention",
    "LatentFactorDataModule",
    "LatentFactorICLModule",
    "SampleMean",
    "SingleLayerLSA",
    "WhiteningDiagnostic",
]
