"""Multi-modal ICL with deep linear cross-attention (``shared/papers/mmca_multimodal_cross_attention_icl.md``).

Synthetic latent-factor prompts (Sec. 3, App. H): :class:`LatentFactorDataModule`, the nets of
:mod:`lit_icl.mmca.nets` and :class:`LatentFactorICLModule`.

Corrupted avMNIST (Sec. 7, Table 1, App. I): :class:`AVMNISTDataModule` (MultiBench layout; the offline stand-in
``avmnist_lite`` is built by ``python -m lit_icl.mmca.avmnist_build``), the nets of
:mod:`lit_icl.mmca.avmnist_nets` and :class:`AVMNISTModule`.
"""

from lit_icl.mmca.avmnist_data import AVMNISTDataModule
from lit_icl.mmca.avmnist_module import AVMNISTModule
from lit_icl.mmca.avmnist_nets import BidirectionalCrossAttention, MultimodalCrossAttention
from lit_icl.mmca.data import LatentFactorDataModule
from lit_icl.mmca.diagnostics import WhiteningDiagnostic
from lit_icl.mmca.module import LatentFactorICLModule
from lit_icl.mmca.nets import BayesOptimal, DeepCrossAttention, SampleMean, SingleLayerLSA

__all__ = [
    "AVMNISTDataModule",
    "AVMNISTModule",
    "BidirectionalCrossAttention",
    "MultimodalCrossAttention",
    "BayesOptimal",
    "DeepCrossAttention",
    "LatentFactorDataModule",
    "LatentFactorICLModule",
    "SampleMean",
    "SingleLayerLSA",
    "WhiteningDiagnostic",
]
