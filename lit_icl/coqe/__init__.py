"""CoQE: reconciling in-context and in-weight learning (``shared/papers/coqe_reconciling_icl_and_iwl.md``).

Few-shot classification on Omniglot-style sequences (Sec. 4.2, 5.2, App. C.2).
"""

from lit_icl.coqe.data import OmniglotSequenceDataModule
from lit_icl.coqe.module import CoQEClassificationModule
from lit_icl.coqe.nets import CoQEClassifier, SequenceTransformer

__all__ = ["CoQEClassificationModule", "CoQEClassifier", "OmniglotSequenceDataModule", "SequenceTransformer"]
