"""Launch configs: the one module that reads, validates and writes them.

A launch config is YAML in Hugging Face Accelerate's config schema, with exactly the keys that
``accelerate config`` writes, so ``accelerate launch --config_file train_dist.yaml`` and
``distify launch train_dist.py`` read the same file. Whatever :func:`load_config` accepts,
Accelerate's own reader accepts too.

What it deliberately does not do:

- Keep distify-only settings in the file. Accelerate's reader rejects unknown keys, so
  ``max_restarts`` lives on :class:`LaunchConfig` (set from ``--max_restarts``) but is never
  written; a file that contains it gets an error that says to use the option instead.
- Support Accelerate's DeepSpeed, Megatron, TPU, dynamo or FP8 settings. A file that sets one of
  them is refused with an error naming the key (never silently ignored); the same keys left
  empty, as ``accelerate config`` often writes them, are accepted and dropped. FSDP is
  supported (``distributed_type: FSDP`` with an ``fsdp_config``: see :mod:`.fsdp`).
- Import torch. GPUs are counted from ``CUDA_VISIBLE_DEVICES`` and ``nvidia-smi -L``.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from distify.errors import UserError
from distify.fsutil import atomic_write_text
from distify.launch import fsdp
from distify.launch.fsdp import FsdpConfig

DISTRIBUTED_TYPES = ("NO", "MULTI_GPU", "MULTI_CPU", "FSDP")
MIXED_PRECISIONS = ("no", "fp16", "bf16")
RDZV_BACKENDS = ("static", "c10d")


@dataclass(frozen=True)
class LaunchConfig:
    """How to launch a job, in Accelerate's config schema (see the module docstring).

    ``num_processes`` is the total over all machines; each machine runs
    ``num_processes // num_machines`` of them. ``distributed_type`` is ``NO`` for one process,
    ``MULTI_CPU`` when forced onto CPUs, else ``MULTI_GPU`` (which on a machine without GPUs still
    means "N torchrun workers": the runtime falls back to CPU and Gloo), or ``FSDP`` for sharded
    models (with its ``fsdp_config``; on CPUs too, with Gloo).
    ``max_restarts`` is distify's own and is never written to the file.
    """

    compute_environment: str = "LOCAL_MACHINE"
    distributed_type: str = "NO"
    num_processes: int = 1
    num_machines: int = 1
    machine_rank: int = 0
    main_process_ip: str | None = None
    main_process_port: int | None = None
    mixed_precision: str = "no"
    gpu_ids: str = "all"
    rdzv_backend: str = "static"
    same_network: bool = True
    use_cpu: bool = False
    debug: bool = False
    main_training_function: str = "main"
    downcast_bf16: str = "no"
    tpu_use_cluster: bool = False
    tpu_use_sudo: bool = False
    tpu_env: tuple[str, ...] = ()
    enable_cpu_affinity: bool = False
    fsdp_config: FsdpConfig | None = None
    max_restarts: int = 0

    @property
    def nproc_per_node(self) -> int:
        """Processes on each machine."""
        return self.num_processes // self.num_machines

    @property
    def on_cpu(self) -> bool:
        """Whether the job is forced onto CPUs (``--cpu``, ``use_cpu`` or ``MULTI_CPU``)."""
        return self.use_cpu or self.distributed_type == "MULTI_CPU"


# Settings that live on LaunchConfig but never in the file (Accelerate rejects unknown keys).
_NOT_IN_FILE = frozenset({"max_restarts"})
FILE_KEYS = tuple(f.name for f in dataclasses.fields(LaunchConfig) if f.name not in _NOT_IN_FILE)

# Keys Accelerate knows that distify does not support. Left empty (as `accelerate config` writes
# them) they mean nothing and are dropped; set, they are refused.
_ACCELERATE_ONLY = frozenset({
    "deepspeed_config", "megatron_lm_config", "parallelism_config", "fp8_config",
    "mpirun_config", "dynamo_config", "dynamo_backend", "fp16", "tpu_name", "tpu_zone",
    "command_file", "commands", "tpu_vm",
})

_BOOL_KEYS = ("same_network", "use_cpu", "debug", "tpu_use_cluster", "tpu_use_sudo",
              "enable_cpu_affinity")
_INT_KEYS = ("num_processes", "num_machines", "machine_rank", "max_restarts")
_STR_KEYS = ("compute_environment", "distributed_type", "mixed_precision", "gpu_ids",
             "rdzv_backend", "main_training_function", "main_process_ip")
_CHOICES = {
    "compute_environment": ("LOCAL_MACHINE",),
    "distributed_type": DISTRIBUTED_TYPES,
    "mixed_precision": MIXED_PRECISIONS,
    "rdzv_backend": RDZV_BACKENDS,
    "downcast_bf16": ("no", "yes"),
}
# Accelerate itself fills these in when they are null or missing.
_NULL_MEANS = {"mixed_precision": "no", "gpu_ids": "all", "same_network": False,
               "rdzv_backend": "static", "tpu_env": ()}
_GPU_IDS = re.compile(r"all|\d+(,\d+)*")


class _Invalid(Exception):
    """A bad setting: the key it is about and what is wrong (turned into a UserError)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


def make_config(**settings: object) -> LaunchConfig:
    """Build a validated config from settings, deriving ``distributed_type`` when not given.

    Args:
        **settings: any :class:`LaunchConfig` fields; the rest take their defaults.

    Raises:
        UserError: a setting is invalid (the message names it).
    """
    merged = dict(settings)
    if "distributed_type" not in merged:
        merged["distributed_type"] = _derive_type("NO", merged)
    try:
        return _build(merged)
    except _Invalid as err:
        raise UserError(str(err)) from None


def with_overrides(cfg: LaunchConfig, **overrides: object) -> LaunchConfig:
    """``cfg`` with the given settings replaced; ``None`` means "keep the config's value".

    Changing ``num_processes``, ``num_machines`` or ``use_cpu`` re-derives ``distributed_type``
    (a one-process config launched with ``--num_processes 4`` becomes a ``MULTI_GPU`` one).

    Raises:
        UserError: the combination is invalid (the message names the setting).
    """
    given = {k: v for k, v in overrides.items() if v is not None}
    sharding = {k: given.pop(k) for k in list(given) if k.startswith("fsdp_")}
    use_fsdp = given.pop("use_fsdp", False)
    merged = {**_as_mapping(cfg), **given}
    if use_fsdp or sharding:
        merged["distributed_type"] = "FSDP"
        current = cfg.fsdp_config.as_mapping() if cfg.fsdp_config is not None else {}
        merged["fsdp_config"] = {**current, **sharding}
    if {"num_processes", "num_machines", "use_cpu"} & given.keys():
        merged["distributed_type"] = _derive_type(str(merged["distributed_type"]), merged)
    try:
        return _build(merged)
    except _Invalid as err:
        raise UserError(f"{err} (with the command-line options applied)") from None


def default_config(*, mixed_precision: str = "no",
                   num_processes: int | None = None) -> LaunchConfig:
    """The config for this machine alone: one process per local GPU, or one process without GPUs.

    Without GPUs the config does not force the CPU (``use_cpu`` stays false): it is usually
    written on a laptop and run on a GPU machine, where the runtime then picks the GPU.

    Args:
        mixed_precision: ``no``, ``fp16`` or ``bf16``.
        num_processes: overrides the GPU count.
    """
    if num_processes is None:
        num_processes = max(local_gpu_count(), 1)
    return make_config(num_processes=num_processes, mixed_precision=mixed_precision)


def local_gpu_count() -> int:
    """GPUs this process could use, counted without importing torch.

    ``CUDA_VISIBLE_DEVICES`` when set (empty or ``-1`` hides all GPUs), capped by what
    ``nvidia-smi -L`` lists when that tool is present; 0 when neither says anything.
    """
    physical = _nvidia_smi_count()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return physical or 0
    count = 0
    for entry in visible.split(","):
        if not entry.strip() or entry.strip().startswith("-"):
            break  # CUDA stops at the first invalid id
        count += 1
    return count if physical is None else min(count, physical)


def _nvidia_smi_count() -> int | None:
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return None
    try:
        out = subprocess.run([tool, "-L"], capture_output=True, text=True, timeout=20,
                             check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def load_config(path: str | os.PathLike) -> LaunchConfig:
    """Read and validate a launch config file.

    Args:
        path: a YAML file in Accelerate's config schema.

    Raises:
        UserError: the file is missing, unreadable, not YAML, not a mapping, or has an unknown
            key or a bad value; the message names the file, the position and the key.
    """
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError("config file not found", path=name) from None
    except UnicodeDecodeError:
        raise UserError("config file is not UTF-8 text", path=name) from None
    except OSError as err:
        raise UserError(f"cannot read config file: {err.strerror}", path=name) from None
    import yaml  # not imported to write a config (dump_config), ~10 ms of a conversion

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise UserError(f"malformed YAML: {problem}", path=name,
                        line=mark.line + 1 if mark else None,
                        col=mark.column + 1 if mark else None) from None
    if not isinstance(data, dict):
        what = "an empty file" if data is None else f"a {type(data).__name__}"
        raise UserError(f"a launch config must be a mapping of settings, got {what}", path=name)
    try:
        return _build(_file_settings(data))
    except _Invalid as err:
        line, col = _key_position(text, err.key)
        raise UserError(str(err), path=name, line=line, col=col) from None


def dump_config(cfg: LaunchConfig) -> str:
    """The YAML text of ``cfg``: Accelerate's keys, sorted as ``accelerate config`` writes them."""
    if cfg.distributed_type == "MULTI_CPU":
        # Accelerate starts multi-CPU jobs only through mpirun: without it, one process.
        header = ("# Launch config for `distify launch` (Accelerate's schema; `accelerate launch` "
                  "runs a multi-CPU\n# config as one process unless given an mpirun hostfile).\n"
                  "# Edit it, or write a new one with `distify config`.\n")
    else:
        header = ("# Launch config for `distify launch` and `accelerate launch --config_file` "
                  "(Accelerate's schema).\n# Edit it, or write a new one with `distify config`.\n")
    mapping = _file_mapping(cfg)
    plain = _plain_yaml(mapping)
    if plain is not None:
        return header + plain
    import yaml

    return header + yaml.safe_dump(mapping, sort_keys=True, default_flow_style=False)


#: the words PyYAML (YAML 1.1) reads as a boolean or null: a string spelled so is quoted
_YAML_WORDS = frozenset(spelling(word) for word in ("yes", "no", "true", "false", "on", "off",
                                                    "null")
                        for spelling in (str.lower, str.title, str.upper))
#: a key or string PyYAML writes as it is (or quoted, when one of _YAML_WORDS)
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}")


def _plain_yaml(mapping: Mapping[str, object]) -> str | None:
    """``yaml.safe_dump(mapping, sort_keys=True, default_flow_style=False)``, written without
    PyYAML (~10 ms to import, a twentieth of a small conversion's whole process) when every
    key is a word and every value a bool, an int, an empty list or a word, as a config that
    ``convert`` writes is; None for anything else (``tests/test_config_file.py`` compares the
    two)."""
    lines = []
    for key in sorted(mapping):
        value = mapping[key]
        if type(key) is not str or not _WORD.fullmatch(key) or key in _YAML_WORDS:
            return None
        if type(value) is bool:
            text = "true" if value else "false"
        elif type(value) is int:
            text = str(value)
        elif type(value) is list and not value:
            text = "[]"
        elif type(value) is str and _WORD.fullmatch(value):
            text = f"'{value}'" if value in _YAML_WORDS else value
        else:
            return None
        lines.append(f"{key}: {text}\n")
    return "".join(lines)


def write_config(cfg: LaunchConfig, path: str | os.PathLike) -> None:
    """Write ``cfg`` to ``path`` atomically (a crash never leaves half a config behind).

    Raises:
        UserError: the folder is missing or not writable.
    """
    atomic_write_text(path, dump_config(cfg))


def _file_mapping(cfg: LaunchConfig) -> dict[str, object]:
    data = {key: value for key, value in _as_mapping(cfg).items() if key in FILE_KEYS}
    data["tpu_env"] = list(cfg.tpu_env)
    if cfg.fsdp_config is not None:
        data["fsdp_config"] = cfg.fsdp_config.as_mapping()
    # Accelerate leaves unset optional settings out of the file.
    return {key: value for key, value in data.items() if value is not None}


def _as_mapping(cfg: LaunchConfig) -> dict[str, object]:
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}


def _file_settings(data: dict) -> dict[str, object]:
    """The file's settings, with unknown and unsupported keys refused."""
    settings = {}
    for key, value in data.items():
        if key in _NOT_IN_FILE:
            raise _Invalid(str(key), "not a config key (Accelerate would refuse the file); "
                                     f"pass --{key} to distify launch instead")
        if key in _ACCELERATE_ONLY:
            if value and value != "NO":
                raise _Invalid(key, "an Accelerate setting that distify launch does not support; "
                                    "remove it, or launch with `accelerate launch`")
            continue
        if key not in FILE_KEYS:
            close = difflib.get_close_matches(str(key), FILE_KEYS, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise _Invalid(str(key), f"unknown key{hint}")
        settings[key] = value
    if "distributed_type" not in settings:
        raise _Invalid("distributed_type", f"missing (one of {', '.join(DISTRIBUTED_TYPES)}); "
                                           "Accelerate requires it")
    return settings


def _derive_type(current: str, settings: Mapping[str, object]) -> str:
    if current == "FSDP":  # how to distribute, whatever the number of processes or devices
        return current
    if settings.get("num_processes", 1) == 1 and settings.get("num_machines", 1) == 1:
        return "NO"
    if settings.get("use_cpu"):
        return "MULTI_CPU"
    return current if current != "NO" else "MULTI_GPU"


def _build(settings: Mapping[str, object]) -> LaunchConfig:
    values = {}
    for key, value in settings.items():
        if value is None and key in _NULL_MEANS:
            value = _NULL_MEANS[key]
        values[key] = _checked_value(key, value)
    cfg = LaunchConfig(**values)
    _check_consistency(cfg)
    return cfg


def _checked_value(key: str, value: object) -> object:
    if key in _BOOL_KEYS and not isinstance(value, bool):
        raise _Invalid(key, f"must be true or false, got {value!r}")
    if key in _INT_KEYS or key == "main_process_port":
        if key == "main_process_port" and value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool):
            raise _Invalid(key, f"must be a whole number, got {value!r}")
        _check_int(key, value)
    if key in _STR_KEYS and not (isinstance(value, str) or (key == "main_process_ip"
                                                             and value is None)):
        raise _Invalid(key, f"must be a string, got {value!r}{_quote_hint(key, value)}")
    if key == "downcast_bf16" and isinstance(value, bool):
        value = "yes" if value else "no"
    if key in _CHOICES and value not in _CHOICES[key]:
        raise _Invalid(key, f"must be one of {', '.join(_CHOICES[key])}, got {value!r}")
    if key == "gpu_ids":
        value = value.replace(" ", "")
        if not _GPU_IDS.fullmatch(value):
            raise _Invalid(key, f"must be 'all' or GPU ids like '0,1', got {value!r}")
    if key == "main_process_ip" and value is not None and not value.strip():
        raise _Invalid(key, "must not be empty")
    if key == "tpu_env":
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise _Invalid(key, f"must be a list of strings, got {value!r}")
        value = tuple(value)
    if key == "fsdp_config" and not isinstance(value, FsdpConfig):
        try:
            value = fsdp.parse(value) if value else None  # `fsdp_config: {}`: not FSDP
        except fsdp.FsdpError as err:
            raise _Invalid(err.key, err.message) from None
    return value


def _quote_hint(key: str, value: object) -> str:
    if isinstance(value, bool):
        # YAML 1.1 reads bare no/yes/off/on as booleans.
        return f" (YAML reads a bare {'yes' if value else 'no'} as a boolean: quote it)"
    if key == "gpu_ids":
        return f" (quote it: gpu_ids: '{value}')"
    return ""


def _check_int(key: str, value: int) -> None:
    if key == "main_process_port":
        if not 0 <= value <= 65535:
            raise _Invalid(key, f"{value} is out of range (0-65535)")
    elif key in ("machine_rank", "max_restarts"):
        if value < 0:
            raise _Invalid(key, f"must be 0 or more, got {value}")
    elif value < 1:
        raise _Invalid(key, f"must be 1 or more, got {value}")


def _check_consistency(cfg: LaunchConfig) -> None:
    if cfg.num_processes % cfg.num_machines:
        raise _Invalid("num_processes", f"{cfg.num_processes} is not a multiple of num_machines "
                                        f"({cfg.num_machines}); it is the total over all machines")
    if cfg.machine_rank >= cfg.num_machines:
        raise _Invalid("machine_rank", f"{cfg.machine_rank} must be below num_machines "
                                       f"({cfg.num_machines}); machines count from 0")
    if cfg.fsdp_config is not None and cfg.distributed_type != "FSDP":
        raise _Invalid("fsdp_config", f"is set but distributed_type is {cfg.distributed_type}; "
                                      "set distributed_type: FSDP, or remove fsdp_config")
    if cfg.distributed_type == "NO" and cfg.num_processes > 1:
        raise _Invalid("distributed_type", f"NO runs one process but num_processes is "
                                           f"{cfg.num_processes}; use MULTI_GPU or MULTI_CPU")
    if cfg.num_machines > 1 and cfg.main_process_port == 0:
        raise _Invalid("main_process_port", "0 (a free port) only works on one machine; "
                                            "pick a port the machines agree on")
    if cfg.gpu_ids != "all" and not cfg.on_cpu:
        chosen = len(cfg.gpu_ids.split(","))
        if cfg.nproc_per_node > chosen:
            raise _Invalid("gpu_ids", f"'{cfg.gpu_ids}' selects {chosen} GPU(s) but each machine "
                                      f"runs {cfg.nproc_per_node} processes")


def _key_position(text: str, key: str) -> tuple[int | None, int | None]:
    """1-based line and column of ``key`` in ``text``: a top-level key, or ``outer.inner`` in a
    nested mapping (``fsdp_config.fsdp_version``); the outer key's when the inner is absent."""
    import yaml

    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None, None
    found = None
    for part in key.split("."):
        if not isinstance(node, yaml.MappingNode):
            break
        match = next(((k, v) for k, v in node.value if getattr(k, "value", None) == part), None)
        if match is None:
            break
        found, node = match
    if found is None:
        return None, None
    return found.start_mark.line + 1, found.start_mark.column + 1
