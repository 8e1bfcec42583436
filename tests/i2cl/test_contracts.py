"""The shipped I2CL data module and LM wrapper satisfy lit_icl.i2cl.contracts (what I2CLModule reads and expects),
and the module refuses objects that do not."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from i2cl.helpers import synthetic_dm
from torch import nn

from lit_icl.core.errors import ConfigError
from lit_icl.core.protocols import implements
from lit_icl.i2cl import CausalLM, I2CLData, I2CLModule, I2CLNet


def test_data_module_satisfies_the_data_contract() -> None:
    dm = synthetic_dm(data_seed=3)
    assert implements(dm, I2CLData) and dm.data_seed == 3
    assert dm.task_data().demos


def test_causal_lm_satisfies_the_net_contract(net: CausalLM) -> None:
    assert implements(net, I2CLNet)
    assert net.n_layers == 2 and net.hidden_size == 32 and net.max_positions == 256 and net.kv_width > 0


def test_module_refuses_a_net_or_data_module_outside_the_contract(net: CausalLM) -> None:
    with pytest.raises(ConfigError, match="lit_icl.i2cl.contracts.I2CLNet"):
        I2CLModule(net=nn.Linear(2, 2))
    with pytest.raises(ConfigError, match="lit_icl.i2cl.contracts.I2CLData"):
        I2CLModule(net=net, methods=["zero_shot"]).bind_datamodule(object())
