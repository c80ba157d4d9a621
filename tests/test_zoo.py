"""The model zoo matches torchvision's VGG-11 and ResNet-18: parameter counts (the
figures torchvision documents) and output shapes. Small inputs keep it fast: both
architectures end in an adaptive average pool, so any input of at least 32x32 works."""

import pytest

torch = pytest.importorskip("torch")
zoo = pytest.importorskip("poolgrad.torch.zoo")


def parameter_count(model):
    return sum(parameter.numel() for parameter in model.parameters())


@pytest.fixture(scope="module")
def vgg11():
    torch.manual_seed(0)
    return zoo.vgg11().eval()


@pytest.fixture(scope="module")
def resnet18():
    torch.manual_seed(0)
    return zoo.resnet18().eval()


def test_parameter_counts_equal_torchvision(vgg11, resnet18):
    assert parameter_count(vgg11) == 132_863_336
    assert parameter_count(resnet18) == 11_689_512


@pytest.mark.parametrize("model, size", [("vgg11", 32), ("resnet18", 64)])
def test_output_shapes(request, model, size):
    model = request.getfixturevalue(model)
    with torch.no_grad():
        out = model(torch.randn(2, 3, size, size))
    assert out.shape == (2, 1000)
    assert torch.isfinite(out).all()


def test_resnet18_at_224_and_the_layers_torchvision_has(resnet18):
    with torch.no_grad():
        assert resnet18(torch.randn(1, 3, 224, 224)).shape == (1, 1000)
    pools = [m for m in resnet18.modules() if isinstance(m, torch.nn.MaxPool2d)]
    assert [(p.kernel_size, p.stride, p.padding) for p in pools] == [(3, 2, 1)]
    downsampled = [name for name, m in resnet18.named_modules()
                   if getattr(m, "downsample", None) is not None]
    assert downsampled == ["layer2.0", "layer3.0", "layer4.0"]


def test_vgg_pools_and_num_classes(vgg11):
    pools = [m for m in vgg11.features if isinstance(m, torch.nn.MaxPool2d)]
    assert len(pools) == 5 and all(p.kernel_size == 2 and p.stride == 2 for p in pools)
    assert isinstance(vgg11.avgpool, torch.nn.AdaptiveAvgPool2d)
    # a second VGG costs seconds of initialization: num_classes is checked on ResNet
    assert zoo.resnet18(num_classes=10).fc.out_features == 10


def test_torchvision_initialization(vgg11, resnet18):
    conv = resnet18.conv1.weight  # kaiming normal, fan out: std sqrt(2 / (64 * 7 * 7))
    assert conv.std().item() == pytest.approx((2 / (64 * 49)) ** 0.5, rel=0.05)
    assert (resnet18.bn1.weight == 1).all() and (resnet18.bn1.bias == 0).all()
    linear = vgg11.classifier[0]
    assert linear.weight.std().item() == pytest.approx(0.01, rel=0.01)
    assert (linear.bias == 0).all() and (vgg11.features[0].bias == 0).all()
