"""The FSDP strategy: FSDP2's ``fully_shard``, for models that do not fit one GPU.

Each process keeps a 1/N shard of every parameter, of its gradient and of the optimizer state;
a layer's weights are all-gathered just before its forward (and backward) and freed after, and
gradients are reduce-scattered. Chosen by ``distributed_type: FSDP`` in the launch config
(``distify launch`` and ``accelerate launch`` then set ``ACCELERATE_USE_FSDP`` and the ``FSDP_*``
variables this module reads), ``DISTIFY_STRATEGY=fsdp`` or ``distify.init(strategy="fsdp")``.
The converted script is the same as under DDP:

- ``prepare(model)``: the main process's weights and buffers are broadcast first (as DDP does,
  so every rank starts from the same model), then ``fully_shard`` is applied to the layers the
  wrap policy picks (``fsdp_auto_wrap_policy``: ``TRANSFORMER_BASED_WRAP`` with
  ``fsdp_transformer_layer_cls_to_wrap``, ``SIZE_BASED_WRAP`` with ``fsdp_min_num_params``, or
  ``NO_WRAP``), with activation checkpointing on those layers when asked, and to the model;
  ``fsdp_reshard_after_forward`` and ``fsdp_offload_params`` (CPU offload) apply to each. Mixed
  precision keeps its autocast and adds FSDP's policy: weights all-gathered in bf16/fp16,
  gradients reduced in fp32.
- optimizers built before ``prepare`` (from the unsharded parameters, as converted scripts do)
  are pointed at the sharded ones;
- ``sync_gradients(False)`` skips the gradient reduce-scatter (accumulation);
- fp16 scales the loss with ``ShardedGradScaler``, whose inf/nan check covers every shard, so all
  ranks skip the same steps; ``clip_grad_norm_`` takes the norm over all shards;
- ``model.state_dict()`` (``fsdp_state_dict_type: FULL_STATE_DICT``, the default) gathers the
  full weights, on the CPU, with the user's keys, on the main process; the other processes get
  an empty dict (a collective: every process must call it, as converted scripts do, which save
  with ``distify.save(model.state_dict(), path)`` on every process). ``load_state_dict`` takes
  the main process's dict and shards it (the others' argument is not read). A prepared
  optimizer's ``state_dict``/``load_state_dict`` likewise, in the plain index-keyed format, so a
  checkpoint loads into the plain model and optimizer on one process, and back.

What it deliberately does not do: FSDP1 (``FullyShardedDataParallel``) or hybrid sharding (a
launch config asking for either is refused with the key named); an evaluation forward on the
main process only (the all-gathers are collectives: every process must run every forward of a
sharded model); whole-model pickles (``torch.save(model)``) of a sharded model; compare the
replicas in debug mode (there are none: each rank holds other shards). ``SHARDED_STATE_DICT``
changes what ``distify.save_state`` writes (one shard per process, torch.distributed.checkpoint),
not what ``state_dict()`` returns.
"""

from __future__ import annotations

import collections
import contextlib
import os
import warnings
import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from . import _buffers, _debug, _objects, _state, _strategy
from ._errors import DistifyError
from ._strategy import DistributedModel, Strategy, register
from ._subclass import original_class

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
WRAP_POLICIES = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
STATE_DICT_TYPES = ("FULL_STATE_DICT", "SHARDED_STATE_DICT")
#: FSDP1's sharding strategies and FSDP2's equivalent ``reshard_after_forward``
_RESHARD = {"FULL_SHARD": True, "SHARD_GRAD_OP": False, "NO_RESHARD": False}
_DEFAULT_MIN_PARAMS = 100_000_000
_HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class FsdpOptions:
    """The ``fsdp_config`` settings FSDP2 uses, as the launchers pass them (``FSDP_*``)."""

    reshard_after_forward: bool = True
    wrap_policy: str = "NO_WRAP"
    layer_classes: tuple[str, ...] = ()
    min_num_params: int = _DEFAULT_MIN_PARAMS
    offload_params: bool = False
    state_dict_type: str = "FULL_STATE_DICT"
    activation_checkpointing: bool = False


def _env(name: str) -> str:
    return os.environ.get(name, "").strip()


def _bool(name: str, default: bool) -> bool:
    raw = _env(name).lower()
    if not raw:
        return default
    if raw in _TRUE or raw in _FALSE:
        return raw in _TRUE
    raise DistifyError(f"{name}={_env(name)!r} is not true or false "
                       f"({_key(name)} in the launch config)")


def _key(variable: str) -> str:
    """The launch config's key for an ``FSDP_*`` variable."""
    return {"FSDP_TRANSFORMER_CLS_TO_WRAP": "fsdp_transformer_layer_cls_to_wrap"}.get(
        variable, "fsdp_" + variable[len("FSDP_"):].lower())


def _choice(name: str, choices: tuple[str, ...], default: str) -> str:
    raw = _env(name).upper()
    if not raw:
        return default
    if raw not in choices:
        raise DistifyError(f"{name}={_env(name)!r} ({_key(name)} in the launch config): use one "
                           f"of {', '.join(choices)}")
    return raw


def read_options() -> FsdpOptions:
    """The FSDP options from the ``FSDP_*`` variables (Accelerate's names).

    Raises:
        DistifyError: a value is invalid, or asks for what FSDP2 does not do (the message
            names the variable and its launch-config key).
    """
    version = _env("FSDP_VERSION") or "2"
    if version not in ("1", "2"):
        raise DistifyError(f"FSDP_VERSION={version!r} (fsdp_version in the launch config): "
                           "distify runs FSDP2; use 2")
    reshard = _reshard_setting(version)
    classes = tuple(name.strip() for name in _env("FSDP_TRANSFORMER_CLS_TO_WRAP").split(",")
                    if name.strip())
    policy = _choice("FSDP_AUTO_WRAP_POLICY", WRAP_POLICIES,
                     "TRANSFORMER_BASED_WRAP" if classes else "NO_WRAP")
    raw_min = _env("FSDP_MIN_NUM_PARAMS")
    try:
        min_params = int(float(raw_min)) if raw_min else 0
    except ValueError:
        raise DistifyError(f"FSDP_MIN_NUM_PARAMS={raw_min!r} (fsdp_min_num_params in the launch "
                           "config) is not a number of parameters") from None
    return FsdpOptions(
        reshard_after_forward=reshard, wrap_policy=policy, layer_classes=classes,
        min_num_params=min_params if min_params > 0 else _DEFAULT_MIN_PARAMS,
        offload_params=_bool("FSDP_OFFLOAD_PARAMS", False),
        state_dict_type=_choice("FSDP_STATE_DICT_TYPE", STATE_DICT_TYPES, "FULL_STATE_DICT"),
        activation_checkpointing=_bool("FSDP_ACTIVATION_CHECKPOINTING", False))


def _reshard_setting(version: str) -> bool:
    raw = _env("FSDP_RESHARD_AFTER_FORWARD").upper()
    strategy = _env("FSDP_SHARDING_STRATEGY").upper()
    if version == "1" and strategy and not raw:  # FSDP1 configs name a sharding strategy
        raw = strategy
    if not raw:
        return True
    if raw in ("HYBRID_SHARD", "HYBRID_SHARD_ZERO2", "NO_SHARD"):
        name = "FSDP_RESHARD_AFTER_FORWARD" if _env("FSDP_RESHARD_AFTER_FORWARD") \
            else "FSDP_SHARDING_STRATEGY"
        raise DistifyError(f"{name}={raw!r} ({_key(name)} in the launch config) is not "
                           "supported: use FULL_SHARD or SHARD_GRAD_OP (or distributed_type: "
                           "MULTI_GPU for DDP instead of NO_SHARD)")
    if raw in _RESHARD:
        return _RESHARD[raw]
    if raw.lower() in _TRUE or raw.lower() in _FALSE:
        return raw.lower() in _TRUE
    raise DistifyError(f"FSDP_RESHARD_AFTER_FORWARD={raw!r} (fsdp_reshard_after_forward in the "
                       "launch config): use true or false")


@register
class FSDPStrategy(Strategy):
    """FSDP2: parameters, gradients and optimizer state sharded over the processes."""

    name = "fsdp"

    def __init__(self, settings: _state.Settings) -> None:
        super().__init__(settings)
        self.options: FsdpOptions = settings.strategy_options or FsdpOptions()
        #: id of an unsharded parameter -> (a weak reference to it, its sharded replacement)
        self.replaced: dict[int, tuple[weakref.ref, nn.Parameter]] = {}
        self.optimizers: weakref.WeakSet = weakref.WeakSet()
        self.models: weakref.WeakSet = weakref.WeakSet()

    @classmethod
    def options_from_environment(cls) -> FsdpOptions:
        return read_options()

    def describe(self) -> str:
        options = self.options
        return (f"fsdp (reshard_after_forward={options.reshard_after_forward}, "
                f"{options.wrap_policy}, {options.state_dict_type})")

    def sharded_checkpoints(self) -> bool:
        return self.options.state_dict_type == "SHARDED_STATE_DICT"

    def model_state_from_main(self) -> bool:
        return True  # _from_main: load_state_dict broadcasts the main process's full dict

    def distribute(self, model: nn.Module) -> DistributedModel:
        from torch.distributed.fsdp import fully_shard

        class_name = original_class(model).__name__
        if self.settings.debug:
            _debug.check(f"prepare({class_name}, fsdp)")
        # Like DDP, start every rank from the main process's weights and buffers.
        _buffers.broadcast_from_main([*model.parameters(), *model.buffers()],
                                     f"prepare_weights({class_name}")
        layers = self._layers(model, class_name)
        if self.options.activation_checkpointing:
            from torch.distributed._composable import checkpoint

            for layer in layers:
                checkpoint(layer)
        unsharded = dict(model.named_parameters())
        settings = self._shard_settings()
        for layer in layers:
            fully_shard(layer, **settings)
        # The root's own weights (embeddings, head) are not freed after the forward (torch's
        # default, as Accelerate does): the backward starts with them, so freeing them would
        # add an all-gather nothing can overlap.
        root = {**settings, "reshard_after_forward": None} if settings[
            "reshard_after_forward"] else settings
        fully_shard(model, **root)
        for name, param in model.named_parameters():
            old = unsharded.get(name)
            if old is not None and old is not param:
                self.replaced[id(old)] = (weakref.ref(old), param)
        for optimizer in list(self.optimizers):  # prepared before this model
            self._point_at_shards(optimizer)
        self.models.add(model)
        return FSDPModel(model)

    def setup_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizers.add(optimizer)
        self._point_at_shards(optimizer)
        _full_optimizer_state_dicts(optimizer)

    def grad_scaler(self) -> torch.amp.GradScaler:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(self.settings.device.type)

    def clip_grad_norm_(self, params: list[torch.Tensor], max_norm: float, norm_type: float,
                        **kwargs: Any) -> torch.Tensor:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type, **kwargs)
        return _full(norm)

    def _shard_settings(self) -> dict[str, Any]:
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

        settings: dict[str, Any] = {"reshard_after_forward": self.options.reshard_after_forward}
        half = _HALF.get(self.settings.mixed_precision)
        if half is not None:
            settings["mp_policy"] = MixedPrecisionPolicy(param_dtype=half,
                                                         reduce_dtype=torch.float32)
        if self.options.offload_params:
            if self.settings.device.type == "cuda":
                settings["offload_policy"] = CPUOffloadPolicy()
            else:
                warnings.warn("fsdp_offload_params is ignored: the model is on the CPU already",
                              stacklevel=5)
        return settings

    def _layers(self, model: nn.Module, class_name: str) -> list[nn.Module]:
        """The sub-modules the wrap policy shards on their own, innermost first."""
        options = self.options
        if options.wrap_policy == "TRANSFORMER_BASED_WRAP":
            wanted = options.layer_classes or tuple(getattr(model, "_no_split_modules", ()) or ())
            if not wanted:
                raise DistifyError(
                    "fsdp_auto_wrap_policy is TRANSFORMER_BASED_WRAP but "
                    "fsdp_transformer_layer_cls_to_wrap names no class: name the model's layer "
                    "class (e.g. Block), or use SIZE_BASED_WRAP or NO_WRAP")
            found = {original_class(m).__name__ for m in model.modules()}
            missing = [name for name in wanted if name not in found]
            if missing:
                shown = ", ".join(sorted(found - {class_name}))
                raise DistifyError(
                    f"fsdp_transformer_layer_cls_to_wrap: {class_name} has no "
                    f"{' or '.join(missing)} module (its classes: {shown}); name one of them")
            layers = [m for m in model.modules()
                      if m is not model and original_class(m).__name__ in wanted]
        elif options.wrap_policy == "SIZE_BASED_WRAP":
            layers = _by_size(model, options.min_num_params)
        else:
            layers = []
        if options.activation_checkpointing and not layers:
            raise DistifyError("fsdp_activation_checkpointing needs layers to checkpoint: set "
                               "fsdp_transformer_layer_cls_to_wrap (TRANSFORMER_BASED_WRAP)")
        return list(reversed(layers))  # innermost first: fully_shard goes bottom-up

    def _point_at_shards(self, optimizer: torch.optim.Optimizer) -> None:
        """Replace, in ``optimizer``, the parameters that sharding replaced."""
        if not self.replaced:
            return
        for group in optimizer.param_groups:
            params = group["params"]
            for index, param in enumerate(params):
                entry = self.replaced.get(id(param))
                if entry is None or entry[0]() is not param:
                    continue
                if optimizer.state.get(param):
                    raise DistifyError(
                        "an optimizer that has already stepped (or loaded its state) was "
                        "prepared with a model sharded by FSDP: prepare the model and the "
                        "optimizer before training or loading the optimizer's state")
                params[index] = entry[1]


class FSDPModel(DistributedModel):
    """A model sharded by ``fully_shard``: it runs its own forwards (the all-gathers are its
    hooks)."""

    replicated = False

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.sync = True

    def forward(self, args: tuple, kwargs: dict, sync: bool) -> Any:
        if sync != self.sync:
            self.module.set_requires_gradient_sync(sync)
            self.sync = sync
        return self.module(*args, **kwargs)

    def synced_parameters(self) -> tuple[tuple[str, nn.Parameter], ...]:
        return tuple((name, param) for name, param in self.module.named_parameters()
                     if param.requires_grad)

    def state_dict(self, own: dict) -> dict:
        main = _state.is_main_process()
        full: collections.OrderedDict = collections.OrderedDict()
        for key, value in own.items():  # the same keys in the same order on every rank
            value = _full(value)
            if main:
                full[key] = value.detach().cpu() if isinstance(value, torch.Tensor) else value
        metadata = getattr(own, "_metadata", None)
        if metadata is not None:
            full._metadata = metadata  # type: ignore[attr-defined]
        return full

    def load_state_dict(self, state_dict: Any) -> Any:
        sharded = nn.Module.state_dict(self.module)
        return _from_main(state_dict, lambda key: sharded.get(key))


def _full(value: Any) -> Any:
    """A DTensor's whole tensor (a collective); anything else as it is."""
    full_tensor = getattr(value, "full_tensor", None)
    return full_tensor() if full_tensor is not None and callable(full_tensor) else value


def _from_main(state: Any, like: Any) -> collections.OrderedDict:
    """The main process's mapping ``state`` on every rank, each tensor shaped like
    ``like(key)`` when that is a DTensor of its size (sharded from the main process's value),
    else broadcast whole. Every rank must call it; only the main process's ``state`` is read."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    main = _state.is_main_process()
    layout = _objects.broadcast_object(
        [(key, _spec(value)) for key, value in state.items()] if main else None, 0,
        _state.comm_device())
    result: collections.OrderedDict = collections.OrderedDict()
    for key, spec in layout:
        if spec[0] == "value":
            result[key] = spec[1]
            continue
        _, shape, dtype = spec
        target = like(key)
        if isinstance(target, DTensor) and tuple(target.shape) == tuple(shape):
            full = state[key].to(target.device, dtype) if main else torch.empty(
                shape, dtype=dtype, device=target.device)
            result[key] = distribute_tensor(full, target.device_mesh, target.placements,
                                            src_data_rank=0)
        else:
            device = _state.comm_device()
            tensor = state[key].to(device) if main else torch.empty(shape, dtype=dtype,
                                                                    device=device)
            dist.broadcast(tensor.contiguous(), src=0)
            result[key] = tensor
    metadata = _objects.broadcast_object(getattr(state, "_metadata", None) if main else None,
                                         0, _state.comm_device())
    if metadata is not None:
        result._metadata = metadata  # type: ignore[attr-defined]
    return result


def _spec(value: Any) -> tuple:
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype)
    return ("value", value)


def _by_size(model: nn.Module, min_params: int) -> list[nn.Module]:
    """SIZE_BASED_WRAP: sub-modules (outermost first) holding at least ``min_params``
    parameters not already in a smaller wrapped one."""
    picked: list[nn.Module] = []

    def visit(module: nn.Module) -> int:
        own = sum(p.numel() for p in module.parameters(recurse=False))
        below = sum(visit(child) for child in module.children())
        total = own + below
        if module is not model and total >= min_params:
            picked.append(module)
            return 0
        return total

    visit(model)
    return list(reversed(picked))


def _full_optimizer_state_dicts(optimizer: torch.optim.Optimizer) -> None:
    """Give a prepared optimizer the FULL_STATE_DICT meaning of ``state_dict`` and
    ``load_state_dict`` (see the module docstring), in the plain index-keyed format."""
    own_state_dict = optimizer.state_dict
    own_load = optimizer.load_state_dict

    def state_dict() -> dict:
        own = own_state_dict()
        main = _state.is_main_process()
        state = {}
        for index in _indices(own):  # the same indices in the same order on every rank
            entry = own["state"].get(index)
            if entry is None:
                continue
            full = {key: _full(value) for key, value in entry.items()}
            if main:
                state[index] = {key: value.detach().cpu() if isinstance(value, torch.Tensor)
                                else value for key, value in full.items()}
        return {"state": state, "param_groups": own["param_groups"]}

    def load_state_dict(state_dict: dict) -> None:
        params = [param for group in optimizer.param_groups for param in group["params"]]
        main = _state.is_main_process()
        indices = _objects.broadcast_object(sorted(state_dict["state"]) if main else None, 0,
                                            _state.comm_device())
        state = {}
        for index in indices:
            param = params[index] if 0 <= index < len(params) else None
            state[index] = dict(_from_main(state_dict["state"][index] if main else {},
                                           lambda _key, param=param: param))
        groups = _objects.broadcast_object(state_dict["param_groups"] if main else None, 0,
                                           _state.comm_device())
        own_load({"state": state, "param_groups": groups})

    optimizer.state_dict = state_dict  # type: ignore[method-assign]
    optimizer.load_state_dict = load_state_dict  # type: ignore[method-assign]


def sharded_optimizer_state(optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's state as shards (torch.distributed.checkpoint's layout), for
    ``save_state`` with ``SHARDED_STATE_DICT``; ``optimizer.state_dict()`` stays the full one."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    with _plain_state_dicts(optimizer):
        return get_optimizer_state_dict(_owner(optimizer), optimizer)


def load_sharded_optimizer_state(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Load what :func:`sharded_optimizer_state` gave, read back by torch.distributed.checkpoint."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    with _plain_state_dicts(optimizer):
        set_optimizer_state_dict(_owner(optimizer), optimizer, state)


@contextlib.contextmanager
def _plain_state_dicts(optimizer: torch.optim.Optimizer):
    """The optimizer's own ``state_dict``/``load_state_dict`` (not the full ones), for torch's
    sharded-state helpers."""
    patched = {name: optimizer.__dict__.pop(name) for name in ("state_dict", "load_state_dict")
               if name in optimizer.__dict__}
    try:
        yield
    finally:
        optimizer.__dict__.update(patched)


def _owner(optimizer: torch.optim.Optimizer) -> nn.Module:
    """The one sharded model whose parameters ``optimizer`` trains."""
    strategy = _strategy.current()
    params = {id(p) for group in optimizer.param_groups for p in group["params"]}
    owners = [model for model in getattr(strategy, "models", ())
              if params & {id(p) for p in model.parameters()}]
    if len(owners) != 1:
        raise DistifyError(
            f"fsdp_state_dict_type SHARDED_STATE_DICT: an optimizer must train one sharded "
            f"model for its state to be sharded, this one trains {len(owners)}; use "
            "FULL_STATE_DICT")
    return owners[0]


def _indices(state_dict: dict) -> list[int]:
    return [index for group in state_dict["param_groups"] for index in group["params"]]
