"""TF^phi, the eigenmap module of IC-SSL (Sec. 3.1, App. A.2, Lemma 2): linear-attention layers
(:class:`LinearAttentionLayer`) implementing block power iteration on TF^L's output (:class:`EigenmapTransformer`),
applied through an autograd Function with a hand-written backward.
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from lit_icl.core.errors import ConfigError
from lit_icl.core.nets import contiguous_grad
from lit_icl.core.precision import float32_region
from lit_icl.core.validation import check_bool, check_int, check_literal, check_nonnegative, check_positive

#: Options with fixed choices, typed once: ``--help`` lists them and ``check_literal`` reads them from here.
EigenmapInit = Literal["subspace", "lemma2"]

#: The floor of a column norm in the paper's ``normalize`` of Eq. (15).
_NORM_EPS = 1e-8


def _normalize_columns(phi: Tensor, eps: float = _NORM_EPS) -> Tensor:
    """Unit-norm columns over the tokens: the paper's row-wise ``normalize`` of Eq. (15) in our layout."""
    return phi / phi.norm(dim=-2, keepdim=True).clamp_min(eps)


# --------------------------------------------------------------------------------------------------------
# TF^phi: the eigenmap module (Sec. 3.1, App. A.2, Lemma 2)
# --------------------------------------------------------------------------------------------------------
class EffectiveWeights(NamedTuple):
    """What one application of a :class:`LinearAttentionLayer` needs of its weights (Eq. 16), in our layout.

    With ``P = Phi^T Phi`` one application is ``out = Phi (base + mix(P)) + (G Phi) value_t`` (Eq. 15), where
    ``mix(P) = sum_h C_h^T B_h P A_h^T`` is linear in ``P``: ``vec(mix(P)) = kron vec(P)`` with row-major ``vec``.
    Stacked over layers each field gains a leading layer axis.
    """

    base: Tensor  # (k, k): (I + S)^T
    value_t: Tensor  # (k, k): (sum_h beta_h A_h)^T, the Psi-part of every head
    kron: Tensor  # (k^2, k^2): sum_h (C_h^T B_h) (x) A_h, the Phi-part of every head


def _effective_weights(skip: Tensor, beta: Tensor, value: Tensor, query: Tensor, key: Tensor) -> EffectiveWeights:
    """:class:`EffectiveWeights` from a layer's ``S (k, k)``, ``beta (H,)``, ``A, B, C (H, k, k)`` (Eq. 16), or from
    a stack of layers (a leading layer axis on each), in one pass.

    ``mix(P)[i, m] = sum_{h, j, l} (C_h^T B_h)[i, j] P[j, l] A_h[m, l]``, so the Kronecker matrix's entry at row
    ``(i, m)``, column ``(j, l)`` is ``sum_h (C_h^T B_h)[i, j] A_h[m, l]``: a product over the heads of the
    flattened ``C_h^T B_h`` and ``A_h``, reordered from ``(i, j), (m, l)`` to ``(i, m), (j, l)``.
    """
    k = skip.shape[-1]
    lead = skip.shape[:-2]
    skip, key = contiguous_grad(skip), contiguous_grad(key)  # used transposed below
    base = torch.eye(k, dtype=skip.dtype, device=skip.device) + skip.mT  # contiguous: reshaped every step
    value_t = (beta.unsqueeze(-2) @ value.flatten(-2)).view(*lead, k, k).mT  # (sum_h beta_h A_h)^T
    cb = key.mT @ query  # C_h^T B_h
    kron = (cb.flatten(-2).mT @ value.flatten(-2)).view(*lead, k, k, k, k)  # [i, j, m, l]
    return EffectiveWeights(base, value_t, kron.transpose(-3, -2).reshape(*lead, k * k, k * k))


class _EigenmapIterations(torch.autograd.Function):
    """Applications of Eq. (15) along a schedule of layers, with a hand-written backward.

    ``forward(phi, gram, base, value_t, kron, repeats)``: ``phi (B, n, k)``, ``gram = Psi^T Psi (B, n, n)`` and a
    layer stack of :class:`EffectiveWeights` (``(L, k, k)``, ``(L, k, k)``, ``(L, k^2, k^2)``); ``repeats =
    (stack_repeats, layer_repeats)`` gives the schedule of Remark 3: the stack of ``L`` layers ``stack_repeats``
    times, each layer ``layer_repeats`` times in a row. Step ``t`` with layer ``l`` computes

        P = Phi^T Phi,  W = base_l + mix_l(P),  out = Phi W + (G Phi) value_t_l,  Phi <- out / max(|out_j|, eps)

    in 8 kernels. The point of the Function is the backward, which a GPU step spends launching kernels. Autograd
    through the same forward takes about 36 kernels a step (577 for the default net's 16 steps), mostly on the
    per-step gradients of the four matrices every step shares (``G`` and a layer's three weights) and on the
    normalisation's three ops; here a step costs 9 kernels, and each shared matrix's gradient is one product over
    all steps at the end (173 in all). With ``d_out`` the gradient of a step's ``out``, the gradients are

        d_out = (g - y <g, y>_j [|out_j| >= eps]) / max(|out_j|, eps)          (y = the step's output, per column j)
        d_Phi = d_out W^T + G^T d_out value_t^T + Phi (dP + dP^T),  vec(dP) = kron^T vec(Phi^T d_out)
        d_G = sum_t (d_out_t value_t^T) Phi_t^T,  d_value_t = sum_{t, b} (G Phi_t)^T d_out_t,
        d_base = sum_{t, b} Phi_t^T d_out_t,  d_kron = sum_{t, b} vec(Phi_t^T d_out_t) vec(P_t)^T

    (the sums over the steps of each layer; ``[.]`` is the clamp's subgradient, as autograd's ``clamp_min``).
    """

    @staticmethod
    def forward(ctx: Any, phi: Tensor, gram: Tensor, base: Tensor, value_t: Tensor, kron: Tensor,
                repeats: tuple[int, int]) -> Tensor:
        b, _, k = phi.shape
        stack_repeats, layer_repeats = repeats
        phis, g_phis, ps, ws, norms = [phi], [], [], [], []
        for _ in range(stack_repeats):
            for layer in range(base.shape[0]):
                for _ in range(layer_repeats):
                    p = phi.mT @ phi  # (B, k, k)
                    # W = (I + S)^T + mix(P): one matrix product with kron, the identity and skip folded in
                    w = torch.addmm(base[layer].reshape(k * k), p.reshape(b, k * k), kron[layer].mT).view(b, k, k)
                    g_phi = gram @ phi
                    out = torch.baddbmm(phi @ w, g_phi, value_t[layer].expand(b, k, k))
                    norm = torch.linalg.vector_norm(out, dim=-2, keepdim=True)
                    phi = out / norm.clamp_min(_NORM_EPS)
                    phis.append(phi)
                    g_phis.append(g_phi)
                    ps.append(p)
                    ws.append(w)
                    norms.append(norm)
        ctx.repeats = repeats
        ctx.steps = len(ws)
        ctx.save_for_backward(gram, base, value_t, kron, *phis, *g_phis, *ps, *ws, *norms)
        return phi

    @staticmethod
    @once_differentiable
    @float32_region
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        gram, _base, value_t, kron, *saved = ctx.saved_tensors
        steps = ctx.steps
        phis = saved[: steps + 1]  # phis[t] is step t's input, phis[t + 1] its output
        g_phis, ps, ws, norms = (saved[steps + 1 + i * steps : steps + 1 + (i + 1) * steps] for i in range(4))
        stack_repeats, layer_repeats = ctx.repeats
        layers, kk = kron.shape[:2]
        b, n, k = grad.shape

        # The normalisation's per-column factors, for all steps at once: 1 / max(|out|, eps), and that times the
        # clamp's subgradient, folded into the outputs y.
        norm = torch.cat(norms, dim=-1)  # (B, 1, steps k)
        inv = norm.clamp_min(_NORM_EPS).reciprocal()
        phi_all = torch.cat(phis, dim=-1)  # (B, n, (steps + 1) k)
        y_scaled = phi_all[..., k:] * (inv * (norm >= _NORM_EPS))
        # P is symmetric, so its gradient enters as dP + dP^T: fold the transpose into kron once.
        kron4 = kron.view(layers, kk, k, k)
        kron_sym = (kron4 + kron4.mT).view(layers, kk, kk)

        d_outs, d_ws, d_gphis = [], [], []
        g = grad
        schedule = [layer for _ in range(stack_repeats) for layer in range(layers) for _ in range(layer_repeats)]
        for t in reversed(range(steps)):
            layer, cols = schedule[t], slice(t * k, (t + 1) * k)
            y = phi_all[..., k + t * k : k + (t + 1) * k]
            dots = (g.mT @ y).diagonal(dim1=-2, dim2=-1).unsqueeze(-2)  # <g_j, y_j> per column j, (B, 1, k)
            d_out = torch.addcmul(g * inv[..., cols], y_scaled[..., cols], dots, value=-1.0)
            phi = phis[t]
            d_w = phi.mT @ d_out
            d_gphi = d_out @ value_t[layer].mT
            d_outs.append(d_out)
            d_ws.append(d_w)
            d_gphis.append(d_gphi)
            if t > 0 or ctx.needs_input_grad[0]:
                d_p = (d_w.reshape(b, kk) @ kron_sym[layer]).view(b, k, k)  # dP + dP^T
                g = torch.baddbmm(d_out @ ws[t].mT, gram.mT, d_gphi)
                g = torch.baddbmm(g, phi, d_p)
        d_outs.reverse()
        d_ws.reverse()
        d_gphis.reverse()

        def per_layer(per_step: Tensor) -> Tensor:
            """Sum a (steps, ...) tensor over the steps of each layer -> (L, ...)."""
            return per_step.view(stack_repeats, layers, layer_repeats, *per_step.shape[1:]).sum((0, 2))

        d_phi = g if ctx.needs_input_grad[0] else None
        d_gram = d_base = d_value_t = d_kron = None
        if ctx.needs_input_grad[1]:
            d_gram = torch.cat(d_gphis, dim=-1) @ phi_all[..., :-k].mT
        if ctx.needs_input_grad[2] or ctx.needs_input_grad[4]:
            d_w_all = torch.stack(d_ws)  # (steps, B, k, k)
            if ctx.needs_input_grad[2]:
                d_base = per_layer(d_w_all.sum(1))
            if ctx.needs_input_grad[4]:
                d_kron = per_layer(d_w_all.view(steps, b, kk).mT @ torch.stack(ps).view(steps, b, kk))
        if ctx.needs_input_grad[3]:
            g_phi_all = torch.stack(g_phis).view(steps, b * n, k)
            d_value_t = per_layer(g_phi_all.mT @ torch.stack(d_outs).view(steps, b * n, k))
        return d_phi, d_gram, d_base, d_value_t, d_kron, None


class LinearAttentionLayer(nn.Module):
    """One layer of Eq. (15) with linear attention and the block weights of Eq. (16).

    Token ``i`` carries ``[psi_i ; phi_i]`` with ``psi_i in R^n`` (the Laplacian block, read-only: we fix
    ``a = s = 0`` on it, as every construction of Lemma 2 does) and the eigenmap ``phi_i in R^k``. With
    ``G = Psi^T Psi`` (``G_ij = psi_i . psi_j``) and per-head ``k x k`` matrices ``A_h, B_h, C_h`` and scalar
    ``beta_h = b_h c_h``, the attention score is ``S^h_ij = beta_h psi_i.psi_j + phi_i^T B_h^T C_h phi_j`` and

        Phi <- Phi (I + S)^T + sum_h [ beta_h G Phi A_h^T + Phi C_h^T B_h (Phi^T Phi) A_h^T ]

    followed by unit-norm columns (the paper's row normalisation). Both products are computed without forming
    an ``n x n`` score matrix per head: the heads are summed into the three matrices of :class:`EffectiveWeights`
    (:meth:`effective_weights`), which :class:`EigenmapTransformer` computes once per forward for all the
    applications of the layer.
    """

    def __init__(self, n_components: int, num_heads: int):
        super().__init__()
        k = check_int("n_components", n_components, minimum=1)
        h = check_int("num_heads", num_heads, minimum=1)
        self.skip = nn.Parameter(torch.zeros(k, k))  # S
        self.beta = nn.Parameter(torch.zeros(h))  # b c per head
        self.value = nn.Parameter(torch.zeros(h, k, k))  # A
        self.query = nn.Parameter(torch.zeros(h, k, k))  # B
        self.key = nn.Parameter(torch.zeros(h, k, k))  # C

    def effective_weights(self) -> EffectiveWeights:
        """This layer's heads summed into the three matrices of :class:`EffectiveWeights` (Eq. 16)."""
        return _effective_weights(self.skip, self.beta, self.value, self.query, self.key)

    @float32_region
    def forward(self, phi: Tensor, gram: Tensor) -> Tensor:
        """One application, ``phi (B, n, k)``, ``gram = Psi^T Psi (B, n, n)``."""
        dtype = self.skip.dtype  # float32 (autocast is off here), or float64 after net.double()
        weights = [w.unsqueeze(0) for w in self.effective_weights()]
        return _EigenmapIterations.apply(phi.to(dtype), gram.to(dtype), *weights, (1, 1))


class EigenmapTransformer(nn.Module):
    """``TF^phi`` of Sec. 3.1: linear attention implementing block power iteration (Lemma 2).

    The input is the Laplacian block ``Psi`` from :class:`LaplacianTransformer`; the eigenmap block starts at a
    learnable initial guess ``M in R^{n x k}`` (App. A.2). As in Remark 3 each layer is applied
    ``layer_repeats`` times and the whole stack ``stack_repeats`` times with tied weights.

    Initialisation (training then moves freely in the parameter family of Eq. 16): even layers do a power
    step ``Phi <- G Phi`` (head 0: ``beta = 1``, ``A = I``, ``S = -I``), odd layers orthogonalise column ``i``
    against columns ``j < i`` with head ``i`` (the Gram-Schmidt construction of the Lemma 2 proof, with the
    ``H`` heads working on ``H`` columns at once, Remark 3.2). With the random-walk block ``Psi = A D^{-1}``
    this is subspace iteration towards the top eigenvectors of ``G = Psi^T Psi``, the smooth, low-frequency
    functions on the point cloud, i.e. the bottom of the Laplacian spectrum. Lemma 2's own shifted form
    (power step on ``mu I - G`` with ``Psi = L_hat``) is :meth:`from_lemma2`; it needs thousands of steps
    because the bottom of ``L_hat^T L_hat`` is tightly clustered, which is why it is not the training default.
    ``init="lemma2"`` starts from that construction inside a trainable net (``num_layers = n_components``,
    ``num_heads = 1``).

    ``learn_init=False`` replaces the learned ``M`` (``n k`` parameters, each tied to a token *position*)
    by a guess computed from each episode's own coordinates, ``[1, x_1, ..., x_d, x_1^2, ...]`` (first ``k``
    columns): no parameter grows with ``n`` (Remark 1) and the module is permutation-equivariant. Low-order
    polynomials of the coordinates are smooth on the point cloud, so they overlap the bottom eigenvectors
    that the iteration extracts.
    """

    def __init__(
        self,
        n_points: int = 100,
        n_components: int = 4,
        num_layers: int = 2,
        num_heads: int | None = None,
        layer_repeats: int = 2,
        stack_repeats: int = 4,
        init_lr_scale: float = 0.01,
        init: EigenmapInit = "subspace",
        mu: float = 4.0,
        learn_init: bool = True,
    ):
        super().__init__()
        num_heads = self._validate(n_points, n_components, num_layers, num_heads, layer_repeats, stack_repeats,
                                   init_lr_scale, init, mu, learn_init)
        self.n_points = n_points
        self.n_components = n_components
        self.layer_repeats = layer_repeats
        self.stack_repeats = stack_repeats
        init_guess = torch.empty(n_points, n_components)
        nn.init.orthogonal_(init_guess)
        # M of App. A.2, reparametrised like the Laplacian module's M (see there).
        self.learn_init = learn_init
        if learn_init:
            self.register_buffer("init_base", init_guess)
            self.init_delta = nn.Parameter(torch.zeros(n_points, n_components))
        self.init_lr_scale = init_lr_scale
        self.layers = nn.ModuleList(LinearAttentionLayer(n_components, num_heads) for _ in range(num_layers))
        if init == "lemma2":
            self._init_lemma2(mu)
        else:
            self._init_subspace(num_heads)

    @staticmethod
    def _validate(
        n_points: int,
        n_components: int,
        num_layers: int,
        num_heads: int | None,
        layer_repeats: int,
        stack_repeats: int,
        init_lr_scale: float,
        init: str,
        mu: float,
        learn_init: bool,
    ) -> int:
        """The constructor's argument checks; returns the number of heads (default: one per component, 1 for
        ``init="lemma2"``)."""
        check_literal("init", init, EigenmapInit)
        check_positive("mu", mu, hint="the shift of Lemma 2's power step; it must exceed the top of G")
        check_bool("learn_init", learn_init)
        if init == "lemma2":
            if num_heads is None:
                num_heads = 1
            if num_heads != 1 or num_layers != n_components:
                raise ConfigError(
                    f"init='lemma2' is Lemma 2's construction: it needs num_layers = n_components = {n_components} "
                    f"and num_heads = 1 (got {num_layers} and {num_heads})"
                )
        num_heads = n_components if num_heads is None else num_heads
        check_int("n_points", n_points, minimum=2, hint="an episode needs at least 2 points")
        check_int("n_components", n_components)
        if not 1 <= n_components < n_points:
            raise ConfigError(f"n_components={n_components} must lie in [1, n_points - 1 = {n_points - 1}]")
        for name, value in (("num_layers", num_layers), ("num_heads", num_heads),
                            ("layer_repeats", layer_repeats), ("stack_repeats", stack_repeats)):
            check_int(name, value, minimum=1)
        check_nonnegative("init_lr_scale", init_lr_scale)
        return num_heads

    def _init_subspace(self, num_heads: int) -> None:
        """Alternating power steps and Gram-Schmidt heads (see the class docstring)."""
        num_layers, k, eye = len(self.layers), self.n_components, torch.eye(self.n_components)
        with torch.no_grad():
            for idx, layer in enumerate(self.layers):
                # Tiny random weights everywhere keep unused heads trainable (all-zero heads get no gradient).
                for p in (layer.query, layer.key, layer.value):
                    p.normal_(0.0, 1e-3)
                if idx % 2 == 0 or num_layers == 1:
                    layer.beta[0] = 1.0
                    layer.value[0] = eye
                    layer.skip.copy_(-eye)
                if idx % 2 == 1 or num_layers == 1:
                    for i in range(1, min(num_heads, k)):
                        mask = torch.diag((torch.arange(k) < i).float())
                        layer.query[i] = mask
                        layer.key[i] = mask
                        layer.value[i].zero_()
                        layer.value[i, i, i] = -1.0

    @property
    def init_state(self) -> Tensor:
        """The learnable initial guess ``M in R^{n x k}`` of App. A.2 (``base + scale * delta``, one kernel)."""
        return torch.add(self.init_base, self.init_delta, alpha=self.init_lr_scale)

    def coordinate_guess(self, x: Tensor) -> Tensor:
        """The position-free initial guess ``[1, x - mean, (x - mean)^2]`` (first ``k`` columns), ``(B, n, k)``."""
        x = x.to(self.layers[0].skip.dtype)
        centred = x - x.mean(-2, keepdim=True)
        cols = torch.cat([torch.ones_like(centred[..., :1]), centred, centred * centred], dim=-1)
        if cols.shape[-1] < self.n_components:
            raise ConfigError(
                f"learn_init=False builds the initial guess from 1 + 2d = {cols.shape[-1]} coordinate functions, "
                f"fewer than n_components={self.n_components}; use learn_init=True or fewer components"
            )
        return cols[..., : self.n_components]

    @float32_region
    def forward(self, psi: Tensor, x: Tensor | None = None) -> Tensor:
        """``psi: (B, n, n)`` token-major Laplacian block -> eigenmap ``(B, n, k)`` with unit-norm columns.

        ``x`` (the episode's coordinates) is needed only with ``learn_init=False``.
        """
        psi = psi.to(self.layers[0].skip.dtype)  # float32, or float64 after net.double()
        gram = psi @ psi.mT  # paper's Psi^T Psi
        if self.learn_init:
            phi = _normalize_columns(self.init_state).unsqueeze(0).expand(psi.shape[0], -1, -1)
        else:
            if x is None:
                raise ValueError("EigenmapTransformer(learn_init=False) needs the coordinates x in forward")
            phi = _normalize_columns(self.coordinate_guess(x))
        # Every application of a layer uses the same weights: sum the heads of all layers once per forward (one
        # pass over the stacked parameters), not once per application.
        stacked = (torch.stack([getattr(layer, name) for layer in self.layers])
                   for name in ("skip", "beta", "value", "query", "key"))
        weights = _effective_weights(*stacked)
        return _EigenmapIterations.apply(phi, gram, *weights, (self.stack_repeats, self.layer_repeats))

    @classmethod
    def from_lemma2(cls, n_points: int, n_components: int, mu: float, iterations: int) -> EigenmapTransformer:
        """The construction in the proof of Lemma 2: ``iterations`` steps of block power iteration with QR.

        Layer 0 does the power step ``Phi <- (mu I - G) Phi`` (``beta = 1``, ``A = -I``, ``S = (mu-1) I``);
        layer ``i = 1..k-1`` orthogonalises column ``i`` against columns ``j < i`` (``A = -e_i e_i^T``,
        ``B = C = diag(1[j < i])``, ``beta = 0``); unit-norm columns after every layer complete the QR step.
        The columns converge to the bottom eigenvectors of ``G = Psi^T Psi`` when ``mu I > G``.
        """
        k = n_components
        return cls(
            n_points, k, num_layers=k, num_heads=1, layer_repeats=1, stack_repeats=iterations, init="lemma2", mu=mu
        )

    def _init_lemma2(self, mu: float) -> None:
        """The weights of :meth:`from_lemma2`'s construction."""
        k = self.n_components
        eye = torch.eye(k)
        with torch.no_grad():
            for i, layer in enumerate(self.layers):
                layer.query.zero_()
                layer.key.zero_()
                layer.value.zero_()
                layer.beta.zero_()
                layer.skip.zero_()
                if i == 0:
                    layer.beta.fill_(1.0)
                    layer.value[0] = -eye
                    layer.skip.copy_((mu - 1.0) * eye)
                else:
                    mask = torch.diag((torch.arange(k) < i).float())
                    layer.query[0] = mask
                    layer.key[0] = mask
                    layer.value[0, i, i] = -1.0
