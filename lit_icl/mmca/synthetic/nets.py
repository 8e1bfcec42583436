"""Networks for multi-modal ICL on latent-factor prompts: plain ``nn.Module``s, no Lightning.

Every net maps a prompt to a prediction of ``y_q``::

    net(x, y, x_query, m=None, zeta=None) -> y_hat (B,)

with token-major inputs ``x (B, L, d)``, ``y (B, L)``, ``x_query (B, d)`` (see :mod:`lit_icl.mmca.synthetic.data`). Only the
Bayes oracle reads the prompt's latent ``m, zeta``. Inside, the paper's column layout is used: a prompt's
``X`` is ``(d, L)`` with token ``i`` as column ``i``.

=========================================  ==============================================================
paper                                      here
=========================================  ==============================================================
single-layer LSA, Eq. (4.2), App. C.1      :class:`SingleLayerLSA`
LCA_T stack + LSA readout, Eqs. (5.1-5.5)   :class:`DeepCrossAttention` (``mixer="cross"``)
  one-/two-parameter (Sec. 5)              ``parametrization="one" / "two"``
  untied scalar / diagonal / full (App. H)  ``"untied" / "diagonal" / "full"``
  softmax CA, Eq. (5.3)                    ``attention="softmax"``
no S_t ablation, Eq. (G.1)                 ``injection=False``
deep LSA ablations, Eq. (G.2)              ``mixer="self"`` (with/without ``injection``)
in-context sample mean (App. G)            :class:`SampleMean`
Bayes-optimal predictor, Eq. (3.3)         :class:`BayesOptimal`
=========================================  ==============================================================
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor, nn

from lit_icl.core.errors import ConfigError
from lit_icl.core.nets import RecordedNet
from lit_icl.core.precision import float32_region
from lit_icl.core.validation import check_literal, check_nonnegative, check_positive
from lit_icl.mmca.theory import alpha_star, bayes_weights, check_norm_range, theorem63_alpha

# Choices are Literal types: `--help` lists them, the parser refuses others, and `check_literal` reads them
# from the type when a net is built from Python.
Parametrization = Literal["one", "two", "untied", "diagonal", "full"]
Attention = Literal["linear", "softmax"]
Mixer = Literal["cross", "self"]
Init = Literal["alpha_star", "theorem_6_3"]
InitialState = Literal["zero", "x"]


def _check_dim(d: object) -> int:
    return check_positive("d", d, integer=True, hint="the covariate dimension d1 + d2 (32 in App. H)")


def zhang_init(d: int) -> tuple[Tensor, Tensor]:
    """``W^PV = [[0, 0], [0, 1]]`` and ``W^KQ = [[I_d, 0], [0, 0]]`` of App. C.1, ``(d+1) x (d+1)`` each."""
    w_pv = torch.zeros(d + 1, d + 1)
    w_pv[d, d] = 1.0
    w_kq = torch.zeros(d + 1, d + 1)
    w_kq[:d, :d] = torch.eye(d)
    return w_pv, w_kq


def lsa_readout(f: Tensor, y: Tensor, x_query: Tensor, w_pv: Tensor, w_kq: Tensor) -> Tensor:
    """``LSA(E_F)_{d+1, L+1}`` of Eqs. (4.2)/(5.5) with ``E_F = [[F, x_q], [y^T, 0]]``, without forming ``E E^T``.

    ``y_hat = e_{d+1}^T W^PV E (E^T W^KQ E / L) e_{L+1}``; the skip term adds ``E_{d+1, L+1} = 0``. With
    ``q = W^KQ [x_q; 0]`` and ``s = E^T q`` (one score per column) this is ``p^T E s / L`` for the last row ``p`` of
    ``W^PV``: ``O(d L)`` per prompt.

    Args:
        f: ``(B, d, L)`` the embedding ``F`` (``X`` itself for Eq. 4.2).
        y: ``(B, L)`` context responses.
        x_query: ``(B, d)``.
        w_pv, w_kq: ``(d+1, d+1)``.
    """
    d, L = f.shape[1], f.shape[2]
    q = x_query @ w_kq[:, :d].T  # (B, d+1): W^KQ [x_q; 0]
    s_ctx = torch.einsum("bdl,bd->bl", f, q[:, :d]) + y * q[:, d : d + 1]  # (B, L): [f_i; y_i]^T q
    s_q = (x_query * q[:, :d]).sum(-1)  # query column [x_q; 0]^T q
    p = w_pv[d]  # last row of W^PV
    top = torch.einsum("bdl,bl->bd", f, s_ctx) + x_query * s_q.unsqueeze(-1)  # top block of E s
    bottom = (y * s_ctx).sum(-1)  # y^T s_ctx (the query column has y = 0)
    return (top @ p[:d] + bottom * p[d]) / L


class SingleLayerLSA(RecordedNet):
    """Single-layer linear self-attention on ``E_X`` (Eq. 4.2), initialised as in App. C.1.

    Both ``(d+1) x (d+1)`` matrices ``W^PV, W^KQ`` are trained: ``2 (d+1)^2`` parameters. Theorem 4.1: no choice
    of them reaches the Bayes predictor when ``||m||`` varies across prompts.

    Args:
        d: covariate dimension ``d1 + d2``.
        init_noise: standard deviation of Gaussian noise added to the App. C.1 initialisation.
        init_seed: seed of that noise (a private generator, so the global RNG plays no part).
    """

    method = "lsa"

    def __init__(self, d: int = 32, init_noise: float = 0.0, init_seed: int = 0):
        super().__init__()
        self.d = _check_dim(d)
        check_nonnegative("init_noise", init_noise)
        w_pv, w_kq = zhang_init(d)
        g = torch.Generator().manual_seed(int(init_seed))
        self.w_pv = nn.Parameter(w_pv + init_noise * torch.randn(d + 1, d + 1, generator=g))
        self.w_kq = nn.Parameter(w_kq + init_noise * torch.randn(d + 1, d + 1, generator=g))

    @float32_region
    def forward(
        self, x: Tensor, y: Tensor, x_query: Tensor, m: Tensor | None = None, zeta: Tensor | None = None
    ) -> Tensor:
        return lsa_readout(x.float().transpose(1, 2), y.float(), x_query.float(), self.w_pv, self.w_kq)


class DeepCrossAttention(RecordedNet):
    """``T`` layers of (linearised) cross-attention with re-injection, then a frozen LSA readout (Eqs. 5.1-5.5).

    With ``F_0 = 0`` and, for ``t = 1..T``::

        F_t = F_{t-1} + S_{t-1} + A_{t-1},   S_{t-1} = W^S_{t-1} X,
        A_{t-1} = W^V_{t-1} X . phi(X^T F_{t-1} / L)                     (mixer="cross", Eqs. 5.3-5.4)
        A_{t-1} = W^V_{t-1} F_{t-1} . phi(F_{t-1}^T F_{t-1} / L)          (mixer="self", Eq. G.2)

    ``W^K = W^Q = I`` frozen; ``phi`` is the identity (``attention="linear"``, the LCA of Eq. 5.5) or a softmax
    over the keys (``attention="softmax"``, Eq. 5.3). The prediction is the LSA readout of ``E_F`` with the
    App. C.1 matrices, i.e. ``y^T F_T^T x_q / L`` (Lemma C.1); the readout is frozen unless
    ``readout_trainable``. ``(W^S_t, W^V_t)`` per ``parametrization`` (Sec. 5, App. H):

    - ``one``: ``(alpha I, -alpha I)`` tied across layers, 1 parameter;
    - ``two``: ``(alpha I, beta I)`` tied, 2 parameters;
    - ``untied``: ``(alpha_t I, beta_t I)``, ``2T``;
    - ``diagonal``: ``(diag(b_t), diag(b'_t))``, ``2Td``;
    - ``full``: unconstrained ``d x d`` matrices, ``2Td^2``.

    ``injection=False`` drops ``S_t`` (Eq. G.1) and its parameters (``one`` keeps its single ``alpha`` in
    ``W^V = -alpha I``; ``two`` is refused since its ``alpha`` would be unused). Note that with ``F_0 = 0`` and
    linear attention, no injection leaves ``F_t = 0`` for ever (the paper's remark that the ablation does no
    better than the sample mean); ``initial_state="x"`` starts from ``F_0 = X`` instead.

    Initialisation (App. H): ``alpha_t = alpha_0 + sigma g``, ``beta_t = beta_0 + sigma g'`` on the scalar, diagonal
    or identity part, with ``alpha_0 = alpha*`` of Theorem 6.2 for ``norm_range`` unless given and
    ``beta_0 = -alpha_0`` unless given. ``init="theorem_6_3"`` sets ``alpha_0 = alpha*(beta_0)`` of Eq. (E.1)
    (needs ``beta_init`` in ``(-2/(m_hi + 1), 0)``).

    Args:
        d: covariate dimension ``d1 + d2``.
        depth: number of layers ``T``.
        parametrization: see above.
        attention: ``linear`` or ``softmax``.
        mixer: ``cross`` (LCA) or ``self`` (deep LSA ablation, Eq. G.2).
        injection: keep the re-injection ``S_t`` (``False``: Eq. G.1).
        init: ``alpha_star`` or ``theorem_6_3``.
        alpha_init: ``alpha_0`` (default: ``alpha*`` of ``norm_range``).
        beta_init: ``beta_0`` (default ``-alpha_0``).
        init_noise: ``sigma_init`` (0.1 in App. H for the untied/diagonal/full models).
        init_seed: seed of the initial noise.
        norm_range: the data's ``||m||`` range, used only to compute ``alpha*`` and ``alpha*(beta_0)``.
        initial_state: ``zero`` (``F_0 = 0``, Sec. 5) or ``x`` (``F_0 = X``).
        readout_trainable: also train the readout's ``W^PV, W^KQ`` (``2 (d+1)^2`` more parameters).
    """

    def __init__(
        self,
        d: int = 32,
        depth: int = 10,
        parametrization: Parametrization = "one",
        attention: Attention = "linear",
        mixer: Mixer = "cross",
        injection: bool = True,
        init: Init = "alpha_star",
        alpha_init: float | None = None,
        beta_init: float | None = None,
        init_noise: float = 0.0,
        init_seed: int = 0,
        norm_range: Sequence[float] = (0.0, 5.0),
        initial_state: InitialState = "zero",
        readout_trainable: bool = False,
    ):
        super().__init__()
        self.d = _check_dim(d)
        self.norm_range = self._validate(
            depth, parametrization, attention, mixer, injection, init, alpha_init, beta_init, init_noise, norm_range,
            initial_state,
        )  # fmt: skip
        if init == "theorem_6_3":
            alpha_init = theorem63_alpha(float(beta_init), depth, self.norm_range)
        a0 = float(alpha_init) if alpha_init is not None else alpha_star(self.norm_range)
        b0 = float(beta_init) if beta_init is not None else -a0

        self.depth = depth
        self.parametrization = parametrization
        self.attention = attention
        self.mixer = mixer
        self.injection = bool(injection)
        self.initial_state = initial_state
        self.alpha_init, self.beta_init = a0, b0
        self._init_weights(a0, b0, float(init_noise), int(init_seed), bool(readout_trainable))

    def _init_weights(self, a0: float, b0: float, s: float, init_seed: int, readout_trainable: bool) -> None:
        """``(W^S_t, W^V_t)`` at ``(a0, b0)`` plus ``s`` times seeded noise, then the App. C.1 readout."""
        d, T = self.d, self.depth
        g = torch.Generator().manual_seed(init_seed)

        def noisy(value: float, *shape: int) -> nn.Parameter:
            return nn.Parameter(value + s * torch.randn(shape, generator=g))

        if self.parametrization in ("one", "two"):
            self.alpha = noisy(a0)  # scalar (shape ())
            if self.parametrization == "two":
                self.beta = noisy(b0)
        elif self.parametrization == "untied":
            if self.injection:
                self.alpha = noisy(a0, T)
            self.beta = noisy(b0, T)
        elif self.parametrization == "diagonal":
            if self.injection:
                self.alpha = noisy(a0, T, d)
            self.beta = noisy(b0, T, d)
        else:
            eye = torch.eye(d)
            if self.injection:
                self.alpha = nn.Parameter(a0 * eye + s * torch.randn(T, d, d, generator=g))
            self.beta = nn.Parameter(b0 * eye + s * torch.randn(T, d, d, generator=g))
        w_pv, w_kq = zhang_init(d)
        if readout_trainable:
            self.w_pv, self.w_kq = nn.Parameter(w_pv), nn.Parameter(w_kq)
        else:
            self.register_buffer("w_pv", w_pv)
            self.register_buffer("w_kq", w_kq)

    @staticmethod
    def _validate(
        depth: int,
        parametrization: str,
        attention: str,
        mixer: str,
        injection: bool,
        init: str,
        alpha_init: float | None,
        beta_init: float | None,
        init_noise: float,
        norm_range: Sequence[float],
        initial_state: str,
    ) -> tuple[float, float]:
        """Check the arguments (each alone, then how they combine); returns the normalised ``norm_range``."""
        check_positive("depth", depth, integer=True, hint="the number of CA layers T")
        check_literal("parametrization", parametrization, Parametrization)
        check_literal("attention", attention, Attention)
        check_literal("mixer", mixer, Mixer)
        check_literal("init", init, Init)
        check_literal("initial_state", initial_state, InitialState)
        if not injection and parametrization == "two":
            raise ConfigError(
                "parametrization='two' needs injection=True (its alpha scales S_t); use 'one' for the no-S_t ablation"
            )
        check_nonnegative("init_noise", init_noise, hint="0.1 in App. H")
        lo, hi = check_norm_range(norm_range)
        if init == "theorem_6_3":
            limit = -2.0 / (hi * hi + 1.0)
            if beta_init is None or not limit < beta_init < 0.0:
                raise ConfigError(
                    f"init='theorem_6_3' needs beta_init in (-2/(m_hi+1), 0) = ({limit:.4g}, 0) for norm_range="
                    f"({lo:g}, {hi:g}), got {beta_init!r}"
                )
            if alpha_init is not None:
                raise ConfigError(
                    "init='theorem_6_3' computes alpha_init = alpha*(beta_init) (Eq. E.1); drop alpha_init"
                )
            if parametrization == "one":
                raise ConfigError(
                    "init='theorem_6_3' applies to a free beta; use parametrization 'two' (or less tied)"
                )
        for name, value in (("alpha_init", alpha_init), ("beta_init", beta_init)):
            if value is not None and (not isinstance(value, (int, float)) or not math.isfinite(value)):
                raise ConfigError(f"{name}={value!r} must be a finite number or null")
        if parametrization == "one" and beta_init is not None:
            raise ConfigError(
                "parametrization='one' ties beta = -alpha; drop beta_init or use parametrization 'two'"
            )
        return lo, hi

    @property
    def method(self) -> str:
        """A short name for result rows, e.g. ``lca_one``, ``lca_one_no_s``, ``deep_lsa_two``, ``sca_full``
        (``_x0`` marks ``initial_state="x"``)."""
        base = {"cross": "lca" if self.attention == "linear" else "sca", "self": "deep_lsa"}[self.mixer]
        if self.mixer == "self" and self.attention == "softmax":
            base = "deep_ssa"
        name = f"{base}_{self.parametrization}" + ("" if self.injection else "_no_s")
        return name + ("_x0" if self.initial_state == "x" else "")

    @property
    def tied(self) -> bool:
        """Weights shared across layers, so the same net runs at any depth (test-time depth sweep)."""
        return self.parametrization in ("one", "two")

    def _value(self, t: int) -> Tensor:
        """``W^V_t`` in its compact form (scalar, ``(d,)`` diagonal or ``(d, d)``)."""
        if self.parametrization == "one":
            return -self.alpha
        if self.parametrization == "two":
            return self.beta
        return self.beta[t]

    def _inject(self, t: int) -> Tensor | None:
        if not self.injection:
            return None
        if self.parametrization in ("one", "two"):
            return self.alpha
        return self.alpha[t]

    def _mul(self, w: Tensor, z: Tensor) -> Tensor:
        """``W z`` for ``z (B, d, n)`` with ``W`` scalar, diagonal ``(d,)`` or full ``(d, d)``."""
        if w.dim() == 0:
            return w * z
        if w.dim() == 1:
            return w.unsqueeze(-1) * z
        return torch.matmul(w, z)

    def layer_weights(self) -> tuple[Tensor, Tensor]:
        """Dense ``(W^S_t, W^V_t)`` for ``t = 0..T-1``, each ``(T, d, d)`` (zeros for ``W^S`` without injection)."""
        eye = torch.eye(self.d, device=next(self.parameters()).device)
        ws, wv = [], []
        for t in range(self.depth):
            for out, w in ((ws, self._inject(t)), (wv, self._value(t))):
                if w is None:
                    out.append(torch.zeros_like(eye))
                elif w.dim() == 0:
                    out.append(w * eye)
                elif w.dim() == 1:
                    out.append(torch.diag(w))
                else:
                    out.append(w)
        return torch.stack(ws), torch.stack(wv)

    def _check_depth(self, depth: int | None) -> int:
        if depth is None:
            return self.depth
        if not self.tied and depth != self.depth:
            raise ValueError(
                f"{self.method} has untied weights for {self.depth} layers; it cannot run at depth {depth}"
            )
        if depth < 1:
            raise ValueError(f"depth={depth} must be >= 1")
        return depth

    @float32_region
    def layer_states(self, x: Tensor, depth: int | None = None) -> list[Tensor]:
        """``[F_1, ..., F_T]``, each ``(B, d, L)`` in the paper's column layout, for the prompt covariates ``x``."""
        depth = self._check_depth(depth)
        xc = x.float().transpose(1, 2)  # (B, d, L)
        if self.attention == "linear":
            return [p @ xc for p in self._linear_maps(xc, depth)[0]]
        L = xc.shape[-1]
        f = xc.clone() if self.initial_state == "x" else torch.zeros_like(xc)
        states = []
        for t in range(depth):
            src = xc if self.mixer == "cross" else f
            # softmax over the keys i of (K^T Q / L)_{ij} = k_i . q_j / L, Eq. (5.3)
            weights = torch.softmax(src.transpose(1, 2) @ f / L, dim=1)
            mixed = src @ weights
            update = self._mul(self._value(t), mixed)
            inject = self._inject(t)
            if inject is not None:
                update = update + self._mul(inject, xc)
            f = f + update
            states.append(f)
        return states

    def _linear_maps(self, xc: Tensor, depth: int) -> tuple[list[Tensor], Tensor]:
        """Linear attention keeps ``F_t = P_t X`` for a ``(B, d, d)`` matrix ``P_t``, so the stack runs in ``O(d^3)``
        per layer instead of ``O(d^2 L)``: with ``Lambda_hat = X X^T / L``,

            cross (Eq. 5.5): ``P_t = P_{t-1} + W^S + W^V Lambda_hat P_{t-1}``
            self (Eq. G.2):  ``P_t = P_{t-1} + W^S + W^V (P_{t-1} Lambda_hat P_{t-1}^T) P_{t-1}``

        since ``X X^T F / L = Lambda_hat P X`` and ``F F^T F / L = P Lambda_hat P^T P X``. Returns ``[P_1..P_T]``
        and ``Lambda_hat``.
        """
        d, L = xc.shape[1], xc.shape[2]
        cov = xc @ xc.transpose(1, 2) / L
        eye = torch.eye(d, device=xc.device).expand_as(cov)
        p = eye.clone() if self.initial_state == "x" else torch.zeros_like(cov)
        maps = []
        for t in range(depth):
            gram = cov if self.mixer == "cross" else p @ cov @ p.transpose(1, 2)
            update = self._mul(self._value(t), gram @ p)
            inject = self._inject(t)
            if inject is not None:
                update = update + self._mul(inject, eye)
            p = p + update
            maps.append(p)
        return maps, cov

    @float32_region
    def forward(
        self,
        x: Tensor,
        y: Tensor,
        x_query: Tensor,
        m: Tensor | None = None,
        zeta: Tensor | None = None,
        depth: int | None = None,
    ) -> Tensor:
        depth = self._check_depth(depth)
        if (
            self.attention == "linear"
            and isinstance(self.w_pv, Tensor)
            and not isinstance(self.w_pv, nn.Parameter)
        ):
            # Frozen App. C.1 readout: y_hat = y^T F^T x_q / L = x_q^T P_T (X y / L) (Lemma C.1).
            xc = x.float().transpose(1, 2)
            xy = (xc @ y.float().unsqueeze(-1)) / xc.shape[-1]  # (B, d, 1)
            if self.mixer == "cross":
                # F_t y / L obeys the same recursion as P_t, on a d-vector: O(d^2) per layer.
                cov = xc @ xc.transpose(1, 2) / xc.shape[-1]
                g = xy.clone() if self.initial_state == "x" else torch.zeros_like(xy)
                for t in range(depth):
                    update = self._mul(self._value(t), cov @ g)
                    inject = self._inject(t)
                    if inject is not None:
                        update = update + self._mul(inject, xy)
                    g = g + update
            else:
                g = self._linear_maps(xc, depth)[0][-1] @ xy
            return (x_query.float().unsqueeze(1) @ g).flatten()
        f = self.layer_states(x, depth)[-1]
        return lsa_readout(f, y.float(), x_query.float(), self.w_pv, self.w_kq)


class SampleMean(RecordedNet):
    """The in-context sample mean ``ybar = (1/L) sum_i y_i`` (App. G): no parameters, ignores ``x_q``."""

    method = "sample_mean"

    def forward(
        self, x: Tensor, y: Tensor, x_query: Tensor, m: Tensor | None = None, zeta: Tensor | None = None
    ) -> Tensor:
        return y.float().mean(-1)


class BayesOptimal(RecordedNet):
    """The Bayes-optimal predictor ``<w, x_q>``, ``w = zeta m / (1 + ||m||^2)`` (Eq. 3.3): an oracle that reads
    the prompt's latent ``(m, zeta)``, no parameters. Its ICL error is 0 by definition; its MSE is ``E[1/Z]``."""

    method = "bayes"

    def forward(
        self, x: Tensor, y: Tensor, x_query: Tensor, m: Tensor | None = None, zeta: Tensor | None = None
    ) -> Tensor:
        if m is None or zeta is None:
            raise ValueError(
                "BayesOptimal needs the prompt's latent m and zeta (batches of LatentFactorDataModule)"
            )
        return (bayes_weights(m.float(), zeta.float()) * x_query.float()).sum(-1)
