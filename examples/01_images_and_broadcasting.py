"""Series post 2: tensors, broadcasting, and images as (N, C, H, W) tensors in [-1, 1].

Draws a small "photo" with broadcasting, loads it back with tinydit.images, builds a batch and saves
it as a grid.   python examples/01_images_and_broadcasting.py --out examples_out
"""

import argparse
from pathlib import Path

import torch

from tinydit.images import from_model_range, load_image, save_grid, tensor_to_pil


def draw_photo(h: int = 120, w: int = 160) -> torch.Tensor:
    """A sky-to-grass picture with a red sun, (3, h, w) in [0, 1], built only from broadcasting."""
    ys = torch.linspace(0, 1, h).view(h, 1).expand(h, w)  # (h, 1) stretched over columns
    xs = torch.linspace(0, 1, w).view(1, w).expand(h, w)  # (1, w) stretched over rows
    sky = torch.stack([0.4 + 0 * ys, 0.6 + 0.2 * ys, 1.0 - 0.3 * ys])  # (3, h, w)
    grass = torch.stack([0.2 + 0 * ys, 0.6 + 0 * ys, 0.2 + 0 * ys])
    img = torch.where(ys > 0.7, grass, sky)
    sun = (xs - 0.75) ** 2 + ((ys - 0.25) * h / w) ** 2 < 0.01  # (h, w) boolean mask
    img[:, sun] = torch.tensor([1.0, 0.2, 0.1]).view(3, 1)
    return img


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="examples_out")
    out = Path(parser.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)

    photo = draw_photo()
    tensor_to_pil(photo).save(out / "photo.png")

    # Per-channel normalisation: a (3, 1, 1) tensor lines up with the channel axis.
    mean = torch.tensor([0.5, 0.5, 0.5]).view(3, 1, 1)
    normed = (photo - mean) / 0.5
    print("normalised range:", round(normed.min().item(), 2), "to", round(normed.max().item(), 2))
    try:
        photo - torch.tensor([0.5, 0.5, 0.5])  # (3,) lines up with the width, not the channels
    except RuntimeError as err:
        print("the classic broadcasting trap:", str(err).split(" at ")[0])

    # permute moves channels; reshape would scramble them.
    hwc = photo.permute(1, 2, 0)  # (H, W, C), the layout of PIL and NumPy
    print(
        "permute back == original:",
        torch.equal(hwc.permute(2, 0, 1), photo),
        "| reshape == original:",
        torch.equal(hwc.reshape(3, 120, 160), photo),
    )

    x = load_image(out / "photo.png", size=32)  # (1, 3, 32, 32) in [-1, 1]
    batch = torch.cat([x, x.flip(-1), -x], dim=0)  # original, mirrored, colour-inverted: (3, 3, 32, 32)
    save_grid(batch, out / "photo_batch.png", nrow=3)
    print(
        "batch",
        tuple(batch.shape),
        batch.dtype,
        "| pixel (0, 0) RGB:",
        [round(v, 3) for v in from_model_range(x[0, :, 0, 0]).tolist()],
    )
    print("wrote", out / "photo_batch.png")


if __name__ == "__main__":
    main()
