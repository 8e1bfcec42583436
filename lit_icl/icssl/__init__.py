"""IC-SSL: in-context semi-supervised learning on manifolds (``shared/papers/icssl_*.md``)."""

from lit_icl.icssl.data import ManifoldDataModule
from lit_icl.icssl.module import ICSSLModule

__all__ = ["ICSSLModule", "ManifoldDataModule"]
