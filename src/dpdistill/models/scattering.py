"""Data-independent scattering features (Tramer & Boneh 2021, "Differentially Private Learning Needs Better
Features"): a fixed Morlet wavelet transform, so DP-SGD spends its budget on a small head only.

`Scattering2D` follows kymatio's Scattering2D: the same Morlet filter bank, reflect padding, order-0/1/2
coefficients averaged by a Gaussian low-pass and subsampled by 2^J (1 + J L + L^2 J (J - 1) / 2 channels per input
channel: 81 for J = 2, L = 8), and each wavelet modulus subsampled to its own scale before the next order, as
kymatio does, in the Fourier domain. Written here because kymatio 0.3.0 no longer imports with current scipy.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dpdistill.errors import ConfigError
from dpdistill.models.base import Classifier
from dpdistill.models.classifiers import conv_blocks

GROUPS = 27  # Tramer & Boneh's GroupNorm groups over the 81 (x channels) coefficients


def _gabor(size: tuple[int, int], sigma: float, theta: float, xi: float, slant: float) -> Tensor:
    """A periodised 2-D Gabor filter in space (kymatio's gabor_2d), summed over neighbouring periods so it wraps."""
    rows, cols = size
    cos, sin = math.cos(theta), math.sin(theta)
    rotation = torch.tensor([[cos, -sin], [sin, cos]], dtype=torch.float64)
    curvature = rotation @ torch.diag(torch.tensor([1.0, slant**2], dtype=torch.float64)) @ rotation.T
    curvature = curvature / (2 * sigma**2)
    filt = torch.zeros(rows, cols, dtype=torch.complex128)
    for shift_x in range(-2, 3):
        for shift_y in range(-2, 3):
            x = torch.arange(shift_x * rows, (shift_x + 1) * rows, dtype=torch.float64)[:, None]
            y = torch.arange(shift_y * cols, (shift_y + 1) * cols, dtype=torch.float64)[None, :]
            envelope = -(curvature[0, 0] * x * x + 2 * curvature[0, 1] * x * y + curvature[1, 1] * y * y)
            filt += torch.exp(torch.complex(envelope, xi * (x * cos + y * sin)))
    return filt / (2 * math.pi * sigma**2 / slant)


def _morlet(size: tuple[int, int], sigma: float, theta: float, xi: float, slant: float) -> Tensor:
    """A Gabor filter minus its envelope scaled to zero mean: a band-pass wavelet (kymatio's morlet_2d)."""
    wave, envelope = _gabor(size, sigma, theta, xi, slant), _gabor(size, sigma, theta, 0.0, slant)
    return wave - wave.sum() / envelope.sum() * envelope


@functools.lru_cache(maxsize=16)
def _filter_spectra(padded: tuple[int, int], J: int, L: int) -> tuple[Tensor, Tensor]:
    """The Morlet wavelets' and the low-pass filter's spectra on the padded grid. kymatio keeps the real part of each
    filter's Fourier transform (the filters are near-symmetric). Built once per grid: their sums over periods take a
    tenth of a second, and every scattering model, feature map and fidelity measure of that size builds the same."""
    wavelets = [_morlet(padded, 0.8 * 2**j, (L // 2 - 1 - angle) * math.pi / L, 3 / 4 * math.pi / 2**j, 4 / L)
                for j in range(J) for angle in range(L)]
    lowpass = _gabor(padded, 0.8 * 2 ** (J - 1), 0.0, 0.0, 1.0)
    return torch.fft.fft2(torch.stack(wavelets)).real.float(), torch.fft.fft2(lowpass).real.float()


def padded_size(size: int, J: int) -> int:
    """kymatio's padded length: a multiple of 2^J at least 2^J beyond the image, so the border does not wrap."""
    return (size + 2**J) // 2**J * 2**J + 2**J


class Scattering2D(nn.Module):
    """Order-2 scattering of (N, C, H, W) images into (N, C * channels, ceil(H / 2^J), ceil(W / 2^J)).

    Buffer-only (no parameters): nothing is learnt, from private data or otherwise.
    """

    def __init__(self, shape: tuple[int, int], J: int = 2, L: int = 8) -> None:
        super().__init__()
        height, width = shape
        if J < 1 or L < 1:
            raise ConfigError(f"scattering needs J >= 1 and L >= 1, got J={J}, L={L}")
        pads = [(padded_size(size, J) - size) for size in shape]
        if 2**J > min(shape) or any(pad // 2 >= size or pad - pad // 2 >= size for pad, size in zip(pads, shape)):
            raise ConfigError(f"scattering with J={J} needs images of at least {2 ** J} pixels a side that can be "
                              f"reflect-padded by 2^J, got {height}x{width}: lower J")
        self.J, self.L, self.shape = J, L, (height, width)
        self.padding = (pads[1] // 2, pads[1] - pads[1] // 2, pads[0] // 2, pads[0] - pads[0] // 2)
        wavelets_hat, lowpass_hat = _filter_spectra((height + pads[0], width + pads[1]), J, L)
        # a signal subsampled by 2^r is filtered at its own resolution by the filter's spectrum folded onto the
        # coarser grid; at full resolution that is the cached spectrum itself, of which each model keeps its own copy
        for resolution in range(J):
            for name, spectrum in (("wavelets_hat", wavelets_hat), ("lowpass_hat", lowpass_hat)):
                folded = _fold(spectrum, 2**resolution, average=False)
                self.register_buffer(f"{name}_{resolution}", folded if resolution else folded.clone(), persistent=False)
        self.out_shape = (math.ceil(height / 2**J), math.ceil(width / 2**J))
        self.channels = 1 + J * L + L * L * J * (J - 1) // 2

    def extra_repr(self) -> str:
        return f"shape={self.shape}, J={self.J}, L={self.L}"

    def _envelope(self, signal_hat: Tensor, resolution: int, scale: int) -> Tensor:
        """|signal * psi_{scale, angle}| for the L angles, from a signal at resolution 2^-resolution, subsampled to
        2^-scale (the wavelet's band allows it); returns its spectrum at that resolution."""
        wavelets = getattr(self, f"wavelets_hat_{resolution}")[scale * self.L:(scale + 1) * self.L]
        filtered = _fold(signal_hat * wavelets, 2 ** (scale - resolution), average=True)
        return torch.fft.fft2(torch.fft.ifft2(filtered).abs())

    def _average(self, signal_hat: Tensor, resolution: int) -> Tensor:
        """Low-pass, subsample to 2^J and drop the padding (kymatio's unpad): the invariant coefficients."""
        averaged = _fold(signal_hat * getattr(self, f"lowpass_hat_{resolution}"), 2 ** (self.J - resolution),
                         average=True)
        coarse = torch.fft.ifft2(averaged).real
        top, left = self.padding[2] // 2**self.J, self.padding[0] // 2**self.J
        return coarse[..., top:top + self.out_shape[0], left:left + self.out_shape[1]]

    def forward(self, images: Tensor) -> Tensor:
        batch, channels = images.shape[:2]
        padded = F.pad(images.reshape(batch * channels, 1, *images.shape[2:]), self.padding, mode="reflect")[:, 0]
        padded_hat = torch.fft.fft2(padded)
        coefficients = [self._average(padded_hat, 0)[:, None]]
        first_order = [self._envelope(padded_hat[:, None], 0, j) for j in range(self.J)]
        coefficients += [self._average(envelope_hat, j) for j, envelope_hat in enumerate(first_order)]
        for j1, envelope_hat in enumerate(first_order):  # | |x * psi_{j1}| * psi_{j2} | for coarser scales j2 > j1
            for j2 in range(j1 + 1, self.J):
                second = self._envelope(envelope_hat[:, :, None], j1, j2)  # (B, L angles j1, L angles j2, ...)
                coefficients.append(self._average(second, j2).flatten(1, 2))
        return torch.cat(coefficients, dim=1).reshape(batch, channels * self.channels, *self.out_shape)


def _fold(spectrum: Tensor, factor: int, average: bool) -> Tensor:
    """Fold a spectrum onto the grid `factor` times coarser by adding its factor x factor blocks (slices, faster
    than a strided reduction). Averaged, it is exactly the spectrum of the signal subsampled by `factor`; summed, a
    band-limited filter's spectrum at the coarser resolution."""
    if factor == 1:
        return spectrum
    rows, cols = spectrum.shape[-2] // factor, spectrum.shape[-1] // factor
    folded = spectrum[..., :rows, :cols].clone()
    for block in range(1, factor * factor):
        top, left = block // factor * rows, block % factor * cols
        folded += spectrum[..., top:top + rows, left:left + cols]
    return folded / (factor * factor) if average else folded


def scattering_features(in_shape: tuple[int, int, int], J: int = 2, L: int = 8) -> tuple[nn.Sequential, int]:
    """Scattering then per-example GroupNorm without parameters (each example normalised over its own
    coefficients, so no statistic of the private data enters); returns the module and its channel count."""
    scattering = Scattering2D(in_shape[1:], J, L)
    channels = in_shape[0] * scattering.channels
    groups = math.gcd(GROUPS, channels)
    return nn.Sequential(scattering, nn.GroupNorm(groups, channels, affine=False)), channels


class ScatterLinear(Classifier):
    """Tramer & Boneh's ScatterNet + linear: fixed, normalised scattering coefficients and one linear layer.
    The backbone has no parameters, so head-only DP-SGD on features computed once is the whole model."""

    fixed_backbone = True

    def __init__(self, in_shape: tuple[int, int, int], num_classes: int, J: int = 2, L: int = 8) -> None:
        super().__init__()
        transform, channels = scattering_features(in_shape, J, L)
        self.backbone = nn.Sequential(transform, nn.Flatten())
        self.head = nn.Linear(channels * math.prod(transform[0].out_shape), num_classes)


class ScatterCNN(Classifier):
    """Tramer & Boneh's small CNN on scattering coefficients: two 3x3 conv blocks (GroupNorm, not BatchNorm, so
    Opacus' per-example gradients apply), max-pooled while the map is at least 4 wide, then a linear layer."""

    def __init__(self, in_shape: tuple[int, int, int], num_classes: int, width: tuple[int, ...] = (64, 64),
                 J: int = 2, L: int = 8) -> None:
        super().__init__()
        transform, channels = scattering_features(in_shape, J, L)
        blocks, channels, size = conv_blocks(channels, min(transform[0].out_shape), width,
                                             lambda out: nn.GroupNorm(math.gcd(8, out), out))
        self.backbone = nn.Sequential(transform, *blocks, nn.Flatten())
        self.head = nn.Linear(channels * size * size, num_classes)

    def fixed_split(self) -> tuple[nn.Module, nn.Module]:
        return self.backbone[0], nn.Sequential(*self.backbone[1:], self.head)
