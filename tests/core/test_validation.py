"""Unit tests of lit_icl.core.validation: each checker accepts the edge of its range, refuses just past it
with a ConfigError naming the option and the value, and check_run_config calls the hooks it promises to."""

from __future__ import annotations

import math
from typing import ClassVar

import pytest
from torch import nn

from lit_icl.core.errors import ConfigError
from lit_icl.core.validation import (
    check_choice,
    check_fraction,
    check_int,
    check_nonempty,
    check_nonnegative,
    check_pair_ordered,
    check_positive,
    check_range,
    check_run_config,
    check_unique,
)


def _refused(fn, *args, **kwargs) -> str:
    with pytest.raises(ConfigError) as info:
        fn(*args, **kwargs)
    msg = str(info.value)
    assert "\n" not in msg, "messages are one line"
    return msg


def test_check_int() -> None:
    assert check_int("n", 3) == 3 and type(check_int("n", 3)) is int
    assert check_int("n", 2, minimum=2) == 2
    assert _refused(check_int, "n_points", 1, minimum=2, hint="an episode needs 2") == (
        "n_points=1 must be >= 2; an episode needs 2"
    )
    assert "must be an integer" in _refused(check_int, "n", 2.0)
    assert "must be an integer" in _refused(check_int, "n", True)  # bools are not counts
    assert "must be an integer" in _refused(check_int, "n", "3")


def test_check_positive_and_nonnegative() -> None:
    assert check_positive("lr", 1e-9) == 1e-9
    assert check_positive("lr", 3) == 3.0 and type(check_positive("lr", 3)) is float
    assert _refused(check_positive, "lr", 0.0) == "lr=0.0 must be > 0"
    assert _refused(check_positive, "lr", -1, hint="e.g. 0.003") == "lr=-1 must be > 0; e.g. 0.003"
    assert "finite" in _refused(check_positive, "lr", math.nan)
    assert "finite" in _refused(check_positive, "lr", math.inf)
    assert check_positive("chunk", 1, integer=True) == 1
    assert _refused(check_positive, "chunk", 0, integer=True) == "chunk=0 must be >= 1"
    assert check_nonnegative("wd", 0.0) == 0.0
    assert check_nonnegative("workers", 0, integer=True) == 0
    assert _refused(check_nonnegative, "wd", -1e-12).startswith("wd=-1e-12 must be >= 0")
    assert "must be an integer" in _refused(check_nonnegative, "workers", 0.5, integer=True)


def test_check_range_and_fraction() -> None:
    assert check_range("x", 0.0, 0.0, 1.0) == 0.0 and check_range("x", 1.0, 0.0, 1.0) == 1.0
    assert _refused(check_range, "x", 0.0, 0.0, 1.0, low_inclusive=False) == "x=0.0 must lie in (0, 1]"
    assert _refused(check_range, "x", 1.0, 0.0, 1.0, high_inclusive=False) == "x=1.0 must lie in [0, 1)"
    assert _refused(check_range, "x", -5, 0.0) == "x=-5 must lie in [0, inf)"
    assert _refused(check_range, "x", 5, None, 2) == "x=5 must lie in (-inf, 2]"
    assert check_range("x", -1e30) == -1e30  # no bounds: any finite number
    assert check_fraction("f", 0.5) == 0.5
    assert check_fraction("f", 1.0, closed_high=True) == 1.0
    assert _refused(check_fraction, "f", 1.0) == "f=1.0 must lie in (0, 1)"
    assert _refused(check_fraction, "f", 0.0, closed_high=True) == "f=0.0 must lie in (0, 1]"


def test_check_choice_nonempty_unique() -> None:
    assert check_choice("kernel", "rbf", ("rbf", "linear")) == "rbf"
    assert _refused(check_choice, "kernel", "poly", ("rbf", "linear")) == (
        "kernel='poly' is not a valid choice; choose one of 'rbf', 'linear'"
    )
    assert check_nonempty("r", (0.1, 0.2)) == [0.1, 0.2]
    assert _refused(check_nonempty, "r", [], example="[0.1]") == "r is empty; give at least one value; e.g. [0.1]"
    assert "must be a list" in _refused(check_nonempty, "manifolds", "cylinder")  # a bare string is no list
    assert check_unique("r", [0.1, 0.2]) == [0.1, 0.2]
    assert _refused(check_unique, "r", [0.1, 0.2, 0.1]) == "r=[0.1, 0.2, 0.1] repeats 0.1; list each value once"


def test_check_pair_ordered() -> None:
    assert check_pair_ordered("p", (0.1, 0.1)) == (0.1, 0.1)
    assert check_pair_ordered("p", [1, 2]) == (1.0, 2.0)
    assert _refused(check_pair_ordered, "p", (0.1, 0.1), strict=True) == (
        "p=(0.1, 0.1) must be (low, high) with low < high; swap the two values"
    )
    assert _refused(check_pair_ordered, "p", (2, 1)) == "p=(2, 1) must be (low, high) with low <= high; swap the two values"
    assert _refused(check_pair_ordered, "p", (0.0, 1.0), low=0.0, low_inclusive=False) == (
        "p=(0.0, 1.0): both ends must lie in (0, inf)"
    )
    assert _refused(check_pair_ordered, "p", (0.5, 2.0), high=1.0) == "p=(0.5, 2.0): both ends must lie in (-inf, 1]"
    assert "pair of two numbers" in _refused(check_pair_ordered, "p", [1.0])
    assert "finite" in _refused(check_pair_ordered, "p", [0.0, math.inf])


class _Recorder:
    def __init__(self, log: list, name: str, fail: bool = False):
        self.log, self.name, self.fail = log, name, fail

    def check_config(self, *, trainer, model, datamodule) -> None:
        self.log.append((self.name, trainer, model, datamodule))
        if self.fail:
            raise ConfigError(f"{self.name} refuses")


class _Net(nn.Module):
    def __init__(self, log: list, name: str):
        super().__init__()
        self.rec = _Recorder(log, name)
        self.lin = nn.Linear(1, 1)

    def check_config(self, **kwargs) -> None:
        self.rec.check_config(**kwargs)


class _Model(nn.Module):
    def __init__(self, log: list):
        super().__init__()
        self.a = _Net(log, "net_a")
        self.b = nn.Sequential(_Net(log, "net_b"))


class _Trainer:
    def __init__(self, callbacks: list):
        self.callbacks = callbacks


def test_check_run_config_calls_every_hook_once_in_order() -> None:
    log: list = []
    dm = _Recorder(log, "datamodule")
    model = _Model(log)
    cb = _Recorder(log, "callback")
    trainer = _Trainer([cb, object(), cb])  # objects without the hook are skipped; each object runs once
    check_run_config(trainer, model, dm)
    assert [e[0] for e in log] == ["datamodule", "net_a", "net_b", "callback"]
    assert all(e[1] is trainer and e[2] is model and e[3] is dm for e in log)


def test_check_run_config_propagates_the_first_error_and_tolerates_none() -> None:
    log: list = []
    trainer = _Trainer([_Recorder(log, "first", fail=True), _Recorder(log, "second")])
    with pytest.raises(ConfigError, match="first refuses"):
        check_run_config(trainer, None, None)
    assert [e[0] for e in log] == ["first"]
    check_run_config(None, None, None)  # nothing to check


def test_real_hooks_compare_against_the_data_sizes() -> None:
    """The shipped hooks: the EIG baseline and the metrics callback refuse sizes the episodes cannot hold."""
    from lit_icl.callbacks import RepresentationMetrics
    from lit_icl.icssl.nets import InContextEigenmap, LaplacianEigenmap

    class _DM:
        n_points = 20

    LaplacianEigenmap(n_components=20, n_neighbors=19).check_config(datamodule=_DM())
    assert "n_neighbors=20" in _refused(LaplacianEigenmap(n_neighbors=20).check_config, datamodule=_DM())
    assert "n_components=21" in _refused(LaplacianEigenmap(n_components=21).check_config, datamodule=_DM())
    RepresentationMetrics(k=19).check_config(datamodule=_DM())
    assert "choose k <= 19" in _refused(RepresentationMetrics(k=20).check_config, datamodule=_DM())
    InContextEigenmap(n_points=20, stack_repeats=1).check_config(datamodule=_DM())
    assert "set the representation's n_points to 20" in _refused(
        InContextEigenmap(n_points=30, stack_repeats=1).check_config, datamodule=_DM()
    )
    # A data module without the attribute (another paper's) is not checked.
    RepresentationMetrics(k=50).check_config(datamodule=object())
    # Pairs against the embeddings a module declares it returns per stage (unchecked if it declares none).

    class _Module:
        embedding_names: ClassVar[dict[str, tuple[str, ...]]] = {"val": ("eig", "model"), "test": ("model",)}

    RepresentationMetrics(pairs=[("model", "eig")]).check_config(model=object(), datamodule=_DM())
    msg = _refused(RepresentationMetrics(pairs=[("model", "eig")]).check_config, model=_Module(), datamodule=_DM())
    assert msg == (
        "RepresentationMetrics pairs name embeddings ['eig'] that the test step does not return "
        "(it returns ['model'])"
    )
    _Module.embedding_names = {"val": ("eig", "model")}
    RepresentationMetrics(pairs=[("model", "eig")]).check_config(model=_Module(), datamodule=_DM())


def test_check_literal_reads_the_choices_from_the_type() -> None:
    from typing import Literal

    from lit_icl.core.validation import check_literal, literal_choices

    Mode = Literal["add", "replace"]
    Wide = Literal[Mode, "none"]  # a Literal of Literals is flattened, as typing itself does
    assert literal_choices(Wide) == ("add", "replace", "none")
    assert check_literal("context_logit", "add", Mode) == "add"
    with pytest.raises(ConfigError, match=r"context_logit='sum' is not a valid choice; choose one of 'add', 'replace'"):
        check_literal("context_logit", "sum", Mode)
    with pytest.raises(TypeError, match="not a Literal"):
        literal_choices(str)
