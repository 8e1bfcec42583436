"""lit_icl: PyTorch Lightning re-implementations of in-context learning papers.

Each paper lives in its own package (``lit_icl.icssl``, ...) with ``data.py`` (LightningDataModules and
generators), ``nets.py`` (plain ``nn.Module``s: the paper's model and its baselines) and ``module.py`` (the
LightningModule: objective and evaluation protocol). ``lit_icl.core``, ``lit_icl.metrics`` and
``lit_icl.callbacks`` hold what several papers share. Run ``python -m lit_icl --help``.
"""

__version__ = "0.1.0"
