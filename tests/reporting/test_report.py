"""The figures every report shares: one image grid, drawn in the data's own convention."""

from pathlib import Path

import matplotlib.image
import torch

from dpdistill.data import load_dataset
from dpdistill.reporting.report import save_image_grid


def test_every_grid_draws_the_datas_background_dark_and_its_ink_light(tmp_path: Path):
    """Images hold -1 where the data sets have their background (a digit's corner) and +1 at full ink: a grid shows
    -1 black and +1 white, as the data look (release's, DP-MERF's and every other samples.png use this one grid)."""
    digits = load_dataset("digits")
    assert digits.x_train[:, 0, 0, 0].eq(-1).all() and digits.x_train.amax() == 1  # the data's convention
    save_image_grid(torch.stack([-torch.ones(1, 8, 8), torch.ones(1, 8, 8)]), tmp_path / "grid.png", columns=2)
    picture = matplotlib.image.imread(tmp_path / "grid.png")[..., :3].mean(-1)
    height, width = picture.shape
    background, ink = picture[height // 2, width // 4], picture[height // 2, 3 * width // 4]
    assert background < 0.05 and ink > 0.95
