"""Tests for lit_icl.icssl.manifolds and lit_icl.icssl.sampling (paper Sec. 4.3, App. D, App. E.1-E.2).

The closed-form geodesics are checked against *independent* numerical computations:

* sphere, cylinder, cone, flat torus: Dijkstra shortest paths on a fine chart grid whose edges are weighted by
  the length in R^3 of the embedded chart segment (computed with the test's own copy of the paper's charts),
  with wrap edges where the chart is periodic;
* spiral: the length of a fine polyline of Phi(t);
* labels: recomputed from the chart with the test's own distance formulas (unrolling by explicit shifts
  instead of the module's remainder-based wrap).

Only torch, math and heapq are used.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator

import pytest
import torch
from torch import Tensor

from lit_icl.icssl.manifolds import (
    Cone,
    Cylinder,
    FlatTorus,
    GeneratorSplit,
    Manifold,
    PoseConfig,
    Sphere,
    Spiral,
    apply_pose,
    random_rotation,
)
from lit_icl.icssl.sampling import MANIFOLD_NAMES, Episodes, ProductManifold, get_manifold, sample_episodes

TWO_PI = 2.0 * math.pi
ALL_SPECS = ["sphere", "cylinder", "cone", "spiral", "torus", "sphere*cylinder*cone*spiral*torus"]
BALL_SPECS = ["sphere", "cylinder", "cone", "torus"]
IDENTITY_POSE = PoseConfig(scale=(1.0, 1.0), translation=(0.0, 0.0), rotation="none")


@pytest.fixture(autouse=True, scope="module")
def _single_thread() -> Iterator[None]:
    """Small tensors on a shared 2-core machine: intra-op threading only adds contention (ms per op)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ----------------------------------------------------------------------------------------------------------
# The test's own copies of the paper's charts (App. E.1), in float64
# ----------------------------------------------------------------------------------------------------------
CONE_ALPHA = math.pi / 5  # fixed apex half-angle for the cone's numerical test


def phi_sphere(p: Tensor) -> Tensor:
    th, ph = p[..., 0], p[..., 1]
    return torch.stack([th.sin() * ph.cos(), th.sin() * ph.sin(), th.cos()], dim=-1)


def phi_cylinder(p: Tensor) -> Tensor:
    th, z = p[..., 0], p[..., 1]
    return torch.stack([th.cos(), th.sin(), z], dim=-1)


def phi_cone(p: Tensor, alpha: float = CONE_ALPHA) -> Tensor:
    s, th = p[..., 0], p[..., 1]
    return torch.stack(
        [s * math.sin(alpha) * th.cos(), s * math.sin(alpha) * th.sin(), s * math.cos(alpha)], dim=-1
    )


def phi_torus(p: Tensor) -> Tensor:
    # The flat torus' embedding is the flat square itself: segment lengths are chart lengths.
    return torch.cat([p, torch.zeros_like(p[..., :1])], dim=-1)


def phi_spiral(t: Tensor) -> Tensor:
    angle = 4 * math.pi * t
    return torch.stack([t**2 * torch.cos(angle), t**2 * torch.sin(angle), torch.ones_like(t)], dim=-1)


# ----------------------------------------------------------------------------------------------------------
# Grid graph + Dijkstra
# ----------------------------------------------------------------------------------------------------------
# 32-neighbourhood: all primitive steps with |di|, |dj| <= 3 (one of each +- pair). Its direction set is dense
# enough that a grid path overshoots a straight line by < 1.5 % in a flat metric (an 8-neighbourhood: ~8 %).
STEPS = [
    (di, dj)
    for di in range(4)
    for dj in range(-3, 4)
    if math.gcd(di, abs(dj)) == 1 and (di > 0 or dj > 0)
]
SUBDIVISIONS = 8  # each edge is the polyline length of 8 sub-segments of the embedded chart segment


def grid_graph(
    low: tuple[float, float],
    high: tuple[float, float],
    sizes: tuple[int, int],
    periodic: tuple[bool, bool],
    phi: Callable[[Tensor], Tensor],
) -> tuple[Tensor, list[list[tuple[int, float]]]]:
    """Nodes ``(N0 * N1, 2)`` and adjacency lists of a chart grid, weighted by embedded segment length.

    Periodic coordinates get nodes at ``low + k h`` and wrap edges (the segment continues past ``high`` and is
    embedded there, which the periodic chart maps back onto the surface); other coordinates get cell-centre
    nodes and no wrap.
    """
    axes = []
    for k in range(2):
        h = (high[k] - low[k]) / sizes[k]
        offset = 0.0 if periodic[k] else 0.5 * h
        axes.append((low[k] + offset + h * torch.arange(sizes[k], dtype=torch.float64), h))
    nodes = torch.stack(torch.meshgrid(axes[0][0], axes[1][0], indexing="ij"), dim=-1)
    ii, jj = torch.meshgrid(torch.arange(sizes[0]), torch.arange(sizes[1]), indexing="ij")
    frac = torch.linspace(0.0, 1.0, SUBDIVISIONS + 1, dtype=torch.float64)
    adj: list[list[tuple[int, float]]] = [[] for _ in range(sizes[0] * sizes[1])]
    for di, dj in STEPS:
        i2, j2 = ii + di, jj + dj
        ok = torch.ones_like(ii, dtype=torch.bool)
        if periodic[0]:
            i2 = i2 % sizes[0]
        else:
            ok &= (i2 >= 0) & (i2 < sizes[0])
        if periodic[1]:
            j2 = j2 % sizes[1]
        else:
            ok &= (j2 >= 0) & (j2 < sizes[1])
        start = nodes[ii[ok], jj[ok]]
        step = torch.tensor([di * axes[0][1], dj * axes[1][1]], dtype=torch.float64)
        pts = phi(start[:, None, :] + frac[:, None] * step)
        weight = (pts[:, 1:] - pts[:, :-1]).norm(dim=-1).sum(dim=-1)
        a = (ii[ok] * sizes[1] + jj[ok]).tolist()
        b = (i2[ok] * sizes[1] + j2[ok]).tolist()
        for u, v, w in zip(a, b, weight.tolist()):
            adj[u].append((v, w))
            adj[v].append((u, w))
    return nodes.reshape(-1, 2), adj


def dijkstra(adj: list[list[tuple[int, float]]], source: int) -> list[float]:
    dist = [math.inf] * len(adj)
    dist[source] = 0.0
    heap = [(0.0, source)]
    while heap:
        d, u = heapq.heappop(heap)
        if d > dist[u]:
            continue
        for v, w in adj[u]:
            nd = d + w
            if nd < dist[v]:
                dist[v] = nd
                heapq.heappush(heap, (nd, v))
    return dist


def _cone_chart(p: Tensor) -> Tensor:
    return torch.cat([p, torch.full_like(p[..., :1], CONE_ALPHA)], dim=-1)


# name -> (manifold, low, high, grid sizes, periodic, phi, grid point -> module chart, region for pair choice)
# Pairs are drawn where the chart grid is roughly isotropic: near the sphere's poles and the cone's apex the
# grid cells become needles and a grid path overshoots by ~10 % for every neighbourhood size.
GRID_CASES: dict[str, tuple] = {
    "sphere": (
        Sphere(), (0.0, 0.0), (math.pi, TWO_PI), (40, 80), (False, True), phi_sphere, lambda p: p,
        lambda p: (p[:, 0] > math.pi / 4) & (p[:, 0] < 3 * math.pi / 4),
    ),
    "cylinder": (
        Cylinder(height=2.0), (0.0, 0.0), (TWO_PI, 2.0), (80, 26), (True, False), phi_cylinder, lambda p: p,
        lambda p: torch.ones_like(p[:, 0], dtype=torch.bool),
    ),
    "cone": (
        Cone(alpha_range=(CONE_ALPHA, CONE_ALPHA)), (0.0, 0.0), (1.0, TWO_PI), (20, 80), (False, True),
        phi_cone, _cone_chart, lambda p: p[:, 0] > 0.3,
    ),
    "torus": (
        FlatTorus(), (0.0, 0.0), (TWO_PI, TWO_PI), (60, 60), (True, True), phi_torus, lambda p: p,
        lambda p: torch.ones_like(p[:, 0], dtype=torch.bool),
    ),
}


@pytest.mark.parametrize("name", list(GRID_CASES))
def test_geodesic_matches_grid_shortest_path(name: str) -> None:
    manifold, low, high, sizes, periodic, phi, to_chart, region = GRID_CASES[name]
    nodes, adj = grid_graph(low, high, sizes, periodic, phi)
    allowed = region(nodes).nonzero().squeeze(1)
    g = _gen(123)
    sources = allowed[torch.randint(len(allowed), (3,), generator=g)]
    closed, numeric, raw_dtheta = [], [], []
    for src in sources.tolist():
        dist = dijkstra(adj, src)
        targets = allowed[torch.randint(len(allowed), (40,), generator=g)]
        targets = targets[targets != src]
        closed.append(manifold.geodesic(to_chart(nodes[src]), to_chart(nodes[targets])))
        numeric.append(torch.tensor([dist[t] for t in targets.tolist()], dtype=torch.float64))
        # periodic coordinate's raw difference, to check that wrap-around routes were exercised
        k = 1 if periodic[1] else 0
        raw_dtheta.append((nodes[targets, k] - nodes[src, k]).abs())
    closed_t, numeric_t = torch.cat(closed), torch.cat(numeric)
    assert closed_t.dtype == torch.float64
    # grid paths are real curves on the surface: never (materially) shorter than the geodesic ...
    assert torch.all(closed_t <= numeric_t * (1 + 2e-4)), (closed_t / numeric_t).max()
    # ... and only slightly longer than it
    assert torch.all(numeric_t <= closed_t * 1.03), (numeric_t / closed_t).max()
    assert (torch.cat(raw_dtheta) > math.pi).any(), "no pair needed the periodic wrap"


def test_spiral_geodesic_matches_polyline_length() -> None:
    spiral = Spiral()
    pairs = [(0.0, 1.0), (0.1, 0.35), (0.93, 0.41), (0.5, 0.52), (0.0, 0.05)]
    for t1, t2 in pairs:
        t = torch.linspace(t1, t2, 20_001, dtype=torch.float64)
        length = (phi_spiral(t)[1:] - phi_spiral(t)[:-1]).norm(dim=-1).sum().item()
        u1, u2 = torch.tensor([[t1]], dtype=torch.float64), torch.tensor([[t2]], dtype=torch.float64)
        closed = spiral.geodesic(u1, u2)
        assert closed.item() == pytest.approx(length, rel=1e-4)


def test_embed_matches_paper_charts() -> None:
    g = _gen(0)
    sphere_u = Sphere().sample_chart(2, 50, g).double()
    torch.testing.assert_close(Sphere().embed(sphere_u), phi_sphere(sphere_u))
    cyl_u = Cylinder().sample_chart(2, 50, g).double()
    torch.testing.assert_close(Cylinder().embed(cyl_u), phi_cylinder(cyl_u))
    cone_u = Cone(alpha_range=(CONE_ALPHA, CONE_ALPHA)).sample_chart(2, 50, g).double()
    torch.testing.assert_close(Cone().embed(cone_u), phi_cone(cone_u[..., :2]))
    tor_u = FlatTorus().sample_chart(2, 50, g).double()
    torch.testing.assert_close(FlatTorus().embed(tor_u), phi_torus(tor_u))
    sp_u = Spiral().sample_chart(2, 50, g).double()
    torch.testing.assert_close(Spiral().embed(sp_u), phi_spiral(sp_u[..., 0]))


def test_chart_ranges_and_dtypes() -> None:
    g = _gen(1)
    expected = {
        "sphere": [(0, math.pi), (0, TWO_PI)],
        "cylinder": [(0, TWO_PI), (0, 3.0)],
        "cone": [(0, 1.0), (0, TWO_PI), (math.pi / 6, math.pi / 3)],
        "spiral": [(0, 1.0)],
        "torus": [(0, TWO_PI), (0, TWO_PI)],
    }
    for name, ranges in expected.items():
        m = get_manifold(name, height=3.0) if name == "cylinder" else get_manifold(name)
        u = m.sample_chart(8, 100, g)
        assert u.shape == (8, 100, m.chart_dim) and u.dtype == torch.float32
        for k, (lo, hi) in enumerate(ranges):
            assert u[..., k].min() >= lo and u[..., k].max() <= hi
    # the cylinder's z really covers (0, height)
    assert get_manifold("cylinder", height=3.0).sample_chart(8, 100, g)[..., 1].max() > 2.5


def test_cone_alpha_is_drawn_per_episode() -> None:
    u = Cone().sample_chart(16, 100, _gen(2))
    alpha = u[..., 2]
    assert torch.all(alpha == alpha[:, :1]), "alpha must be constant within an episode"
    assert alpha[:, 0].unique().numel() == 16, "alpha must vary across episodes"


# ----------------------------------------------------------------------------------------------------------
# Wrap-around and broadcasting
# ----------------------------------------------------------------------------------------------------------
def test_torus_wraparound() -> None:
    torus = FlatTorus()
    a = torch.tensor([0.05, 1.0])
    b = torch.tensor([TWO_PI - 0.05, 1.0])
    assert torus.geodesic(a, b).item() == pytest.approx(0.1, abs=1e-5)
    both = torch.tensor([TWO_PI - 0.05, TWO_PI - 0.05])
    diagonal = torus.geodesic(torch.tensor([0.05, 0.05]), both).item()
    assert diagonal == pytest.approx(0.1 * math.sqrt(2), abs=1e-5)


def test_cylinder_wraparound() -> None:
    cyl = Cylinder()
    a = torch.tensor([0.05, 0.5])
    assert cyl.geodesic(a, torch.tensor([TWO_PI - 0.05, 0.5])).item() == pytest.approx(0.1, abs=1e-5)
    slanted = cyl.geodesic(a, torch.tensor([TWO_PI - 0.05, 0.8])).item()
    assert slanted == pytest.approx(math.hypot(0.1, 0.3), abs=1e-5)


def test_cone_wraparound() -> None:
    cone = Cone()
    alpha = math.pi / 4
    a = torch.tensor([0.5, 0.05, alpha])
    b = torch.tensor([0.5, TWO_PI - 0.05, alpha])
    expected = 2 * 0.5 * math.sin(0.5 * math.sin(alpha) * 0.1)  # chord in the unrolled sector
    assert cone.geodesic(a, b).item() == pytest.approx(expected, rel=1e-4)


@pytest.mark.parametrize("spec", ALL_SPECS)
def test_geodesic_broadcasting_and_metric_sanity(spec: str) -> None:
    m = get_manifold(spec)
    u = m.sample_chart(3, 30, _gen(3))
    pairwise = m.geodesic(u[:, :, None], u[:, None, :])
    assert pairwise.shape == (3, 30, 30)
    torch.testing.assert_close(pairwise, pairwise.transpose(1, 2))
    assert pairwise.diagonal(dim1=1, dim2=2).abs().max() < 1e-5
    assert pairwise.min() >= 0
    torch.testing.assert_close(m.geodesic(u, u[:, 7:8]), pairwise[:, :, 7])


# ----------------------------------------------------------------------------------------------------------
# Product manifolds (App. E.2)
# ----------------------------------------------------------------------------------------------------------
# chart column slices of "sphere*cylinder*cone*spiral*torus", written out by hand
PRODUCT_SLICES = [(Sphere(), slice(0, 2)), (Cylinder(), slice(2, 4)), (Cone(), slice(4, 7)),
                  (Spiral(), slice(7, 8)), (FlatTorus(), slice(8, 10))]


def _independent_distance(name: str, u1: Tensor, u2: Tensor) -> Tensor:
    """Distances recomputed with the test's own formulas (wrap by explicit shifts, float64)."""
    u1, u2 = u1.double(), u2.double()
    shifts = torch.tensor([-TWO_PI, 0.0, TWO_PI], dtype=torch.float64)

    def unwrapped(a: Tensor, b: Tensor) -> Tensor:  # min over the three periodic copies of b
        return (a[..., None] - b[..., None] + shifts).abs().min(dim=-1).values

    if name == "sphere":
        dot = (phi_sphere(u1) * phi_sphere(u2)).sum(-1).clamp(-1, 1)
        return torch.arccos(dot)
    if name == "cylinder":
        return torch.sqrt(unwrapped(u1[..., 0], u2[..., 0]) ** 2 + (u1[..., 1] - u2[..., 1]) ** 2)
    if name == "cone":
        s1, s2, alpha = u1[..., 0], u2[..., 0], u1[..., 2]
        ang = torch.sin(alpha) * unwrapped(u1[..., 1], u2[..., 1])
        return torch.sqrt((s1**2 + s2**2 - 2 * s1 * s2 * torch.cos(ang)).clamp(min=0))
    if name == "spiral":
        f = lambda t: (1 + 4 * math.pi**2 * t**2) ** 1.5
        return (f(u1[..., 0]) - f(u2[..., 0])).abs() / (6 * math.pi**2)
    if name == "torus":
        return torch.sqrt(unwrapped(u1[..., 0], u2[..., 0]) ** 2 + unwrapped(u1[..., 1], u2[..., 1]) ** 2)
    raise AssertionError(name)


def test_product_distance_is_root_sum_square_of_factors() -> None:
    m = get_manifold("sphere*cylinder*cone*spiral*torus")
    assert isinstance(m, ProductManifold) and m.chart_dim == 10 and m.ambient_dim == 15
    u = m.sample_chart(4, 40, _gen(4)).double()
    d = m.geodesic(u[:, :, None], u[:, None, :])
    squares = torch.zeros_like(d)
    for factor, sl in PRODUCT_SLICES:
        squares += _independent_distance(factor.name, u[:, :, None, sl], u[:, None, :, sl]) ** 2
    torch.testing.assert_close(d, squares.sqrt(), atol=1e-6, rtol=1e-6)


def test_product_embedding_is_concatenation_with_independent_poses() -> None:
    m = get_manifold("sphere*cylinder*cone*spiral*torus")
    ep = sample_episodes(m, 6, 50, _gen(5))
    flat = sample_episodes(m, 6, 50, _gen(5), pose=IDENTITY_POSE)
    torch.testing.assert_close(ep.chart, flat.chart)
    scales = []
    for k, (factor, sl) in enumerate(PRODUCT_SLICES):
        block = slice(3 * k, 3 * k + 3)
        torch.testing.assert_close(flat.x[..., block], factor.embed(flat.chart[..., sl]))
        # each 3-D block is a similarity image of the factor's embedding, with its own scale
        scales.append(_episode_scales(ep.x[..., block], flat.x[..., block]))
    scales_t = torch.stack(scales)  # (factors, episodes)
    assert torch.all((scales_t > 0.02 - 1e-6) & (scales_t < 0.1 + 1e-6))
    # independent draws: no two factors share an episode's scale
    assert (scales_t[:, None, :] - scales_t[None, :, :]).abs().add(torch.eye(5)[..., None]).min() > 1e-6


def test_product_labels_are_quantile_ball() -> None:
    for fraction, expected_positives in [(0.5, 50), (0.2, 20)]:
        m = get_manifold("sphere*cylinder*cone*spiral*torus", positive_fraction=fraction)
        ep = sample_episodes(m, 8, 100, _gen(6))
        centre = ep.chart[torch.arange(8), ep.center][:, None, :]
        squares = [
            _independent_distance(f.name, ep.chart[..., sl], centre[..., sl]) ** 2 for f, sl in PRODUCT_SLICES
        ]
        d = torch.stack(squares).sum(dim=0).sqrt()
        # radius = linear-interpolated quantile of the distances (the documented rule)
        sorted_d = d.sort(dim=-1).values
        pos = fraction * 99
        lo = math.floor(pos)
        radius = sorted_d[:, lo] + (pos - lo) * (sorted_d[:, lo + 1] - sorted_d[:, lo])
        torch.testing.assert_close(ep.y, (d < radius[:, None]).long())
        assert torch.all(ep.y.sum(-1) == expected_positives)
        assert torch.all(ep.y[torch.arange(8), ep.center] == 1)


# ----------------------------------------------------------------------------------------------------------
# Labels (App. E.1)
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", BALL_SPECS)
def test_ball_labels_match_independent_recomputation(spec: str) -> None:
    m = get_manifold(spec)
    ep = sample_episodes(m, 32, 100, _gen(7))
    assert ep.y.dtype == torch.int64 and ep.center.dtype == torch.int64 and ep.x.dtype == torch.float32
    assert ep.x.shape == (32, 100, 3) and ep.y.shape == (32, 100) and ep.center.shape == (32,)
    centre = ep.chart[torch.arange(32), ep.center][:, None, :]
    d = _independent_distance(spec, ep.chart, centre)
    expected = (d < m.tau).long()
    # float32 (module) vs float64 (here) can only disagree within rounding of the threshold
    clear = (d - m.tau).abs() > 1e-5
    assert torch.equal(ep.y[clear], expected[clear])
    assert torch.all(ep.y[torch.arange(32), ep.center] == 1), "the centre lies in its own ball"
    assert 0 < ep.y.float().mean() < 1
    assert ep.center.unique().numel() > 10, "centres must be random"


def _torus_ball_fraction(tau: float) -> float:
    """Exact share of the flat torus (2 pi)^2 within wrapped distance tau of a point, by 2-D quadrature."""
    # Unwrapped offsets (u, v) in [-pi, pi]^2 on a fine midpoint grid; independent of the module's wrap.
    k = 2000
    grid = (torch.arange(k, dtype=torch.float64) + 0.5) / k * TWO_PI - math.pi
    inside = (grid[:, None] ** 2 + grid[None, :] ** 2) < tau * tau
    return inside.double().mean().item()


@pytest.mark.parametrize("tau", [0.5, math.sqrt(math.pi / 2)])
def test_torus_positive_fraction_matches_area(tau: float) -> None:
    """App. E.1.5: the torus ball covers 1/8 of the surface by default (tau = 0.5 covers 2 %, see FlatTorus)."""
    area = _torus_ball_fraction(tau)
    assert area == pytest.approx(math.pi * tau * tau / TWO_PI**2, rel=2e-3)
    ep = sample_episodes(FlatTorus(tau=tau), 4000, 100, _gen(3))
    # The centre is always positive; each of the other 99 points independently with probability `area`.
    expected = (1 + 99 * area) / 100
    assert ep.y.float().mean().item() == pytest.approx(expected, abs=0.003)


def test_default_torus_threshold_is_one_eighth() -> None:
    assert _torus_ball_fraction(get_manifold("torus").tau) == pytest.approx(1 / 8, abs=5e-4)
    assert get_manifold("torus", tau=0.5).tau == 0.5
    with pytest.raises(ValueError, match="torus tau"):
        FlatTorus(tau=0.0)


def test_sphere_cap_fraction_matches_chart_uniform_integral() -> None:
    """The sphere samples the chart uniformly (App. E.1.1), so its cap share is not the 25 % of the area.

    Independent check: P(angle(p, q) < pi/3) for p, q with theta ~ U(0, pi), phi ~ U(0, 2 pi), by midpoint
    quadrature over (theta_p, theta_q, delta phi).
    """
    k = 120
    mid = (torch.arange(k, dtype=torch.float64) + 0.5) / k
    tp, tq, dphi = torch.meshgrid(mid * math.pi, mid * math.pi, mid * TWO_PI, indexing="ij")
    cos_angle = torch.cos(tp) * torch.cos(tq) + torch.sin(tp) * torch.sin(tq) * torch.cos(dphi)
    p = (cos_angle > math.cos(math.pi / 3)).double().mean().item()
    ep = sample_episodes(get_manifold("sphere"), 4000, 100, _gen(4))
    assert ep.y.float().mean().item() == pytest.approx((1 + 99 * p) / 100, abs=0.004)
    assert p > 0.26, "chart-uniform sampling puts more mass in polar caps than the area's 25 %"


def test_spiral_labels_are_below_median() -> None:
    ep = sample_episodes("swiss_roll", 16, 100, _gen(8))
    t = ep.chart[..., 0]
    middle = t.sort(dim=-1).values[:, 49:51].mean(dim=-1, keepdim=True)  # median of an even-sized sample
    assert torch.equal(ep.y, (t < middle).long())
    assert torch.all(ep.y.sum(-1) == 50)
    assert torch.equal(ep.center, t.argmin(dim=-1))


# ----------------------------------------------------------------------------------------------------------
# Pose (App. D)
# ----------------------------------------------------------------------------------------------------------
def _episode_scales(posed: Tensor, unposed: Tensor) -> Tensor:
    """Per-episode ratio of pairwise distances; asserts it is one constant per episode (a similarity)."""
    before = torch.cdist(unposed.double(), unposed.double())
    after = torch.cdist(posed.double(), posed.double())
    # float32 posed coordinates carry ~1e-7 absolute error next to translations of size ~1, so only pairs
    # whose scaled distance is >= ~1e-3 can show the ratio to 1e-3 relative accuracy.
    mask = before > 0.05
    ratio = torch.where(mask, after / before.clamp(min=1e-12), torch.nan)
    scale = torch.nanmean(ratio.flatten(1), dim=1)
    expected = scale[:, None, None].expand_as(ratio)
    assert torch.allclose(torch.where(mask, ratio, expected), expected, rtol=1e-3, atol=0), "not a similarity"
    return scale


@pytest.mark.parametrize("rotation", ["planar", "haar", "none"])
def test_pose_is_similarity_with_documented_ranges(rotation: str) -> None:
    x = Sphere().embed(Sphere().sample_chart(16, 60, _gen(9)))
    pose = PoseConfig(rotation=rotation)
    posed = apply_pose(x, pose, _gen(10))
    scale = _episode_scales(posed, x)
    assert torch.all((scale > 0.02 - 1e-6) & (scale < 0.1 + 1e-6))
    assert scale.unique().numel() == 16
    if rotation in ("planar", "none"):
        # rotation about z and (t_x, t_y, 0) translation leave z scaled only
        torch.testing.assert_close(posed[..., 2], scale[:, None].float() * x[..., 2], rtol=1e-4, atol=1e-6)
        # the translation is (t_x, t_y) in [-1, 1]^2: the centroid stays within |t| + s * |centroid|
        assert posed[..., :2].abs().max() <= 1.0 + 0.1 + 1e-6


def test_random_rotation_is_special_orthogonal() -> None:
    for kind in ("planar", "haar", "none"):
        r = random_rotation(200, kind, _gen(11))
        torch.testing.assert_close(r @ r.transpose(1, 2), torch.eye(3).expand(200, 3, 3), atol=1e-5, rtol=0)
        torch.testing.assert_close(torch.linalg.det(r), torch.ones(200), atol=1e-5, rtol=0)
    haar = random_rotation(4000, "haar", _gen(12))
    # Haar on SO(3): E[R] = 0 and the (3,3) entry is uniform on [-1, 1] (variance 1/3)
    assert haar.mean(0).abs().max() < 0.05
    assert abs(haar[:, 2, 2].var().item() - 1 / 3) < 0.03


@pytest.mark.parametrize("spec", ALL_SPECS)
def test_pose_leaves_chart_and_labels_unchanged(spec: str) -> None:
    posed = sample_episodes(spec, 8, 100, _gen(13))
    flat = sample_episodes(spec, 8, 100, _gen(13), pose=IDENTITY_POSE)
    assert torch.equal(posed.chart, flat.chart)
    assert torch.equal(posed.y, flat.y)
    assert torch.equal(posed.center, flat.center)
    m = get_manifold(spec)
    torch.testing.assert_close(flat.x, m.embed(flat.chart))
    if m.ambient_dim == 3:
        scale = _episode_scales(posed.x, flat.x)
        assert torch.all((scale > 0.02 - 1e-6) & (scale < 0.1 + 1e-6))


# ----------------------------------------------------------------------------------------------------------
# Determinism and the generator contract
# ----------------------------------------------------------------------------------------------------------
def _assert_episodes_equal(a: Episodes, b: Episodes) -> None:
    for field_name in ("x", "y", "chart", "center"):
        assert torch.equal(getattr(a, field_name), getattr(b, field_name)), field_name


@pytest.mark.parametrize("spec", ALL_SPECS)
def test_same_seed_same_episodes_different_seed_different(spec: str) -> None:
    a = sample_episodes(spec, 4, 100, _gen(14), pose=PoseConfig(rotation="haar"))
    b = sample_episodes(spec, 4, 100, _gen(14), pose=PoseConfig(rotation="haar"))
    c = sample_episodes(spec, 4, 100, _gen(15), pose=PoseConfig(rotation="haar"))
    _assert_episodes_equal(a, b)
    assert not torch.equal(a.x, c.x) and not torch.equal(a.chart, c.chart)


def test_global_rng_is_never_used() -> None:
    torch.manual_seed(0)
    state = torch.get_rng_state()
    for spec in ALL_SPECS:
        for rotation in ("planar", "haar"):
            sample_episodes(spec, 2, 20, _gen(16), pose=PoseConfig(rotation=rotation))
    assert torch.equal(torch.get_rng_state(), state)
    with pytest.raises(TypeError, match="torch.Generator"):
        sample_episodes("sphere", 2, 20, None)  # type: ignore[arg-type]


@pytest.mark.parametrize("spec", ALL_SPECS)
def test_split_generators_sample_each_share_as_its_generator_alone(spec: str) -> None:
    """``GeneratorSplit``: one pass over several generators' episodes gives each generator's own episodes (the
    same draws, in the same order), bit for bit; a generator with no episodes is left untouched."""
    counts = [3, 0, 5, 1]
    generators = [_gen(20 + j) for j in range(len(counts))]
    split = GeneratorSplit(generators, counts)
    together = sample_episodes(spec, sum(counts), 40, split, pose=PoseConfig(rotation="haar"))
    start = 0
    for j, count in enumerate(counts):
        if count == 0:
            continue
        alone = sample_episodes(spec, count, 40, _gen(20 + j), pose=PoseConfig(rotation="haar"))
        part = Episodes(*(getattr(together, f)[start:start + count] for f in ("x", "y", "chart", "center")))
        _assert_episodes_equal(part, alone)
        start += count
    assert torch.equal(generators[1].get_state(), _gen(21).get_state())
    assert not torch.equal(generators[0].get_state(), _gen(20).get_state())


def test_split_generators_run_a_function_on_each_generators_own_rows() -> None:
    """``each`` (how the labels are computed): each generator's rows, copied out, with that generator."""
    rows = torch.arange(12.0).reshape(6, 2)
    split = GeneratorSplit([_gen(0), _gen(1), _gen(2)], [2, 0, 4])
    seen = []

    def fn(x: Tensor, g: torch.Generator) -> tuple[Tensor, Tensor]:
        seen.append((x.shape, x.storage_offset(), x.is_contiguous()))
        return x.sum(-1), torch.rand(len(x), generator=g)

    total, noise = split.each(fn, rows)
    assert seen == [(torch.Size([2, 2]), 0, True), (torch.Size([4, 2]), 0, True)]
    torch.testing.assert_close(total, rows.sum(-1), rtol=0, atol=0)
    assert torch.equal(noise, torch.cat([torch.rand(2, generator=_gen(0)), torch.rand(4, generator=_gen(2))]))


def test_split_generators_refuse_a_draw_of_another_size() -> None:
    split = GeneratorSplit([_gen(0), _gen(1)], [2, 3])
    with pytest.raises(ValueError, match="5 episodes"):
        sample_episodes("sphere", 4, 10, split)
    with pytest.raises(ValueError, match="one count per generator"):
        GeneratorSplit([_gen(0)], [1, 2])


# ----------------------------------------------------------------------------------------------------------
# Registry and parser
# ----------------------------------------------------------------------------------------------------------
def test_get_manifold_names_aliases_and_products() -> None:
    assert MANIFOLD_NAMES == ("sphere", "cylinder", "cone", "spiral", "torus")
    assert isinstance(get_manifold("SPHERE"), Sphere)
    assert isinstance(get_manifold("swiss_roll"), Spiral)
    assert isinstance(get_manifold("Flat_Torus"), FlatTorus)
    prod = get_manifold("sphere * Swiss_Roll*torus*torus")
    assert isinstance(prod, ProductManifold)
    assert prod.name == "sphere*spiral*torus*torus"
    assert isinstance(get_manifold(prod.name), ProductManifold)
    assert [f.name for f in prod.factors] == ["sphere", "spiral", "torus", "torus"]
    for name in ("sphere", "cylinder", "cone", "spiral", "torus"):
        m: Manifold = get_manifold(name)
        assert m.name == name and m.ambient_dim == 3


def test_get_manifold_routes_options() -> None:
    assert get_manifold("cylinder", height=5.0).height == 5.0
    cone = get_manifold("cone", alpha_range=(0.3, 0.4))
    assert cone.alpha_range == (0.3, 0.4)
    prod = get_manifold("cylinder*cone*sphere", height=3.0, alpha_range=(0.2, 0.3), positive_fraction=0.25)
    assert prod.positive_fraction == 0.25
    assert prod.factors[0].height == 3.0 and prod.factors[1].alpha_range == (0.2, 0.3)
    with pytest.raises(ValueError, match="height"):
        get_manifold("sphere", height=3.0)
    with pytest.raises(ValueError, match="positive_fraction"):
        get_manifold("torus", positive_fraction=0.3)


@pytest.mark.parametrize("spec", ["cylindr", "sphere*cylindr", "klein_bottle"])
def test_unknown_manifold_raises_clear_error(spec: str) -> None:
    bad = spec.split("*")[-1]
    with pytest.raises(ValueError) as info:
        get_manifold(spec)
    message = str(info.value)
    assert f"'{bad}'" in message and "\n" not in message
    for name in ("sphere", "cylinder", "cone", "spiral", "torus", "swiss_roll", "flat_torus"):
        assert name in message


def test_product_factor_permutation_reorders_whole_blocks_per_episode() -> None:
    """Sec. 4.3.2: one random order of the 3-D factor blocks per episode; charts, labels and poses unchanged."""
    spec = "sphere*cylinder*cone*spiral*torus"
    plain = sample_episodes(get_manifold(spec), 64, 30, _gen(11))
    perm = sample_episodes(get_manifold(spec, permute_factors=True), 64, 30, _gen(11))
    assert torch.equal(plain.chart, perm.chart) and torch.equal(plain.y, perm.y)
    a, b = plain.x.view(64, 30, 5, 3), perm.x.view(64, 30, 5, 3)
    orders = []
    for e in range(64):
        # Each permuted block equals exactly one plain block, the same one for every point of the episode.
        match = [next(j for j in range(5) if torch.equal(b[e, :, i], a[e, :, j])) for i in range(5)]
        assert sorted(match) == list(range(5))
        orders.append(tuple(match))
    assert len(set(orders)) > 20, "orders differ between episodes"
