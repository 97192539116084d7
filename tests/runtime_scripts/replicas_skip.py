"""Loss-spike skipping decided per process: the replicas drift apart in the first epoch.

Written the way such scripts are: the update is skipped when the batch's loss is far above the
running average. Each rank looks at its own batch's loss, so the ranks skip different steps
and their weights differ from then on. The runtime must stop the job at the end of the first
epoch with "replicas diverged" (``DISTIFY_REPLICA_CHECK=0``: it runs to the end). Rank 0 prints
"epoch N done" after each epoch and "finished" at the end.
"""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import distify.runtime as distify

torch.manual_seed(0)
inputs = torch.randn(256, 8)
targets = inputs.sum(dim=1, keepdim=True) + 0.1 * torch.randn(256, 1)
targets[::7] += 20.0  # outliers: some batches have a loss spike
loader = DataLoader(TensorDataset(inputs, targets), batch_size=16, shuffle=True)

model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
model, optimizer, loader = distify.prepare(model, optimizer, loader)

average = None
for epoch in range(3):
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        distify.backward(loss)
        if average is not None and loss.item() > 3 * average:
            continue  # a loss spike: skip this update
        average = loss.item() if average is None else 0.9 * average + 0.1 * loss.item()
        optimizer.step()
    distify.print(f"epoch {epoch} done")
distify.print("finished")
