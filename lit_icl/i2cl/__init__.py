"""Implicit in-context learning, I2CL (``shared/papers/i2cl_implicit_in_context_learning.md``).

A frozen HuggingFace causal LM (:class:`CausalLM`), the tasks of App. A / C.2 and local (text, label) files
(:class:`I2CLDataModule`), and :class:`I2CLModule`: context vectors (Eq. 2-3), injection (Eq. 4), noisy
self-calibration (Eq. 5-6) and the baselines. This package imports ``transformers`` and ``datasets`` only when a
model or a hub task is loaded, so the rest of lit_icl works without the ``i2cl`` extra.
"""

from lit_icl.i2cl.data import TASKS, I2CLDataModule
from lit_icl.i2cl.module import METHODS, I2CLModule, calibrate, transfer_init
from lit_icl.i2cl.nets import CausalLM

__all__ = ["METHODS", "TASKS", "CausalLM", "I2CLDataModule", "I2CLModule", "calibrate", "transfer_init"]
