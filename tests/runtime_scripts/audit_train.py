"""A converted training script that, like many real ones, prints and writes from places the
conversion did not guard (``python audit_train.py [--fail]``, under ``distify launch``):

- a ``sys.stdout.write`` progress line and a helper module's ``print`` on every rank;
- a per-rank ``open(..., "w")``, a ``torch.save`` to a path (twice: reported once), an
  ``np.save`` and a helper's write on every rank;
- writes where they are legitimate: the temporary folder, ``HF_HOME``, the launch's log
  folder, ``/dev/null``, ``distify.save``/``distify.open``;
- ``--fail``: rank 1 raises at the end.

Every rank prints whether the write check is installed in it (``audit <rank> <True|False>``).
"""

import os
import sys
import tempfile

import audit_helper
import torch
from torch import nn

import distify.runtime as distify
from distify.runtime import _audit

model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = distify.prepare(model, optimizer)
rank = distify.rank()
os.makedirs("out", exist_ok=True)

for step in range(3):
    loss = model(torch.full((2, 4), float(rank + step))).pow(2).mean()
    optimizer.zero_grad()
    distify.backward(loss)
    optimizer.step()
    sys.stdout.write(f"\rstep {step + 1}/3 rank {rank}")
    sys.stdout.flush()
    torch.save(model.state_dict(), "out/last.pt")  # torch.save
sys.stdout.write("\n")
audit_helper.log(f"epoch done on rank {rank}")

with open(f"out/metrics_rank{rank}.txt", "w") as f:  # per-rank open
    f.write(f"{loss.item()}\n")
try:
    import numpy as np
except ImportError:
    pass
else:
    np.save("out/weights.npy", model.weight.detach().numpy())  # np.save
audit_helper.write_summary("out/summary.txt", "done\n")

with open(os.path.join(tempfile.gettempdir(), f"scratch_{rank}.txt"), "w") as f:
    f.write("x")
hf_home = os.environ.get("HF_HOME", tempfile.gettempdir())
os.makedirs(os.path.join(hf_home, "hub"), exist_ok=True)
with open(os.path.join(hf_home, "hub", f"model_{rank}.bin"), "wb") as f:
    f.write(b"x")
log_dir = os.environ.get("DISTIFY_LOG_DIR", tempfile.gettempdir())
with open(os.path.join(log_dir, f"extra_{rank}.txt"), "w") as f:
    f.write("x")
with open(os.devnull, "w") as f:
    f.write("x")
distify.save(model.state_dict(), "out/model.pt")
with distify.open("out/config.json", "w") as f:
    f.write("{}")

print(f"audit {rank} {_audit._watch is not None}")
if "--fail" in sys.argv and rank == 1:
    raise ValueError("boom on rank 1")
