"""CoQE networks for few-shot classification on image sequences (CoQE paper Sec. 4.2, 5.2, App. C.2).

The causal Transformer they share with the regression experiment is in :mod:`lit_icl.coqe.layers`.

- :class:`ResNetEmbedder`: 4 groups x 2 bottleneck residual blocks (Chan et al.'s "SimpleResNet"), group
  widths 16/32/32/64 for E = 64, 64/128/128/256 for E = 256, 64/128/256/512 for E = 512 (App. C.2);
- :class:`SequenceTransformer`: the baseline, a causal Transformer (width 64, 8 heads) over the interleaved
  tokens ``x_1, l_1, ..., x_8, l_8, x_q`` with a linear read-out over all classes;
- :class:`CoQEClassifier`: CoQE (Sec. 4.2): a sample encoder ``s`` (ResNet + linear), a task encoder ``t``
  (Transformer + linear), a static vector per class, and the *dynamic* class vectors built from the task
  representations of the context's label tokens, which replace the static ones for classes in the context.

Both classifiers take ``images (B, S, H, W)`` in [0, 1] and the ``S - 1`` context labels ``(B, S - 1)`` and
return logits at every image position (the last one is the query), so one objective serves both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_icl.coqe.layers import TOKEN_WIDTH, CausalTransformer, sinusoidal_positions
from lit_icl.core.errors import ConfigError
from lit_icl.core.nets import RecordedNet
from lit_icl.core.validation import check_bool, check_int, check_literal, check_positive

#: How a context class's logit meets its static one: ``replace`` it (the paper) or ``add`` to it (public code).
ContextLogit = Literal["replace", "add"]
#: Which modified query logits get the training noise: ``all`` (Sec. 4.2) or ``non_context`` classes only.
NoiseOn = Literal["all", "non_context"]
#: Positions whose encoding :class:`SequenceEmbedder` keeps ready (sequences of up to 512 images).
MAX_TOKENS = 1023
#: Group widths of the ResNet for each embedding size E in App. C.2.
RESNET_CHANNELS: dict[int, tuple[int, int, int, int]] = {
    64: (16, 32, 32, 64),
    256: (64, 128, 128, 256),
    512: (64, 128, 256, 512),
}



# ------------------------------------------------------------------------------------------ ResNet
class Bottleneck(nn.Module):
    """ResNet-v1 bottleneck block: 1x1 -> c/4, 3x3 (stride) -> c/4, 1x1 -> c, each with BN; ReLU after the add.

    The last BN's scale starts at 0 (as in Chan et al.), so every block starts as its shortcut.
    """

    def __init__(self, in_ch: int, out_ch: int, stride: int, project: bool):
        super().__init__()
        mid = max(out_ch // 4, 1)
        self.conv1 = nn.Conv2d(in_ch, mid, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(mid)
        self.conv2 = nn.Conv2d(mid, mid, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(mid)
        self.conv3 = nn.Conv2d(mid, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_ch)
        nn.init.zeros_(self.bn3.weight)
        self.shortcut = (
            nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), nn.BatchNorm2d(out_ch))
            if project
            else nn.Identity()
        )

    def forward(self, x: Tensor) -> Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + self.shortcut(x))


class ResNetEmbedder(nn.Module):
    """Chan et al.'s image embedder: ``(N, H, W)`` in [0, 1] -> ``(N, out_dim)``.

    Stem: 7x7 conv (64 channels, stride 2), BN, ReLU, 3x3 max-pool (stride 2); then 4 groups of 2 bottleneck
    blocks with strides (1, 2, 2, 2), a projection shortcut on each group's first block; global mean pool.
    105x105 inputs give feature maps 53, 27, 27, 14, 7, 4. When E > ``out_dim`` a linear layer maps back to
    ``out_dim`` = 64 (App. C.2: "a fully connected layer ... to project the final embedding dimension back to
    64 before feeding it into the Transformer").

    Args:
        emb_dim: E, one of 64, 256, 512 (App. C.2), selecting the group widths of :data:`RESNET_CHANNELS`;
            ignored when ``channels`` is given.
        channels: explicit widths of the 4 groups (each divisible by 4), e.g. for tiny test nets.
        out_dim: width of the tokens it feeds.
        stem_channels: stem width (64 in Chan et al.).
        channels_last: keep the convolutions' weights and feature maps channels-last (NHWC), the layout cuDNN's
            convolutions prefer on recent GPUs. The same function; values agree with the default layout to
            rounding, not bit for bit, so it is off by default (``benchmarks/gpu_suite.py`` measures it).
    """

    def __init__(
        self,
        emb_dim: int = 64,
        channels: Sequence[int] | None = None,
        out_dim: int = TOKEN_WIDTH,
        stem_channels: int = 64,
        channels_last: bool = False,
    ):
        super().__init__()
        # Checked even when resnet_channels overrides it, so a typo never waits for a later config change.
        check_int("emb_dim", emb_dim, minimum=1, hint=f"one of {sorted(RESNET_CHANNELS)}, or any size >= 1 beside "
                  "resnet_channels, which overrides it")
        if channels is None:
            if emb_dim not in RESNET_CHANNELS:
                raise ConfigError(
                    f"emb_dim={emb_dim!r} has no preset; use one of {sorted(RESNET_CHANNELS)} or give the 4 group "
                    f"widths as resnet_channels (e.g. --model.init_args.net.init_args.resnet_channels '[8, 16, 32, "
                    f"{emb_dim}]')"
                )
            channels = RESNET_CHANNELS[emb_dim]
        channels = tuple(channels)
        if len(channels) != 4 or any(isinstance(c, bool) or not isinstance(c, int) or c < 4 for c in channels):
            # The nets take these as `resnet_channels`, the name a config or command line gives.
            raise ConfigError(
                f"resnet_channels={list(channels)} must be 4 integers >= 4 (one width per residual group)"
            )
        check_int("out_dim", out_dim, minimum=1)
        check_int("stem_channels", stem_channels, minimum=1)
        self.channels = channels
        self.stem = nn.Sequential(
            nn.Conv2d(1, stem_channels, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(stem_channels),
            nn.ReLU(),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
        blocks: list[nn.Module] = []
        in_ch = stem_channels
        for c, stride in zip(channels, (1, 2, 2, 2)):
            blocks.append(Bottleneck(in_ch, c, stride, project=True))
            blocks.append(Bottleneck(c, c, 1, project=False))
            in_ch = c
        self.groups = nn.Sequential(*blocks)
        self.feature_dim = channels[-1]
        self.proj = nn.Linear(channels[-1], out_dim) if channels[-1] != out_dim else nn.Identity()
        self.out_dim = out_dim
        check_bool("channels_last", channels_last)
        self.channels_last = channels_last
        if channels_last:
            # Moving the module to a device or loading a checkpoint into it keeps this layout.
            self.to(memory_format=torch.channels_last)

    @staticmethod
    def strided_input_sizes(image_size: int) -> list[int]:
        """Side of the feature map entering each stride-2 3x3 convolution for ``image_size`` inputs (groups 2-4).

        Stem conv (7x7, stride 2, pad 3), max-pool (3x3, stride 2, pad 1), then each group's first block; the
        first group keeps its size. 105 gives [27, 14, 7], 28 gives [7, 4, 2].
        """
        side = (image_size - 1) // 2 + 1  # stem convolution
        side = (side - 1) // 2 + 1  # max-pool
        sizes = []
        for _ in range(3):  # groups 2, 3, 4: their first block's 3x3 convolution has stride 2
            sizes.append(side)
            side = (side - 1) // 2 + 1
        return sizes

    def check_config(self, *, trainer: Any = None, datamodule: Any = None, **_: Any) -> None:
        """Refuse bf16 on a CPU when a stride-2 3x3 convolution would see 1x1 maps (images of 16 pixels or less).

        There torch's CPU bf16 kernel returns a wrong weight gradient: the taps that only cover padding get
        whatever the memory held (``benchmarks/bf16_conv_grad.py``, torch 2.14.1: errors up to 1e34, or NaN);
        float32 on the CPU is right to rounding. A GPU uses cuDNN's kernels instead.
        """
        image_size = (getattr(datamodule, "hparams", None) or {}).get("image_size")
        if trainer is None or not isinstance(image_size, int):
            return
        if "bf16" not in str(trainer.precision) or trainer.strategy.root_device.type != "cpu":
            return
        if min(self.strided_input_sizes(image_size)) <= 1:
            raise ConfigError(
                f"trainer.precision {trainer.precision} on a CPU with image_size={image_size} feeds 1x1 feature maps "
                "into the ResNet's stride-2 convolutions, whose bf16 weight gradients torch's CPU kernels get wrong; "
                "use image_size >= 17, precision 32-true, or a GPU"
            )

    def forward(self, images: Tensor) -> Tensor:
        x = images.unsqueeze(1)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        x = self.groups(self.stem(x))
        return self.proj(x.mean(dim=(2, 3)))


# ------------------------------------------------------------------------------------------ sequences
class SequenceLogits(NamedTuple):
    """Logits at every image position ``(B, S, C)``; the last position is the query.

    ``logits`` are what the model predicts with (CoQE: the modified logits). ``static_logits`` are CoQE's
    logits from the unmodified static class vectors (for ``L_orig``), ``None`` for the Transformer.
    """

    logits: Tensor
    static_logits: Tensor | None


class SequenceEmbedder(nn.Module):
    """Tokens ``x_1, l_1, ..., x_{S-1}, l_{S-1}, x_S`` (``2S - 1`` of them) plus sinusoidal positions.

    Image tokens come from the ResNet, label tokens from a learned table (init N(0, 0.02^2) as Chan et al.);
    the query's label is never fed.
    """

    def __init__(self, resnet: ResNetEmbedder, n_classes: int | None, max_time: float = 30.0):
        check_positive("max_time", max_time, hint="the base of the positional encoding, 30 in Chan et al.")
        super().__init__()
        self.resnet = resnet
        self.label_embedding: nn.Embedding | None = None
        if n_classes is not None:
            self.build_labels(n_classes)
        self.max_time = max_time
        # The encoding of the first MAX_TOKENS positions, made once: a row does not depend on the table's length,
        # so slicing it gives the same numbers as computing it per call. Made here rather than cached in
        # `forward`, because a tensor that a compiled forward stores on the module is an output of its CUDA graph,
        # which the next replay overwrites. Not saved in checkpoints (it is a function of max_time).
        self.register_buffer("_pe", sinusoidal_positions(MAX_TOKENS, resnet.out_dim, max_time), persistent=False)

    def build_labels(self, n_classes: int) -> None:
        """Create the label table (one row per training class) once the class count is known."""
        self.label_embedding = nn.Embedding(n_classes, self.resnet.out_dim)
        nn.init.trunc_normal_(self.label_embedding.weight, std=0.02, a=-0.04, b=0.04)

    def forward(self, images: Tensor, context_labels: Tensor) -> Tensor:
        b, s, h, w = images.shape
        if context_labels.shape != (b, s - 1):
            raise ValueError(f"context_labels has shape {tuple(context_labels.shape)}, expected {(b, s - 1)}")
        if self.label_embedding is None:
            raise RuntimeError(
                "the net does not know its number of classes yet: pass n_classes, or bind the module to its data "
                "module (Trainer.fit(model, datamodule=...) or the CLI do it)"
            )
        x = self.resnet(images.reshape(b * s, h, w)).view(b, s, -1)
        lab = self.label_embedding(context_labels)
        d = x.shape[-1]
        tokens = torch.empty(b, 2 * s - 1, d, dtype=x.dtype, device=x.device)
        tokens[:, 0::2] = x
        tokens[:, 1::2] = lab.to(x.dtype)
        n = 2 * s - 1
        pe = self._pe[:n] if n <= MAX_TOKENS else sinusoidal_positions(n, d, self.max_time).to(x.device)
        return tokens + pe.to(tokens.dtype)


class _SequenceClassifier(RecordedNet):
    """What both sequence classifiers share: the class count, given or taken from the data module later.

    The data module is the one source of truth for the number of training classes. A net built with
    ``n_classes=None`` creates its class-sized layers (label table, read-out) in :meth:`set_n_classes`, which
    ``CoQEClassificationModule.bind_datamodule`` calls before any training or checkpoint restore.
    """

    n_classes: int | None
    #: Attribute name of the linear read-out over all classes.
    readout_name: str

    def set_n_classes(self, n_classes: int) -> None:
        """Build the class-sized layers for ``n_classes`` classes (once); a different count is refused."""
        check_int("n_classes", n_classes, minimum=1)
        if getattr(self, "n_classes", None) is not None:
            if n_classes != self.n_classes:
                raise ConfigError(
                    f"the net has n_classes={self.n_classes} but the data has {n_classes} training classes; set "
                    f"model.init_args.net.init_args.n_classes: {n_classes}, or leave it out (the data module sets it)"
                )
            return
        self._check_classes(n_classes)
        self.n_classes = n_classes
        self.embed.build_labels(n_classes)
        self._build_readout(n_classes)

    def _check_classes(self, n_classes: int) -> None:
        """Arguments that depend on the class count (none here)."""

    def _build_readout(self, n_classes: int) -> None:
        setattr(self, self.readout_name, nn.Linear(TOKEN_WIDTH, n_classes))

    def _init_classes(self, n_classes: int | None) -> None:
        """Called at the end of ``__init__``: build the class-sized layers now if the count is given."""
        self.n_classes = None
        if n_classes is not None:
            self.set_n_classes(n_classes)


class SequenceTransformer(_SequenceClassifier):
    """The baseline: Chan et al.'s Transformer over image/label tokens, a linear read-out over all classes.

    Args:
        n_classes: output classes = training classes of the data; ``None`` (default) takes the data module's
            ``n_labels`` when the module is bound to it.
        emb_dim: ResNet embedding size E (64, 256, 512).
        depth: Transformer layers L (4 or 12 in App. C.2).
        heads: attention heads (8).
        resnet_channels: explicit ResNet group widths (overrides ``emb_dim``; for tiny nets).
        stem_channels: width of the ResNet stem (64 in Chan et al.; smaller for CPU-scale runs).
        max_time: base of the positional encoding.
        channels_last: the ResNet's layout (:class:`ResNetEmbedder`).
    """

    method = "transformer"
    readout_name = "head"

    def __init__(
        self,
        n_classes: int | None = None,
        emb_dim: int = 64,
        depth: int = 12,
        heads: int = 8,
        resnet_channels: Sequence[int] | None = None,
        stem_channels: int = 64,
        max_time: float = 30.0,
        channels_last: bool = False,
    ):
        super().__init__()
        resnet = ResNetEmbedder(emb_dim, resnet_channels, stem_channels=stem_channels, channels_last=channels_last)
        self.embed = SequenceEmbedder(resnet, None, max_time)
        self.encoder = CausalTransformer(TOKEN_WIDTH, depth, heads)
        self._init_classes(n_classes)

    def forward(self, images: Tensor, context_labels: Tensor, noise: Tensor | None = None) -> SequenceLogits:
        if noise is not None:
            raise ValueError("the Transformer baseline takes no logit noise (that is CoQE's training trick)")
        z = self.encoder(self.embed(images, context_labels))
        return SequenceLogits(self.head(z[:, 0::2]), None)


class CoQEClassifier(_SequenceClassifier):
    """CoQE for few-shot classification (Sec. 4.2, Fig. 2).

    - sample representation ``s = Linear(h)`` of every token ``h`` (ResNet image tokens, label tokens, PE);
    - task representation ``t = Linear(Transformer(s))`` at every token;
    - static class vectors: a linear layer ``W s + b`` over all classes (the IWL path);
    - dynamic class vectors: for each class ``c`` among the labels *before* image position ``p``, the mean of
      ``t`` over the label tokens carrying ``c``; its logit ``<s_p, P_c>`` replaces the static logit
      (``context_logit="replace"``, the paper) or is added to the gradient-stopped static logit
      (``"add"``, the public code);
    - training noise (Sec. 4.2: "we add Gaussian noise to the modified logits"): ``noise (B, C)`` is added to
      the modified *query* logits of a subset of classes, chosen by ``noise_on`` and ``noise_k``:

      - ``noise_on="all"``: every class, context classes included (with ``noise_k``: only the ``noise_k``
        classes with the smallest static logits, whether in the context or not; this with
        ``context_logit="add"``, ``detach_static=True`` and ``noise_k=1500`` is the public code's rule, whose
        context logit is added to the gradient-stopped noisy static row);
      - ``noise_on="non_context"``: only classes *not* in the context (and among the ``noise_k`` smallest).
        The dynamic logits then learn to outbid a boost that is absent at test, so a context class wins most
        IWL test queries (measured; see ``docs/coqe_omniglot.md``). Kept to reproduce that finding.

      A mean added to every logit of a row does not change its softmax, so under ``noise_on="all"`` without
      ``noise_k`` only the spread of the noise acts; ``noise_k`` makes the mean act too.

    No noise is ever applied at evaluation (the module passes none).

    Prototypes are computed per sequence. (The public code averages ``t`` over the whole batch, which mixes
    different classes that share the labels 0/1 in few-shot evaluation sequences.)

    Args:
        n_classes: training classes of the data; ``None`` (default) takes the data module's ``n_labels`` when
            the module is bound to it.
        emb_dim: ResNet embedding size E (512 in the paper's main CoQE, 256 parameter-matched).
        depth: task-encoder layers L (4).
        heads: attention heads (8).
        context_logit: ``replace`` (paper) or ``add`` (public code).
        detach_static: stop the gradient of the static logits inside the modified logits, so ``L_mod`` trains
            only the context path (public code); default False (the paper does not say).
        noise_on: which query logits the training noise reaches: ``all`` (default) or ``non_context``.
        noise_k: restrict the noise to the ``noise_k`` classes with the smallest static logits; ``None`` = no
            restriction.
        resnet_channels: explicit ResNet group widths (overrides ``emb_dim``).
        stem_channels: width of the ResNet stem (64 in Chan et al.; smaller for CPU-scale runs).
        max_time: base of the positional encoding.
        channels_last: the ResNet's layout (:class:`ResNetEmbedder`).
    """

    method = "coqe"
    readout_name = "static"

    def __init__(
        self,
        n_classes: int | None = None,
        emb_dim: int = 512,
        depth: int = 4,
        heads: int = 8,
        context_logit: ContextLogit = "replace",
        detach_static: bool = False,
        noise_on: NoiseOn = "all",
        noise_k: int | None = None,
        resnet_channels: Sequence[int] | None = None,
        stem_channels: int = 64,
        max_time: float = 30.0,
        channels_last: bool = False,
    ):
        super().__init__()
        check_literal("context_logit", context_logit, ContextLogit)
        check_literal("noise_on", noise_on, NoiseOn)
        if noise_k is not None:
            check_int("noise_k", noise_k, minimum=1)
        self.context_logit = context_logit
        self.detach_static = detach_static
        self.noise_on = noise_on
        self.noise_k = noise_k
        resnet = ResNetEmbedder(emb_dim, resnet_channels, stem_channels=stem_channels, channels_last=channels_last)
        self.embed = SequenceEmbedder(resnet, None, max_time)
        self.sample_proj = nn.Linear(TOKEN_WIDTH, TOKEN_WIDTH)
        self.encoder = CausalTransformer(TOKEN_WIDTH, depth, heads)
        self.task_proj = nn.Linear(TOKEN_WIDTH, TOKEN_WIDTH)
        self._init_classes(n_classes)

    def _check_classes(self, n_classes: int) -> None:
        if self.noise_k is not None and self.noise_k > n_classes:
            raise ConfigError(
                f"noise_k={self.noise_k} exceeds n_classes={n_classes}; use <= n_classes or null"
            )

    def forward(self, images: Tensor, context_labels: Tensor, noise: Tensor | None = None) -> SequenceLogits:
        s = self.sample_proj(self.embed(images, context_labels))
        t = self.task_proj(self.encoder(s))
        s_img, t_lab = s[:, 0::2], t[:, 1::2]  # (B, S, d), (B, S-1, d)
        static = self.static(s_img)  # (B, S, C)
        n_img, n_ctx = s_img.shape[1], t_lab.shape[1]
        # Position p sees the label tokens j < p (label token j sits after image j in the sequence).
        before = torch.ones(n_img, n_ctx, device=s.device).tril(-1)  # before[p, j] = j < p
        onehot = F.one_hot(context_labels, self.n_classes).to(s.dtype)  # (B, S-1, C)
        counts = torch.einsum("pj,bjc->bpc", before.to(s.dtype), onehot)  # label-token count per class
        scores = torch.einsum("bpd,bjd->bpj", s_img, t_lab) * before.to(s.dtype)
        # <s_p, mean_j t_j> = mean_j <s_p, t_j>: average the scores, never build (B, S, C, d) prototypes.
        dynamic = torch.einsum("bpj,bjc->bpc", scores, onehot) / counts.clamp_min(1.0)
        present = counts > 0
        base = static.detach() if self.detach_static else static
        if self.context_logit == "add":
            dynamic = dynamic + static.detach()
        modified = torch.where(present, dynamic, base)
        if noise is not None:
            query = modified[:, -1] + noise.to(modified.dtype) * self.noise_mask(static[:, -1], present[:, -1])
            modified = torch.cat([modified[:, :-1], query[:, None]], dim=1)
        return SequenceLogits(modified, static)

    def noise_mask(self, static_query: Tensor, present_query: Tensor) -> Tensor:
        """``(B, C)`` 0/1: which query logits get noise (see ``noise_on`` and ``noise_k``)."""
        mask = ~present_query if self.noise_on == "non_context" else torch.ones_like(present_query)
        if self.noise_k is not None:
            smallest = torch.zeros_like(mask)
            idx = static_query.detach().topk(self.noise_k, dim=-1, largest=False).indices
            smallest.scatter_(-1, idx, True)
            mask = mask & smallest
        return mask.to(static_query.dtype)
