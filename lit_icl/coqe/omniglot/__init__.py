"""CoQE on Omniglot-style image sequences: ICL on holdout classes vs IWL on training classes (Sec. 4.2, 5.2, App. C.2).

- :mod:`.data`: bursty/Zipfian sequences (:class:`OmniglotSequenceDataModule`) read through :mod:`.images`
  (Omniglot layout, cached image bank); :mod:`.glyphs` builds the offline stand-in;
- :mod:`.nets`: the ResNet embedder, the Transformer baseline (:class:`SequenceTransformer`) and CoQE
  (:class:`CoQEClassifier`);
- :mod:`.module`: training with the noise schedule on the modified logits, ICL/IWL evaluators, result rows.
"""

from lit_icl.coqe.omniglot.data import OmniglotSequenceDataModule
from lit_icl.coqe.omniglot.module import CoQEClassificationModule
from lit_icl.coqe.omniglot.nets import CoQEClassifier, SequenceTransformer

__all__ = ["CoQEClassificationModule", "CoQEClassifier", "OmniglotSequenceDataModule", "SequenceTransformer"]
