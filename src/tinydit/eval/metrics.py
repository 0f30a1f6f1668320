"""Sample-quality metrics on feature vectors: Fréchet distance, KID, precision and recall; and how alike two
networks' features are (linear CKA), to know whether a judge is independent of what it judges.

All functions take features as float tensors (N, F) from the same feature network, real first.
They are computed in float64 on the CPU: the covariance square root is numerically delicate.

* Fréchet distance (Heusel et al. 2017, "GANs trained by a two time-scale update rule"):
  ||mu_r - mu_g||^2 + Tr(S_r + S_g - 2 (S_r S_g)^(1/2)), between Gaussians fitted to the features.
* KID (Bińkowski et al. 2018, "Demystifying MMD GANs"): the unbiased estimate of the squared MMD
  with the cubic polynomial kernel k(x, y) = (x.y / F + 1)^3, averaged over random subsets.
* Precision and recall (Kynkäänniemi et al. 2019, "Improved precision and recall metric"): each set
  is a union of balls around its points, each ball reaching the point's k-th nearest neighbour.
  Precision is the share of generated points inside the real manifold; recall the share of real
  points inside the generated one.
"""

from __future__ import annotations

import torch

from tinydit.errors import TinyDiTError

__all__ = [
    "feature_stats",
    "frechet_distance",
    "fid_from_features",
    "kid",
    "precision_recall",
    "linear_cka",
    "MIN_SAMPLES",
]

MIN_SAMPLES = 10  # below this none of the estimates below means anything


def _check(features: torch.Tensor, name: str, at_least: int = MIN_SAMPLES) -> torch.Tensor:
    if features.dim() != 2:
        raise ValueError(f"{name} features must be (N, F), got {tuple(features.shape)}")
    if features.shape[0] < at_least:
        raise TinyDiTError(f"{name}: {features.shape[0]} samples is too few for this metric; use at least {at_least}")
    return features.detach().to("cpu", torch.float64)


def feature_stats(features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean (F,) and unbiased covariance (F, F) of features (N, F), in float64."""
    f = _check(features, "features", 2)
    mu = f.mean(0)
    centred = f - mu
    return mu, centred.T @ centred / (f.shape[0] - 1)


def _sqrtm_psd(m: torch.Tensor) -> torch.Tensor:
    w, v = torch.linalg.eigh((m + m.T) / 2)
    return (v * w.clamp(min=0).sqrt()) @ v.T


def frechet_distance(mu1: torch.Tensor, sigma1: torch.Tensor, mu2: torch.Tensor, sigma2: torch.Tensor) -> float:
    """The Fréchet distance between N(mu1, sigma1) and N(mu2, sigma2).

    Tr((S1 S2)^(1/2)) is computed as Tr((S1^(1/2) S2 S1^(1/2))^(1/2)): the same eigenvalues, but of a
    symmetric matrix, so no complex square roots appear.
    """
    mu1, mu2, sigma1, sigma2 = (a.to(torch.float64) for a in (mu1, mu2, sigma1, sigma2))
    root1 = _sqrtm_psd(sigma1)
    inner = root1 @ sigma2 @ root1
    tr_cross = torch.linalg.eigvalsh((inner + inner.T) / 2).clamp(min=0).sqrt().sum()
    value = (mu1 - mu2).pow(2).sum() + sigma1.trace() + sigma2.trace() - 2 * tr_cross
    return max(0.0, value.item())  # tiny negative values are rounding error


def fid_from_features(real: torch.Tensor, fake: torch.Tensor) -> float:
    return frechet_distance(*feature_stats(_check(real, "real")), *feature_stats(_check(fake, "generated")))


def _mmd2_unbiased(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    d = x.shape[1]
    kxx = (x @ x.T / d + 1) ** 3
    kyy = (y @ y.T / d + 1) ** 3
    kxy = (x @ y.T / d + 1) ** 3
    m, n = x.shape[0], y.shape[0]
    sum_xx = (kxx.sum() - kxx.diagonal().sum()) / (m * (m - 1))  # off-diagonal: unbiased
    sum_yy = (kyy.sum() - kyy.diagonal().sum()) / (n * (n - 1))
    return sum_xx + sum_yy - 2 * kxy.mean()


def kid(
    real: torch.Tensor, fake: torch.Tensor, subsets: int = 100, subset_size: int = 1000, seed: int = 0
) -> tuple[float, float]:
    """Kernel Inception Distance in the given feature space: (mean, std) over random subsets.

    ``subset_size`` is capped at the smaller set's size, as in torch-fidelity and clean-fid.
    """
    real, fake = _check(real, "real"), _check(fake, "generated")
    size = min(subset_size, real.shape[0], fake.shape[0])
    gen = torch.Generator().manual_seed(seed)
    values = torch.stack(
        [
            _mmd2_unbiased(
                real[torch.randperm(real.shape[0], generator=gen)[:size]],
                fake[torch.randperm(fake.shape[0], generator=gen)[:size]],
            )
            for _ in range(subsets)
        ]
    )
    return values.mean().item(), values.std().item()


def _kth_radius(x: torch.Tensor, k: int, chunk: int = 2048) -> torch.Tensor:
    """Distance from each row of x to its k-th nearest other row: (N,). Chunked: memory O(chunk N)."""
    out = []
    for i in range(0, x.shape[0], chunk):
        d = torch.cdist(x[i : i + chunk], x)  # (chunk, N); each row's own zero distance is included
        out.append(d.kthvalue(k + 1, dim=1).values)
    return torch.cat(out)


def _inside(points: torch.Tensor, centres: torch.Tensor, radii: torch.Tensor, chunk: int = 2048) -> torch.Tensor:
    """For each point, whether it lies in any ball (centres, radii): bool (N,)."""
    out = []
    for i in range(0, points.shape[0], chunk):
        d = torch.cdist(points[i : i + chunk], centres)  # (chunk, M)
        out.append((d <= radii.unsqueeze(0)).any(dim=1))
    return torch.cat(out)


def precision_recall(real: torch.Tensor, fake: torch.Tensor, k: int = 3) -> tuple[float, float]:
    """Improved precision and recall with k-nearest-neighbour manifolds (k = 3 as in the paper)."""
    real, fake = _check(real, "real", k + 1), _check(fake, "generated", k + 1)
    real_r, fake_r = _kth_radius(real, k), _kth_radius(fake, k)
    precision = _inside(fake, real, real_r).double().mean().item()
    recall = _inside(real, fake, fake_r).double().mean().item()
    return precision, recall


def linear_cka(x: torch.Tensor, y: torch.Tensor) -> float:
    """Linear centred kernel alignment of two networks' features of the same n inputs, x (n, p) and y (n, q)
    (Kornblith et al. 2019, eq. 5): ||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F) after centring each feature.

    1 for features that are the same up to an orthogonal map and an isotropic scale (a rotation of one
    network's feature space into the other's), near 0 for unrelated features; it does not depend on the
    ordering or the number of features. Computed in float64."""
    if x.dim() != 2 or y.dim() != 2 or x.shape[0] != y.shape[0]:
        raise TinyDiTError(
            f"`x` and `y` must be (n, p) and (n, q) features of the same n inputs, "
            f"got {tuple(x.shape)} and {tuple(y.shape)}"
        )
    if x.shape[0] < 2:
        raise TinyDiTError(f"`x` and `y` need at least 2 inputs, got {x.shape[0]}")
    x, y = x.double(), y.double()
    x, y = x - x.mean(0), y - y.mean(0)
    cross = (y.T @ x).pow(2).sum()
    norms = torch.linalg.matrix_norm(x.T @ x) * torch.linalg.matrix_norm(y.T @ y)
    if norms == 0:
        raise TinyDiTError("`x` or `y` is constant over the inputs: CKA is undefined")
    return (cross / norms).item()
