"""Small nets under torchvision's model names: a few layers, the same call signature and the
attributes scripts touch (``fc``, ``features``, ``classifier``)."""
from __future__ import annotations

from torch import nn


class _Small(nn.Module):
    def __init__(self, num_classes=1000, width=64):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(width, num_classes)

    def forward(self, x):
        return self.fc(self.avgpool(self.relu(self.bn1(self.conv1(x)))).flatten(1))


def _factory(name):
    def build(pretrained=False, weights=None, num_classes=1000, progress=True, **kwargs):
        return _Small(num_classes)
    build.__name__ = name
    return build


resnet18 = _factory("resnet18")
resnet34 = _factory("resnet34")
resnet50 = _factory("resnet50")
resnet101 = _factory("resnet101")
alexnet = _factory("alexnet")


class VGG(nn.Module):
    def __init__(self, num_classes=1000):
        super().__init__()
        layers, c = [], 3
        for i in range(37):
            if i % 5 == 4:
                layers.append(nn.MaxPool2d(2, ceil_mode=True))
            elif i % 5 in (1, 3):
                layers.append(nn.ReLU(inplace=False))
            else:
                layers.append(nn.Conv2d(c, 8, 3, padding=1))
                c = 8
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Linear(8, num_classes))

    def forward(self, x):
        return self.classifier(self.avgpool(self.features(x)).flatten(1))


def vgg16(pretrained=False, weights=None, **kwargs):
    return VGG(kwargs.get("num_classes", 1000))


vgg19 = vgg16


class VGG16_Weights:
    DEFAULT = IMAGENET1K_V1 = "stub"


class VGG19_Weights(VGG16_Weights):
    pass


class ResNet18_Weights(VGG16_Weights):
    pass
