"""Shared by the I2CL tests: a tiny byte-level tokenizer, tiny random Llama / GPT-2 models built from configs (no
weights, seconds), a small synthetic data module, and the CLI arguments of a tiny offline run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from lit_icl.i2cl.data import I2CLDataModule

OFFLINE = "configs/i2cl/offline.yaml"


CORPUS = [
    "Review: a great film , truly moving .\nSentiment: positive\n",
    "Review: dull and boring , a waste .\nSentiment: negative\n",
    "Input: abc def ghi\nLabel: A\n",
    "Input: !@ #$ %^\nLabel: B\n",
    "Input: 12 345 6789\nLabel: C\n",
    "the quick brown fox jumps over the lazy dog 0123456789",
]


def tiny_tokenizer():
    """A byte-level BPE tokenizer trained in memory on a few lines (GPT-2 style: leading-space tokens)."""
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS * 20, vocab_size=400, min_frequency=1, special_tokens=["<eos>"])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<eos>")


def tiny_model(kind: str, vocab: int, max_positions: int = 256, init_range: float = 0.02):
    torch.manual_seed(0)
    if kind == "llama":
        cfg = transformers.LlamaConfig(
            vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=max_positions, attn_implementation="eager",
            initializer_range=init_range,
        )
    else:
        cfg = transformers.GPT2Config(
            vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=max_positions,
            attn_implementation="eager", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        )
    return transformers.AutoModelForCausalLM.from_config(cfg).float()


#: Decoder families the I2CL hooks are tested on, with what their blocks add to the residual stream:
#: (attention write, MLP write). Pre-norm blocks write the sub-layer output itself (or its residual dropout, which
#: is the identity in eval mode); Gemma-2/3 and OLMo-2 write the output of a post-sub-layer norm.
FAMILIES = {
    "llama": ("self_attn", "mlp"), "mistral": ("self_attn", "mlp"), "qwen2": ("self_attn", "mlp"),
    "qwen3": ("self_attn", "mlp"), "gemma": ("self_attn", "mlp"),
    "gemma2": ("post_attention_layernorm", "post_feedforward_layernorm"),
    "gemma3_text": ("post_attention_layernorm", "post_feedforward_layernorm"),
    "olmo2": ("post_attention_layernorm", "post_feedforward_layernorm"),
    "phi3": ("resid_attn_dropout", "resid_mlp_dropout"),
    "gpt2": ("attn", "mlp"), "gptj": ("attn", "mlp"),
    "gpt_neox": ("post_attention_dropout", "post_mlp_dropout"),  # parallel residual (the default)
    "gpt_neox_sequential": ("post_attention_dropout", "post_mlp_dropout"),
}


def tiny_family(kind: str, vocab: int):
    """A 2-layer random model of one of :data:`FAMILIES` (width 32, eager attention, float32)."""
    torch.manual_seed(0)
    ids = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    if kind in ("gpt2", "gptj"):
        cfg = transformers.AutoConfig.for_model(kind, vocab_size=vocab, n_embd=32, n_layer=2, n_head=4,
                                                n_positions=256, **({"rotary_dim": 4} if kind == "gptj" else {}),
                                                bos_token_id=1, eos_token_id=2)
    else:
        model_type = "gpt_neox" if kind.startswith("gpt_neox") else kind
        extra = {"use_parallel_residual": False} if kind == "gpt_neox_sequential" else {}
        if model_type != "gpt_neox":
            extra.update(num_key_value_heads=2, head_dim=8)
        cfg = transformers.AutoConfig.for_model(
            model_type, vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, max_position_embeddings=256, **extra, **ids,
        )
    cfg._attn_implementation = "eager"
    return transformers.AutoModelForCausalLM.from_config(cfg).float()


def synthetic_dm(**kw) -> I2CLDataModule:
    args = {"task": "synthetic", "eval_samples": 12, "holdout_samples": 6, "shots_per_class": 2, "synthetic_train": 60,
                "synthetic_test": 30}
    args.update(kw)
    return I2CLDataModule(**args)


# ---------------------------------------------------------------------- CLI
#: What a run that switches :func:`cli_args` to a file task (``jsonl`` / ``csv``) adds: the synthetic task's pool sizes
#: back at their defaults, since a file task never reads them and refuses them otherwise.
SYNTHETIC_SIZES_OFF = ("--data.init_args.synthetic_train", "300", "--data.init_args.synthetic_test", "600")


def cli_args(tmp_path: Path, llama_dir: str, *extra: str) -> list[str]:
    return [
        "--config", OFFLINE,
        "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"),
        "--trainer.logger.init_args.name", "tiny",
        "--trainer.max_epochs", "2",
        "--trainer.enable_model_summary", "false",
        "--trainer.log_every_n_steps", "1",
        "--model.init_args.net.init_args.model_name_or_path", llama_dir,
        "--model.init_args.methods", "[zero_shot, few_shot, noise_vector, task_vector, i2cl, icl_i2cl]",
        "--data.init_args.task", "synthetic",
        "--data.init_args.train_file", "null",
        "--data.init_args.test_file", "null",
        "--data.init_args.template", "null",
        "--data.init_args.label_words", "null",
        "--data.init_args.shots_per_class", "2",
        "--data.init_args.eval_samples", "9",
        "--data.init_args.holdout_samples", "3",
        "--data.init_args.synthetic_train", "30",
        "--data.init_args.synthetic_test", "15",
        *extra,
    ]
