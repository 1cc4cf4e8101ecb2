"""DataLens' networks: the batched bank is N independent conditional DCGAN discriminators (each normalised over its
own batch), and the generator is class-conditional."""

import torch
import torch.nn.functional as F

from dpdistill.models.datalens import ConditionalGenerator, DiscriminatorBank, same_padding


def one_teacher(bank: DiscriminatorBank, teacher: int, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Teacher `teacher` of `bank` as the official code writes it: the one-hot class concatenated as maps before each
    convolution and beside each dense layer's input, batch norm over this batch."""
    classes = bank.num_classes
    onehot = F.one_hot(labels, classes).float()

    def with_maps(maps):
        return torch.cat([maps, onehot[:, :, None, None].expand(-1, -1, *maps.shape[2:])], 1)

    def rows(parameter, count):
        return parameter[teacher * count:(teacher + 1) * count]

    def normalised(values, scale, shift, dims):
        mean, var = values.mean(dims, keepdim=True), values.var(dims, unbiased=False, keepdim=True)
        return (values - mean) / torch.sqrt(var + 1e-5) * scale + shift

    def kernels(image_part, class_part, count):
        return torch.cat([rows(image_part, count), rows(class_part, count)], 1)

    first, second = bank.first, bank.second
    maps = F.conv2d(F.pad(with_maps(images), bank.pads[0]), kernels(bank.conv1, bank.conv1_class, first),
                    rows(bank.conv1_bias, first), 2)
    maps = F.leaky_relu(maps, 0.2)
    maps = F.conv2d(F.pad(with_maps(maps), bank.pads[1]), kernels(bank.conv2, bank.conv2_class, second),
                    rows(bank.conv2_bias, second), 2)
    maps = normalised(maps, rows(bank.conv2_scale, second)[:, None, None], rows(bank.conv2_shift, second)[:, None, None],
                      (0, 2, 3))
    features = torch.cat([F.leaky_relu(maps, 0.2).flatten(1), onehot], 1)
    hidden = features @ torch.cat([bank.dense[teacher], bank.dense_class[teacher]]) + bank.dense_bias[teacher]
    width = hidden.shape[1]
    hidden = F.leaky_relu(normalised(hidden, rows(bank.dense_scale, width), rows(bank.dense_shift, width), 0), 0.2)
    logit = torch.cat([bank.logit[teacher], bank.logit_class[teacher]])
    return (torch.cat([hidden, onehot], 1) @ logit + bank.logit_bias[teacher]).squeeze(-1)


def test_the_bank_computes_each_teacher_as_its_own_conditional_dcgan_discriminator():
    torch.manual_seed(0)
    bank = DiscriminatorBank(teachers=4, in_shape=(1, 12, 12), num_classes=3, width=5, hidden=7)
    with torch.no_grad():  # batch norm's affine parameters away from their initial 1 and 0
        for parameter in (bank.conv2_scale, bank.conv2_shift, bank.dense_scale, bank.dense_shift, bank.conv1_bias):
            parameter.normal_()
    images, labels = torch.rand(4, 6, 1, 12, 12), torch.randint(3, (4, 6))
    batched = bank(images, labels)
    for teacher in range(4):
        assert torch.allclose(batched[teacher], one_teacher(bank, teacher, images[teacher], labels[teacher]),
                              atol=1e-5)
    shared = bank(images[0], labels[0])
    assert torch.allclose(shared, bank(images[:1].expand(4, -1, -1, -1, -1), labels[:1].expand(4, -1)))


def test_batch_norm_does_not_mix_teachers():
    """Changing one teacher's batch changes no other teacher's logits, though batch norm reads the whole batch."""
    torch.manual_seed(1)
    bank = DiscriminatorBank(teachers=3, in_shape=(1, 8, 8), num_classes=2, width=4, hidden=6)
    images, labels = torch.rand(3, 5, 1, 8, 8), torch.randint(2, (3, 5))
    changed = images.clone()
    changed[1] = torch.rand(5, 1, 8, 8) * 3
    before, after = bank(images, labels), bank(changed, labels)
    assert torch.equal(before[0], after[0]) and torch.equal(before[2], after[2])
    assert not torch.allclose(before[1], after[1])


def test_a_teachers_loss_moves_only_its_own_weights():
    bank = DiscriminatorBank(teachers=4, in_shape=(1, 8, 8), num_classes=2, width=3, hidden=5)
    logits = bank(torch.rand(4, 3, 1, 8, 8), torch.randint(2, (4, 3)))
    logits[2].sum().backward()
    touched = (bank.dense.grad.abs().sum((1, 2)) > 0).tolist()
    assert touched == [False, False, True, False]
    conv_touched = bank.conv1.grad.abs().reshape(4, -1).sum(1) > 0
    assert conv_touched.tolist() == [False, False, True, False]


def test_same_padding_is_tensorflows():
    assert same_padding(28) == (1, 2) and same_padding(14) == (1, 2) and same_padding(7) == (2, 2)


def test_the_generator_depends_on_the_class_and_stays_in_range():
    generator = ConditionalGenerator(latent_dim=6, num_classes=4, out_shape=(1, 8, 8), hidden=16, width=4).eval()
    latents = torch.rand(4, 6) * 2 - 1
    same = latents[:1].expand(4, -1)
    images = generator(same, torch.arange(4))
    assert images.shape == (4, 1, 8, 8) and images.abs().max() <= 1
    assert not torch.allclose(images[0], images[1])
    assert generator(latents, torch.arange(4)).shape == (4, 1, 8, 8)
    assert not list(generator.buffers())  # batch norm on each batch's statistics, no running averages
