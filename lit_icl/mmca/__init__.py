"""Multi-modal in-context learning with deep (linearised) cross-attention.

Paper: Nicholas Barnfield, Subhabrata Sen and Pragya Sur, "Multi-layer Cross-attention is Provably Optimal for
Multi-modal In-context Learning", 2026, arXiv:2602.04872.

One sub-package per experiment, each with ``data.py``, ``nets.py`` and ``module.py``:

- :mod:`lit_icl.mmca.synthetic`: latent-factor prompts (Secs. 3-7, App. H): :class:`LatentFactorDataModule`, the
  nets :class:`SingleLayerLSA`, :class:`DeepCrossAttention`, :class:`SampleMean`, :class:`BayesOptimal`, the
  module :class:`LatentFactorICLModule` and the callback :class:`WhiteningDiagnostic`
  (configs ``configs/mmca/synthetic.yaml`` + ``configs/mmca/synthetic/*.yaml``).
- :mod:`lit_icl.mmca.avmnist`: corrupted avMNIST (Sec. 7, Table 1, App. I): :class:`AVMNISTDataModule`
  (MultiBench layout; the offline stand-in ``avmnist_lite`` is built on first use, or by
  ``python -m lit_icl.mmca.avmnist.build``),
  the nets :class:`MultimodalCrossAttention`, :class:`BidirectionalCrossAttention` and :class:`AVMNISTModule`
  (configs ``configs/mmca/avmnist.yaml`` + ``configs/mmca/avmnist/*.yaml``).

Shared by both: :mod:`lit_icl.mmca.theory` (closed forms: Theorem 6.2's ``alpha*``, the Bayes weights of Eq. 3.3,
the population losses) and :mod:`lit_icl.mmca.contracts` (what each module reads from its data module and net).

Configs name the public names exported here (``lit_icl.mmca.DeepCrossAttention``). Checkpoints written before
the split name the old files (``lit_icl.mmca.nets``, ``lit_icl.mmca.avmnist_nets`` ...) and still load: loading
rewrites those paths (:mod:`lit_icl.core.legacy`).
"""

from lit_icl.mmca.avmnist.data import AVMNISTDataModule
from lit_icl.mmca.avmnist.module import AVMNISTModule
from lit_icl.mmca.avmnist.nets import BidirectionalCrossAttention, MultimodalCrossAttention
from lit_icl.mmca.synthetic.data import LatentFactorDataModule
from lit_icl.mmca.synthetic.diagnostics import WhiteningDiagnostic
from lit_icl.mmca.synthetic.module import LatentFactorICLModule
from lit_icl.mmca.synthetic.nets import BayesOptimal, DeepCrossAttention, SampleMean, SingleLayerLSA

__all__ = [
    "AVMNISTDataModule",
    "AVMNISTModule",
    "BayesOptimal",
    "BidirectionalCrossAttention",
    "DeepCrossAttention",
    "LatentFactorDataModule",
    "LatentFactorICLModule",
    "MultimodalCrossAttention",
    "SampleMean",
    "SingleLayerLSA",
    "WhiteningDiagnostic",
]
