import math

import pytest
import torch

from tinydit.errors import TinyDiTError
from tinydit.eval.metrics import feature_stats, fid_from_features, frechet_distance, kid, precision_recall


def test_frechet_distance_matches_closed_form_for_diagonal_gaussians():
    # For diagonal covariances the distance is ||mu1 - mu2||^2 + sum (s1 - s2)^2 over standard deviations.
    mu1, mu2 = torch.tensor([0.0, 1.0, 2.0]), torch.tensor([1.0, 1.0, 0.0])
    s1, s2 = torch.tensor([1.0, 2.0, 0.5]), torch.tensor([3.0, 2.0, 1.5])
    expected = (mu1 - mu2).pow(2).sum() + (s1 - s2).pow(2).sum()
    got = frechet_distance(mu1, torch.diag(s1**2), mu2, torch.diag(s2**2))
    assert math.isclose(got, expected.item(), rel_tol=1e-9)


def test_frechet_distance_is_rotation_invariant_for_full_covariances():
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(5, 5, generator=gen, dtype=torch.float64), torch.randn(5, 5, generator=gen, dtype=torch.float64)
    s1, s2 = a @ a.T + 0.1 * torch.eye(5, dtype=torch.float64), b @ b.T + 0.1 * torch.eye(5, dtype=torch.float64)
    mu1, mu2 = torch.randn(5, generator=gen, dtype=torch.float64), torch.randn(5, generator=gen, dtype=torch.float64)
    q, _ = torch.linalg.qr(torch.randn(5, 5, generator=gen, dtype=torch.float64))
    d = frechet_distance(mu1, s1, mu2, s2)
    d_rot = frechet_distance(q @ mu1, q @ s1 @ q.T, q @ mu2, q @ s2 @ q.T)
    assert math.isclose(d, d_rot, rel_tol=1e-8)
    # and for commuting covariances (shared eigenvectors) it reduces to the scalar formula per axis
    w1, w2 = (
        torch.tensor([1.0, 4.0, 9.0, 0.25, 2.0], dtype=torch.float64),
        torch.tensor([4.0, 1.0, 9.0, 1.0, 8.0], dtype=torch.float64),
    )
    got = frechet_distance(mu1, q @ torch.diag(w1) @ q.T, mu1, q @ torch.diag(w2) @ q.T)
    assert math.isclose(got, (w1.sqrt() - w2.sqrt()).pow(2).sum().item(), rel_tol=1e-8)


def test_identical_sets_give_about_zero_and_shifted_sets_do_not():
    x = torch.randn(2000, 16, generator=torch.Generator().manual_seed(1))
    assert fid_from_features(x, x) < 1e-6
    assert abs(fid_from_features(x, x + 1.0) - 16.0) < 1e-6  # a mean shift of 1 in 16 dimensions
    assert kid(x, x, subsets=5, subset_size=500)[0] < 0.01
    assert precision_recall(x, x) == (1.0, 1.0)


def test_feature_stats_unbiased_covariance():
    x = torch.tensor([[0.0], [2.0]])
    mu, sigma = feature_stats(x)
    assert mu.item() == 1.0 and sigma.item() == 2.0


def test_kid_is_unbiased_on_equal_distributions():
    gen = torch.Generator().manual_seed(0)
    means = []
    for seed in range(20):
        a, b = torch.randn(300, 8, generator=gen), torch.randn(300, 8, generator=gen)
        means.append(kid(a, b, subsets=10, subset_size=100, seed=seed)[0])
    means = torch.tensor(means)
    assert (means < 0).any()  # an unbiased estimate of zero must sometimes fall below it
    assert abs(means.mean().item()) < 3 * means.std().item() / math.sqrt(len(means))
    shifted = kid(
        torch.randn(300, 8, generator=gen), torch.randn(300, 8, generator=gen) + 0.5, subsets=10, subset_size=100
    )[0]
    assert shifted > means.max()


def test_precision_and_recall_separate_quality_from_coverage():
    gen = torch.Generator().manual_seed(0)
    real = torch.randn(1000, 2, generator=gen)
    collapsed = 0.1 * torch.randn(1000, 2, generator=gen)  # all inside the real data, covers little of it
    precision, recall = precision_recall(real, collapsed)
    assert precision > 0.95 and recall < 0.5
    far = torch.randn(1000, 2, generator=gen) + 8.0  # nothing like the real data
    assert precision_recall(real, far) == (0.0, 0.0)


def test_too_few_samples_is_a_clear_error():
    with pytest.raises(TinyDiTError, match="too few"):
        fid_from_features(torch.randn(100, 4), torch.randn(3, 4))


def test_linear_cka_is_one_for_the_same_features_up_to_rotation_and_scale_and_near_zero_for_unrelated_ones():
    from tinydit.eval.metrics import linear_cka

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2000, 16, generator=gen) @ torch.randn(16, 16, generator=gen)  # correlated features
    rotation, _ = torch.linalg.qr(torch.randn(16, 16, generator=gen))  # orthogonal
    assert linear_cka(x, x) == pytest.approx(1.0, abs=1e-12)
    assert linear_cka(x, 3.7 * x @ rotation + 5.0) == pytest.approx(1.0, abs=1e-9)  # rotated, scaled, shifted
    assert linear_cka(x, torch.cat([x, x], 1)) == pytest.approx(1.0, abs=1e-9)  # any number of features
    assert linear_cka(x, torch.randn(2000, 8, generator=gen)) < 0.02  # independent features
    # negative control: a scale that differs per feature is no rotation, and CKA sees it
    stretched = x @ rotation * torch.logspace(0, 2, 16)
    assert linear_cka(x, stretched) < 0.9
    with pytest.raises(TinyDiTError, match="same n inputs"):
        linear_cka(x, x[:10])
