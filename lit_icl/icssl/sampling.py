"""Episodes on IC-SSL's synthetic manifolds (Sec. 4.3): product manifolds (App. E.2), the spec parser
:func:`get_manifold` (``"sphere"``, ``"sphere*cylinder*cone*spiral*torus"``, ...) and :func:`sample_episodes`.
The single manifolds and the random pose are in :mod:`lit_icl.icssl.manifolds`.

Typical use::

    g = torch.Generator().manual_seed(0)
    ep = sample_episodes(get_manifold("sphere*cylinder*cone*spiral*torus"), 64, 100, g)
    ep.x.shape, ep.y.shape  # (64, 100, 15), (64, 100)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor

from lit_icl.core.errors import ConfigError
from lit_icl.icssl.manifolds import (
    _DTYPE,
    Cone,
    Cylinder,
    FlatTorus,
    GeneratorSplit,
    Manifold,
    PoseConfig,
    RandomSource,
    Sphere,
    Spiral,
    _check_generator,
    _rand,
)

__all__ = ["MANIFOLD_NAMES", "Episodes", "ProductManifold", "get_manifold", "sample_episodes"]


# ----------------------------------------------------------------------------------------------------------
# Product manifolds (App. E.2)
# ----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProductManifold(Manifold):
    """Cartesian product ``M_1 x ... x M_K`` with the product metric (Sec. 4.3.2, App. E.2).

    * Sampling: each factor's chart is sampled independently; the product chart is their concatenation
      (``chart_dim = sum_k chart_dim_k``).
    * Embedding: each factor is embedded in its own R^3 and posed independently (its own scale, rotation and
      translation, App. E.2 / Sec. 4.3.2); the ambient point is the concatenation (``ambient_dim = 3K``).
    * Distance: Eq. (39) / Theorem 1, ``d_x(P, Q) = sqrt(sum_k d_{M_k}(p_k, q_k)^2)``.
    * Labels: a geodesic ball about a uniformly drawn centre point, as for the single manifolds. The paper
      gives no threshold for products (distances grow with ``K``, so no single ``tau`` fits every product);
      this implementation uses a quantile rule instead: the radius is the ``positive_fraction``-quantile
      (linear interpolation, as ``torch.quantile``) of the episode's distances to the centre, and
      ``y = d < radius``. The centre (distance 0) is always positive, even when the radius is 0. With the
      default 0.5 and ``n = 100``, 50 points are positive (absent ties).

    A factor's own labelling rule (``tau`` or the spiral's median rule) plays no role in a product.

    ``permute_factors=True`` adds the permutation of Sec. 4.3.2 ("random scale, rotation, and permutation
    applied independently to each factor"): after posing, each episode's 3-D factor blocks are put in a random
    order (one order per episode, drawn last from the generator, so charts, labels and poses are unchanged).
    A model then cannot tell the factors apart by position.
    """

    factors: tuple[Manifold, ...]
    positive_fraction: float = 0.5
    permute_factors: bool = False
    ambient_dim: int = field(init=False)
    chart_dim: int = field(init=False)
    option_names: ClassVar[tuple[str, ...]] = ("positive_fraction", "permute_factors")
    tau: ClassVar[None] = None

    def __post_init__(self) -> None:
        # frozen dataclass: bypass __setattr__ for the derived fields.
        object.__setattr__(self, "factors", tuple(self.factors))
        if len(self.factors) < 2:
            raise ConfigError(
                f"a product manifold needs at least 2 factors (App. E.2), got {len(self.factors)}"
            )
        if not all(isinstance(f, Manifold) for f in self.factors):
            raise TypeError("ProductManifold factors must be Manifold instances")
        if not 0.0 < self.positive_fraction <= 1.0:
            raise ConfigError(f"positive_fraction must be in (0, 1], got {self.positive_fraction}")
        object.__setattr__(self, "chart_dim", sum(f.chart_dim for f in self.factors))
        object.__setattr__(self, "ambient_dim", sum(f.ambient_dim for f in self.factors))

    @property
    def name(self) -> str:  # type: ignore[override]
        """``"sphere*cylinder*..."``: the spec string :func:`get_manifold` parses back into this product."""
        return "*".join(f.name for f in self.factors)

    def _chart_slices(self) -> list[slice]:
        """Column slice of each factor inside the concatenated chart."""
        slices, start = [], 0
        for f in self.factors:
            slices.append(slice(start, start + f.chart_dim))
            start += f.chart_dim
        return slices

    def sample_chart(self, num_episodes: int, n_points: int, generator: RandomSource) -> Tensor:
        return torch.cat([f.sample_chart(num_episodes, n_points, generator) for f in self.factors], dim=-1)

    def embed(self, u: Tensor) -> Tensor:
        return torch.cat([f.embed(u[..., sl]) for f, sl in zip(self.factors, self._chart_slices())], dim=-1)

    def geodesic(self, u1: Tensor, u2: Tensor) -> Tensor:
        parts = zip(self.factors, self._chart_slices())
        squares = [f.geodesic(u1[..., sl], u2[..., sl]) ** 2 for f, sl in parts]
        return torch.sqrt(torch.stack(torch.broadcast_tensors(*squares), dim=0).sum(dim=0))

    def label(self, chart: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """Quantile-radius geodesic ball about a random centre (see the class docstring)."""
        num, n, _ = chart.shape
        center = torch.randint(n, (num,), generator=generator, device=generator.device)
        dist = self.distance_to_center(chart, center)
        radius = torch.quantile(dist, self.positive_fraction, dim=-1, keepdim=True)
        is_center = torch.arange(n, device=chart.device).unsqueeze(0) == center.unsqueeze(1)
        return ((dist < radius) | is_center).long(), center

    def embed_and_pose(self, chart: Tensor, pose: PoseConfig, generator: RandomSource) -> Tensor:
        # Each factor gets its own pose draw (Sec. 4.3.2: transformations "applied independently to each
        # factor"), consumed from the generator in factor order.
        parts = zip(self.factors, self._chart_slices())
        x = torch.cat([f.embed_and_pose(chart[..., sl], pose, generator) for f, sl in parts], dim=-1)
        if not self.permute_factors:
            return x
        b, n, _ = x.shape
        k = len(self.factors)
        order = _rand((b, k), generator).argsort(dim=-1)
        blocks = x.view(b, n, k, 3)
        return blocks.gather(2, order[:, None, :, None].expand(b, n, k, 3)).reshape(b, n, 3 * k)


# ----------------------------------------------------------------------------------------------------------
# Registry and parser
# ----------------------------------------------------------------------------------------------------------
_REGISTRY: dict[str, type[Manifold]] = {
    "sphere": Sphere,
    "cylinder": Cylinder,
    "cone": Cone,
    "spiral": Spiral,
    "torus": FlatTorus,
}
_ALIASES: dict[str, str] = {"swiss_roll": "spiral", "flat_torus": "torus"}

#: Canonical names accepted by :func:`get_manifold` (aliases: ``swiss_roll``, ``flat_torus``).
MANIFOLD_NAMES: tuple[str, ...] = tuple(_REGISTRY)

_CHOICES = (
    "sphere, cylinder, cone, spiral (alias swiss_roll), torus (alias flat_torus), "
    "or a product like 'sphere*torus'"
)


def _resolve(name: str, spec: str) -> type[Manifold]:
    """Map one (case-insensitive, alias-aware) factor name to its class, or raise a one-line ValueError."""
    key = name.strip().lower().replace("-", "_")
    key = _ALIASES.get(key, key)
    if key not in _REGISTRY:
        where = f" in {spec!r}" if name.strip() != spec.strip() else ""
        raise ConfigError(f"unknown manifold {name.strip()!r}{where}; choose from {_CHOICES}")
    return _REGISTRY[key]


def get_manifold(spec: str, **options: Any) -> Manifold:
    """Build a manifold from a name or a ``'*'``-separated product spec.

    Args:
        spec: one of ``sphere``, ``cylinder``, ``cone``, ``spiral`` (alias ``swiss_roll``), ``torus`` (alias
            ``flat_torus``), case-insensitive, or a product such as ``"sphere*cylinder*cone*spiral*torus"``
            (App. E.2; factors may repeat).
        **options: constructor arguments, each routed to every part of the spec that accepts it:
            ``height`` (cylinder), ``alpha_range`` and ``s_max`` (cone), ``positive_fraction`` (product).

    Raises:
        ConfigError: (a ``ValueError``) an unknown manifold name (the message names it and lists the valid
            names), or an option that applies to no part of the spec.
    """
    if not isinstance(spec, str):
        raise TypeError(f"manifold spec must be a string, got {type(spec).__name__}")
    classes = [_resolve(p, spec) for p in spec.split("*")]
    is_product = len(classes) > 1
    accepting = _accepted_options(classes)
    for key in options:
        if key not in accepting:
            raise ConfigError(
                f"option {key!r} does not apply to manifold {spec!r}; options are height (cylinder), "
                "alpha_range and s_max (cone), tau (torus), positive_fraction and permute_factors (products)"
            )

    factors = [cls(**{k: v for k, v in options.items() if k in cls.option_names}) for cls in classes]
    if not is_product:
        return factors[0]
    product_opts = {k: v for k, v in options.items() if k in ProductManifold.option_names}
    return ProductManifold(tuple(factors), **product_opts)


def _accepted_options(classes: Sequence[type[Manifold]]) -> set[str]:
    """The options some part of a spec takes: its factors' own, and a product's."""
    accepting = set(ProductManifold.option_names) if len(classes) > 1 else set()
    for cls in classes:
        accepting.update(cls.option_names)
    return accepting


def get_manifolds(specs: Sequence[str], **options: Any) -> list[Manifold]:
    """:func:`get_manifold` for each of ``specs``, given only the ``options`` that apply to it (a cylinder its
    ``height``, a product its ``positive_fraction``), so that one set of options serves a list of manifolds.

    Raises:
        ConfigError: a spec that is not a string, or an unknown manifold name.
    """
    out = []
    for spec in specs:
        if not isinstance(spec, str):
            raise ConfigError(f"manifold {spec!r} must be a name such as 'cylinder'")
        accepting = _accepted_options([_resolve(p, spec) for p in spec.split("*")])
        out.append(get_manifold(spec, **{k: v for k, v in options.items() if k in accepting}))
    return out


# ----------------------------------------------------------------------------------------------------------
# Episodes
# ----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)  # eq=False: elementwise tensor == has no single truth value
class Episodes:
    """A batch of ``B`` labelled point clouds of ``n`` points each (Sec. 4.3).

    Attributes:
        x: ``(B, n, D)`` float32 posed ambient coordinates (``D = 3``, or ``3K`` for a K-factor product).
        y: ``(B, n)`` int64 labels in {0, 1} (1 = inside the geodesic ball).
        chart: ``(B, n, chart_dim)`` float32 chart coordinates (for products, the concatenated factor charts;
            for the cone the third column is the episode's apex angle).
        center: ``(B,)`` int64 index of the ball's centre (for the spiral, the point with the smallest ``t``).
    """

    x: Tensor
    y: Tensor
    chart: Tensor
    center: Tensor


def sample_episodes(
    manifold: Manifold | str,
    num_episodes: int,
    n_points: int,
    generator: RandomSource,
    pose: PoseConfig = PoseConfig(),  # noqa: B008 - frozen (immutable), so one shared default is safe
) -> Episodes:
    """Sample ``num_episodes`` labelled episodes of ``n_points`` points on ``manifold`` (Sec. 4.3, App. D-E).

    Steps, each vectorised over the batch: (1) sample chart parameters uniformly; (2) label with a geodesic
    ball on the unit-scale manifold (App. E.1; spiral: median rule; products: quantile radius); (3) embed with
    ``Phi`` and apply a random pose per episode (per factor for products; App. D). Random draws come from
    ``generator`` in exactly that order, so the same seed reproduces the same episodes, and changing only
    ``pose`` leaves ``chart``, ``y`` and ``center`` unchanged.

    Args:
        manifold: a :class:`Manifold` or a spec string for :func:`get_manifold`.
        num_episodes: batch size ``B``.
        n_points: points per episode ``n`` (the paper uses 100).
        generator: the only source of randomness; a
            :class:`~lit_icl.icssl.manifolds.GeneratorSplit` samples several chunks' episodes in one pass, each
            chunk's as its own generator alone would.
        pose: ranges of the random pose; ``PoseConfig(scale=(1, 1), translation=(0, 0), rotation="none")``
            gives the unposed embedding.
    """
    _check_generator(generator)
    if isinstance(manifold, str):
        manifold = get_manifold(manifold)
    if num_episodes < 1 or n_points < 1:
        raise ValueError(f"num_episodes and n_points must be >= 1, got {num_episodes} and {n_points}")
    if isinstance(generator, GeneratorSplit) and generator.total != num_episodes:
        raise ValueError(f"the generators draw for {generator.total} episodes, not num_episodes={num_episodes}")
    chart = manifold.sample_chart(num_episodes, n_points, generator)
    if isinstance(generator, GeneratorSplit):  # labels chunk by chunk (see GeneratorSplit)
        y, center = generator.each(manifold.label, chart)
    else:
        y, center = manifold.label(chart, generator)
    x = manifold.embed_and_pose(chart, pose, generator)
    return Episodes(x=x.to(_DTYPE), y=y, chart=chart, center=center)
