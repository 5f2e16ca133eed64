"""The model and the batches of a training benchmark.

``synthetic`` (default) is the seeds' mock dataset: one random batch of the model's input shape
(ImageNet-shaped 3 x S x S images for the ResNets, S = 224 unless ``--image-size``), reused
every step, so the measurement is the training step and nothing else. ``digits`` is
scikit-learn's bundled 8 x 8 digits (1,797 images, 10 classes, no download), split across ranks
(rank r takes every size-th sample of one shuffled order) and upsampled where a model needs
larger images.
"""
from __future__ import annotations

from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from accord.bench.options import TrainOptions
from accord.models import get_model

_SYNTHETIC_CLASSES = {"resnet18": 1000, "resnet50": 1000, "mlp": 1000, "lenet": 10}
MLP_FEATURES = 1024


def image_size(opts: TrainOptions) -> int | None:
    """Side of the input images (None for the MLP)."""
    if opts.model == "mlp":
        return None
    if opts.image_size is not None:
        return opts.image_size
    if opts.model == "lenet":
        return 8 if opts.data == "digits" else 28
    return 32 if opts.data == "digits" else 224


def build_model(opts: TrainOptions) -> nn.Module:
    """The model of ``opts`` for its data (10 classes on digits)."""
    classes = 10 if opts.data == "digits" else _SYNTHETIC_CLASSES[opts.model]
    if opts.model == "mlp":
        return get_model("mlp", num_classes=classes, in_features=64 if opts.data == "digits" else MLP_FEATURES)
    if opts.model == "lenet":
        return get_model("lenet", num_classes=classes, image_size=image_size(opts))
    return get_model(opts.model, num_classes=classes)


def _input_shape(opts: TrainOptions) -> tuple[int, ...]:
    side = image_size(opts)
    if opts.model == "mlp":
        return (MLP_FEATURES,)
    return (1 if opts.model == "lenet" else 3, side, side)


def _shape_digits(x: torch.Tensor, opts: TrainOptions) -> torch.Tensor:
    """(N, 64) pixels in [0, 1] -> what the model takes."""
    if opts.model == "mlp":
        return x
    images = x.view(-1, 1, 8, 8)
    side = image_size(opts)
    if side != 8:
        images = F.interpolate(images, size=(side, side), mode="bilinear", align_corners=False)
    return images if opts.model == "lenet" else images.expand(-1, 3, -1, -1).contiguous()


def batches(opts: TrainOptions, rank: int, size: int,
            device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless (inputs, labels) batches of ``opts.batch_size`` for this rank, on ``device``."""
    gen = torch.Generator().manual_seed(opts.seed * 1000 + rank)
    if opts.data == "synthetic":
        classes = _SYNTHETIC_CLASSES[opts.model]
        x = torch.randn((opts.batch_size, *_input_shape(opts)), generator=gen).to(device)
        y = torch.randint(0, classes, (opts.batch_size,), generator=gen).to(device)
        while True:
            yield x, y
    from sklearn.datasets import load_digits

    digits = load_digits()
    order = torch.randperm(len(digits.target), generator=torch.Generator().manual_seed(opts.seed))
    mine = order[rank::size]
    x_all = _shape_digits(torch.tensor(digits.data, dtype=torch.float32)[mine] / 16.0, opts).to(device)
    y_all = torch.tensor(digits.target, dtype=torch.int64)[mine].to(device)
    n = len(y_all)
    while True:
        perm = torch.randperm(n, generator=gen).to(device)
        for start in range(0, n - opts.batch_size + 1, opts.batch_size):
            idx = perm[start:start + opts.batch_size]
            yield x_all[idx], y_all[idx]
        if n < opts.batch_size:  # fewer samples than one batch: sample with replacement
            idx = torch.randint(0, n, (opts.batch_size,), generator=gen).to(device)
            yield x_all[idx], y_all[idx]
