"""The benchmark models in plain PyTorch 1.13, twins of models/*.json.

Each model is built from torch.nn layers with their default initialisation
(each layer's own reset_parameters), so that torch.manual_seed(S) followed
by MODELS[name]() gives bit for bit the state that modelstate builds from
models/NAME.json with seed S. check_models.py verifies this.

Class names equal the spec's custom module types ("ResNet", "Bottleneck",
"GPT2", ...). Submodules are assigned in the order the spec lists them,
which is also the order the random generator is drawn from.

The models only hold state: they have no forward(), as the benchmarks
measure construction, load_state_dict and dtype conversion.

Usage:
    from bench_models import MODELS
    torch.manual_seed(0)
    model = MODELS["resnet50"]()
"""
import torch.nn as nn


def mlp():
    """MLP 784-256-10."""
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))


def linear64(depth=64, width=1024):
    """depth x Linear(width, width): 256 MiB of float32 at the defaults."""
    return nn.Sequential(*[nn.Linear(width, width) for _ in range(depth)])


class Bottleneck(nn.Module):
    """torchvision's ResNet v1.5 Bottleneck (stride on the 3x3 conv).

    Unlike torchvision's _make_layer, which constructs `downsample` before
    the block, the block constructs it last, where it is registered: a
    modelstate spec draws random numbers in registration order. Module tree
    and state_dict keys are torchvision's; with torchvision's init loop
    removed, only the order of the draws differs.
    """

    expansion = 4

    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        width = planes
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1,
                               bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        if stride != 1 or inplanes != out:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, out, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out))
        else:
            # torchvision stores None; PyTorch then lists no child.
            self.downsample = None


class ResNet(nn.Module):
    """torchvision's resnet50() module tree, default layer init only."""

    def __init__(self, layers=(3, 4, 6, 3), num_classes=1000):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(64, layers[0], 1)
        self.layer2 = self._make_layer(128, layers[1], 2)
        self.layer3 = self._make_layer(256, layers[2], 2)
        self.layer4 = self._make_layer(512, layers[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * Bottleneck.expansion, num_classes)

    def _make_layer(self, planes, blocks, stride):
        layers = []
        for i in range(blocks):
            layers.append(Bottleneck(self.inplanes, planes,
                                     stride if i == 0 else 1))
            self.inplanes = planes * Bottleneck.expansion
        return nn.Sequential(*layers)


def resnet50():
    return ResNet()


class GPT2Attention(nn.Module):

    def __init__(self, d):
        super().__init__()
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.attn_dropout = nn.Dropout(0.1)
        self.resid_dropout = nn.Dropout(0.1)


class GPT2MLP(nn.Module):

    def __init__(self, d):
        super().__init__()
        self.c_fc = nn.Linear(d, 4 * d)
        self.c_proj = nn.Linear(4 * d, d)
        self.act = nn.GELU(approximate="tanh")
        self.dropout = nn.Dropout(0.1)


class GPT2Block(nn.Module):

    def __init__(self, d):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = GPT2Attention(d)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = GPT2MLP(d)


# GPT-2 small. check_models.py scales these down for its quick check.
GPT2_CONFIG = {"vocab": 50257, "n_ctx": 1024, "d": 768, "n_layer": 12}


class GPT2(nn.Module):
    """GPT-2 with an untied lm_head, Linear in place of HF's Conv1D."""

    def __init__(self, vocab, n_ctx, d, n_layer):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(n_ctx, d)
        self.drop = nn.Dropout(0.1)
        self.h = nn.ModuleList([GPT2Block(d) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)


def gpt2(**config):
    """GPT-2 small (about 163 M parameters); config overrides GPT2_CONFIG."""
    return GPT2(**{**GPT2_CONFIG, **config})


# Name (= models/NAME.json) -> factory of the full-size model.
MODELS = {
    "mlp": mlp,
    "resnet50": resnet50,
    "gpt2": gpt2,
    "linear64": linear64,
}
