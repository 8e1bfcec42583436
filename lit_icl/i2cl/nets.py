"""A frozen HuggingFace causal LM with the hooks I2CL needs (plain ``nn.Module``, no Lightning).

- :meth:`CausalLM.capture` records every layer's attention output ``a_l`` and MLP output ``m_l`` (Eq. 1: what
  each sub-layer writes into the residual stream, before the residual add), and each block's output (the
  residual stream itself, used by the task-vector baseline).
- :meth:`CausalLM.inject` replaces ``a_l^t`` by ``lambda_l^a v_l^a + beta_l^a a_l^t`` and ``m_l^t`` by
  ``lambda_l^m v_l^m + beta_l^m m_l^t`` at every layer and token (Eq. 4), optionally with the calibration noise
  of Eq. 6: ``gamma ||x||_2 eta`` added to the injected output, ``x`` that output itself (the public code, the
  default) or the *residual stream* after the sub-layer (Eq. 6 as written; adding the noise to the sub-layer's
  output is the same thing because the residual add is linear).
- :meth:`CausalLM.replace_hidden` writes a vector into one block's output at the last real token (task vector).

Which modules are hooked (``hook_point``): by default what each sub-layer writes into the residual stream;
``hook_point: module`` hooks the attention and MLP modules themselves, as the authors' public code does (its module
paths ``layers.{l}.self_attn`` / ``.mlp``): on post-norm blocks the context vectors are then the raw sub-layer
outputs, and the post-norm rescales ``lambda v + beta a`` (and the calibration noise) before it reaches the stream.

The write is read from the model, not from a list of model types (:func:`decoder_layout`): the
decoder blocks are the model's ``nn.ModuleList`` of ``num_hidden_layers`` identical blocks, each with one attention
and one MLP child; a probe forward then follows each sub-layer's output through the block to the module whose
output is added to the residual stream. In pre-norm blocks (Llama, Mistral, Qwen, Gemma 1, Phi-3, GPT-2, GPT-J,
GPT-NeoX) that is the sub-layer itself (or its residual dropout); in blocks with post-sub-layer norms (Gemma-2/3,
OLMo-2) it is that norm, so ``v``, ``lambda`` and ``beta`` act on what enters the stream, as Eq. 1 and 4 define
them. The probe checks ``block out = block in + attention write + MLP write`` at every layer (sequential and
parallel blocks alike) and refuses, in one line naming what it found, a layout where that does not hold.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn

from lit_icl.core.errors import ConfigError
from lit_icl.core.nets import RecordedNet
from lit_icl.core.transfer import to_device
from lit_icl.core.validation import check_literal

#: Index of each hooked sub-layer in the ``(L, 2, ...)`` context-vector and coefficient tensors.
ATTN, MLP = 0, 1
#: Child names of a decoder block that hold its attention / MLP (HuggingFace's spellings across families).
ATTN_NAMES = ("self_attn", "attn", "attention", "self_attention")
MLP_NAMES = ("mlp", "feed_forward", "ffn")


def _blocks(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The decoder's ``ModuleList`` of blocks: ``num_hidden_layers`` (or ``n_layer``) blocks of one class."""
    cfg = getattr(model, "config", None)
    n = getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "n_layer", None)
    found = [(name, m) for name, m in model.named_modules()
             if isinstance(m, nn.ModuleList) and len(m) > 0 and all(type(b) is type(m[0]) for b in m)]
    matching = [(name, m) for name, m in found if n is None or len(m) == n]
    if len(matching) != 1:
        seen = ", ".join(f"{name or '<root>'}[{len(m)}]" for name, m in found) or "none"
        raise ConfigError(
            f"I2CL cannot hook {type(model).__name__}: expected one ModuleList of {n} decoder blocks, found {seen}"
        )
    return matching[0]


def _sub_layer(block: nn.Module, names: Sequence[str], what: str, where: str) -> tuple[str, nn.Module]:
    hits = [(name, m) for name, m in block.named_children() if name in names]
    if len(hits) != 1:
        children = ", ".join(name for name, _ in block.named_children())
        raise ConfigError(
            f"I2CL cannot hook {where} ({type(block).__name__}): it needs exactly one {what} child named one of "
            f"{'/'.join(names)}; its children are {children}"
        )
    return hits[0]


@torch.no_grad()
def decoder_layout(model: nn.Module) -> list[tuple[nn.Module, nn.Module, nn.Module]]:
    """``[(block, attention write, MLP write)]`` per layer: the modules whose outputs enter the residual stream.

    One probe forward (8 tokens) records every block's input and output and the input and output of each of its
    children. Starting from the attention (resp. MLP) output, the module that consumes exactly that tensor (a
    post-sub-layer norm, a residual dropout) is followed until none does; its output is the sub-layer's write. The
    layout is accepted only if ``block out - block in == attention write + MLP write`` at every layer, which is
    what Eq. 1 needs; anything else is a one-line :class:`ConfigError` saying what was found.
    """
    where, blocks = _blocks(model)
    names = [(_sub_layer(b, ATTN_NAMES, "attention", f"{where}[{i}]"), _sub_layer(b, MLP_NAMES, "MLP", f"{where}[{i}]"))
             for i, b in enumerate(blocks)]
    records: dict[nn.Module, list[tuple[Any, Any]]] = {}  # module -> [(first input, first output)] per call
    block_io: dict[int, list[Tensor]] = {}
    handles = []

    def record(module: nn.Module, args: Any, kwargs: dict[str, Any], out: Any) -> None:
        first_in = args[0] if args else kwargs.get("hidden_states")
        records.setdefault(module, []).append((first_in, _first(out)))

    for i, block in enumerate(blocks):
        for child in block.children():
            handles.append(child.register_forward_hook(record, with_kwargs=True))

        def block_hook(module: nn.Module, args: Any, kwargs: dict[str, Any], out: Any, i: int = i) -> None:
            block_io[i] = [args[0] if args else kwargs["hidden_states"], _first(out)]

        handles.append(block.register_forward_hook(block_hook, with_kwargs=True))
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        vocab = int(getattr(model.config, "vocab_size", 0) or 2)
        ids = (torch.arange(1, 9, device=device) % vocab)[None]
        model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)

    layout = []
    for i, block in enumerate(blocks):
        writes = []
        for (name, sub) in names[i]:
            calls = records.get(sub, [])
            if len(calls) != 1:
                raise ConfigError(f"I2CL cannot hook {where}[{i}].{name}: it ran {len(calls)} times in one forward")
            module, out = sub, calls[0][1]
            while True:  # follow the tensor to the module whose output the residual add reads
                consumers = [c for c in block.children() if c is not module and len(records.get(c, [])) == 1
                             and isinstance(records[c][0][0], Tensor) and records[c][0][0].shape == out.shape
                             and torch.equal(records[c][0][0], out)]
                if len(consumers) != 1:
                    break
                module, out = consumers[0], records[consumers[0]][0][1]
            writes.append((module, out))
        if i not in block_io:
            raise ConfigError(f"I2CL cannot hook {where}[{i}]: the probe forward never ran it")
        inp, out = (t.float() for t in block_io[i])
        err = (out - inp - writes[ATTN][1].float() - writes[MLP][1].float()).norm()
        # float32 sums agree to rounding; in 16-bit the residual adds round at the scale of the stream itself
        exact = block_io[i][1].dtype == torch.float32
        scale, tol = ((out - inp).norm(), 1e-3) if exact else (out.norm(), 2e-2)
        if not err <= tol * scale:
            child = {m: n for n, m in block.named_children()}
            raise ConfigError(
                f"I2CL cannot hook {where}[{i}] ({type(block).__name__}): block output minus input is not attention "
                f"plus MLP write (relative error {float(err / scale):.2g}; writes found: {child[writes[ATTN][0]]}, "
                f"{child[writes[MLP][0]]})"
            )
        layout.append((block, writes[ATTN][0], writes[MLP][0]))
    return layout


def _first(out: Any) -> Tensor:
    return out[0] if isinstance(out, tuple) else out


def _last_token_hidden(lm: nn.Module, ids: Tensor, mask: Tensor) -> Tensor:
    """The LM's final hidden state at each row's last real token, ``(B, D)`` (rows are right-padded)."""
    hidden = lm.base_model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
    last = mask.sum(1, keepdim=True) - 1  # (B, 1)
    # Selected, not indexed: indexing's backward accumulates into the hidden states with an index_put, which CUDA
    # runs by sorting the indices; this backward is a selection too. Each row sums one hidden state and zeros, so
    # the result is that state exactly (and a padded position's value, whatever it is, never enters).
    pick = torch.arange(ids.shape[1], device=ids.device) == last  # (B, T)
    return torch.where(pick.unsqueeze(-1), hidden, 0.0).sum(1)


class CalibrationForward(nn.Module):
    """The forward that calibration runs: :func:`_last_token_hidden` of the LM, under the hooks open at the call.

    It is the module ``--compile.mode`` compiles for I2CL (``I2CLModule.compile_targets``): compiling it in place
    leaves every other use of the LM (context vectors, the task vector, evaluation) eager, so one compiled graph
    serves the calibration steps and nothing else. Dynamo traces the injection hooks into that graph; a new
    ``inject`` context with the same hook code reuses it. It holds the LM without registering it, so the LM's
    weights appear once in the state dict (under the :class:`CausalLM`).
    """

    def __init__(self, lm: nn.Module):
        super().__init__()
        object.__setattr__(self, "lm", lm)  # not a child module: see the class docstring

    def forward(self, ids: Tensor, mask: Tensor) -> Tensor:
        return _last_token_hidden(self.lm, ids, mask)


def _replace_first(out: Any, new: Tensor) -> Any:
    return (new, *out[1:]) if isinstance(out, tuple) else new


#: What Eq. 6's calibration noise is relative to (see :meth:`CausalLM.inject`).
NoiseNorm = Literal["stream", "sublayer"]
#: Which modules are hooked: ``write``, what enters the residual stream (after a post-sub-layer norm), or
#: ``module``, the attention / MLP modules' own outputs (the public code; before that norm).
HookPoint = Literal["write", "module"]
#: The LM's weight dtype: ``auto`` is bfloat16 on a GPU, float32 on CPU.
DType = Literal["auto", "float32", "bfloat16", "float16"]


class CausalLM(RecordedNet):
    """A frozen causal LM and its tokenizer, with capture / injection hooks.

    Args:
        model_name_or_path: hub id (e.g. ``meta-llama/Llama-2-7b-hf``) or local folder.
        gguf_file: optional GGUF file name inside ``model_name_or_path`` (dequantised on load; slow, so export
            once with ``python -m lit_icl.i2cl.build`` for repeated use).
        dtype: ``auto`` (bfloat16 on a GPU, float32 on CPU), ``float32``, ``bfloat16`` or ``float16``.
        trust_remote_code: passed to ``from_pretrained``.
        hook_point: ``write`` (default) captures and injects what each sub-layer adds to the residual stream (Eq. 1
            and 4 read literally); ``module`` hooks the attention and MLP modules themselves, before a post-sub-layer
            norm (the public code's module paths; on pre-norm blocks such as Llama's, the same modules as ``write``).
            On Gemma 3 270M ``write`` with the public code's noise scaling was the best measured recipe
            (``experiments/results/i2cl_recipes_cpu.md``).
    """

    def __init__(
        self,
        model_name_or_path: str = "meta-llama/Llama-2-7b-hf",
        gguf_file: str | None = None,
        dtype: DType = "auto",
        trust_remote_code: bool = False,
        hook_point: HookPoint = "write",
    ):
        super().__init__()
        check_literal("dtype", dtype, DType)
        check_literal("hook_point", hook_point, HookPoint)
        if not isinstance(model_name_or_path, str) or not model_name_or_path:
            raise ConfigError(f"model_name_or_path={model_name_or_path!r} must be a hub id or a local folder")
        if gguf_file is not None and not (Path(model_name_or_path) / gguf_file).is_file():
            raise ConfigError(
                f"gguf_file={gguf_file!r} is not a file in {model_name_or_path!r}; give the folder that holds it"
            )
        # Imported here: `python -m lit_icl.i2cl.build` runs that module as a script, and the package importing it
        # first would make runpy warn (tests/test_repository.py).
        from lit_icl.i2cl.build import ensure_offline, offline_hint

        local = Path(model_name_or_path)
        # A local path that is not there (a hub id has at most one '/'): an offline model folder is exported on
        # first use when its package is installed; otherwise say how, not the hub's rules for repo ids.
        looks_local = local.is_absolute() or model_name_or_path.startswith((".", "data/")) or model_name_or_path.count("/") > 1
        if not local.exists() and looks_local and not ensure_offline(local):
            raise ConfigError(f"no model folder at {model_name_or_path}: {offline_hint(local)} (docs/i2cl.md)")
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if dtype == "auto":
            torch_dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
        else:
            torch_dtype = getattr(torch, dtype)
        kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
        if gguf_file is not None:
            kwargs["gguf_file"] = gguf_file
        from transformers.utils import logging as hf_logging

        # No per-tensor progress bar: a local model of this size loads in seconds, and a bad value of the module
        # after the net is built must be refused in one line alone.
        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        try:
            tokenizer = AutoTokenizer.from_pretrained(model_name_or_path, **kwargs)
            model = AutoModelForCausalLM.from_pretrained(model_name_or_path, dtype=torch_dtype, **kwargs)
        except OSError as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ConfigError(
                f"cannot load model {model_name_or_path!r}: {first} (offline? use an offline model, "
                "--model.init_args.net.init_args.model_name_or_path data/i2cl/smollm2-135m-instruct or "
                "data/i2cl/gemma-3-270m: docs/i2cl.md)"
            ) from None
        finally:
            if bars:
                hf_logging.enable_progress_bar()
        self._setup(model, tokenizer, hook_point)

    @classmethod
    def from_objects(cls, model: nn.Module, tokenizer: Any, hook_point: HookPoint = "write") -> CausalLM:
        """Wrap an already built model and tokenizer (tests build tiny random ones with ``from_config``)."""
        check_literal("hook_point", hook_point, HookPoint)
        obj = cls.__new__(cls)
        nn.Module.__init__(obj)
        obj._setup(model, tokenizer, hook_point)
        return obj

    def _setup(self, model: nn.Module, tokenizer: Any, hook_point: HookPoint) -> None:
        writes = decoder_layout(model)  # refuses unsupported families before anything else
        where, blocks = _blocks(model)
        modules = [(block, _sub_layer(block, ATTN_NAMES, "attention", f"{where}[{i}]")[1],
                    _sub_layer(block, MLP_NAMES, "MLP", f"{where}[{i}]")[1]) for i, block in enumerate(blocks)]
        # True when some block normalises a sub-layer's output before the residual add (Gemma-2/3, OLMo-2): its write
        # is another module that has weights (a residual dropout, as in Phi-3 or GPT-NeoX, has none and is the
        # identity in eval mode, so hooking before it changes nothing)
        self.post_norm = any(w is not m and next(w.parameters(), None) is not None
                             for wl, ml in zip(writes, modules) for w, m in zip(wl[1:], ml[1:]))
        #: ``[(block, hooked attention, hooked MLP)]`` per layer (see ``hook_point``).
        self.layout = writes if hook_point == "write" else modules
        self.hook_point = hook_point
        model.eval()
        for p in model.parameters():
            p.requires_grad_(False)  # frozen: only the 4L coefficients of the LightningModule train
        self.lm = model
        #: What calibration runs and ``--compile.mode`` compiles (see :class:`CalibrationForward`).
        self.calibration_forward = CalibrationForward(model)
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
        #: ``final_logit_softcapping`` of Gemma-2/3 (``None`` elsewhere), applied as the model's own head does.
        self.softcap = getattr(cfg, "final_logit_softcapping", None)

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
        # From pinned memory: a blocking copy to a GPU waits for every kernel queued before it (a device sync per
        # call), and a pageable one may (lit_icl.core.transfer).
        return to_device(ids, self.device), to_device(mask, self.device)

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
        """Float32 next-token logits at each row's last real token, ``(B, vocab)`` (always eager).

        Only the gathered hidden states go through the output head (the vocabulary is large).
        """
        return self._read_out(_last_token_hidden(self.lm, ids, mask))

    def calibration_logits(self, ids: Tensor, mask: Tensor) -> Tensor:
        """:meth:`last_logits` through :attr:`calibration_forward`, compiled when ``--compile.mode`` asks.

        Eager, it runs the same operations as :meth:`last_logits`, so its values are the same to the bit.
        """
        return self._read_out(self.calibration_forward(ids, mask))

    @property
    def calibration_compiled(self) -> bool:
        """Whether :attr:`calibration_forward` has been compiled in place (``nn.Module.compile``)."""
        return getattr(self.calibration_forward, "_compiled_call_impl", None) is not None

    def _read_out(self, h: Tensor) -> Tensor:
        logits = self.lm.get_output_embeddings()(h).float()
        if self.softcap:  # Gemma-2/3 squash the final logits (monotone, but it changes the calibration loss)
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def draw_noise(self, ids: Tensor, noise_first: bool = True) -> Tensor:
        """Eq. 6's standard-normal draws for one forward of ``ids``, ahead of it: ``(L, 2, B, T, D)`` float32.

        The same calls, in the same order, as :meth:`inject`'s hooks make during an eager forward (one
        ``(B, T, D)`` draw per layer, attention then MLP), so the values are the eager run's. A compiled forward
        takes them as an input: a draw inside the graph would come from the compiler's own generator.
        """
        b, t = ids.shape
        eta = torch.stack([torch.randn(b, t, self.hidden_size, device=ids.device)
                           for _ in range(self.n_layers) for _ in range(2)]).view(self.n_layers, 2, b, t, -1)
        if not noise_first:
            eta[..., 0, :] = 0
        return eta

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
    def inject(self, context: Tensor, coef: Tensor, gamma: float = 0.0,
               noise_norm: NoiseNorm = "sublayer", noise_first: bool = True,
               noise: Tensor | None = None) -> Iterator[None]:
        """Eq. 4 (and Eq. 6's noise when ``gamma > 0``) at every layer and token while the context is open.

        Args:
            context: ``(L, 2, D)`` context vectors ``v`` (index 0 attention, 1 MLP).
            coef: ``(L, 2, 2)`` coefficients; ``coef[l, k, 0] = lambda``, ``coef[l, k, 1] = beta``.
            gamma: relative noise level of Eq. 6 (0 at evaluation).
            noise_norm: what the noise scales with: ``stream``, the residual stream after the sub-layer (Eq. 6 as
                the paper writes it), or ``sublayer``, the injected sub-layer output itself (the public code's
                ``out += gamma ||out|| eta``). They differ by the ratio of the two norms, large in models whose
                residual stream carries a few huge coordinates (Gemma's grows to ~40,000 while a write is ~3,000).
                ``stream`` needs ``hook_point: write`` on post-norm blocks (the stream after a raw sub-layer output
                is not known until its norm has run).
            noise_first: ``False`` spares the first position (the attention sink most LMs park on their first
                token) from the noise; the draws are the same, position 0's are zeroed.
            noise: the draws of :meth:`draw_noise` for the coming forward, ``(L, 2, B, T, D)``; ``None`` (the eager
                path) draws each one in its hook, so only one is held at a time.
        """
        check_literal("noise_norm", noise_norm, NoiseNorm)
        if gamma > 0 and noise_norm == "stream" and self.hook_point == "module" and self.post_norm:
            raise ValueError("noise_norm='stream' needs hook_point='write' on post-norm blocks; use "
                             "noise_norm='sublayer'")
        if context.shape != (self.n_layers, 2, self.hidden_size) or coef.shape != (self.n_layers, 2, 2):
            raise ValueError(
                f"context {tuple(context.shape)} / coef {tuple(coef.shape)} do not fit "
                f"L={self.n_layers}, D={self.hidden_size}"
            )
        if noise is not None and (noise.shape[:2] != (self.n_layers, 2) or noise.shape[-1] != self.hidden_size):
            raise ValueError(f"noise {tuple(noise.shape)} does not fit L={self.n_layers}, D={self.hidden_size}")
        state: dict[int, Tensor] = {}  # the residual stream entering the next hooked sub-layer, per layer
        handles = []

        def noisy(new: Tensor, residual: Tensor, layer: int, kind: int) -> Tensor:
            # eta ~ N(0, I) scaled by the (detached) L2 norm of the residual stream it perturbs (Eq. 6), or of the
            # sub-layer output (public code)
            scale = new if noise_norm == "sublayer" else residual.float() + new
            if noise is None:
                eta = torch.randn_like(new)
                if not noise_first:
                    eta[..., 0, :] = 0
            else:
                eta = noise[layer, kind]
            return new + gamma * scale.detach().norm(dim=-1, keepdim=True) * eta

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
                    new = noisy(new, state[layer], layer, kind)
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
