"""Synthetic manifolds for in-context semi-supervised learning (IC-SSL).

Implements the manifolds of "In-context semi-supervised learning", Section 4.3 (families of manifolds):
Appendix D (random pose: isotropic scale, planar rotation, planar translation) and Appendix E.1 (the five
classic manifolds in R^3, their charts, closed-form geodesics and label thresholds). Product manifolds
(Appendix E.2), the spec parser and the episode sampler are in :mod:`lit_icl.icssl.sampling`.

An *episode* is ``n`` points (``n = 100`` in the paper) drawn on one manifold together with binary labels
that mark a geodesic ball: a centre index ``c`` is drawn uniformly and ``y_i = 1`` iff
``d_M(x_i, x_c) < tau_M`` (App. E.1). Everything is vectorised over a batch of ``B`` episodes, returns
float32 coordinates, and draws every random number from an explicit :class:`torch.Generator`, never from
the global RNG, so that a data module can reproduce any episode from a seed.

Public API (here, and in :mod:`~lit_icl.icssl.sampling` the last four)::

    PoseConfig(scale=(0.02, 0.1), translation=(-1.0, 1.0), rotation="planar")
    Manifold                       # base class: name, chart_dim, ambient_dim, tau,
                                   # sample_chart, embed, geodesic, label, embed_and_pose
    Sphere(), Cylinder(height=2.0), Cone(alpha_range=(pi/6, pi/3), s_max=1.0), Spiral(), FlatTorus()
    GeneratorSplit(generators, counts)  # several chunks' generators, sampled in one pass
    apply_pose(x, pose, generator) -> Tensor
    random_rotation(num, kind, generator, dtype=torch.float32) -> Tensor
    ProductManifold(factors, positive_fraction=0.5)
    Episodes(x, y, chart, center)
    get_manifold(spec, **options) -> Manifold
    sample_episodes(manifold, num_episodes, n_points, generator, pose=PoseConfig()) -> Episodes
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor

from lit_icl.core.errors import ConfigError

__all__ = [
    "TORUS_TAU",
    "Cone",
    "Cylinder",
    "FlatTorus",
    "GeneratorSplit",
    "Manifold",
    "PoseConfig",
    "Sphere",
    "Spiral",
    "apply_pose",
    "random_rotation",
    "wrapped_angle_difference",
]

TWO_PI: float = 2.0 * math.pi

#: Default flat-torus threshold: the geodesic disc of area (2 pi)^2 / 8, App. E.1.5's "1/8 of the surface".
TORUS_TAU: float = math.sqrt(math.pi / 2.0)

# All generated coordinates are float32 whatever torch's default dtype is, so episodes are bit-identical
# across processes that configure torch differently.
_DTYPE: torch.dtype = torch.float32


# ----------------------------------------------------------------------------------------------------------
# Small helpers
# ----------------------------------------------------------------------------------------------------------
class GeneratorSplit:
    """The random source of a batch of episodes made of several chunks, each with its own generator.

    Every draw in this module and in :mod:`~lit_icl.icssl.sampling` has the episodes on its leading axis. Given
    one, generator ``j`` draws the next ``counts[j]`` rows of it, exactly the draw it makes when it samples its
    own ``counts[j]`` episodes alone; the rows are stacked in generator order. So a sampler run once over the
    whole batch makes each chunk's episodes from the same random numbers as a run per chunk, and its arithmetic
    runs once per batch instead of once per chunk. Generators with a count of 0 are never drawn from, as a
    chunk with no episode on a manifold does not sample it.

    Equal random numbers give equal episodes only where the arithmetic does not depend on an element's place in
    the tensor. Charts, embeddings and poses qualify (products, ``sin``, ``cos``, batched matrix products and
    QR, per element or per matrix). The geodesic distances behind the labels do not: torch's CPU ``atan2`` and
    ``pow`` round an element one way inside a vectorised loop and another in its scalar tail, so a distance at a
    label's threshold could come out one ulp apart. :func:`~lit_icl.icssl.sampling.sample_episodes` therefore
    labels each generator's episodes on their own (:meth:`each`), as a run per chunk would.

    Args:
        generators: one per chunk.
        counts: the episodes each generator draws for, in the same order.
    """

    def __init__(self, generators: Sequence[torch.Generator], counts: Sequence[int]):
        if len(generators) != len(counts) or not generators:
            raise ValueError(f"need one count per generator, got {len(generators)} generators, {len(counts)} counts")
        for g in generators:
            _check_generator(g)
        self.parts = [(g, int(c)) for g, c in zip(generators, counts) if c > 0]
        self.total = sum(c for _, c in self.parts)
        self.device = generators[0].device

    def draw(self, fn: Callable[[tuple[int, ...], torch.Generator], Tensor], shape: tuple[int, ...]) -> Tensor:
        """``fn(shape, generator)`` with the leading axis of ``shape`` split over the generators."""
        if not shape or shape[0] != self.total:
            raise ValueError(f"a split draw needs {self.total} episodes on its leading axis, got shape {shape}")
        return torch.cat([fn((c, *shape[1:]), g) for g, c in self.parts])

    def each(self, fn: Callable[..., tuple[Tensor, ...]], *rows: Tensor) -> tuple[Tensor, ...]:
        """``fn(*rows_j, generator_j)`` on each generator's own rows, the outputs stacked in generator order.

        Each generator's rows are copied into tensors of their own first, laid out as a run over that chunk
        alone would have them, so ``fn`` computes exactly what it computes there.
        """
        outs, start = [], 0
        for g, c in self.parts:
            outs.append(fn(*(r[start:start + c].clone() for r in rows), g))
            start += c
        return tuple(torch.cat(parts) for parts in zip(*outs))


#: What the samplers draw from: one generator, or a batch's generators (:class:`GeneratorSplit`).
RandomSource = torch.Generator | GeneratorSplit


def _draw(fn: Callable[[tuple[int, ...], torch.Generator], Tensor], shape: tuple[int, ...],
          generator: RandomSource) -> Tensor:
    return generator.draw(fn, shape) if isinstance(generator, GeneratorSplit) else fn(shape, generator)


def _rand(shape: tuple[int, ...], generator: RandomSource, dtype: torch.dtype = _DTYPE) -> Tensor:
    """``U(0, 1)`` of ``shape`` on the generator's device (the episodes on the leading axis)."""
    return _draw(lambda s, g: torch.rand(s, generator=g, device=g.device, dtype=dtype), shape, generator)


def _randn(shape: tuple[int, ...], generator: RandomSource, dtype: torch.dtype = _DTYPE) -> Tensor:
    """Standard normal of ``shape`` on the generator's device (the episodes on the leading axis)."""
    return _draw(lambda s, g: torch.randn(s, generator=g, device=g.device, dtype=dtype), shape, generator)


def _uniform(shape: tuple[int, ...], low: float, high: float, generator: RandomSource) -> Tensor:
    """Draw ``U(low, high)`` of ``shape`` (float32) from ``generator`` on the generator's device."""
    return low + (high - low) * _rand(shape, generator)


def wrapped_angle_difference(a: Tensor, b: Tensor, period: float = TWO_PI) -> Tensor:
    """Shortest periodic difference ``min(|a - b|, period - |a - b|)`` in ``[0, period / 2]``.

    App. E.1.5 writes this wrap for the flat torus; the cylinder (E.1.2) and the cone (E.1.3) are periodic in
    their angle too, so their geodesics need the same wrap (the paper's formulas there write a bare
    ``Delta theta``). ``remainder`` first maps the raw difference into ``[0, period)`` so that inputs outside
    the chart range (e.g. a user's ``theta = -0.1``) are handled as well.
    """
    d = torch.remainder(a - b, period)
    return torch.minimum(d, period - d)


def _check_generator(generator: Any) -> RandomSource:
    """Reject a missing generator: silently falling back to the global RNG would break reproducibility."""
    if not isinstance(generator, torch.Generator | GeneratorSplit):
        raise TypeError(
            f"generator must be a torch.Generator (got {type(generator).__name__}); "
            "the manifold sampler never uses the global RNG"
        )
    return generator


def _gather_points(chart: Tensor, index: Tensor) -> Tensor:
    """Pick one point per episode: ``chart (B, n, m)``, ``index (B,)`` -> ``(B, 1, m)`` (broadcastable)."""
    batch = torch.arange(chart.shape[0], device=chart.device)
    return chart[batch, index].unsqueeze(1)


# ----------------------------------------------------------------------------------------------------------
# Random pose (App. D)
# ----------------------------------------------------------------------------------------------------------
#: The random rotation of an episode (App. D / App. E.1).
PoseRotation = Literal["planar", "haar", "none"]


@dataclass(frozen=True)
class PoseConfig:
    """Ranges of the random pose applied to the embedded points (App. D, "Manifold transformations").

    The paper's code draws, per episode, an isotropic scale ``s ~ U(0.02, 0.1)``, a rotation about the z axis
    by ``theta ~ U(0, 2 pi)`` and a translation ``(t_x, t_y, 0)`` with ``t_x, t_y ~ U(-1, 1)``, and applies
    them to row vectors as ``x -> s * x @ R + t``. App. E.1's prose calls the rotation a "3-D rotation";
    ``rotation="haar"`` provides that reading (a uniformly random element of SO(3)).

    Attributes:
        scale: ``(low, high)`` of the uniform isotropic scale factor; ``(1.0, 1.0)`` disables scaling.
        translation: ``(low, high)`` of the uniform x and y translations (z is never translated, as in the
            paper's code); ``(0.0, 0.0)`` disables translation.
        rotation: ``"planar"`` (about z, App. D), ``"haar"`` (uniform on SO(3), App. E.1) or ``"none"``.
    """

    scale: tuple[float, float] = (0.02, 0.1)
    translation: tuple[float, float] = (-1.0, 1.0)
    rotation: PoseRotation = "planar"

    def __post_init__(self) -> None:
        lo, hi = self.scale
        if not 0.0 < lo <= hi:
            raise ConfigError(f"PoseConfig.scale must satisfy 0 < low <= high, got {self.scale}")
        if not self.translation[0] <= self.translation[1]:
            raise ConfigError(f"PoseConfig.translation must satisfy low <= high, got {self.translation}")
        if self.rotation not in ("planar", "haar", "none"):
            raise ConfigError(
                f"PoseConfig.rotation must be 'planar', 'haar' or 'none', got {self.rotation!r}"
            )


def random_rotation(
    num: int,
    kind: PoseRotation,
    generator: RandomSource,
    dtype: torch.dtype = _DTYPE,
) -> Tensor:
    """Draw ``num`` rotation matrices ``(num, 3, 3)`` to right-multiply row vectors (``x @ R``).

    * ``"planar"``: the z-axis rotation of App. D, written exactly as in the paper's code,
      ``[[cos, -sin, 0], [sin, cos, 0], [0, 0, 1]]`` with ``theta ~ U(0, 2 pi)``.
    * ``"haar"``: uniform on SO(3). QR of a standard Gaussian matrix gives a Haar-distributed orthogonal ``Q``
      once the columns are multiplied by ``sign(diag(R))`` (Mezzadri 2007); flipping the first column of the
      matrices with ``det = -1`` is a measure-preserving bijection O(3)^- -> SO(3), so the result is Haar on
      SO(3).
    * ``"none"``: identity.
    """
    device = generator.device
    if kind == "none":
        return torch.eye(3, dtype=dtype, device=device).expand(num, 3, 3).clone()
    if kind == "planar":
        theta = _uniform((num,), 0.0, TWO_PI, generator).to(dtype)
        c, s = torch.cos(theta), torch.sin(theta)
        zero, one = torch.zeros_like(c), torch.ones_like(c)
        rows = [
            torch.stack([c, -s, zero], dim=-1),
            torch.stack([s, c, zero], dim=-1),
            torch.stack([zero, zero, one], dim=-1),
        ]
        return torch.stack(rows, dim=-2)
    if kind == "haar":
        gauss = _randn((num, 3, 3), generator, dtype)
        q, r = torch.linalg.qr(gauss)
        # sign fix: without it QR's convention (positive or arbitrary diag(R)) biases the distribution.
        signs = torch.where(torch.diagonal(r, dim1=-2, dim2=-1) < 0, -1.0, 1.0).to(dtype)
        q = q * signs.unsqueeze(-2)
        det_sign = torch.where(torch.linalg.det(q) < 0, -1.0, 1.0).to(dtype)
        flip = torch.ones((num, 1, 3), dtype=dtype, device=device)
        flip[:, 0, 0] = det_sign
        return q * flip
    raise ValueError(f"unknown rotation kind {kind!r}; choose from 'planar', 'haar', 'none'")


def apply_pose(x: Tensor, pose: PoseConfig, generator: RandomSource) -> Tensor:
    """Apply an independent random pose to each episode: ``x -> s * x @ R + t`` (App. D).

    Args:
        x: ``(B, n, 3)`` embedded points (row vectors) of ``B`` episodes.
        pose: ranges of the scale, rotation and translation.
        generator: source of all random draws (per episode: scale, rotation, translation, in that order).

    Returns:
        ``(B, n, 3)`` posed points. Pairwise Euclidean distances within an episode are multiplied by that
        episode's scale ``s``; everything else about the geometry is unchanged (a similarity transform).
    """
    _check_generator(generator)
    if x.ndim != 3 or x.shape[-1] != 3:
        raise ValueError(f"apply_pose expects (B, n, 3) points, got shape {tuple(x.shape)}")
    num = x.shape[0]
    scale = _uniform((num, 1, 1), pose.scale[0], pose.scale[1], generator).to(x.dtype)
    rot = random_rotation(num, pose.rotation, generator, dtype=x.dtype)
    txy = _uniform((num, 1, 2), pose.translation[0], pose.translation[1], generator).to(x.dtype)
    # z translation is zero, as in the paper's code ("planar translation").
    shift = torch.cat([txy, torch.zeros_like(txy[..., :1])], dim=-1)
    return torch.baddbmm(shift, scale * x, rot)


# ----------------------------------------------------------------------------------------------------------
# Manifolds (App. E.1)
# ----------------------------------------------------------------------------------------------------------
class Manifold(ABC):
    """A Riemannian manifold with a global chart and a closed-form intrinsic distance (Sec. 4.3, App. E.1).

    Chart points ``u`` are tensors whose last dimension is ``chart_dim``; all methods broadcast over the
    leading dimensions. Subclasses define the chart sampler, the chart map ``Phi`` (:meth:`embed`) and the
    geodesic distance; the default :meth:`label` is the geodesic ball of radius :attr:`tau` around a uniformly
    drawn centre (App. E.1). Charts and poses draw through this module's ``_uniform``, ``_rand`` and ``_randn``
    with the episodes on the leading axis, so that they sample from a :class:`GeneratorSplit` too (a data
    module's batch of chunks); a direct ``torch.rand(..., generator=...)`` would refuse it. :meth:`label` always
    gets one chunk's own generator (:meth:`GeneratorSplit.each`).

    Attributes:
        name: canonical name used by :func:`get_manifold`.
        chart_dim: number of chart coordinates per point.
        ambient_dim: dimension of the embedding space (3 for the classic manifolds).
        tau: label threshold ``tau_M`` of App. E.1, or ``None`` where the labelling rule is different.
        option_names: constructor keyword arguments that :func:`get_manifold` may route to this class.
    """

    name: str
    chart_dim: int
    ambient_dim: int = 3
    tau: float | None = None
    option_names: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def sample_chart(self, num_episodes: int, n_points: int, generator: RandomSource) -> Tensor:
        """Sample chart parameters uniformly (App. E.1): ``(num_episodes, n_points, chart_dim)`` float32."""

    @abstractmethod
    def embed(self, u: Tensor) -> Tensor:
        """The chart map ``Phi``: ``(..., chart_dim)`` -> ``(..., ambient_dim)`` (unposed, unit scale)."""

    @abstractmethod
    def geodesic(self, u1: Tensor, u2: Tensor) -> Tensor:
        """Closed-form intrinsic distance between chart points, broadcasting over leading dimensions.

        ``geodesic(u[:, :, None], u[:, None, :])`` gives the ``(B, n, n)`` distance matrix and
        ``geodesic(u, u[:, c:c + 1])`` the ``(B, n)`` distances to point ``c``.
        """

    def distance_to_center(self, chart: Tensor, center: Tensor) -> Tensor:
        """Geodesic distance of every point to its episode's centre: ``(B, n, m)``, ``(B,)`` -> ``(B, n)``."""
        return self.geodesic(chart, _gather_points(chart, center))

    def label(self, chart: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """Geodesic-ball labels of App. E.1: ``y_i = 1`` iff ``d(x_i, x_c) < tau`` for ``c ~ Unif{0..n-1}``.

        Labels are computed on the unit-scale manifold, i.e. before any pose, so they cannot depend on it.

        Returns:
            ``(y, center)``: ``(B, n)`` int64 labels in {0, 1} (the centre itself is positive since
            ``d = 0 < tau``) and the ``(B,)`` int64 centre indices.
        """
        if self.tau is None:
            raise ValueError(f"manifold {self.name!r} has no label threshold tau; override label()")
        num, n, _ = chart.shape
        center = torch.randint(n, (num,), generator=generator, device=generator.device)
        dist = self.distance_to_center(chart, center)
        return (dist < self.tau).long(), center

    def embed_and_pose(self, chart: Tensor, pose: PoseConfig, generator: RandomSource) -> Tensor:
        """Embed with ``Phi`` and apply one random pose per episode (App. D): ``(B, n, ambient_dim)``."""
        return apply_pose(self.embed(chart), pose, generator)


@dataclass(frozen=True)
class Sphere(Manifold):
    """Unit sphere S^2 (App. E.1.1).

    ``Phi(theta, phi) = (sin theta cos phi, sin theta sin phi, cos theta)``, ``theta ~ U(0, pi)``,
    ``phi ~ U(0, 2 pi)``. Following the paper ("sampling the chart parameters uniformly"), the chart, not the
    surface area, is uniform, so points concentrate towards the poles.

    Geodesic: the great-circle length ``arccos<p, q>``, evaluated as ``atan2(|p x q|, <p, q>)``. The two are
    equal on the unit sphere, but ``arccos`` of a float32 inner product near +-1 has an error of order
    ``sqrt(eps) ~ 3e-4`` (a point's distance to itself would come out as ~3e-4), whereas ``atan2`` is accurate
    at all angles and gives exactly 0 for identical points (``atan2`` has no domain to leave, so the clamp of
    the inner product to ``[-1, 1]`` that ``arccos`` needs is unnecessary here).

    Threshold ``tau = pi / 3`` (a 60-degree cap).
    """

    name: ClassVar[str] = "sphere"
    chart_dim: ClassVar[int] = 2
    ambient_dim: ClassVar[int] = 3
    tau: ClassVar[float] = math.pi / 3

    def sample_chart(self, num_episodes: int, n_points: int, generator: RandomSource) -> Tensor:
        u = _uniform((num_episodes, n_points, 2), 0.0, 1.0, _check_generator(generator))
        return u * torch.tensor([math.pi, TWO_PI], dtype=_DTYPE, device=u.device)

    def embed(self, u: Tensor) -> Tensor:
        theta, phi = u[..., 0], u[..., 1]
        st = torch.sin(theta)
        return torch.stack([st * torch.cos(phi), st * torch.sin(phi), torch.cos(theta)], dim=-1)

    def geodesic(self, u1: Tensor, u2: Tensor) -> Tensor:
        p, q = torch.broadcast_tensors(self.embed(u1), self.embed(u2))
        cross = torch.linalg.cross(p, q, dim=-1).norm(dim=-1)
        dot = (p * q).sum(dim=-1)
        return torch.atan2(cross, dot)


@dataclass(frozen=True)
class Cylinder(Manifold):
    """Unit-radius cylinder (App. E.1.2).

    ``Phi(theta, z) = (r cos theta, r sin theta, z)`` with ``r = 1``, ``theta ~ U(0, 2 pi)``,
    ``z ~ U(0, height)``. The paper does not state the height; ``height = 2.0`` (the default) makes the axial
    extent comparable to the circumference's half-length ``pi r`` and leaves room for the ``tau = 1`` ball.

    Geodesic (unrolled strip): ``d^2 = (r Delta theta)^2 + (z_1 - z_2)^2`` with ``Delta theta`` wrapped to
    ``[0, pi]``; the paper's formula omits the wrap, but the cylinder is periodic in ``theta``, so the
    shortest path may cross ``theta = 0``. Threshold ``tau = 1.0``.
    """

    height: float = 2.0
    name: ClassVar[str] = "cylinder"
    chart_dim: ClassVar[int] = 2
    ambient_dim: ClassVar[int] = 3
    tau: ClassVar[float] = 1.0
    radius: ClassVar[float] = 1.0
    option_names: ClassVar[tuple[str, ...]] = ("height",)

    def __post_init__(self) -> None:
        if not self.height > 0:
            raise ConfigError(f"Cylinder height must be positive, got {self.height}")

    def sample_chart(self, num_episodes: int, n_points: int, generator: RandomSource) -> Tensor:
        u = _uniform((num_episodes, n_points, 2), 0.0, 1.0, _check_generator(generator))
        return u * torch.tensor([TWO_PI, self.height], dtype=_DTYPE, device=u.device)

    def embed(self, u: Tensor) -> Tensor:
        theta, z = u[..., 0], u[..., 1]
        return torch.stack([self.radius * torch.cos(theta), self.radius * torch.sin(theta), z], dim=-1)

    def geodesic(self, u1: Tensor, u2: Tensor) -> Tensor:
        dtheta = wrapped_angle_difference(u1[..., 0], u2[..., 0])
        return torch.hypot(self.radius * dtheta, u1[..., 1] - u2[..., 1])


@dataclass(frozen=True)
class Cone(Manifold):
    """Right circular cone with apex at the origin (App. E.1.3).

    ``Phi(s, theta) = (s sin a cos theta, s sin a sin theta, s cos a)`` with slant distance
    ``s ~ U(0, s_max)``, ``theta ~ U(0, 2 pi)`` and apex half-angle ``a ~ U(alpha_range)`` drawn once per
    episode (the paper only states ``a in (0, pi/2)``; ``(pi/6, pi/3)`` is this implementation's default).
    The angle is stored as a third chart column ``(s, theta, a)`` (constant within an episode) so that
    :meth:`geodesic` can read it; :meth:`geodesic` uses the ``a`` of its first argument.

    Geodesic (unrolling the cone into a planar sector of angle ``2 pi sin a < 2 pi``):
    ``d^2 = s_1^2 + s_2^2 - 2 s_1 s_2 cos(sin a * Delta theta)`` with ``Delta theta`` wrapped to
    ``[0, pi]``. The unrolled angle ``sin a * Delta theta`` is then below ``pi``, so the straight segment lies
    inside the sector and is the shortest path. It is evaluated in the algebraically equal, cancellation-free
    form ``(s_1 - s_2)^2 + 4 s_1 s_2 sin^2(sin a * Delta theta / 2)`` and clamped at 0 before the square root.
    Threshold ``tau = 0.5``.
    """

    alpha_range: tuple[float, float] = (math.pi / 6, math.pi / 3)
    s_max: float = 1.0
    name: ClassVar[str] = "cone"
    chart_dim: ClassVar[int] = 3
    ambient_dim: ClassVar[int] = 3
    tau: ClassVar[float] = 0.5
    option_names: ClassVar[tuple[str, ...]] = ("alpha_range", "s_max")

    def __post_init__(self) -> None:
        lo, hi = self.alpha_range
        if not 0.0 < lo <= hi < math.pi / 2:
            raise ConfigError(f"Cone alpha_range must satisfy 0 < low <= high < pi/2, got {self.alpha_range}")
        if not self.s_max > 0:
            raise ConfigError(f"Cone s_max must be positive, got {self.s_max}")

    def sample_chart(self, num_episodes: int, n_points: int, generator: RandomSource) -> Tensor:
        _check_generator(generator)
        st = _uniform((num_episodes, n_points, 2), 0.0, 1.0, generator)
        st = st * torch.tensor([self.s_max, TWO_PI], dtype=_DTYPE, device=st.device)
        alpha = _uniform((num_episodes, 1, 1), self.alpha_range[0], self.alpha_range[1], generator)
        return torch.cat([st, alpha.expand(num_episodes, n_points, 1)], dim=-1)

    def embed(self, u: Tensor) -> Tensor:
        s, theta, alpha = u[..., 0], u[..., 1], u[..., 2]
        radial = s * torch.sin(alpha)
        return torch.stack(
            [radial * torch.cos(theta), radial * torch.sin(theta), s * torch.cos(alpha)], dim=-1
        )

    def geodesic(self, u1: Tensor, u2: Tensor) -> Tensor:
        s1, s2 = u1[..., 0], u2[..., 0]
        unrolled = torch.sin(u1[..., 2]) * wrapped_angle_difference(u1[..., 1], u2[..., 1])
        d2 = (s1 - s2) ** 2 + 4.0 * s1 * s2 * torch.sin(0.5 * unrolled) ** 2
        return torch.sqrt(torch.clamp(d2, min=0.0))


@dataclass(frozen=True)
class Spiral(Manifold):
    """Archimedean spiral / "Swiss roll" curve (App. E.1.4).

    ``Phi(t) = (t^2 cos 4 pi t, t^2 sin 4 pi t, 1)``, ``t ~ U(0, 1)``. Speed ``2 t sqrt(1 + 4 pi^2 t^2)``, so
    the arc length between ``t_1`` and ``t_2`` is
    ``|(1 + 4 pi^2 t_2^2)^{3/2} - (1 + 4 pi^2 t_1^2)^{3/2}| / (6 pi^2)``.

    Labels (the paper's special rule): class 1 iff ``t < median(t)`` of the episode. The median is the usual
    one (mean of the two middle values for even ``n``, as ``numpy.median``), so exactly half of the points
    are positive when ``n`` is even. Because arc length from ``t = 0`` increases with ``t``, this is the
    geodesic ball around the curve's start whose radius is the median distance to it; the reported
    ``center`` is the sampled point with the smallest ``t``. ``tau`` is ``None`` (no fixed threshold).
    """

    name: ClassVar[str] = "spiral"
    chart_dim: ClassVar[int] = 1
    ambient_dim: ClassVar[int] = 3
    tau: ClassVar[None] = None

    def sample_chart(self, num_episodes: int, n_points: int, generator: RandomSource) -> Tensor:
        return _uniform((num_episodes, n_points, 1), 0.0, 1.0, _check_generator(generator))

    def embed(self, u: Tensor) -> Tensor:
        t = u[..., 0]
        r, angle = t * t, 4.0 * math.pi * t
        return torch.stack([r * torch.cos(angle), r * torch.sin(angle), torch.ones_like(t)], dim=-1)

    @staticmethod
    def _arc_length_primitive(t: Tensor) -> Tensor:
        """``(1 + 4 pi^2 t^2)^{3/2} / (6 pi^2)``: arc length from any fixed origin, up to a constant."""
        return (1.0 + 4.0 * math.pi**2 * t * t) ** 1.5 / (6.0 * math.pi**2)

    def geodesic(self, u1: Tensor, u2: Tensor) -> Tensor:
        return torch.abs(self._arc_length_primitive(u2[..., 0]) - self._arc_length_primitive(u1[..., 0]))

    def label(self, chart: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """``y = t < median(t)`` per episode; ``center`` = index of the smallest ``t`` (no random draw)."""
        t = chart[..., 0]
        median = torch.quantile(t, 0.5, dim=-1, keepdim=True)
        return (t < median).long(), torch.argmin(t, dim=-1)


@dataclass(frozen=True)
class FlatTorus(Manifold):
    """Flat torus T^2 = R^2 / (2 pi Z)^2 (App. E.1.5).

    ``Phi(theta, phi) = (theta, phi, 0)`` with ``(theta, phi) ~ U(0, 2 pi)^2`` (the embedding is the flat
    fundamental square, so the ambient coordinates do not show the identification of opposite edges; only the
    geodesic does). ``d^2 = Delta theta^2 + Delta phi^2`` with both differences wrapped to ``[0, pi]``.

    Threshold: App. E.1.5 states ``tau = 0.5`` *and* that the ball covers "approximately 1/8 of the torus
    surface area"; the two disagree. A geodesic disc of radius ``tau < pi`` has area ``pi tau^2`` out of
    ``(2 pi)^2``, so ``tau = 0.5`` covers 1/(16 pi) = 2.0 % of the surface (2.9 % of the points of a
    100-point episode once the centre is counted), a task on which the constant "negative" predictor scores
    97 %. The default follows the stated area instead: ``tau = sqrt(pi / 2) = 1.2533`` gives exactly 1/8
    (:data:`TORUS_TAU`). ``FlatTorus(tau=0.5)`` (data option ``torus_tau: 0.5``) is the literal threshold.
    """

    tau: float = TORUS_TAU
    name: ClassVar[str] = "torus"
    chart_dim: ClassVar[int] = 2
    ambient_dim: ClassVar[int] = 3
    option_names: ClassVar[tuple[str, ...]] = ("tau",)

    def __post_init__(self) -> None:
        if not 0.0 < self.tau <= math.pi * math.sqrt(2.0):
            raise ConfigError(
                f"torus tau={self.tau} must lie in (0, pi*sqrt(2)] (the largest geodesic distance on the "
                "flat torus); App. E.1.5 states 0.5, the default sqrt(pi/2) = 1.2533 covers 1/8 of the surface"
            )

    def sample_chart(self, num_episodes: int, n_points: int, generator: RandomSource) -> Tensor:
        return _uniform((num_episodes, n_points, 2), 0.0, TWO_PI, _check_generator(generator))

    def embed(self, u: Tensor) -> Tensor:
        return torch.cat([u[..., :2], torch.zeros_like(u[..., :1])], dim=-1)

    def geodesic(self, u1: Tensor, u2: Tensor) -> Tensor:
        return torch.hypot(
            wrapped_angle_difference(u1[..., 0], u2[..., 0]),
            wrapped_angle_difference(u1[..., 1], u2[..., 1]),
        )

