"""Models built from torch.nn as people write them, for the push/pull
round trips: a ResNet-style CNN, a GPT-2-style decoder with its lm_head
tied to the token embedding, a BERT-style encoder (TransformerEncoder-
Layers in a ModuleList), an LSTM sequence-to-sequence model and a model
around nn.Transformer. Each has a forward, so a pulled copy can be
checked against the original where its classes are torch's own."""

import math

import torch
from torch import nn
from torch.nn import functional as F


# ------------------------------------------------------------- ResNet ----
class BasicBlock(nn.Module):
    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, stride, bias=False),
                nn.BatchNorm2d(planes))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, widths=(16, 32, 64), blocks=2, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, widths[0], 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.inplanes = widths[0]
        # torchvision's way: each stage built right before it is assigned.
        self.layer1 = self._make_layer(widths[0], blocks, 1)
        self.layer2 = self._make_layer(widths[1], blocks, 2)
        self.layer3 = self._make_layer(widths[2], blocks, 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(widths[-1], classes)

    def _make_layer(self, width, blocks, stride):
        stage = [BasicBlock(self.inplanes, width, stride)]
        stage += [BasicBlock(width, width) for _ in range(blocks - 1)]
        self.inplanes = width
        return nn.Sequential(*stage)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# -------------------------------------------------------------- GPT-2 ----
class CausalSelfAttention(nn.Module):
    def __init__(self, d, heads, ctx):
        super().__init__()
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.attn_dropout = nn.Dropout(0.1)
        self.resid_dropout = nn.Dropout(0.1)
        self.register_buffer("bias", torch.tril(torch.ones(
            ctx, ctx, dtype=torch.bool)).view(1, 1, ctx, ctx),
            persistent=False)
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        att = att.masked_fill(~self.bias[:, :, :t, :t], float("-inf"))
        att = self.attn_dropout(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, d)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.c_fc = nn.Linear(d, 4 * d)
        self.act = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * d, d)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x):
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, d, heads, ctx):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, heads, ctx)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = MLP(d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab=512, ctx=64, d=64, heads=4, layers=2):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(ctx, d)
        self.drop = nn.Dropout(0.1)
        self.h = nn.ModuleList([Block(d, heads, ctx) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as GPT-2 does

    def forward(self, idx):
        pos = torch.arange(idx.shape[1])
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


# --------------------------------------------------------------- BERT ----
class Embeddings(nn.Module):
    def __init__(self, vocab, d, ctx):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, d, padding_idx=0)
        self.position_embeddings = nn.Embedding(ctx, d)
        self.token_type_embeddings = nn.Embedding(2, d)
        self.LayerNorm = nn.LayerNorm(d, eps=1e-12)
        self.dropout = nn.Dropout(0.1)
        self.register_buffer("position_ids", torch.arange(ctx).expand(1, -1),
                             persistent=False)

    def forward(self, ids):
        pos = self.position_ids[:, :ids.shape[1]]
        x = self.word_embeddings(ids) + self.position_embeddings(pos) + \
            self.token_type_embeddings(torch.zeros_like(ids))
        return self.dropout(self.LayerNorm(x))


class Pooler(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.dense = nn.Linear(d, d)
        self.activation = nn.Tanh()

    def forward(self, x):
        return self.activation(self.dense(x[:, 0]))


class Bert(nn.Module):
    def __init__(self, vocab=512, d=64, heads=4, ff=128, ctx=64, layers=2):
        super().__init__()
        self.embeddings = Embeddings(vocab, d, ctx)
        self.layers = nn.ModuleList([
            nn.TransformerEncoderLayer(d, heads, ff, dropout=0.1,
                                       activation="gelu",
                                       layer_norm_eps=1e-12,
                                       batch_first=True)
            for _ in range(layers)])
        self.pooler = Pooler(d)

    def forward(self, ids):
        x = self.embeddings(ids)
        for layer in self.layers:
            x = layer(x)
        return self.pooler(x)


# ------------------------------------------------------------ Seq2Seq ----
class Seq2Seq(nn.Module):
    """An encoder LSTM whose final (h, c) starts a decoder LSTM, and a
    Linear over the decoder's outputs."""

    def __init__(self, vocab=40, d=16, hidden=32, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.encoder = nn.LSTM(d, hidden, layers, batch_first=True,
                               dropout=0.1)
        self.decoder = nn.LSTM(d, hidden, layers, batch_first=True,
                               dropout=0.1)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, src, tgt):
        _, state = self.encoder(self.embed(src))
        y, _ = self.decoder(self.embed(tgt), state)
        return self.out(y)


# -------------------------------------------------------- Transformer ----
class Translator(nn.Module):
    """nn.Transformer between token embeddings and a vocabulary head."""

    def __init__(self, vocab=50, d=32, heads=4):
        super().__init__()
        self.src_embed = nn.Embedding(vocab, d)
        self.tgt_embed = nn.Embedding(vocab, d)
        self.transformer = nn.Transformer(d, heads, 2, 2, 64, dropout=0.1,
                                          batch_first=True)
        self.head = nn.Linear(d, vocab)

    def forward(self, src, tgt):
        mask = self.transformer.generate_square_subsequent_mask(tgt.shape[1])
        y = self.transformer(self.src_embed(src), self.tgt_embed(tgt),
                             tgt_mask=mask)
        return self.head(y)


MODELS = {"resnet": ResNet, "gpt2": GPT, "bert": Bert, "seq2seq": Seq2Seq}


def randomize(model, seed):
    """Values no initializer would produce, running stats and integer
    buffers included, so a round trip that dropped anything shows."""
    g = torch.Generator().manual_seed(seed)
    seen = set()
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            if id(t) in seen or t.dtype == torch.bool:
                continue
            seen.add(id(t))
            if t.dtype.is_floating_point:
                t.copy_(torch.randn(t.shape, generator=g))
            else:
                t.copy_(torch.randint(0, 1000, t.shape, generator=g))
    return model
