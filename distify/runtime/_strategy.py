"""The strategy seam: how prepared models are spread over the processes.

Everything a converted script calls (``prepare``, ``backward``, ``save``, ``clip_grad_norm_``,
``sync_gradients``, ...) is the same whatever the strategy; what differs goes through one
:class:`Strategy` object, chosen by the launch config (``distributed_type``), the environment
or ``distify.init(strategy=...)``:

- ``ddp`` (``_ddp``): every process holds the whole model; gradients are averaged by
  DistributedDataParallel. The default.
- ``fsdp`` (``_fsdp``): parameters, gradients and optimizer state are sharded over the
  processes with FSDP2's ``fully_shard``, for models that do not fit one GPU.

A strategy decides how a model is distributed (:meth:`Strategy.distribute`, which returns a
:class:`DistributedModel` that runs the training forwards, says which gradients it
synchronises and what ``state_dict`` means for it), how optimizers and the fp16 loss scaler fit
it, how gradients are clipped, and over which processes the runtime's own collectives run
(:meth:`Strategy.all_reduce`, :meth:`~Strategy.all_gather`, :meth:`~Strategy.broadcast`,
:meth:`~Strategy.barrier`: the metrics of ``reduce``/``gather``, the loaders' end-of-data
agreement, ``broadcast_object``, ``wait_for_everyone``, the debug checks). DDP and FSDP2 both
run them over every process of the job; a strategy that splits the job into groups (hybrid
sharding, pipeline stages) overrides them. Adding a strategy is one module with a subclass decorated
by :func:`register`, named in ``_BUILT_IN`` (imported on first use). In a single process no strategy
distributes anything: a model is only moved to the device, so the script computes exactly what
the original does.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn

from . import _progress, _state
from ._errors import DistifyError

_TRUE = ("1", "true", "yes", "on")


class DistributedModel:
    """One prepared model as its strategy distributed it.

    Attributes:
        replicated: every process holds the same full weights (debug mode compares them).
    """

    replicated: ClassVar[bool] = True

    def forward(self, args: tuple, kwargs: dict, sync: bool) -> Any:
        """Run a training forward; ``sync``: whether its backward synchronises gradients
        (``False`` on the micro-steps of gradient accumulation)."""
        raise NotImplementedError

    def synced_parameters(self) -> tuple[tuple[str, nn.Parameter], ...]:
        """The parameters whose gradients the strategy synchronises, by name."""
        raise NotImplementedError

    def state_dict(self, own: dict) -> dict:
        """What the prepared model's ``state_dict()`` gives the script, from the module's own
        (the same keys as the user's module; DDP: ``own`` itself)."""
        return own

    def load_state_dict(self, state_dict: Any) -> Any:
        """What the prepared model's ``load_state_dict`` hands to the module's own."""
        return state_dict

    def after_move(self) -> None:
        """After the prepared model was moved or cast (``.to()``, ``.cpu()``, ``.half()``...):
        keep synchronising its gradients, or make its next training forward refuse to run."""

    def release(self) -> None:
        """Let go of what holds the process group (at a normal exit)."""


class Strategy:
    """How models are distributed (see the module docstring). One instance per process.

    Args:
        settings: the runtime's settings (``settings.strategy_options`` holds the strategy's
            own, as :meth:`options_from_environment` read them).
    """

    name: ClassVar[str] = ""

    def __init__(self, settings: _state.Settings) -> None:
        self.settings = settings

    @classmethod
    def options_from_environment(cls) -> Any:
        """The strategy's own settings, read from the environment when the runtime starts.

        Raises:
            DistifyError: a setting is invalid (the message names its variable).
        """
        return None

    def distribute(self, model: nn.Module) -> DistributedModel | None:
        """Set ``model`` (already on the device) up for training across the processes.

        Called with more than one process only. Returns None for a model with nothing to train.
        """
        raise NotImplementedError

    def setup_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Make a prepared optimizer fit the distributed models (e.g. sharded parameters)."""

    def grad_scaler(self) -> torch.amp.GradScaler:
        """The fp16 loss scaler: one per process, made on first use."""
        return torch.amp.GradScaler(self.settings.device.type)

    def clip_grad_norm_(self, params: list[torch.Tensor], max_norm: float, norm_type: float,
                        **kwargs: Any) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_`` over gradients that are already unscaled."""
        return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type, **kwargs)

    def describe(self) -> str:
        """One line for messages: the strategy and its main settings."""
        return self.name

    # Checkpoints (``save_state``/``load_state``): what the strategy's models need.

    def sharded_checkpoints(self) -> bool:
        """Each process saves and loads its own shards (torch.distributed.checkpoint), instead
        of the main process writing whole state dicts."""
        return False

    def model_state_from_main(self) -> bool:
        """Loading a whole model state dict, the main process reads it and the strategy hands
        it to the others (so only the main process needs the file's contents)."""
        return False

    # The runtime's collectives: every process that trains on its own data takes part.

    def all_reduce(self, tensor: torch.Tensor, op: dist.ReduceOp.RedOpType) -> None:
        """Combine ``tensor`` in place over the processes (``dist.ReduceOp.SUM``, ...)."""
        with _progress.waiting("all_reduce"):
            dist.all_reduce(tensor, op=op)

    def all_gather(self, parts: list[torch.Tensor], tensor: torch.Tensor) -> None:
        """Fill ``parts`` (one tensor like ``tensor`` per process, in rank order) with every
        process's ``tensor``."""
        with _progress.waiting("all_gather"):
            dist.all_gather(parts, tensor)

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        """Overwrite ``tensor`` with process ``src``'s, in place."""
        with _progress.waiting("broadcast"):
            dist.broadcast(tensor, src=src)

    def barrier(self) -> None:
        """Wait until every process arrives."""
        device = self.settings.device
        with _progress.waiting("barrier"):
            if device.type == "cuda":
                dist.barrier(device_ids=[device.index])
            else:
                dist.barrier()


_REGISTRY: dict[str, type[Strategy]] = {}
#: the strategies shipped with distify: the module that registers each, imported on first use
#: (a DDP job never imports FSDP's machinery, and this module imports no strategy)
_BUILT_IN = {"ddp": "._ddp", "fsdp": "._fsdp"}


def register(cls: type[Strategy]) -> type[Strategy]:
    """Class decorator: make a strategy selectable by its ``name``."""
    _REGISTRY[cls.name] = cls
    return cls


def names() -> tuple[str, ...]:
    """The registered strategies' names."""
    return tuple(sorted(set(_REGISTRY) | set(_BUILT_IN)))


def _lookup(name: str) -> type[Strategy] | None:
    """The strategy class registered as ``name`` (its module imported if it is a built-in)."""
    if name not in _REGISTRY and name in _BUILT_IN:
        importlib.import_module(_BUILT_IN[name], __package__)
    return _REGISTRY.get(name)


def from_environment(argument: str | None) -> tuple[str, Any]:
    """The strategy to use and its options: ``argument``, else ``DISTIFY_STRATEGY``, else
    ``fsdp`` when ``ACCELERATE_USE_FSDP`` is true, else ``ddp``.

    Raises:
        DistifyError: an unknown strategy, or an invalid option of it.
    """
    source, value = "strategy argument", argument
    if value is None and os.environ.get("DISTIFY_STRATEGY", "").strip():
        source, value = "DISTIFY_STRATEGY", os.environ["DISTIFY_STRATEGY"]
    if value is None:
        fsdp = os.environ.get("ACCELERATE_USE_FSDP", "").strip().lower() in _TRUE
        source, value = "ACCELERATE_USE_FSDP", "fsdp" if fsdp else "ddp"
    name = str(value).strip().lower()
    cls = _lookup(name)
    if cls is None:
        raise DistifyError(f"unknown strategy {value!r} (from {source}): use one of "
                           f"{', '.join(names())}")
    return name, cls.options_from_environment()


def current() -> Strategy:
    """This process's strategy (made on first use, from the settings)."""
    runtime = _state.current()
    strategy = runtime.strategy
    if strategy is None:
        settings = _state.settings()
        cls = _lookup(settings.strategy)
        assert cls is not None, settings.strategy  # from_environment checked the name
        strategy = runtime.strategy = cls(settings)
    return strategy


def as_list(parameters: torch.Tensor | Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """``parameters`` (a tensor or an iterable of them, as torch's clipping takes) as a list."""
    return [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)

