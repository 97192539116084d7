"""A correct job that uses every collective of the runtime: it must run without an error or a
warning, under debug mode (``DISTIFY_DEBUG=1``) too, and end with bit-identical weights.

Gradient accumulation with ``sync_gradients``, two forwards of the prepared model per backward,
a frozen teacher (nothing to train, so not under DDP) and a split drawn from the shared
generator inside ``main_process_first``. The main process prints ``RESULT {...}``.
"""

import json

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, random_split

import distify.runtime as distify


class Student(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 8)
        self.out = nn.Linear(8, 1)

    def forward(self, x):
        return self.out(self.fc(x).relu())


torch.manual_seed(0)
with distify.main_process_first():  # a dataset helper that "downloads", then splits
    data = TensorDataset(torch.randn(96, 4), torch.randn(96, 1))
    train, val = random_split(data, [64, 32], generator=distify.shared_generator())
student = Student()
teacher = nn.Linear(4, 1).requires_grad_(False)
optimizer = torch.optim.SGD(student.parameters(), lr=0.05)
student, teacher, optimizer = distify.prepare(student, teacher, optimizer)
scheduler = distify.prepare(torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9))
loader = distify.prepare(DataLoader(train, batch_size=8, shuffle=True))
val_loader = distify.prepare(DataLoader(val, batch_size=8))

accumulate, steps = 2, 0
for _ in range(2):
    student.train()
    for i, (x, y) in enumerate(loader):
        distify.sync_gradients((i + 1) % accumulate == 0)
        distill = (student(x * 0.5) - teacher(x)).square().mean()
        loss = ((student(x) - y).square().mean() + distill) / accumulate
        distify.backward(loss)
        if (i + 1) % accumulate == 0:
            distify.clip_grad_norm_(student.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            steps += 1
    student.eval()
    total, seen, gathered = 0.0, 0, 0
    with torch.no_grad():
        for x, y in val_loader:
            total += (student(x) - y).square().sum().item()
            seen += len(y)
            gathered += len(distify.gather_for_metrics(student(x)))
    total, seen = distify.reduce(total), distify.reduce(seen)
    distify.wait_for_everyone()

weights = distify.gather(torch.cat([p.detach().flatten() for p in student.parameters()])[None])
distify.print("RESULT " + json.dumps({
    "steps": steps, "seen": seen, "gathered": gathered, "run": distify.broadcast_object("r0"),
    "same_weights": all(torch.equal(w, weights[0]) for w in weights)}))
