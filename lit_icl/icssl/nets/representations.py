"""The representations ``phi(X)`` of IC-SSL's ``[Data + Model]`` (Sec. 4.1): the in-context eigenmap TF^phi o TF^L
(ORIG+E2E-ICL), the exact eigenmap (EIG), the raw coordinates (ORIG) and a learned projection in front of one.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch.nn.functional as F
from torch import Tensor, nn

from lit_icl.core.errors import ConfigError
from lit_icl.core.nets import RecordedNet
from lit_icl.core.spectral import LaplacianNorm, laplacian_eigenmap
from lit_icl.core.validation import check_int, check_literal, check_positive
from lit_icl.icssl.nets.eigenmap import EigenmapInit, EigenmapTransformer
from lit_icl.icssl.nets.laplacian import Activation, LaplacianOutput, LaplacianTransformer


# --------------------------------------------------------------------------------------------------------
# Representations phi(X)
# --------------------------------------------------------------------------------------------------------
class InContextEigenmap(RecordedNet):
    """``TF_rep = TF^phi o TF^L`` (Sec. 3.1): the learned, in-context Laplacian eigenmap of ORIG+E2E-ICL.

    The two ablations of Table 6 (App. F.8) are options: ``lap_activation="linear"`` (the Laplacian module
    without the RBF activation) and ``lap_layers = eig_layers = layer_repeats = stack_repeats = 1`` (the
    non-iterative "1-layer Lap+PE", one pass through each module).

    The paper-faithful form (``configs/icssl/manifolds/faithful.yaml``) is ``lap_output="laplacian"`` (TF^L
    outputs ``L_hat``, Lemma 1), ``eig_init="lemma2"`` (TF^phi starts as Lemma 2's shifted power iteration,
    ``eig_layers = n_components``, one head), ``layer_repeats = stack_repeats = 2`` (Remark 3's looping) and
    ``learn_init=False`` (fixed ``M``, Remark 1).
    """

    def __init__(
        self,
        n_points: int = 100,
        n_components: int = 4,
        lap_layers: int = 2,
        lap_bandwidths: Sequence[float] = (0.004, 0.01, 0.025, 0.06),
        exclude_self: bool = True,
        lap_output: LaplacianOutput = "random_walk",
        eig_layers: int = 2,
        eig_heads: int | None = None,
        layer_repeats: int = 2,
        stack_repeats: int = 4,
        lap_activation: Activation = "rbf",
        learn_init: bool = True,
        eig_init: EigenmapInit = "subspace",
        eig_mu: float = 4.0,
    ):
        super().__init__()
        check_literal("lap_activation", lap_activation, Activation)
        # Checked here under this class's own option names (the parts below call them num_layers, ...).
        check_int("n_points", n_points, minimum=2, hint="an episode needs at least 2 points")
        check_int("n_components", n_components)
        if not 1 <= n_components < n_points:
            raise ConfigError(f"n_components={n_components} must lie in [1, n_points - 1 = {n_points - 1}]")
        check_int("lap_layers", lap_layers, minimum=1)
        check_int("eig_layers", eig_layers, minimum=1)
        if eig_heads is not None:
            check_int("eig_heads", eig_heads, minimum=1, hint="or leave it unset for one head per component")
        check_int("layer_repeats", layer_repeats, minimum=1)
        check_int("stack_repeats", stack_repeats, minimum=1)
        self.n_points = n_points
        self.out_dim = n_components
        self.laplacian = LaplacianTransformer(
            n_points, lap_layers, lap_bandwidths, exclude_self, lap_output, activation=lap_activation,
            learn_init=learn_init,
        )
        self.eigenmap = EigenmapTransformer(
            n_points, n_components, eig_layers, eig_heads, layer_repeats, stack_repeats,
            init=eig_init, mu=eig_mu, learn_init=learn_init,
        )

    def check_config(self, *, datamodule: object = None, **_: object) -> None:
        """Before a run: the episode size the data produces must be the one ``M`` was built for."""
        data_n = getattr(datamodule, "n_points", None)
        if data_n is not None and data_n != self.n_points:
            raise ConfigError(
                f"the representation was built for n_points={self.n_points} but the data has n_points={data_n}; "
                f"set the representation's n_points to {data_n}"
            )

    def forward(self, x: Tensor) -> Tensor:
        _, psi = self.laplacian(x)
        return self.eigenmap(psi, x)


class LaplacianEigenmap(RecordedNet):
    """EIG of Sec. 4.1: exact bottom eigenvectors of the kNN-RBF graph Laplacian (App. D), no parameters."""

    def __init__(
        self,
        n_components: int = 4,
        n_neighbors: int = 6,
        rbf_scale: float = 10.0,
        normalization: LaplacianNorm = "sym",
    ):
        super().__init__()
        check_int("n_components", n_components, minimum=1)
        check_int("n_neighbors", n_neighbors, minimum=1)
        check_positive("rbf_scale", rbf_scale, hint="App. D uses 10")
        check_literal("normalization", normalization, LaplacianNorm)
        self.out_dim = n_components
        self.n_components = n_components
        self.n_neighbors = n_neighbors
        self.rbf_scale = rbf_scale
        self.normalization = normalization

    def check_config(self, *, datamodule: object = None, **_: object) -> None:
        """Before a run: the kNN graph and the eigenvectors must fit in the data's episodes."""
        n = getattr(datamodule, "n_points", None)
        if n is None:
            return
        if self.n_neighbors > n - 1:
            raise ConfigError(
                f"n_neighbors={self.n_neighbors} but episodes have only {n} points; "
                f"choose 1 <= n_neighbors <= {n - 1}"
            )
        if self.n_components > n:
            raise ConfigError(
                f"n_components={self.n_components} must lie in [1, {n}] for episodes of {n} points"
            )

    def forward(self, x: Tensor) -> Tensor:
        return laplacian_eigenmap(x, self.n_components, self.n_neighbors, self.rbf_scale, self.normalization)


class RawCoordinates(RecordedNet):
    """ORIG of Sec. 4.1: the raw coordinates, unchanged (the control without representation learning)."""

    def forward(self, x: Tensor) -> Tensor:
        return x.float()


def check_input_dim(net: nn.Module, datamodule: object, option: str) -> None:
    """Refuse a net whose ``input_dim`` is not the data's point dimension (``datamodule.ambient_dim``), naming
    the ``option`` that sets it; data that does not say its dimension passes."""
    dim = getattr(datamodule, "ambient_dim", None)
    if dim is not None and dim != net.input_dim:
        raise ConfigError(
            f"{type(net).__name__} input_dim={net.input_dim} but the data's points have {dim} coordinates; "
            f"set {option} {dim}"
        )


class ProjectedRepresentation(RecordedNet):
    """``phi(X P)``: a learned linear map ``P`` of every point before another representation (our ablation).

    Not in the paper. Its Sec. 4.2 models are scale-matched (about 1.5 M parameters each), while
    :class:`InContextEigenmap` on 1,280-dim image features has about 11 K, all in the Laplacian's bandwidths and
    the eigenmap: it sees the features only through an RBF graph on the raw space. ``P`` (``input_dim x dim``,
    shared across episodes) lets the model learn which feature directions separate classes across episodes, as
    the Transformer baseline's input projection can. Each projected point is rescaled to the norm ``scale`` (the
    data's ``feature_scale`` after its l2 normalisation), so the Laplacian's bandwidths keep their meaning.

    Args:
        representation: the representation that receives the projected points (e.g. :class:`InContextEigenmap`).
        input_dim: the points' dimension (the feature dimension of the data).
        dim: the projected dimension.
        scale: the norm of every projected point; ``None`` leaves the projection's own scale.
    """

    def __init__(self, representation: nn.Module, input_dim: int, dim: int = 64, scale: float | None = 0.1):
        super().__init__()
        check_int("input_dim", input_dim, minimum=1, hint="the data's feature dimension")
        check_int("dim", dim, minimum=1)
        if scale is not None:
            check_positive("scale", scale, hint="the data's feature_scale, e.g. 0.1")
        self.input_dim, self.dim, self.scale = input_dim, dim, scale
        self.projection = nn.Linear(input_dim, dim, bias=False)
        self.representation = representation

    @property
    def n_points(self) -> int | None:
        return getattr(self.representation, "n_points", None)

    @property
    def out_dim(self) -> int | None:
        return getattr(self.representation, "out_dim", None)

    def check_config(self, *, datamodule: object = None, **_: object) -> None:
        """Before a run: the projection's input size must be the data's point dimension."""
        check_input_dim(self, datamodule, "--model.init_args.net.init_args.representation.init_args.input_dim")

    def forward(self, x: Tensor) -> Tensor:
        z = self.projection(x.float())
        if self.scale is not None:  # F.normalize clamps the norm, so an all-zero point stays zero
            z = F.normalize(z, dim=-1) * self.scale
        return self.representation(z)
