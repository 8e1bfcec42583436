"""CoQE: reconciling in-context and in-weight learning (``shared/papers/coqe_reconciling_icl_and_iwl.md``).

Two experiments:

- few-shot classification on Omniglot-style sequences (Sec. 4.2, 5.2, App. C.2): ``data``, ``nets``, ``module``;
- in-context regression of function classes (Sec. 4.1, 5.1, App. C.1): ``regression_data``, ``regression_nets``,
  ``regression_module``.
"""

from lit_icl.coqe.data import OmniglotSequenceDataModule
from lit_icl.coqe.module import CoQEClassificationModule
from lit_icl.coqe.nets import CoQEClassifier, SequenceTransformer
from lit_icl.coqe.regression_data import RegressionDataModule
from lit_icl.coqe.regression_module import CoQERegressionModule
from lit_icl.coqe.regression_nets import (
    Averaging,
    CoQERegressor,
    Lasso,
    LeastSquares,
    NearestNeighbours,
    RegressionTransformer,
    TwoLayerNN,
)

__all__ = [
    "Averaging", "CoQEClassificationModule", "CoQEClassifier", "CoQERegressionModule", "CoQERegressor", "Lasso",
    "LeastSquares", "NearestNeighbours", "OmniglotSequenceDataModule", "RegressionDataModule",
    "RegressionTransformer", "SequenceTransformer", "TwoLayerNN",
]
