"""distify's FSDP strategy vs hand-written FSDP2, isolated: one small transformer, two ways, ONE job.

Under torchrun, each process holds two copies of ``blocks.TinyTransformer`` built from the same
seed: one sharded by hand (``fully_shard`` on each ``Block``, then on the model, torch's
defaults; the optimizer built after), one prepared by ``distify.prepare(model, optimizer)``
under the runtime's FSDP strategy (the runner sets ``DISTIFY_STRATEGY=fsdp`` and
``FSDP_TRANSFORMER_CLS_TO_WRAP=Block``) and trained with ``distify.backward``. Both train with
AdamW (foreach) on the same fixed batches, with no DataLoader, so only the model, backward and
optimizer paths differ. Blocks of steps of the two alternate, so both see the same machine load.
Rank 0 prints one JSON line: the median wall and process CPU time per step of each, and how many
all-gathers and reduce-scatters each issues per step (counted in two extra untimed steps).

    DISTIFY_STRATEGY=fsdp FSDP_TRANSFORMER_CLS_TO_WRAP=Block \\
        python -m torch.distributed.run --standalone --nproc-per-node 2 micro_fsdp.py
"""
import argparse
import collections
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from blocks import TinyTransformer, add_arguments
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import distify.runtime as distify

COUNTED = ("all_gather_single", "reduce_scatter_single", "all_reduce", "broadcast")


def collectives_per_step(run_step, steps: int = 2) -> dict[str, float]:
    """The torch.distributed collectives ``run_step`` issues per step (FSDP2 calls them through
    the ``torch.distributed`` module, so wrapping its functions counts them)."""
    counts: collections.Counter = collections.Counter()
    originals = {name: getattr(dist, name) for name in COUNTED if hasattr(dist, name)}

    def counting(name, original):
        def call(*args, **kwargs):
            counts[name] += 1
            return original(*args, **kwargs)
        return call

    for name, original in originals.items():
        setattr(dist, name, counting(name, original))
    try:
        for _ in range(steps):
            run_step()
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)
    return {name: counts[name] / steps for name in originals}


def main():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    parser.add_argument("--blocks", type=int, default=10, help="blocks of steps of each")
    parser.add_argument("--block-steps", type=int, default=6)
    args = parser.parse_args()

    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        # distify makes no process group for one process, but fully_shard needs one
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    distify.init()  # the process group, from torchrun's environment
    device = distify.device()
    half = args.mixed_precision == "bf16"

    def build():
        torch.manual_seed(args.seed)
        return TinyTransformer(args.vocab, args.length, args.width, args.layers,
                               args.heads).to(device)

    raw_model = build()
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if half else MixedPrecisionPolicy()
    for block in raw_model.blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(raw_model, mp_policy=policy)
    raw_optimizer = torch.optim.AdamW(raw_model.parameters(), lr=args.lr, foreach=True)

    model = build()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, foreach=True)
    model, optimizer = distify.prepare(model, optimizer)

    g = torch.Generator().manual_seed(100 + distify.rank())
    batches = [torch.randint(0, args.vocab, (args.batch_size, args.length + 1), generator=g)
               .to(device) for _ in range(args.block_steps)]

    def raw_step(tokens):
        raw_optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=half):
            logits = raw_model(tokens[:, :-1])
        F.cross_entropy(logits.float().reshape(-1, args.vocab), tokens[:, 1:].reshape(-1)).backward()
        raw_optimizer.step()

    def distify_step(tokens):
        optimizer.zero_grad(set_to_none=True)
        logits = model(tokens[:, :-1])
        distify.backward(F.cross_entropy(logits.reshape(-1, args.vocab),
                                         tokens[:, 1:].reshape(-1)))
        optimizer.step()

    steps = {"fsdp": raw_step, "distify": distify_step}
    result = {"bench": "micro_fsdp", "blocks": args.blocks, "block_steps": args.block_steps,
              "world_size": distify.world_size()}
    for name, step in steps.items():  # warm-up, and the collectives each issues
        for tokens in batches[:4]:
            step(tokens)
        counted = collectives_per_step(lambda step=step: step(batches[0]))
        result.update({f"{name}_{kind}": count for kind, count in counted.items()})

    samples = {name: ([], []) for name in steps}
    for block in range(args.blocks):
        order = list(steps.items())
        if block % 2:
            order.reverse()
        for name, step in order:
            if device.type == "cuda":
                torch.cuda.synchronize()
            wall, cpu = time.perf_counter(), time.process_time()
            for tokens in batches:
                step(tokens)
            if device.type == "cuda":
                torch.cuda.synchronize()
            samples[name][0].append((time.perf_counter() - wall) / len(batches))
            samples[name][1].append((time.process_time() - cpu) / len(batches))
    for name, (wall, cpu) in samples.items():
        result[f"{name}_wall_ms"] = 1e3 * statistics.median(wall)
        result[f"{name}_cpu_ms"] = 1e3 * statistics.median(cpu)
    for index, kind in enumerate(("wall", "cpu")):  # paired: each block against its neighbour
        pairs = zip(samples["distify"][index], samples["fsdp"][index])
        result[f"ratio_{kind}"] = statistics.median(d / f for d, f in pairs)
    if distify.is_main_process():
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
