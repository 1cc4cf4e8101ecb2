"""DataLens' networks: the batched bank is N independent discriminators, and the generator is class-conditional."""

import torch
import torch.nn.functional as F

from dpdistill.models.datalens import ConditionalGenerator, DiscriminatorBank


def test_the_bank_computes_each_teacher_as_its_own_mlp():
    torch.manual_seed(0)
    bank = DiscriminatorBank(teachers=5, input_dim=12, num_classes=3, hidden=(7, 4))
    images, labels = torch.randn(5, 6, 12), torch.randint(3, (5, 6))
    batched = bank(images, labels)
    for teacher in range(5):
        hidden = images[teacher] @ bank.weights[0][teacher] + bank.biases[0][teacher] \
            + bank.class_weights[teacher][labels[teacher]]
        hidden = F.leaky_relu(hidden, 0.2) @ bank.weights[1][teacher] + bank.biases[1][teacher]
        logits = F.leaky_relu(hidden, 0.2) @ bank.weights[2][teacher] + bank.biases[2][teacher]
        assert torch.allclose(batched[teacher], logits.squeeze(-1), atol=1e-5)
    shared = bank(images[:1].expand(5, -1, -1), labels[0])
    assert torch.allclose(shared, bank(images[:1].expand(5, -1, -1), labels[:1].expand(5, -1)))


def test_a_teachers_loss_moves_only_its_own_weights():
    bank = DiscriminatorBank(teachers=4, input_dim=8, num_classes=2)
    logits = bank(torch.randn(4, 3, 8), torch.randint(2, (4, 3)))
    logits[2].sum().backward()
    touched = (bank.weights[0].grad.abs().sum((1, 2)) > 0).tolist()
    assert touched == [False, False, True, False]


def test_the_generator_depends_on_the_class_and_stays_in_range():
    generator = ConditionalGenerator(latent_dim=6, num_classes=4, out_shape=(1, 8, 8), hidden=16, width=4).eval()
    latents = torch.rand(4, 6) * 2 - 1
    same = latents[:1].expand(4, -1)
    images = generator(same, torch.arange(4))
    assert images.shape == (4, 1, 8, 8) and images.abs().max() <= 1
    assert not torch.allclose(images[0], images[1])
    assert generator(latents, torch.arange(4)).shape == (4, 1, 8, 8)
