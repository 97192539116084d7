"""Saves followed by loads on every rank (``python faults_files.py MODE``); each rank prints one
JSON line ``{"rank": r, "stale": n, "missing": n, "reads": n}`` (reads of a previous file, or of
none, among its reads), and the main process "finished" at the end.

Every round the main process takes a moment (a state dict that takes time to gather), saves
``{"round": i}`` to ``c.pt``, and every rank loads it back:

- ``abspath``: every rank calls ``distify.save(obj, "c.pt")``, then loads
  ``os.path.abspath("c.pt")``;
- ``symlink``: the same, loading ``link.pt``, a symbolic link to ``c.pt``;
- ``fileobj``: the same, loading through ``open(os.path.abspath("c.pt"), "rb")``;
- ``main_only``: ``if distify.is_main_process(): distify.save(obj, "c.pt")``, then
  ``distify.load("c.pt")`` on every rank;
- ``main_only_open``: the same with ``distify.open(path, "w")`` and ``distify.open(path)``;
- ``dataset``: ``main_only``, with a prepared DataLoader whose Dataset loads a file per sample
  (``distify.load`` inside ``__getitem__``: different files on each rank, never waited for);
  at the end rank 1 alone loads ``c.pt`` once more (the main process never does: it must not
  wait for ever).
"""

import json
import os
import sys
import time

import torch

import distify.runtime as distify

mode = sys.argv[1]
ROUNDS = 15
rank = distify.rank()
if distify.is_main_process():
    torch.save({"round": -1}, "c.pt")
    os.symlink("c.pt", "link.pt")
    with open("c.json", "w") as f:
        json.dump({"round": -1}, f)
distify.wait_for_everyone()


class Samples(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, index):
        return distify.load(f"sample_{index}.pt")["x"]


loader = None
if mode == "dataset":
    if distify.is_main_process():
        for index in range(8):
            torch.save({"x": torch.full((2,), float(index))}, f"sample_{index}.pt")
    distify.wait_for_everyone()
    loader = distify.prepare(torch.utils.data.DataLoader(Samples(), batch_size=2))

stale = missing = 0
for round_ in range(ROUNDS):
    if loader is not None:
        for _batch in loader:
            pass
    if rank == 0:
        time.sleep(0.05)
    state = {"round": round_, "blob": torch.zeros(50_000)}
    if mode in ("abspath", "symlink", "fileobj"):
        distify.save(state, "c.pt")
    elif mode in ("main_only", "dataset"):
        if distify.is_main_process():
            distify.save(state, "c.pt")
    elif mode == "main_only_open" and distify.is_main_process():
        with distify.open("c.json", "w") as f:
            json.dump({"round": round_}, f)
    try:
        if mode == "abspath":
            got = distify.load(os.path.abspath("c.pt"))["round"]
        elif mode == "symlink":
            got = distify.load("link.pt")["round"]
        elif mode == "fileobj":
            with open(os.path.abspath("c.pt"), "rb") as f:
                got = distify.load(f)["round"]
        elif mode == "main_only_open":
            with distify.open(os.path.abspath("c.json")) as f:
                got = json.load(f)["round"]
        else:
            got = distify.load("c.pt")["round"]
    except (FileNotFoundError, EOFError, RuntimeError):
        missing += 1
        continue
    stale += got != round_
if mode == "dataset" and rank == 1:
    distify.load("c.pt")
print(json.dumps({"rank": rank, "stale": stale, "missing": missing, "reads": ROUNDS}),
      flush=True)
distify.print("finished", flush=True)
