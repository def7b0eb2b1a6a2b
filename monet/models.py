"""The bundled models (monet.catalog names them).

They are small and self-contained so that demos and tests run on a CPU in
seconds: a ResNet-style CNN, an MLP with dropout, a transformer, and
transformers' DistilBERT built from its config.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers with a residual shortcut (1x1 conv-BN when the shape changes)."""

    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class ResidualCNN(nn.Module):
    """ResNet-style CNN: conv-BN-ReLU stem, three stages of basic blocks (max-pool before the
    second, a strided block opening the third), global average pool, linear head."""

    def __init__(self, num_classes: int = 10, widths: tuple[int, int, int] = (16, 32, 64),
                 blocks: tuple[int, int, int] = (3, 2, 2), in_channels: int = 3):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU())
        stages, cin = [], widths[0]
        for i, (width, n) in enumerate(zip(widths, blocks)):
            layers = [nn.MaxPool2d(2)] if i == 1 else []
            for j in range(n):
                layers.append(BasicBlock(cin, width, 2 if (i == 2 and j == 0) else 1))
                cin = width
            stages.append(nn.Sequential(*layers))
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = self.stages(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class MLP(nn.Module):
    """Linear-ReLU layers, dropout, and a linear head."""

    def __init__(self, in_features: int = 32, hidden: int = 128, depth: int = 32, num_classes: int = 10,
                 dropout: float = 0.1):
        super().__init__()
        layers, width = [], in_features
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        self.body = nn.Sequential(*layers)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(width, num_classes)

    def forward(self, x):
        return self.head(self.drop(self.body(x)))


class TransformerBlock(nn.Module):
    """Pre-norm transformer encoder block: multi-head self-attention and an MLP (GELU, or SiLU as in
    Llama-style models), dropout on both branches."""

    _ACTIVATIONS = {"gelu": nn.GELU, "silu": nn.SiLU}

    def __init__(self, dim: int = 128, heads: int = 4, mlp_ratio: int = 4, dropout: float = 0.1,
                 activation: str = "gelu"):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), self._ACTIVATIONS[activation](),
                                 nn.Linear(mlp_ratio * dim, dim))
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(c // self.heads), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.drop(self.proj(y))
        return x + self.drop(self.mlp(self.norm2(x)))


class Transformer(nn.Module):
    """A stack of transformer blocks with a final LayerNorm; input and output are (batch, tokens, dim)."""

    def __init__(self, dim: int = 128, depth: int = 4, heads: int = 4, dropout: float = 0.1,
                 activation: str = "gelu"):
        super().__init__()
        self.blocks = nn.Sequential(*(TransformerBlock(dim, heads, dropout=dropout, activation=activation)
                                      for _ in range(depth)))
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        return self.norm(self.blocks(x))


class DistilBertQA(nn.Module):
    """DistilBERT for extractive question answering (transformers, built from its config: no
    download), taking token ids and returning start and end logits stacked (batch, 2, tokens).
    Needs the `transformers` package (pip install "monet[transformers]")."""

    def __init__(self, **config):
        super().__init__()
        try:
            from transformers import DistilBertConfig, DistilBertForQuestionAnswering
        except ImportError as exc:
            raise ValueError("the distilbert model needs transformers: pip install 'monet[transformers]'") from exc
        self.model = DistilBertForQuestionAnswering(DistilBertConfig(**config))

    def forward(self, ids):
        out = self.model(input_ids=ids)
        return torch.stack((out.start_logits, out.end_logits), dim=1)
