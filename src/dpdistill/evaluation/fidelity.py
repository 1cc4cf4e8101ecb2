"""How close synthetic images are to real ones, with no download: a Fréchet distance in a fixed feature space.

FID fits a Gaussian to each image set's features and measures the Fréchet (2-Wasserstein) distance between the
two; its features come from an Inception network trained on ImageNet, which dpdistill cannot fetch. Here the
features are the scattering coefficients that the private routes already use (J = 2, L = 8, per-image group
normalisation, models/scattering.py), averaged over 3 x 3 spatial cells: a fixed, data-independent map, so the
figure compares sets but is on its own scale (not comparable with published FIDs). Lower is closer; two halves of
the real test split give the floor it can reach.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dpdistill.models.features import feature_batch, outputs
from dpdistill.models.scattering import scattering_features
from dpdistill.progress import Progress

CELLS = 3  # spatial cells a side the coefficients are averaged over
DESCRIPTION = ("Fréchet distance between Gaussians fitted to the scattering coefficients (J = 2, L = 8, group "
               "normalised, averaged over 3 x 3 cells) of the two image sets; lower is closer, on its own scale")


class ScatteringCells(nn.Module):
    """Images -> (n, channels * CELLS^2): normalised scattering coefficients averaged over spatial cells."""

    def __init__(self, in_shape: tuple[int, int, int]) -> None:
        super().__init__()
        self.transform, _ = scattering_features(in_shape)

    def forward(self, images: Tensor) -> Tensor:
        return F.adaptive_avg_pool2d(self.transform(images), CELLS).flatten(1)


def frechet_distance(first: np.ndarray, second: np.ndarray) -> float:
    """Fréchet distance between Gaussians fitted to the rows of `first` and of `second` (n, d), n >= 2 each.

    Its cross term, trace sqrt(C1 C2), is the sum of the square roots of the eigenvalues of R C2 R with R = C1^(1/2),
    a symmetric positive semi-definite matrix: two symmetric eigendecompositions, where a general matrix square
    root of C1 C2 took seconds at the 729 dimensions of the scattering cells."""
    mean_first, mean_second = first.mean(0), second.mean(0)
    cov_first, cov_second = np.cov(first, rowvar=False), np.cov(second, rowvar=False)
    root_first = _psd_sqrt(cov_first)
    cross = np.sqrt(np.clip(np.linalg.eigvalsh(root_first @ cov_second @ root_first), 0, None)).sum()
    distance = ((mean_first - mean_second) ** 2).sum() + np.trace(cov_first) + np.trace(cov_second) - 2 * cross
    return float(max(distance, 0.0))


def _psd_sqrt(matrix: np.ndarray) -> np.ndarray:
    """The symmetric square root of a covariance (eigenvalues below 0 by rounding count as 0)."""
    values, vectors = np.linalg.eigh(matrix)
    return (vectors * np.sqrt(np.clip(values, 0, None))) @ vectors.T


def scattering_frechet(synthetic: Tensor, real: Tensor, device: str | torch.device = "cpu",
                       progress: Progress | None = None) -> dict[str, float | str]:
    """The synthetic images' distance to `real` (the real test split), and the floor: the distance between the two
    halves of `real`. Images (n, C, H, W) in [-1, 1] as dpdistill holds them; `progress` hears both feature passes
    (minutes for 60,000 images on a CPU)."""
    features = ScatteringCells(tuple(real.shape[1:])).to(device)
    batch = feature_batch(device)
    real_features = outputs(features, real, batch_size=batch, device=device, progress=progress).double().numpy()
    synthetic_features = outputs(features, synthetic, batch_size=batch, device=device,
                                 progress=progress).double().numpy()
    half = len(real_features) // 2
    return {"synthetic_to_real": frechet_distance(synthetic_features, real_features),
            "real_halves": frechet_distance(real_features[:half], real_features[half:]),
            "measure": DESCRIPTION}
