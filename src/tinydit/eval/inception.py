"""The standard Inception feature extractor for FID, through torchmetrics and torch-fidelity.

The network is torch-fidelity's port of the TensorFlow FID Inception, which is what published FIDs
use. TinyDiT takes its 2048-d pool features and computes the Fréchet distance itself
(``tinydit.eval.metrics``), so Inception reference features are cached like the offline ones. Images are
fed as uint8 RGB; grayscale is repeated over three channels.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tinydit.errors import TinyDiTError
from tinydit.eval.features import file_sha256

__all__ = ["InceptionFeatures", "download_name"]


def download_name() -> str:
    """The file name of the weights torch-fidelity downloads (its own constant, so the two cannot drift)."""
    from torch_fidelity.feature_extractor_inceptionv3 import URL_INCEPTION_V3

    return URL_INCEPTION_V3.rsplit("/", 1)[-1]


class InceptionFeatures:
    """Callable: uint8 images (N, C, H, W) -> 2048-d features (N, 2048). ``name`` and ``sha256``
    identify the weights (the file's hash, or the name of the standard download)."""

    def __init__(self, weights: str | Path | None = None, batch_size: int = 100):
        try:
            from torchmetrics.image.fid import NoTrainInceptionV3
        except ImportError as err:
            raise TinyDiTError(
                "Inception FID needs torchmetrics and torch-fidelity: "
                "pip install 'tinydit[inception]'; the offline metrics need neither"
            ) from err
        self.batch_size = batch_size
        self.name = "inception"
        if weights is not None:
            weights = Path(weights)
            if not weights.is_file():
                raise TinyDiTError(f"`inception_weights` {weights} does not exist")
            try:  # torch-fidelity unpickles the file in full; only let plain tensors through
                torch.load(weights, map_location="cpu", weights_only=True)
            except Exception as err:
                raise TinyDiTError(
                    f"`inception_weights` {weights} is not a plain state dict of weights "
                    f"({type(err).__name__}); pass a copy of {download_name()}"
                ) from err
            self.sha256 = file_sha256(weights)
        else:
            self.sha256 = download_name().removesuffix(".pth")
        try:
            self.net = NoTrainInceptionV3(
                name="inception-v3-compat",
                features_list=["2048"],
                feature_extractor_weights_path=str(weights) if weights else None,
            )
        except Exception as err:  # URLError / OSError when offline, RuntimeError for a wrong file
            raise TinyDiTError(
                f"the Inception weights could not be {'loaded' if weights else 'downloaded'} "
                f"({type(err).__name__}: {str(err).splitlines()[0][:120]}). Offline, pass a local copy with "
                "`inception_weights` PATH, or use the offline metrics (the default)"
            ) from err

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        out = []
        for i in range(0, images.shape[0], self.batch_size):
            x = images[i : i + self.batch_size]
            if x.shape[1] == 1:
                x = x.expand(-1, 3, -1, -1)  # (n, 1, H, W) -> (n, 3, H, W)
            out.append(self.net(x).reshape(x.shape[0], -1).double())  # (n, 2048)
        return torch.cat(out)
