"""Offline stand-in for wandb: records calls in memory, never touches the network or disk."""
from __future__ import annotations

config: dict = {}
run = None
calls: list = []


def init(*args, **kwargs):
    calls.append(("init", args, kwargs))
    return None


def log(*args, **kwargs):
    calls.append(("log", args, kwargs))


def watch(*args, **kwargs):
    calls.append(("watch", args, kwargs))


def finish(*args, **kwargs):
    calls.append(("finish", args, kwargs))
