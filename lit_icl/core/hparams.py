"""Saving a constructor's arguments as hyper-parameters without keeping the functions that called it alive.

Every module and data module records its ``__init__`` arguments with Lightning's ``save_hyperparameters()``, which
reads them from the calling frame. Called without a frame, Lightning takes it with ``inspect.currentframe()`` into
a local variable of its own, so its frame refers to itself: a reference cycle that only the garbage collector
frees. Until a collection does, which may be long after, that frame holds its caller's frame, and so every frame up
the stack: CPython keeps a returned function's local variables while another frame still refers to it. A model or
data module built inside a function therefore kept that function's local variables (tensors, trainers, loaders)
alive after it returned.

One case is costly beyond memory. A DataLoader iterator with persistent workers held that way is freed by the
collector, which runs its queues' finalizers before the iterator's own clean-up: the clean-up's "stop" never
reaches the workers, and each waits out its 5 s join timeout (a 10 s pause in the test suite, two workers).
:func:`save_init_hparams` hands Lightning the frame instead, so nothing refers to itself.
"""

from __future__ import annotations

import sys

from lightning.pytorch.core.mixins import HyperparametersMixin


def save_init_hparams(obj: HyperparametersMixin, up: int = 1) -> None:
    """``obj.save_hyperparameters()`` for the constructor ``up`` frames above this call, without a reference cycle.

    Args:
        obj: the module or data module being constructed.
        up: where its ``__init__`` is: 1, the function that calls this; 2, that function's caller (a helper such as
            :meth:`lit_icl.core.module.ICLModule.save_reloadable_hparams`, itself called from the ``__init__``).

    The arguments recorded are those of Lightning's own call from the same ``__init__``: Lightning walks up from
    that frame through every constructor of the class hierarchy (a subclass's arguments included).
    """
    # sys._getframe(0) is this call; the frame is passed on, not stored in a variable of this one.
    obj.save_hyperparameters(frame=sys._getframe(up))
