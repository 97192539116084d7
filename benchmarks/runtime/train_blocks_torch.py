"""FSDP benchmark workload, distributed by hand: raw torch.distributed with DDP or FSDP2.

The same model, data, optimizer and loop as train_blocks_single.py, distributed the way a careful
engineer does it without a library: process group from torchrun's environment, a
DistributedSampler, and either

- ``--strategy ddp``: ``DistributedDataParallel``; bf16 through autocast;
- ``--strategy fsdp``: FSDP2, ``fully_shard`` on each ``Block`` and then on the whole model
  (parameters resharded after forward, FSDP's default), the optimizer built after sharding, from
  the sharded parameters; bf16 through ``MixedPrecisionPolicy(param_dtype=bf16,
  reduce_dtype=float32)`` plus autocast, which is what distify's FSDP strategy does (so both
  compute the same thing and the comparison is of the runtime, not of a precision choice).

Run with ``python -m torch.distributed.run --standalone --nproc-per-node N``.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from blocks import Meter, TinyTransformer, add_arguments, sequences
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def shard(model, use_bf16):
    """FSDP2: each Block its own unit (its weights gathered for its forward and backward only),
    then the rest of the model."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if use_bf16 else MixedPrecisionPolicy()
    for block in model.blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", choices=["ddp", "fsdp"], required=True)
    add_arguments(parser)
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    torch.manual_seed(args.seed)
    data = sequences(args.samples, args.vocab, args.length, seed=1)
    sampler = DistributedSampler(data, shuffle=True, seed=args.seed, drop_last=True)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    use_bf16 = args.mixed_precision == "bf16"

    meter = Meter(device, args.warmup)
    meter.before_model()
    model = TinyTransformer(args.vocab, args.length, args.width, args.layers,
                            args.heads).to(device)
    if args.strategy == "fsdp":
        model = shard(model, use_bf16)
    else:
        model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01,
                                  foreach=True)

    model.train()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
                logits = model(x)
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))
            loss.backward()
            optimizer.step()
            meter.step()
    meter.report(args.strategy, model, optimizer, loss)
    dist.barrier()  # leave together: a Gloo peer that closes first can make the other abort
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
