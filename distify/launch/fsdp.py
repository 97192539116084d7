"""The ``fsdp_config`` of a launch config (``distributed_type: FSDP``), in Accelerate's keys.

``accelerate config`` writes these keys under ``fsdp_config``; ``accelerate launch`` and
``distify launch`` turn them into the ``FSDP_*`` variables that distify's runtime reads
(``distify/runtime/_fsdp.py``), so the same file works with both launchers. distify runs FSDP2
(``fully_shard``) whatever ``fsdp_version`` says; an FSDP1 ``fsdp_sharding_strategy`` is mapped
onto FSDP2's ``reshard_after_forward`` by the runtime.

Validated here (this module must not import torch: the CLI runs without it): unknown keys
(with a did-you-mean), types, choices, and what FSDP2 cannot do (hybrid sharding; RAM-efficient
loading, which needs Hugging Face Transformers' loaders). Keys that only tune FSDP1
(``fsdp_backward_prefetch``, ``fsdp_forward_prefetch``, ``fsdp_use_orig_params``,
``fsdp_sync_module_states``: distify always starts every rank from the main process's weights)
are accepted, kept in the file, and have no effect.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass

WRAP_POLICIES = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
STATE_DICT_TYPES = ("FULL_STATE_DICT", "SHARDED_STATE_DICT")
SHARDING_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP")
_UNSUPPORTED_SHARDING = ("NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")


@dataclass(frozen=True)
class FsdpConfig:
    """The ``fsdp_config`` mapping; None means "not in the file" (the runtime's default)."""

    fsdp_version: int = 2
    fsdp_auto_wrap_policy: str | None = None
    fsdp_transformer_layer_cls_to_wrap: str | None = None
    fsdp_min_num_params: int | None = None
    fsdp_reshard_after_forward: bool | None = None
    fsdp_offload_params: bool | None = None
    fsdp_state_dict_type: str | None = None
    fsdp_activation_checkpointing: bool | None = None
    fsdp_sharding_strategy: str | None = None
    # FSDP1 tuning, accepted and without effect (see the module docstring)
    fsdp_backward_prefetch: str | None = None
    fsdp_forward_prefetch: bool | None = None
    fsdp_use_orig_params: bool | None = None
    fsdp_sync_module_states: bool | None = None
    fsdp_cpu_ram_efficient_loading: bool | None = None

    def env(self) -> dict[str, str]:
        """The variables ``accelerate launch`` sets for this config (and the runtime reads)."""
        env = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": str(self.fsdp_version)}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None or field.name == "fsdp_version":
                continue
            name = "FSDP_TRANSFORMER_CLS_TO_WRAP" if field.name == \
                "fsdp_transformer_layer_cls_to_wrap" else field.name.upper()
            env[name] = str(value).lower() if isinstance(value, bool) else str(value)
        return env

    def as_mapping(self) -> dict[str, object]:
        """The keys set, for the file."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) is not None}


KEYS = tuple(f.name for f in dataclasses.fields(FsdpConfig))
_BOOLS = ("fsdp_reshard_after_forward", "fsdp_offload_params", "fsdp_activation_checkpointing",
          "fsdp_forward_prefetch", "fsdp_use_orig_params", "fsdp_sync_module_states",
          "fsdp_cpu_ram_efficient_loading")
_CHOICES = {"fsdp_auto_wrap_policy": WRAP_POLICIES, "fsdp_state_dict_type": STATE_DICT_TYPES,
            "fsdp_backward_prefetch": ("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH")}


class FsdpError(ValueError):
    """A bad ``fsdp_config`` entry: ``key`` is its full key (``fsdp_config.fsdp_version``)."""

    def __init__(self, key: str, message: str) -> None:
        self.key = f"fsdp_config.{key}" if key else "fsdp_config"
        self.message = message
        super().__init__(f"{self.key}: {message}")


def parse(data: object) -> FsdpConfig:
    """Validate an ``fsdp_config`` mapping (from a file or from launch options).

    Raises:
        FsdpError: the first bad entry, naming its key.
    """
    if data is None:
        return FsdpConfig()
    if not isinstance(data, Mapping):
        raise FsdpError("", f"must be a mapping of fsdp_* settings, got {data!r}")
    values: dict[str, object] = {}
    for key, value in data.items():
        key = str(key)
        if key not in KEYS:
            close = difflib.get_close_matches(key, KEYS, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise FsdpError(key, f"unknown key{hint}")
        if value is not None:
            values[key] = _checked(key, value)
    return FsdpConfig(**values)


def _checked(key: str, value: object) -> object:
    if key in _BOOLS:
        if not isinstance(value, bool):
            raise FsdpError(key, f"must be true or false, got {value!r}")
        if key == "fsdp_cpu_ram_efficient_loading" and value:
            raise FsdpError(key, "needs Hugging Face Transformers' model loading, which distify "
                                 "does not do; set it to false")
        return value
    if key == "fsdp_version":
        if value not in (1, 2) or isinstance(value, bool):
            raise FsdpError(key, f"must be 1 or 2, got {value!r} (distify runs FSDP2 either way)")
        return value
    if key == "fsdp_min_num_params":
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise FsdpError(key, f"must be a whole number of parameters, got {value!r}")
        return value
    if not isinstance(value, str):
        raise FsdpError(key, f"must be a string, got {value!r}")
    if key == "fsdp_sharding_strategy":
        if value.upper() in _UNSUPPORTED_SHARDING:
            raise FsdpError(key, f"{value} is not supported: use FULL_SHARD or SHARD_GRAD_OP "
                                 "(for NO_SHARD, use distributed_type: MULTI_GPU, which is DDP)")
        if value.upper() not in SHARDING_STRATEGIES:
            raise FsdpError(key, f"must be one of {', '.join(SHARDING_STRATEGIES)}, got "
                                 f"{value!r}")
    if key in _CHOICES and value not in _CHOICES[key]:
        raise FsdpError(key, f"must be one of {', '.join(_CHOICES[key])}, got {value!r}")
    if key == "fsdp_transformer_layer_cls_to_wrap":
        names = [name.strip() for name in value.split(",")]
        if not all(name.isidentifier() for name in names):
            raise FsdpError(key, f"must be class names separated by commas, got {value!r}")
        return ",".join(names)
    return value
