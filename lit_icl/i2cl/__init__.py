"""Implicit in-context learning, I2CL.

Implements Zhuowei Li, Zihao Xu, Ligong Han, Yunhe Gao, Song Wen, Di Liu, Hao Wang and Dimitris N. Metaxas,
*Implicit In-context Learning*, ICLR 2025, arXiv:2405.14660.

A frozen HuggingFace causal LM (:class:`CausalLM`), the tasks of App. A / C.2 and local (text, label) files
(:class:`I2CLDataModule`), and :class:`I2CLModule`: context vectors (Eq. 2-3), injection (Eq. 4), noisy
self-calibration (Eq. 5-6) and the baselines. ``contracts.py`` says what the module needs of its data module and
LM (:class:`I2CLData`, :class:`I2CLNet`). This package imports ``transformers`` and ``datasets`` only when a
model or a hub task is loaded, so the rest of lit_icl works without the ``i2cl`` extra.
"""

from lit_icl.i2cl.contracts import I2CLData, I2CLNet
from lit_icl.i2cl.data import TASKS, I2CLDataModule
from lit_icl.i2cl.module import METHODS, I2CLModule, calibrate, transfer_init
from lit_icl.i2cl.nets import CausalLM

__all__ = [
    "METHODS",
    "TASKS",
    "CausalLM",
    "I2CLData",
    "I2CLDataModule",
    "I2CLModule",
    "I2CLNet",
    "calibrate",
    "transfer_init",
]
