"""A stand-in for tensorboard_logger: ``Logger(logdir)`` writes an event file there, as the
real one does, so writes on every rank are visible."""
from __future__ import annotations

import os
import socket
import time


class Logger:
    def __init__(self, logdir, flush_secs=2, **kwargs):
        os.makedirs(logdir, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}"
        self._path = os.path.join(logdir, name)
        open(self._path, "a").close()

    def log_value(self, name, value, step=None):
        with open(self._path, "a") as f:
            f.write(f"{name} {value} {step}\n")


def configure(logdir, flush_secs=2):
    global _default
    _default = Logger(logdir)


def log_value(name, value, step=None):
    _default.log_value(name, value, step)
