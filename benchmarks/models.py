"""The benchmark models, built without torchvision.

Plain-PyTorch VGG-16, MobileNetV2, GoogLeNet and UNet match the torchvision (or classic
UNet) architectures layer for layer; ResNet-50 comes from MONAI and the transformers
(DistilBERT, GPT-2) from `transformers` configs, with no download. Every model takes one
tensor, returns one tensor and has no data-dependent control flow (the ones written here
use no in-place ops either), so its training step traces into one graph. `blocks` names each
model's repeated blocks in forward order, the units a per-block `torch.utils.checkpoint`
baseline wraps; `chain` writes the forward as a list of one-tensor functions run one after
another, what `torch.utils.checkpoint.checkpoint_sequential` takes (None for the UNet, whose
skip connections cross every cut).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from monet.catalog import load_model
from monet.models import BasicBlock, ResidualCNN

IMAGE_SHAPE = (32, 3, 224, 224)
QUICK_IMAGE_SHAPE = (8, 3, 128, 128)


def conv_bn(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1, eps: float = 1e-5,
            act: type[nn.Module] = nn.ReLU) -> nn.Sequential:
    """Conv (no bias, 'same' padding for odd kernels), BatchNorm, then `act`."""
    return nn.Sequential(nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout, eps=eps), act())


class VGG16(nn.Module):
    """torchvision `vgg16`: five stages of 3x3 conv+ReLU (with bias, no BN) each closed by a
    max-pool, 7x7 adaptive average pool, and three linear layers with ReLU and dropout."""

    STAGES = ((64, 2), (128, 2), (256, 3), (512, 3), (512, 3))

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        stages, cin = [], 3
        for width, depth in self.STAGES:
            layers = []
            for _ in range(depth):
                layers += [nn.Conv2d(cin, width, 3, padding=1), nn.ReLU()]
                cin = width
            stages.append(nn.Sequential(*layers, nn.MaxPool2d(2)))
        self.features = nn.Sequential(*stages)
        self.avgpool = nn.AdaptiveAvgPool2d(7)
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096), nn.ReLU(), nn.Dropout(),
            nn.Linear(4096, 4096), nn.ReLU(), nn.Dropout(),
            nn.Linear(4096, num_classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


class InvertedResidual(nn.Module):
    """MobileNetV2 block: 1x1 expand (skipped when the ratio is 1), 3x3 depthwise, 1x1 linear
    projection; a residual add when stride and width are unchanged."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hidden = cin * expand
        layers = [conv_bn(cin, hidden, 1, act=nn.ReLU6)] if expand != 1 else []
        layers += [conv_bn(hidden, hidden, 3, stride, groups=hidden, act=nn.ReLU6),
                   nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.conv = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.conv(x) if self.residual else self.conv(x)


class MobileNetV2(nn.Module):
    """torchvision `mobilenet_v2` (width 1.0): a strided 3x3 stem, 17 inverted residuals, a 1x1
    conv to 1280 channels, global average pool, dropout and a linear head."""

    # expansion t, width c, repeats n, first stride s
    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1))

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        layers, cin = [conv_bn(3, 32, 3, 2, act=nn.ReLU6)], 32
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers.append(conv_bn(cin, 1280, 1, act=nn.ReLU6))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))

    def forward(self, x):
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


def basic_conv(cin: int, cout: int, kernel: int, stride: int = 1) -> nn.Sequential:
    """GoogLeNet's BasicConv2d: conv (no bias), BatchNorm with eps 0.001, ReLU."""
    return conv_bn(cin, cout, kernel, stride, eps=1e-3)


class Inception(nn.Module):
    """GoogLeNet inception module: 1x1, 1x1->3x3, 1x1->3x3 (torchvision's "5x5" branch is 3x3)
    and 3x3 max-pool->1x1 branches, concatenated on channels."""

    def __init__(self, cin: int, c1: int, c3red: int, c3: int, c5red: int, c5: int, pool_proj: int):
        super().__init__()
        self.branch1 = basic_conv(cin, c1, 1)
        self.branch2 = nn.Sequential(basic_conv(cin, c3red, 1), basic_conv(c3red, c3, 3))
        self.branch3 = nn.Sequential(basic_conv(cin, c5red, 1), basic_conv(c5red, c5, 3))
        self.branch4 = nn.Sequential(nn.MaxPool2d(3, 1, 1, ceil_mode=True), basic_conv(cin, pool_proj, 1))

    def forward(self, x):
        return torch.cat([self.branch1(x), self.branch2(x), self.branch3(x), self.branch4(x)], 1)


class GoogLeNet(nn.Module):
    """torchvision `googlenet` without aux logits or input transform: conv stem, nine inception
    modules between ceil-mode max-pools, global average pool, dropout 0.2 and a linear head."""

    def __init__(self, num_classes: int = 1000):
        super().__init__()

        def pool(kernel: int = 3) -> nn.MaxPool2d:
            return nn.MaxPool2d(kernel, 2, ceil_mode=True)

        self.stem = nn.Sequential(basic_conv(3, 64, 7, 2), pool(), basic_conv(64, 64, 1), basic_conv(64, 192, 3),
                                  pool())
        self.inception3 = nn.Sequential(Inception(192, 64, 96, 128, 16, 32, 32),
                                        Inception(256, 128, 128, 192, 32, 96, 64), pool())
        self.inception4 = nn.Sequential(Inception(480, 192, 96, 208, 16, 48, 64),
                                        Inception(512, 160, 112, 224, 24, 64, 64),
                                        Inception(512, 128, 128, 256, 24, 64, 64),
                                        Inception(512, 112, 144, 288, 32, 64, 64),
                                        Inception(528, 256, 160, 320, 32, 128, 128), pool(2))
        self.inception5 = nn.Sequential(Inception(832, 256, 160, 320, 32, 128, 128),
                                        Inception(832, 384, 192, 384, 48, 128, 128))
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2), nn.Linear(1024, num_classes))

    def forward(self, x):
        return self.head(self.inception5(self.inception4(self.inception3(self.stem(x)))))


def double_conv(cin: int, cout: int) -> nn.Sequential:
    """A UNet level: two 3x3 conv+BN+ReLU."""
    return nn.Sequential(conv_bn(cin, cout, 3), conv_bn(cout, cout, 3))


class Down(nn.Module):
    """UNet encoder level: 2x2 max-pool, then a double conv."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.conv = double_conv(cin, cout)

    def forward(self, x):
        return self.conv(F.max_pool2d(x, 2))


class Up(nn.Module):
    """UNet decoder level: 2x2 transposed conv halving the channels, concatenation with the
    encoder's skip tensor, then a double conv."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.up = nn.ConvTranspose2d(cin, cin // 2, 2, stride=2)
        self.conv = double_conv(cin, cout)

    def forward(self, x, skip):
        return self.conv(torch.cat([skip, self.up(x)], 1))


class UNet(nn.Module):
    """Ronneberger's UNet with padded convs (output is input-sized; height and width must be
    divisible by 16): widths 64-128-256-512-1024, four down and four up levels, 1x1 head."""

    WIDTHS = (64, 128, 256, 512, 1024)

    def __init__(self, in_channels: int = 3, out_channels: int = 2):
        super().__init__()
        w = self.WIDTHS
        self.inc = double_conv(in_channels, w[0])
        self.downs = nn.ModuleList(Down(a, b) for a, b in zip(w, w[1:]))
        self.ups = nn.ModuleList(Up(a, b) for a, b in zip(w[:0:-1], w[-2::-1]))
        self.outc = nn.Conv2d(w[0], out_channels, 1)

    def forward(self, x):
        skips = [self.inc(x)]
        for down in self.downs:
            skips.append(down(skips[-1]))
        x = skips.pop()
        for up in self.ups:
            x = up(x, skips.pop())
        return self.outc(x)


class GPT2LM(nn.Module):
    """GPT-2 language model (transformers, built from its config: no download, no KV cache),
    taking token ids and returning the logits (batch, tokens, vocab).

    The causal mask is passed ready-made (4D): without one, transformers checks the position
    ids for packed sequences, a data-dependent branch that does not trace.
    """

    def __init__(self, **config):
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel

        self.model = GPT2LMHeadModel(GPT2Config(use_cache=False, **config))

    def forward(self, ids):
        return self.model(input_ids=ids, attention_mask=self._causal(ids.shape[1], ids.device)).logits

    @staticmethod
    def _causal(n: int, device: torch.device) -> torch.Tensor:
        return torch.ones(n, n, dtype=torch.bool, device=device).tril()[None, None]

    def chain(self) -> list[Callable[[torch.Tensor], torch.Tensor]]:
        """Embedding, the 12 blocks, final norm and LM head, each a function of the hidden states
        (each block builds the causal mask as GPT2Model does)."""
        from transformers.masking_utils import create_causal_mask

        body = self.model.transformer

        def embed(ids):
            positions = torch.arange(ids.shape[1], device=ids.device)[None]
            return body.drop(body.wte(ids) + body.wpe(positions))

        def block_fn(block):
            def run(hidden):
                positions = torch.arange(hidden.shape[1], device=hidden.device)[None]
                mask = create_causal_mask(config=body.config, inputs_embeds=hidden,
                                          attention_mask=self._causal(hidden.shape[1], hidden.device),
                                          past_key_values=None, position_ids=positions)
                return block(hidden, None, mask, position_ids=positions)
            return run

        return [embed, *map(block_fn, body.h), lambda hidden: self.model.lm_head(body.ln_f(hidden))]


def resnet50() -> nn.Module:
    from monai.networks.nets import resnet50 as monai_resnet50

    return monai_resnet50(spatial_dims=2, n_input_channels=3, num_classes=1000)


def resnet_blocks(model: nn.Module) -> list[nn.Module]:
    return [block for stage in (model.layer1, model.layer2, model.layer3, model.layer4) for block in stage]


def resnet_chain(model: nn.Module) -> list[Callable]:
    stem = [model.conv1, model.bn1, model.act] + ([] if model.no_max_pool else [model.maxpool])
    return [*stem, *resnet_blocks(model), model.avgpool, nn.Flatten(), model.fc]


def vgg_chain(model: VGG16) -> list[Callable]:
    return [*model.features, model.avgpool, nn.Flatten(), *model.classifier]


def mobilenet_chain(model: MobileNetV2) -> list[Callable]:
    return [*model.features, nn.AdaptiveAvgPool2d(1), nn.Flatten(), *model.classifier]


def googlenet_chain(model: GoogLeNet) -> list[Callable]:
    return [*model.stem, *model.inception3, *model.inception4, *model.inception5, *model.head]


def cnn_chain(model: ResidualCNN) -> list[Callable]:
    return [*model.stem, *(layer for stage in model.stages for layer in stage), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
            model.head]


def distilbert_chain(model: nn.Module) -> list[Callable]:
    """Embeddings, the 6 layers (no padding mask: every token attends), and the QA head as
    `monet.models.DistilBertQA` returns it (start and end logits stacked)."""
    qa = model.model

    def head(hidden):
        start, end = qa.qa_outputs(qa.dropout(hidden)).split(1, dim=-1)
        return torch.stack((start.squeeze(-1), end.squeeze(-1)), dim=1)

    return [qa.distilbert.embeddings, *qa.distilbert.transformer.layer, head]


@dataclass(frozen=True)
class BenchModel:
    """A benchmark model: how to build it (full size, 1000 classes), its input at full (GPU) size
    and at a quick size whose eager training step takes at most a few seconds on 2 CPU cores
    (activations outweigh parameters there, except in VGG-16 and GPT-2), its repeated
    blocks in forward order, and its forward as a chain of one-tensor functions (or None)."""

    name: str
    build: Callable[[], nn.Module]
    input_shape: tuple[int, ...]
    quick_shape: tuple[int, ...]
    input_dtype: str
    blocks: Callable[[nn.Module], list[nn.Module]]
    chain: Callable[[nn.Module], list[Callable]] | None


MODELS: dict[str, BenchModel] = {m.name: m for m in (
    BenchModel("resnet50", resnet50, IMAGE_SHAPE, (4, 3, 128, 128), "float32", resnet_blocks, resnet_chain),
    BenchModel("vgg16", VGG16, IMAGE_SHAPE, QUICK_IMAGE_SHAPE, "float32", lambda m: list(m.features), vgg_chain),
    BenchModel("mobilenet_v2", MobileNetV2, IMAGE_SHAPE, QUICK_IMAGE_SHAPE, "float32",
               lambda m: [b for b in m.features if isinstance(b, InvertedResidual)], mobilenet_chain),
    BenchModel("googlenet", GoogLeNet, IMAGE_SHAPE, QUICK_IMAGE_SHAPE, "float32",
               lambda m: [b for b in m.modules() if isinstance(b, Inception)], googlenet_chain),
    BenchModel("unet", UNet, (8, 3, 256, 256), (2, 3, 128, 128), "float32",
               lambda m: [m.inc, *m.downs, *m.ups], None),
    BenchModel("distilbert", lambda: load_model("distilbert")[0], (8, 384), (8, 128), "int64",
               lambda m: list(m.model.distilbert.transformer.layer), distilbert_chain),
    BenchModel("gpt2", GPT2LM, (8, 512), (2, 128), "int64", lambda m: list(m.model.transformer.h), GPT2LM.chain),
    # monet's bundled ResNet-style CNN: small enough for the benchmark test in CI.
    BenchModel("cnn", ResidualCNN, (32, 3, 64, 64), (8, 3, 32, 32), "float32",
               lambda m: [b for b in m.modules() if isinstance(b, BasicBlock)], cnn_chain),
)}
