"""Checks of the runtime under a launcher (torchrun, 2 processes): metrics, one writer, the model.

Every rank appends JSON lines ``{"check": ..., "rank": ..., ...}`` to ``OUT/results-rankN.jsonl``
(its own file: lines printed by two processes can interleave); the test asserts on them. The
main process also prints "hello from rank N" through distify.print.
"""

import atexit
import copy
import hashlib
import io
import json
import os
import sys

import torch
from torch import nn
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    SequentialSampler,
    TensorDataset,
    random_split,
)


def report_threads_at_exit():
    """Registered before distify's own exit handler, so it runs after the group is left."""
    threads = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                threads.append(comm.read().strip())
        except OSError:  # the thread ended while we looked
            pass
    report("threads_at_exit", names=sorted(threads))


if os.path.isdir("/proc/self/task"):
    atexit.register(report_threads_at_exit)

import distify.runtime as distify  # noqa: E402

OUT = sys.argv[1]
RANK = distify.rank()


def report(check, **values):
    with open(os.path.join(OUT, f"results-rank{RANK}.jsonl"), "a") as results:
        results.write(json.dumps({"check": check, "rank": RANK, **values}) + "\n")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x)

    def embed(self, x):
        return self.fc(x).relu()


class HasModuleChild(nn.Module):
    def __init__(self):
        super().__init__()
        self.module = nn.Linear(4, 4)

    def forward(self, x):
        return self.module(x)


torch.manual_seed(0)
samples = 251
xs, ys = torch.randn(samples, 4), torch.randint(0, 3, (samples,))
dataset = TensorDataset(xs, ys, torch.arange(samples))
net = Net()
reference_keys = list(net.state_dict())
optimizer = torch.optim.SGD(net.parameters(), lr=0.5)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
model, optimizer, scheduler = distify.prepare(net, optimizer, scheduler)
with torch.no_grad():
    reference_correct = int((model(xs).argmax(1) == ys).sum())


def evaluate(loader, train_mode):
    """An evaluation loop as a user writes it; returns what the test compares."""
    model.train(train_mode)
    correct = seen = batches = 0
    gathered_ids = []
    with torch.set_grad_enabled(train_mode):
        for x, y, ids in loader:
            pred = model(x).argmax(1)
            correct += int((pred == y).sum())
            seen += y.size(0)
            batches += 1
            gathered_ids += distify.gather_for_metrics(ids).tolist()
    return {"correct": distify.reduce(correct), "seen": distify.reduce(seen),
            "ids": sorted(gathered_ids), "batches": batches, "len": len(loader)}


# EVAL mode (no shuffle, eval, no_grad): exact disjoint shards, 126 + 125 samples. With 25 per
# batch rank 1 would have one batch fewer; the split keeps per-batch gathers in step.
eval_loader = distify.prepare(DataLoader(dataset, batch_size=25))
report("eval", reference=reference_correct, **evaluate(eval_loader, train_mode=False))
# A shuffled loader evaluated with the model in eval mode: exact shards, nothing repeated.
shuffled = distify.prepare(DataLoader(dataset, batch_size=25, shuffle=True))
report("eval_shuffled", **evaluate(shuffled, train_mode=False))
# Worker processes load the batches of this rank's shard (the sampler runs in the main process).
workers = distify.prepare(DataLoader(dataset, batch_size=25, shuffle=True, num_workers=2))
report("eval_workers", reference=reference_correct, **evaluate(workers, train_mode=False))
# TRAIN mode because the model trains with gradients on.
report("train_mode_training", **evaluate(eval_loader, train_mode=True))
# A custom batch_sampler: whole batches go round-robin.
custom = distify.prepare(DataLoader(dataset, batch_sampler=BatchSampler(
    SequentialSampler(dataset), batch_size=20, drop_last=False)))
report("batch_sampler", **evaluate(custom, train_mode=False))

# DDP averages gradients: ranks feed different data, weights stay equal; the scheduler steps once.
model.train()
for _ in range(3):
    optimizer.zero_grad()
    x = torch.randn(8, 4) * (RANK + 1)
    distify.backward(model(x).square().mean())
    optimizer.step()
    scheduler.step()
weights = distify.gather(model.fc.weight.detach().flatten()[None])
report("ddp", weights_equal=bool(torch.equal(weights[0], weights[1])),
       last_epoch=scheduler.last_epoch, lr=scheduler.get_last_lr()[0],
       step_was_skipped=optimizer.step_was_skipped)

# Gradient accumulation: no averaging under sync_gradients(False), averaging again after True.
def local_grads(sync):
    distify.sync_gradients(sync)
    distify.backward(model(torch.randn(8, 4) * (RANK + 1)).square().mean())
    return distify.gather(model.fc.weight.grad.flatten()[None].clone())


optimizer.zero_grad()
unsynced, synced = local_grads(False), local_grads(True)
optimizer.zero_grad()
report("accumulation", unsynced_differ=not torch.equal(unsynced[0], unsynced[1]),
       synced_equal=torch.equal(synced[0], synced[1]))

# The prepared model is still the user's model.
buffer = io.BytesIO()
torch.save(model, buffer)
buffer.seek(0)
loaded = torch.load(buffer, weights_only=False)
clone = copy.deepcopy(model)
child = distify.prepare(HasModuleChild())
report("model", isinstance=isinstance(model, Net), type_name=type(model).__name__,
       fc_out=model.fc.out_features, embed_shape=list(model.embed(torch.randn(2, 4)).shape),
       module_is_model=model.module is model, unwrap_is_model=distify.unwrap(model) is model,
       keys_unchanged=list(model.state_dict()) == reference_keys,
       pickled_class_is_original=type(loaded) is Net and type(clone) is Net,
       pickled_private_state=[k for k in vars(loaded) if k.startswith("_distify")],
       pickled_equal=all(torch.equal(a, b) for a, b in
                         zip(loaded.state_dict().values(), model.state_dict().values())),
       own_module_child=child.module is child._modules["module"],
       prepare_twice=distify.prepare(model) is model and
       distify.prepare(eval_loader) is eval_loader)

# Collectives on Python numbers and uneven tensors.
report("collectives", sum_int=distify.reduce(RANK + 1), max_int=distify.reduce(RANK, "max"),
       mean_float=distify.reduce(float(RANK), "mean"), sum_type=type(distify.reduce(3)).__name__,
       tensor_sum=distify.reduce(torch.tensor([RANK, 1])).tolist(),
       uneven=distify.gather(torch.full((RANK + 2, 2), RANK)).tolist(),
       objects=distify.gather([f"r{RANK}"] * (RANK + 1)),
       broadcast=distify.broadcast_object(f"run-{RANK}"))
try:
    import numpy
except ImportError:  # torch's CPU wheel does not need it
    numpy = None
if numpy is not None:
    mean = distify.reduce(numpy.float32(RANK), "mean")
    total = distify.reduce(numpy.int64(RANK + 1))
    report("numpy numbers", mean=float(mean), mean_type=type(mean).__name__,
           total=int(total), total_type=type(total).__name__)

# One writer: only rank 0 saves and prints; main_process_first runs rank 0's body first.
distify.save(model.state_dict(), os.path.join(OUT, f"from_rank{RANK}.pt"))
distify.print(f"hello from rank {RANK}")
marker = os.path.join(OUT, "downloaded")
with distify.main_process_first():
    saw_marker = os.path.exists(marker)
    if distify.is_main_process():
        open(marker, "w").close()
distify.wait_for_everyone()
report("writer", saw_marker=saw_marker, world_size=distify.world_size(),
       files=sorted(name for name in os.listdir(OUT) if name.endswith(".pt")))

# A checkpoint saved and then loaded in the same run: load waits for the main process's write
# (rank 0 is made slow on purpose, so rank 1 would otherwise find no file).
import time  # noqa: E402

checkpoint = os.path.join(OUT, "resume.pt")
if RANK == 0:
    time.sleep(1.0)
distify.save({"step": 7, "weight": model.fc.weight.detach()}, checkpoint)
resumed = distify.load(checkpoint)
# The Accelerate habit: a save on the main process only, the user's own barrier, then a load
# everywhere. Nothing in save or load may wait for the other ranks (a barrier there would be
# met by rank 0 alone); the reduce after it is the next collective on both ranks.
guarded = os.path.join(OUT, "guarded.pt")
if distify.is_main_process():
    distify.save({"step": 8}, guarded)
distify.wait_for_everyone()
guarded_step = distify.load(guarded)["step"]
ranks_after_guarded = distify.reduce(1)
# Symmetric saves with rank 1 slow: rank 0 writes and reads back without waiting for rank 1.
late = os.path.join(OUT, "rank1-reached-save")
if RANK == 1:
    time.sleep(2.0)
    open(late, "w").close()
distify.save({"step": 9}, os.path.join(OUT, "eager.pt"))
eager_step = distify.load(os.path.join(OUT, "eager.pt"))["step"]
rank0_waited_for_rank1 = os.path.exists(late) if RANK == 0 else None
distify.wait_for_everyone()
report("main_process_saves", guarded_step=guarded_step, ranks_after_guarded=ranks_after_guarded,
       eager_step=eager_step, rank0_waited_for_rank1=rank0_waited_for_rank1)
# Trackers built through on_main_process exist on rank 0 only; elsewhere every use is a no-op.
tracker = distify.on_main_process(dict)(runs=1)
report("resume_and_trackers", step=resumed["step"],
       weight_equal=torch.equal(resumed["weight"], model.fc.weight.detach()),
       tracker_real=isinstance(tracker, dict), tracker_truthy=bool(tracker),
       tracker_chain=tracker.add_scalar("loss", 1.0) is tracker if not tracker else None)

# Draws every rank must agree on. The ranks are seeded differently on purpose: the shared
# generator still splits alike everywhere, and the main process draws exactly what its own
# default generator would have drawn without it.
torch.manual_seed(100 + RANK)
before = torch.get_rng_state()
shared = random_split(range(20), [15, 5], generator=distify.shared_generator())
after_shared = torch.get_rng_state()
torch.set_rng_state(before)
plain = random_split(range(20), [15, 5])
report("shared_generator", train=list(shared[0].indices), val=list(shared[1].indices),
       same_as_plain=[list(s.indices) for s in shared] == [list(p.indices) for p in plain],
       same_state_after=torch.equal(after_shared, torch.get_rng_state()),
       state_after=hashlib.sha256(bytes(after_shared.tolist())).hexdigest())

# A data helper that downloads, then splits, called inside main_process_first: the main process
# runs it while the others wait, so the shared generator must not need them at that moment.
with distify.main_process_first():
    inside = random_split(range(12), [9, 3], generator=distify.shared_generator())
report("shared_generator_first", train=list(inside[0].indices))
