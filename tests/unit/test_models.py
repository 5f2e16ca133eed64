"""Model definitions: parameter counts and names as torchvision/Paddle, shapes, registry."""
from __future__ import annotations

import pytest
import torch

from accord.models import get_model, known_models, register_model
from accord.models.lenet import LeNet
from accord.models.mlp import MLP, mlp_26m
from accord.models.resnet import resnet18, resnet50

pytestmark = pytest.mark.timeout(60)


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_resnet_parameter_counts_match_torchvision():
    assert _count(resnet50()) == 25_557_032
    assert _count(resnet18()) == 11_689_512


def test_resnet_state_dict_names():
    r18, r50 = resnet18().state_dict(), resnet50().state_dict()
    # every conv has one weight, every BatchNorm 5 entries (weight, bias, running stats, counter)
    convs18 = 1 + 8 * 2 + 3  # stem, 8 basic blocks x 2, 3 downsample shortcuts
    convs50 = 1 + 16 * 3 + 4  # stem, 16 bottlenecks x 3, 4 downsample shortcuts
    assert len(r18) == convs18 * 6 + 2 == 122
    assert len(r50) == convs50 * 6 + 2 == 320
    for key in ["conv1.weight", "bn1.running_var", "layer1.0.conv2.weight", "layer2.0.downsample.0.weight",
                "layer2.0.downsample.1.num_batches_tracked", "layer4.1.bn2.bias", "fc.weight", "fc.bias"]:
        assert key in r18, key
    assert "layer1.0.downsample.0.weight" not in r18
    for key in ["layer1.0.downsample.0.weight", "layer1.0.conv3.weight", "layer3.5.bn3.weight",
                "layer4.2.conv2.weight"]:
        assert key in r50, key
    assert tuple(r50["layer2.0.conv2.weight"].shape) == (128, 128, 3, 3)
    assert tuple(r50["fc.weight"].shape) == (1000, 2048)


@torch.no_grad()
def test_resnet_forward_and_options():
    x = torch.randn(2, 3, 64, 64)
    assert get_model("resnet18", num_classes=10)(x).shape == (2, 10)
    assert resnet50(num_classes=7).eval()(x[:1]).shape == (1, 7)
    net = resnet18(zero_init_residual=True)
    assert all(float(b.bn2.weight.abs().sum()) == 0 for stage in
               (net.layer1, net.layer2, net.layer3, net.layer4) for b in stage)


def test_lenet_sizes_and_inputs():
    assert _count(LeNet(10, image_size=28)) == 61_610  # Paddle's LeNet
    # 8x8: conv1 6*9+6, conv2 16*6*9+16, fc 64*120+120, 120*84+84, 84*10+10
    assert _count(LeNet(10, image_size=8)) == 60 + 880 + 7_800 + 10_164 + 850 == 19_754
    net = get_model("lenet", image_size=8)
    assert net(torch.randn(5, 64)).shape == (5, 10)  # sklearn digits rows
    assert net(torch.randn(5, 1, 8, 8)).shape == (5, 10)
    assert get_model("LeNet", num_classes=3)(torch.randn(2, 1, 28, 28)).shape == (2, 3)
    with pytest.raises(ValueError, match="HINT:"):
        LeNet(image_size=2)


def test_mlp_sizes():
    # 1024*4096+4096 + 4096*4096+4096 + 4096*1024+1024 + 1024*1000+1000
    assert _count(mlp_26m()) == 4_198_400 + 16_781_312 + 4_195_328 + 1_025_000 == 26_200_040
    assert _count(get_model("mlp", num_classes=10)) == 26_200_040 - 1_025_000 + 10_250
    small = MLP(6, [4], 2)
    assert _count(small) == 6 * 4 + 4 + 4 * 2 + 2
    assert small(torch.randn(3, 2, 3)).shape == (3, 2)  # inputs are flattened
    assert _count(MLP(5, [], 3)) == 18
    with pytest.raises(ValueError, match="HINT:"):
        MLP(0, [4], 2)


def test_registry():
    assert {"resnet18", "resnet50", "lenet", "mlp"} <= set(known_models())
    with pytest.raises(ValueError, match=r"(?s)unknown model 'vgg'; known: \[.*'resnet50'.*HINT:") as info:
        get_model("vgg")
    assert "lenet" in str(info.value)
    register_model("Tiny", lambda num_classes=4: MLP(2, [], num_classes))
    try:
        assert get_model("tiny")(torch.zeros(1, 2)).shape == (1, 4)
        with pytest.raises(ValueError, match=r"(?s)model 'tiny' is already registered.*HINT: .*override=True"):
            register_model("TINY", lambda num_classes=3: MLP(2, [], num_classes))
        register_model("TINY", lambda num_classes=3: MLP(2, [], num_classes), override=True)
        assert get_model("tiny")(torch.zeros(1, 2)).shape == (1, 3)
    finally:
        from accord import models

        models._REGISTRY.pop("tiny")
