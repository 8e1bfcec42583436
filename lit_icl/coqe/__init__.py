"""CoQE: separate sample and task encoders joined by an inner product, for in-context and in-weight learning.

Paper: Chen, Wang, Zhang and Chen, "Reconciling In-Context and In-Weight Learning via Dual Representation Space
Encoding", TMLR 2026, arXiv:2603.13459 (an earlier version, "Reconciling In-Context and In-Weight Learning: A
Dual-Space Modeling Perspective", was under review at ICLR 2026). Section, equation and appendix numbers in this
package follow that paper.

Two experiments, one folder each (``data.py``, ``nets.py``, ``module.py``):

- :mod:`lit_icl.coqe.omniglot`: few-shot classification on bursty/Zipfian Omniglot-style image sequences
  (Sec. 4.2, 5.2, App. C.2), with the offline ``glyphs`` stand-in (:mod:`lit_icl.coqe.omniglot.glyphs`);
- :mod:`lit_icl.coqe.regression`: in-context regression of function classes (Sec. 4.1, 5.1, App. C.1).

Both build on the causal Transformer of :mod:`lit_icl.coqe.layers`. Configs name the public classes below
(``lit_icl.coqe.CoQEClassifier``), so files can move without breaking configs or checkpoints.
"""

from lit_icl.coqe.omniglot import (
    CoQEClassificationModule,
    CoQEClassifier,
    OmniglotSequenceDataModule,
    SequenceTransformer,
)
from lit_icl.coqe.regression import (
    Averaging,
    CoQERegressionModule,
    CoQERegressor,
    Lasso,
    LeastSquares,
    NearestNeighbours,
    RegressionDataModule,
    RegressionTransformer,
    TwoLayerNN,
)

__all__ = [
    "Averaging", "CoQEClassificationModule", "CoQEClassifier", "CoQERegressionModule", "CoQERegressor",
    "Lasso", "LeastSquares", "NearestNeighbours", "OmniglotSequenceDataModule", "RegressionDataModule",
    "RegressionTransformer", "SequenceTransformer", "TwoLayerNN",
]
