"""Implicit in-context learning, I2CL.

Implements Zhuowei Li, Zihao Xu, Ligong Han, Yunhe Gao, Song Wen, Di Liu, Hao Wang and Dimitris N. Metaxas,
*Implicit In-context Learning*, ICLR 2025, arXiv:2405.14660.

Files: ``tasks.py`` (the tasks of App. A / C.2 and local (text, label) files, as text), ``data.py``
(:class:`I2CLDataModule`: demonstrations, calibration batches, evaluation queries), ``nets.py`` (the frozen
HuggingFace causal LM, :class:`CausalLM`: capture of Eq. 1-2, injection of Eq. 4 with Eq. 6's noise),
``calibration.py`` (Eq. 5's loss, the schedules, the plain calibration loop, Algorithm 1's transfer),
``module.py`` (:class:`I2CLModule`: context vectors, calibration under Lightning, the baselines, the test rows),
``build.py`` (the offline models and tasks, built on first use or by ``python -m lit_icl.i2cl.build``) and
``contracts.py`` (what the module needs of its data module and LM: :class:`I2CLData`, :class:`I2CLNet`). This package imports ``transformers`` and ``datasets`` only when a
model or a hub task is loaded, so the rest of lit_icl works without the ``i2cl`` extra.
"""

from lit_icl.i2cl.calibration import calibrate, transfer_init
from lit_icl.i2cl.contracts import I2CLData, I2CLNet
from lit_icl.i2cl.data import I2CLDataModule
from lit_icl.i2cl.module import METHODS, I2CLModule
from lit_icl.i2cl.nets import CausalLM
from lit_icl.i2cl.tasks import TASKS

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
