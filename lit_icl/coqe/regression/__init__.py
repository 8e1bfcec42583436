"""CoQE on in-context regression: linear, sparse, ReLU-net and combination function classes (Sec. 4.1, 5.1, App. C.1).

- :mod:`.data`: prompts of one function class, with the four test shifts (:class:`RegressionDataModule`);
- :mod:`.nets`: CoQE (:class:`CoQERegressor`), the GPT-2-style Transformer (:class:`RegressionTransformer`) and
  the closed-form baselines (least squares, Lasso, nearest neighbours, averaging, a two-layer net);
- :mod:`.module`: training with the curriculum, error-vs-examples curves per shift, result rows.
"""

from lit_icl.coqe.regression.data import RegressionDataModule
from lit_icl.coqe.regression.module import CoQERegressionModule
from lit_icl.coqe.regression.nets import (
    Averaging,
    CoQERegressor,
    Lasso,
    LeastSquares,
    NearestNeighbours,
    RegressionTransformer,
    TwoLayerNN,
)

__all__ = [
    "Averaging", "CoQERegressionModule", "CoQERegressor", "Lasso", "LeastSquares", "NearestNeighbours",
    "RegressionDataModule", "RegressionTransformer", "TwoLayerNN",
]
