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

Configs name the public names exported here (``lit_icl.mmca.DeepCrossAttention``). The modules' old file names
(``lit_icl.mmca.nets``, ``lit_icl.mmca.avmnist_nets`` ...) stay importable as aliases (:data:`LEGACY_MODULES`), so
configs and checkpoints written before the split still load.
"""

from lit_icl.core.compat import alias_modules
from lit_icl.mmca.avmnist.data import AVMNISTDataModule
from lit_icl.mmca.avmnist.module import AVMNISTModule
from lit_icl.mmca.avmnist.nets import BidirectionalCrossAttention, MultimodalCrossAttention
from lit_icl.mmca.synthetic.data import LatentFactorDataModule
from lit_icl.mmca.synthetic.diagnostics import WhiteningDiagnostic
from lit_icl.mmca.synthetic.module import LatentFactorICLModule
from lit_icl.mmca.synthetic.nets import BayesOptimal, DeepCrossAttention, SampleMean, SingleLayerLSA

#: Module names before the split into experiments -> where the code lives now.
LEGACY_MODULES = {
    "lit_icl.mmca.data": "lit_icl.mmca.synthetic.data",
    "lit_icl.mmca.nets": "lit_icl.mmca.synthetic.nets",
    "lit_icl.mmca.module": "lit_icl.mmca.synthetic.module",
    "lit_icl.mmca.diagnostics": "lit_icl.mmca.synthetic.diagnostics",
    "lit_icl.mmca.figures": "lit_icl.mmca.synthetic.figures",
    "lit_icl.mmca.avmnist_data": "lit_icl.mmca.avmnist.data",
    "lit_icl.mmca.avmnist_nets": "lit_icl.mmca.avmnist.nets",
    "lit_icl.mmca.avmnist_module": "lit_icl.mmca.avmnist.module",
}
# Not lit_icl.mmca.avmnist_build: it holds no class a config or checkpoint names, and an alias would import the
# builder with the package, which makes `python -m lit_icl.mmca.avmnist.build` warn (runpy) and cannot serve the
# old `python -m lit_icl.mmca.avmnist_build` anyway (runpy refuses a module found under another name).
alias_modules(LEGACY_MODULES)

__all__ = [
    "LEGACY_MODULES",
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
