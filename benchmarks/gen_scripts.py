"""Generate realistic single-GPU PyTorch training scripts of a chosen length, for benchmarks.

A generated script looks like the large research scripts people actually convert: many model
classes (MLP, CNN, residual and attention blocks), dataset builders, metric helpers, train and
evaluation loops fed by DataLoaders, optimizers and LR schedulers, device selection, prints,
checkpoints with ``torch.save``, a results file, argparse — everything ``distify convert``
rewrites, plus plenty of code it must leave alone (comments, docstrings, type hints, f-strings,
comprehensions, numpy helpers).

The output is deterministic for a given size (no randomness), valid Python, and converts with
status ``converted``.

    python benchmarks/gen_scripts.py 5000 -o benchmarks/.work/train_5000.py
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HEADER = '''\
"""Experiment driver: trains and evaluates a family of small vision and sequence models.

Generated for distify's benchmarks; written in the style of a long single-GPU research script.
"""
import argparse
import json
import math
import os
import time
from collections import defaultdict
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import CosineAnnealingLR, StepLR
from torch.utils.data import DataLoader, Dataset, TensorDataset

# ---------------------------------------------------------------------------------------------
# Global configuration
# ---------------------------------------------------------------------------------------------
DEFAULTS = {
    "batch_size": 32,
    "eval_batch_size": 64,
    "epochs": 2,
    "lr": 3e-4,
    "weight_decay": 0.01,
    "log_every": 10,
    "out_dir": "runs",
}


def seed_everything(seed: int) -> None:
    """Make a run repeatable."""
    torch.manual_seed(seed)
    np.random.seed(seed)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


class AverageMeter:
    """Keeps a running average of a scalar (loss, accuracy, throughput)."""

    def __init__(self, name: str, fmt: str = ":.4f"):
        self.name = name
        self.fmt = fmt
        self.reset()

    def reset(self) -> None:
        self.val = 0.0
        self.avg = 0.0
        self.sum = 0.0
        self.count = 0

    def update(self, val: float, n: int = 1) -> None:
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / max(1, self.count)

    def __str__(self) -> str:
        fmtstr = "{name} {val" + self.fmt + "} ({avg" + self.fmt + "})"
        return fmtstr.format(**self.__dict__)


def write_results(path: str, results: Dict[str, float]) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as handle:
        json.dump(results, handle, indent=2, sort_keys=True)
'''

# Each unit is a self-contained experiment; {i} is its number, {w} a width, {d} a depth.
UNIT_VISION = '''

# =============================================================================================
# Experiment {i}: a small convolutional classifier on synthetic {h}x{h} images
# =============================================================================================
class ConvBlock{i}(nn.Module):
    """Conv -> BatchNorm -> ReLU, optionally followed by max-pooling."""

    def __init__(self, in_ch: int, out_ch: int, pool: bool = True):
        super().__init__()
        self.conv = nn.Conv2d(in_ch, out_ch, kernel_size=3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(out_ch)
        self.pool = nn.MaxPool2d(2) if pool else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(F.relu(self.bn(self.conv(x))))


class ConvNet{i}(nn.Module):
    def __init__(self, in_channels: int = 3, num_classes: int = 10, width: int = {w}):
        super().__init__()
        self.features = nn.Sequential(
            ConvBlock{i}(in_channels, width),
            ConvBlock{i}(width, width * 2),
            ConvBlock{i}(width * 2, width * 4, pool=False),
            nn.AdaptiveAvgPool2d(1),
        )
        self.dropout = nn.Dropout(p=0.1)
        self.classifier = nn.Linear(width * 4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = torch.flatten(x, 1)
        return self.classifier(self.dropout(x))


def make_images_{i}(n: int, seed: int, num_classes: int = 10) -> TensorDataset:
    """Images whose class is written into the mean of one channel: learnable and tiny."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, num_classes, (n,), generator=g)
    images = torch.randn(n, 3, {h}, {h}, generator=g) * 0.5
    images[:, 0] += labels.view(-1, 1, 1).float() / num_classes
    return TensorDataset(images, labels)


def topk_accuracy_{i}(output: torch.Tensor, target: torch.Tensor, topk=(1, 5)) -> List[float]:
    """Precision@k for the specified values of k."""
    with torch.no_grad():
        maxk = min(max(topk), output.size(1))
        batch_size = target.size(0)
        _, pred = output.topk(maxk, 1, True, True)
        pred = pred.t()
        correct = pred.eq(target.view(1, -1).expand_as(pred))
        res = []
        for k in topk:
            correct_k = correct[:min(k, maxk)].reshape(-1).float().sum(0, keepdim=True)
            res.append(correct_k.mul_(100.0 / batch_size).item())
        return res


def train_one_epoch_{i}(model, train_loader, optimizer, scheduler, device, epoch, log_every=10):
    model.train()
    losses = AverageMeter("loss")
    top1 = AverageMeter("acc@1", ":6.2f")
    start = time.time()
    for step, (images, labels) in enumerate(train_loader):
        images, labels = images.to(device), labels.to(device)
        optimizer.zero_grad(set_to_none=True)
        logits = model(images)
        loss = F.cross_entropy(logits, labels, label_smoothing=0.1)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optimizer.step()
        scheduler.step()
        acc1, _ = topk_accuracy_{i}(logits, labels)
        losses.update(loss.item(), images.size(0))
        top1.update(acc1, images.size(0))
        if step % log_every == 0:
            elapsed = time.time() - start
            print(f"[exp {i}] epoch {{epoch}} step {{step}}/{{len(train_loader)}} "
                  f"{{losses}} {{top1}} ({{elapsed:.1f}}s)")
    return losses.avg


def evaluate_{i}(model, val_loader, device):
    model.eval()
    total_loss = 0.0
    correct = 0
    seen = 0
    with torch.no_grad():
        for images, labels in val_loader:
            images, labels = images.to(device), labels.to(device)
            logits = model(images)
            total_loss += F.cross_entropy(logits, labels, reduction="sum").item()
            correct += (logits.argmax(dim=1) == labels).sum().item()
            seen += labels.size(0)
    avg_loss = total_loss / max(1, seen)
    accuracy = correct / max(1, seen)
    print(f"[exp {i}] validation: loss {{avg_loss:.4f}}, accuracy {{accuracy:.3f}} ({{correct}}/{{seen}})")
    return avg_loss, accuracy


def run_experiment_{i}(args) -> Dict[str, float]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train_set = make_images_{i}(args.train_size, seed={i})
    val_set = make_images_{i}(args.val_size, seed={i} + 10_000)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True,
                              num_workers=args.workers, pin_memory=True, drop_last=True)
    val_loader = DataLoader(val_set, batch_size=args.eval_batch_size, shuffle=False,
                            num_workers=args.workers)
    model = ConvNet{i}(num_classes=10, width={w}).to(device)
    print(f"[exp {i}] ConvNet{i}: {{count_parameters(model):,}} parameters")
    optimizer = optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    scheduler = CosineAnnealingLR(optimizer, T_max=args.epochs * len(train_loader))
    best_acc = 0.0
    history = defaultdict(list)
    for epoch in range(args.epochs):
        train_loss = train_one_epoch_{i}(model, train_loader, optimizer, scheduler, device, epoch,
                                         log_every=args.log_every)
        val_loss, val_acc = evaluate_{i}(model, val_loader, device)
        history["train_loss"].append(train_loss)
        history["val_loss"].append(val_loss)
        if val_acc > best_acc:
            best_acc = val_acc
            torch.save({{"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "epoch": epoch, "accuracy": val_acc}},
                       os.path.join(args.out_dir, "convnet_{i}_best.pt"))
    torch.save(model.state_dict(), os.path.join(args.out_dir, "convnet_{i}_last.pt"))
    return {{"exp{i}_best_acc": best_acc, "exp{i}_final_loss": history["val_loss"][-1]}}
'''

UNIT_SEQUENCE = '''

# =============================================================================================
# Experiment {i}: a {d}-layer transformer encoder on synthetic token sequences
# =============================================================================================
class SequenceDataset{i}(Dataset):
    """Random token sequences; the label is the most frequent token modulo the class count."""

    def __init__(self, n: int, seq_len: int = {s}, vocab: int = 97, num_classes: int = 4,
                 seed: int = 0):
        rng = np.random.default_rng(seed)
        self.tokens = torch.from_numpy(rng.integers(0, vocab, size=(n, seq_len))).long()
        counts = np.array([np.bincount(row, minlength=vocab).argmax() for row in
                           self.tokens.numpy()])
        self.labels = torch.from_numpy(counts % num_classes).long()

    def __len__(self) -> int:
        return self.tokens.size(0)

    def __getitem__(self, index: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.tokens[index], self.labels[index]


class PositionalEncoding{i}(nn.Module):
    def __init__(self, dim: int, max_len: int = 512):
        super().__init__()
        position = torch.arange(max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, dim, 2) * (-math.log(10000.0) / dim))
        pe = torch.zeros(max_len, dim)
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.pe[: x.size(1)]


class AttentionBlock{i}(nn.Module):
    """Pre-norm self-attention followed by a GELU feed-forward, both residual."""

    def __init__(self, dim: int, heads: int = 4, mlp_ratio: float = 2.0, dropout: float = 0.1):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(dropout),
                                 nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        h = self.norm1(x)
        attn_out, _ = self.attn(h, h, h, key_padding_mask=mask, need_weights=False)
        x = x + attn_out
        return x + self.mlp(self.norm2(x))


class SequenceClassifier{i}(nn.Module):
    def __init__(self, vocab: int = 97, dim: int = {w}, depth: int = {d}, num_classes: int = 4):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = PositionalEncoding{i}(dim)
        self.blocks = nn.ModuleList([AttentionBlock{i}(dim) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.pos(self.embed(tokens))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(dim=1))


def train_sequences_{i}(model, loader, optimizer, device, epoch, grad_clip=1.0):
    model.train()
    running_loss = 0.0
    for batch_idx, (tokens, labels) in enumerate(loader):
        tokens = tokens.to(device)
        labels = labels.to(device)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(tokens), labels)
        loss.backward()
        if grad_clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        running_loss += loss.item()
        if batch_idx % 20 == 0:
            print("exp {i} | epoch %d | batch %d | loss %.4f" % (epoch, batch_idx, loss.item()))
    return running_loss / max(1, len(loader))


@torch.no_grad()
def evaluate_sequences_{i}(model, loader, device):
    model.eval()
    test_loss = 0.0
    correct = 0
    for tokens, labels in loader:
        tokens, labels = tokens.to(device), labels.to(device)
        output = model(tokens)
        test_loss += F.cross_entropy(output, labels, reduction="sum").item()
        correct += output.argmax(dim=1).eq(labels).sum().item()
    n = len(loader.dataset)
    print(f"exp {i} | eval | loss {{test_loss / n:.4f}} | accuracy {{100.0 * correct / n:.2f}}%")
    return correct / n


def run_experiment_{i}(args) -> Dict[str, float]:
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    train_loader = DataLoader(SequenceDataset{i}(args.train_size, seed={i}),
                              batch_size=args.batch_size, shuffle=True)
    test_loader = DataLoader(SequenceDataset{i}(args.val_size, seed={i} + 1),
                             batch_size=args.eval_batch_size)
    model = SequenceClassifier{i}(dim={w}, depth={d})
    model = model.to(device)
    optimizer = optim.Adam(model.parameters(), lr=args.lr, betas=(0.9, 0.98), eps=1e-9)
    scheduler = StepLR(optimizer, step_size=1, gamma=0.9)
    scores = []
    for epoch in range(1, args.epochs + 1):
        loss = train_sequences_{i}(model, train_loader, optimizer, device, epoch)
        scores.append(evaluate_sequences_{i}(model, test_loader, device))
        scheduler.step()
        print(f"exp {i} | epoch {{epoch}} done | train loss {{loss:.4f}} | lr {{scheduler.get_last_lr()[0]:.2e}}")
    checkpoint = {{"state_dict": model.state_dict(), "scores": scores, "config": vars(args)}}
    torch.save(checkpoint, f"{{args.out_dir}}/sequence_{i}.pt")
    return {{"exp{i}_best_acc": max(scores)}}
'''

UNIT_TABULAR = '''

# =============================================================================================
# Experiment {i}: residual MLP regression on tabular features
# =============================================================================================
FEATURES_{i} = {f}
HIDDEN_{i} = [{w}, {w}, {w2}]


def standardize_{i}(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Zero mean, unit variance per column (numpy, like most tabular pipelines)."""
    mean = x.mean(axis=0, keepdims=True)
    std = x.std(axis=0, keepdims=True)
    return (x - mean) / (std + eps)


def make_tabular_{i}(n: int, seed: int) -> TensorDataset:
    rng = np.random.default_rng(seed)
    x = standardize_{i}(rng.normal(size=(n, FEATURES_{i})).astype(np.float32))
    weights = rng.normal(size=(FEATURES_{i}, 1)).astype(np.float32)
    y = np.tanh(x @ weights) + 0.05 * rng.normal(size=(n, 1)).astype(np.float32)
    return TensorDataset(torch.from_numpy(x), torch.from_numpy(y.astype(np.float32)))


class ResidualMLP{i}(nn.Module):
    """MLP with residual connections where consecutive widths match."""

    def __init__(self, in_features: int = FEATURES_{i}, hidden=None, out_features: int = 1,
                 dropout: float = 0.05):
        super().__init__()
        hidden = hidden or HIDDEN_{i}
        dims = [in_features] + list(hidden)
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.norms = nn.ModuleList(nn.LayerNorm(b) for b in dims[1:])
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(dims[-1], out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer, norm in zip(self.layers, self.norms):
            h = self.dropout(F.silu(norm(layer(x))))
            x = x + h if h.shape == x.shape else h
        return self.out(x)


def fit_{i}(model, loader, optimizer, device, epochs, log_every=25):
    history = []
    for epoch in range(epochs):
        model.train()
        epoch_loss = 0.0
        for step, (features, target) in enumerate(loader):
            features, target = features.to(device), target.to(device)
            prediction = model(features)
            loss = F.mse_loss(prediction, target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            epoch_loss += loss.item() * features.size(0)
            if step % log_every == 0:
                print(f"exp {i}: epoch {{epoch}} step {{step}} mse {{loss.item():.5f}}")
        history.append(epoch_loss / len(loader.dataset))
    return history


def score_{i}(model, loader, device) -> Tuple[float, float]:
    model.eval()
    squared_error = 0.0
    absolute_error = 0.0
    count = 0
    with torch.no_grad():
        for features, target in loader:
            features, target = features.to(device), target.to(device)
            prediction = model(features)
            squared_error += F.mse_loss(prediction, target, reduction="sum").item()
            absolute_error += (prediction - target).abs().sum().item()
            count += target.numel()
    rmse = math.sqrt(squared_error / max(1, count))
    mae = absolute_error / max(1, count)
    print(f"exp {i}: rmse {{rmse:.4f}} mae {{mae:.4f}} over {{count}} targets")
    return rmse, mae


def run_experiment_{i}(args) -> Dict[str, float]:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    loaders = {{
        "train": DataLoader(make_tabular_{i}(args.train_size, {i}), batch_size=args.batch_size,
                            shuffle=True),
        "valid": DataLoader(make_tabular_{i}(args.val_size, {i} + 7), batch_size=args.eval_batch_size),
    }}
    model = ResidualMLP{i}().to(device)
    optimizer = optim.SGD(model.parameters(), lr=args.lr * 10, momentum=0.9, nesterov=True)
    history = fit_{i}(model, loaders["train"], optimizer, device, args.epochs)
    rmse, mae = score_{i}(model, loaders["valid"], device)
    with open(os.path.join(args.out_dir, "tabular_{i}.log"), "a") as log:
        log.write(json.dumps({{"history": history, "rmse": rmse, "mae": mae}}) + "\\n")
    torch.save(model.state_dict(), os.path.join(args.out_dir, "tabular_{i}.pt"))
    return {{"exp{i}_rmse": rmse, "exp{i}_mae": mae}}
'''

UNIT_HELPERS = '''

# ---------------------------------------------------------------------------------------------
# Helpers {i}: augmentation and schedule utilities (no training code)
# ---------------------------------------------------------------------------------------------
def random_flip_{i}(images: torch.Tensor, p: float = 0.5) -> torch.Tensor:
    """Flip a batch of images horizontally with probability ``p`` per image."""
    mask = torch.rand(images.size(0), device=images.device) < p
    flipped = images.flip(-1)
    return torch.where(mask.view(-1, 1, 1, 1), flipped, images)


def mixup_{i}(x: torch.Tensor, y: torch.Tensor, alpha: float = 0.2):
    lam = float(np.random.beta(alpha, alpha)) if alpha > 0 else 1.0
    index = torch.randperm(x.size(0), device=x.device)
    mixed = lam * x + (1 - lam) * x[index]
    return mixed, y, y[index], lam


def warmup_cosine_{i}(step: int, warmup: int = {w}, total: int = 1000) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def summarize_{i}(history: Dict[str, List[float]]) -> str:
    parts = []
    for key, values in sorted(history.items()):
        if values:
            parts.append(f"{{key}}: last {{values[-1]:.4f}}, best {{min(values):.4f}}")
    return "; ".join(parts)
'''

UNITS = (UNIT_VISION, UNIT_SEQUENCE, UNIT_TABULAR)


def _unit(i: int) -> str:
    template = UNITS[i % len(UNITS)]
    w = (16, 32, 48, 64)[i % 4]
    return template.format(i=i, w=w, w2=w * 2, d=1 + i % 3, h=(16, 24, 32)[i % 3],
                           s=(16, 32, 48)[i % 3], f=8 + i % 24)


def _footer(count: int) -> str:
    calls = "\n".join(f"    results.update(run_experiment_{i}(args))" for i in range(count))
    return f'''

# =============================================================================================
# Entry point
# =============================================================================================
def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="Run every experiment in this file")
    parser.add_argument("--batch-size", type=int, default=DEFAULTS["batch_size"])
    parser.add_argument("--eval-batch-size", type=int, default=DEFAULTS["eval_batch_size"])
    parser.add_argument("--epochs", type=int, default=DEFAULTS["epochs"])
    parser.add_argument("--lr", type=float, default=DEFAULTS["lr"])
    parser.add_argument("--weight-decay", type=float, default=DEFAULTS["weight_decay"])
    parser.add_argument("--log-every", type=int, default=DEFAULTS["log_every"])
    parser.add_argument("--train-size", type=int, default=256)
    parser.add_argument("--val-size", type=int, default=96)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", default=DEFAULTS["out_dir"])
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    seed_everything(args.seed)
    os.makedirs(args.out_dir, exist_ok=True)
    results: Dict[str, float] = {{}}
    started = time.time()
{calls}
    print(f"all {count} experiments finished in {{time.time() - started:.1f}}s")
    write_results(os.path.join(args.out_dir, "results.json"), results)


if __name__ == "__main__":
    main()
'''


def generate(lines: int) -> str:
    """A training script of about ``lines`` lines (at least one experiment).

    Whole experiments (about 150 lines each) are added while they fit, then small helper
    sections (about 35 lines, no training code) bring the length close to ``lines``.
    """
    parts: list[str] = []
    experiments = 0
    total = HEADER.count("\n") + _footer(0).count("\n")
    while True:
        unit = _unit(experiments)
        size = unit.count("\n") + 1  # + its call in main()
        if experiments and total + size > lines:
            break
        parts.append(unit)
        experiments += 1
        total += size
    helper = 0
    while total + UNIT_HELPERS.count("\n") // 2 < lines:
        text = UNIT_HELPERS.format(i=helper, w=10 * (helper + 1))
        parts.append(text)
        helper += 1
        total += text.count("\n")
    return HEADER + "".join(parts) + _footer(experiments)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lines", type=int, help="approximate number of lines")
    parser.add_argument("-o", "--output", type=Path, help="file to write (default: stdout)")
    args = parser.parse_args(argv)
    text = generate(args.lines)
    compile(text, "<generated>", "exec")
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text, encoding="utf-8")
        print(f"{args.output}: {text.count(chr(10))} lines", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
