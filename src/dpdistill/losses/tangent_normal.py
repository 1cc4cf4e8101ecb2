"""Tangent-normal regularisation (Yu et al., CVPR 2019), as DGD uses it (seed 004, Eq. 4 and 6): an unlabelled
image is encoded by a VAE and reconstructed three times: from its code (x_hat), from the code moved a little in a
random direction (x_tangent: a step along the images' manifold), and with a random step in image space orthogonal
to the decoder's tangent space at the code (x_normal: off the manifold). The student's features should not move
under either step, and its predictions on x_hat should be confident.

The steps are random, not adversarial ("random perturbation noise", the seed); they carry no privacy role and are
drawn from the run's seeded generator. The seed's unsupervised energy adds the student's sum p log p, which would
reward uncertain predictions; its text asks for "more determinate predictions", so the entropy is minimised.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import jvp, vmap

from dpdistill.models.vae import VAE


@torch.no_grad()
def tangent_normal_views(vae: VAE, images: Tensor, tangent_radius: float, normal_radius: float
                         ) -> tuple[Tensor, Tensor, Tensor]:
    """(x_hat, x_tangent, x_normal) for `images`: reconstructions from a sampled code, from the code moved by
    `tangent_radius` (L2, in code units), and x_hat moved by `normal_radius` (root mean square per pixel) in a
    direction orthogonal to the columns of the decoder's Jacobian."""
    mean, log_variance = vae.encode(images)
    codes = mean + torch.randn_like(mean) * (0.5 * log_variance).exp()
    reconstructed = vae.decode(codes)
    tangent = vae.decode(codes + tangent_radius * F.normalize(torch.randn_like(codes), dim=1))
    jacobians = decoder_jacobians(vae, codes)
    direction = torch.randn(len(images), jacobians.shape[1], 1, device=images.device)
    # an orthonormal basis of a space holding the tangent space, not the Jacobian's Gram matrix: a decoder whose
    # units are all dead at a code, or that ignores a coordinate, makes that matrix singular
    basis = torch.linalg.qr(jacobians).Q
    normal = (direction - basis @ (basis.transpose(1, 2) @ direction)).squeeze(2)
    scale = normal_radius * normal.shape[1] ** 0.5
    return reconstructed, tangent, reconstructed + scale * F.normalize(normal, dim=1).view_as(reconstructed)


FEATURE_DISTANCES = ("normalized", "raw")


def tangent_normal_loss(features: Tensor, logits: Tensor, entropy_weight: float = 1.0, raw: bool = False) -> Tensor:
    """Seed 004's unsupervised energy per image from the student's backbone `features` of (x_hat, x_tangent,
    x_normal) stacked in that order and its `logits` on x_hat: squared feature distances from x_hat to its tangent
    and normal neighbours, plus `entropy_weight` times the entropy of the prediction on x_hat. By default the
    features are L2-normalised and x_hat's are a fixed target, as in every consistency loss (raw distances are also
    made small by shrinking every feature together); `raw` takes Eq. 6 as written."""
    if raw:
        centre, along, across = features.flatten(1).chunk(3)
    else:
        centre, along, across = F.normalize(features.flatten(1), dim=1).chunk(3)
        centre = centre.detach()
    entropy = -(F.softmax(logits, 1) * F.log_softmax(logits, 1)).sum(1)
    return ((centre - along).pow(2).sum(1) + (centre - across).pow(2).sum(1) + entropy_weight * entropy).mean()


def decoder_jacobians(vae: VAE, codes: Tensor) -> Tensor:
    """(n, pixels, latent_dim): each code's decoder Jacobian, one forward-mode product per latent coordinate for
    the whole batch at once (each image depends on its own code only)."""
    def decode(batch: Tensor) -> Tensor:
        return vae.decode(batch).flatten(1)

    basis = torch.eye(codes.shape[1], device=codes.device)
    columns = vmap(lambda unit: jvp(decode, (codes,), (unit.expand_as(codes),))[1])(basis)
    return columns.permute(1, 2, 0)
