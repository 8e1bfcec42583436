"""Fixtures of the I2CL tests (module-scoped: the tiny models are built once per test file)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from i2cl.helpers import tiny_model, tiny_tokenizer

from lit_icl.i2cl.nets import CausalLM


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def net(request, tokenizer) -> CausalLM:
    return CausalLM.from_objects(tiny_model(request.param, len(tokenizer)), tokenizer)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory, tokenizer) -> str:
    """A tiny random Llama saved as a plain HF folder, for the CLI."""
    path = tmp_path_factory.mktemp("tiny_llama")
    tiny_model("llama", len(tokenizer)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)
