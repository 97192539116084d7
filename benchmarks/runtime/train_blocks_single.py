"""FSDP benchmark workload, single-GPU version: the INPUT of `distify convert`.

A small transformer (``blocks.TinyTransformer``, ``Block`` layers) learning next tokens of
synthetic sequences with AdamW, written the way a single-GPU script is written.
runtime_overhead.py converts it with the CLI in every benchmark run (never edited by hand) and
runs the one converted script under DDP and under FSDP (``FSDP_TRANSFORMER_CLS_TO_WRAP=Block``)
by environment alone; ``train_blocks_torch.py`` is the same loop distributed by hand.

The timing and memory numbers come from ``blocks.Meter``, one JSON line per process.
"""
import argparse

import torch
import torch.nn.functional as F
from blocks import Meter, TinyTransformer, add_arguments, sequences
from torch.utils.data import DataLoader


def main():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = sequences(args.samples, args.vocab, args.length, seed=1)
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, drop_last=True)

    meter = Meter(device, args.warmup)
    meter.before_model()
    model = TinyTransformer(args.vocab, args.length, args.width, args.layers,
                            args.heads).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01,
                                  foreach=True)

    model.train()
    for _ in range(args.epochs):
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad(set_to_none=True)
            logits = model(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
            loss.backward()
            optimizer.step()
            meter.step()
    meter.report("single", model, optimizer, loss)


if __name__ == "__main__":
    main()
