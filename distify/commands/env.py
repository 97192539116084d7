"""`distify env`: the facts a bug report needs, as a block to paste (like ``accelerate env``).

torch is imported inside the command and only there, so the command also works (and says so)
where torch is missing or broken; every probe of torch is guarded, so a broken CUDA set-up is
reported, not raised. The launch config is found and validated as ``distify launch`` finds
and validates it.

What it deliberately does not do: print environment variables other than the launcher's,
distify's, Accelerate's, torch's and the collective libraries' (they may hold secrets).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from distify import __version__
from distify.errors import UserError

_ENV_NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
              "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")
_ENV_PREFIXES = ("DISTIFY_", "ACCELERATE_", "TORCH_DISTRIBUTED_", "TORCH_NCCL_", "TORCHELASTIC_",
                 "NCCL_", "GLOO_")


@click.command(
    name="env",
    epilog="""\b
Examples:
  distify env                               # paste the output into your bug report
  distify env train_dist.py                 # with the config launch uses: train_dist.yaml
                                            # (else ./distify_config.yaml)
  distify env --config_file node1.yaml
  distify env --json > env.json
""",
)
@click.option("--config_file", "--config-file", "config_file",
              type=click.Path(dir_okay=False),
              help="Launch config to show. Default: SCRIPT's sibling <stem>.yaml, else "
                   "./distify_config.yaml, as `distify launch` finds it.")
@click.option("--json", "as_json", is_flag=True, help="Print the same facts as JSON.")
@click.argument("script", required=False, type=click.Path(dir_okay=False))
def env(config_file: str | None, as_json: bool, script: str | None) -> None:
    """Print distify's, Python's, torch's and the GPUs' versions, the distributed backends, the
    launcher's environment variables and the launch config in use, ready for a bug report.

    Works without torch (it says so). A launch config that does not load is shown with the
    one-line error `distify launch` would give.
    """
    facts = collect(script, config_file)
    if as_json:
        click.echo(json.dumps(facts, indent=2))
    else:
        click.echo(render(facts), nl=False)


def collect(script: str | None = None, config_file: str | None = None) -> dict[str, Any]:
    """Every fact ``distify env`` shows, as JSON-ready values.

    Args:
        script: a script whose sibling ``<stem>.yaml`` is the launch config, as for
            ``distify launch``.
        config_file: the launch config to show instead.
    """
    return {
        "distify": {"version": __version__, "location": str(Path(__file__).resolve().parents[1])},
        "python": {"version": platform.python_version(),
                   "implementation": platform.python_implementation(),
                   "executable": sys.executable},
        "platform": {"system": platform.platform(), "machine": platform.machine(),
                     "cpus": os.cpu_count()},
        "accelerate": _installed_version("accelerate"),
        "torch": _torch_facts(),
        "environment": {name: value for name, value in sorted(os.environ.items())
                        if name in _ENV_NAMES or name.startswith(_ENV_PREFIXES)},
        "launch_config": _launch_config(script, config_file),
    }


def render(facts: dict[str, Any]) -> str:
    """The facts as the block ``distify env`` prints."""
    py, plat = facts["python"], facts["platform"]
    lines = [
        "Copy and paste the text below into your bug report.",
        "",
        f"- distify version: {facts['distify']['version']} ({facts['distify']['location']})",
        f"- Python: {py['version']} ({py['implementation']}, {py['executable']})",
        f"- Platform: {plat['system']} ({plat['machine']}, {plat['cpus']} CPUs)",
        f"- Accelerate: {facts['accelerate'] or 'not installed'}",
        *_torch_lines(facts["torch"]),
        *_section("Environment variables",
                  [f"{name}={value}" for name, value in facts["environment"].items()],
                  "none set (of RANK, WORLD_SIZE, MASTER_ADDR, CUDA_VISIBLE_DEVICES, "
                  "DISTIFY_*, ACCELERATE_*, NCCL_*, ...)"),
        *_config_lines(facts["launch_config"]),
    ]
    return "\n".join(lines) + "\n"


def _torch_facts() -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {"version": None}
    except Exception as err:  # a broken install (missing shared library, ...) is a fact too
        return {"version": None, "error": f"{type(err).__name__}: {err}"}
    available = _probe(torch.cuda.is_available)  # a broken driver: its error, shown
    cuda = available is True
    return {
        "version": torch.__version__,
        "location": str(Path(torch.__file__).parent),
        "cuda_available": available,
        "cuda_build": torch.version.cuda,
        "hip_build": getattr(torch.version, "hip", None),
        "cudnn": _probe(lambda: _cudnn_version(torch)),
        "nccl": _probe(lambda: _nccl_version(torch)) if cuda else None,
        "gpus": _probe(lambda: [torch.cuda.get_device_name(i)
                                for i in range(torch.cuda.device_count())]) if cuda else [],
        "mps_available": _probe(lambda: torch.backends.mps.is_available()),
        "distributed": _probe(lambda: _distributed_facts(torch)),
    }


def _probe(function: Callable[[], Any]) -> Any:
    """``function()``, or the error it raised as text: a broken driver is worth reporting."""
    try:
        return function()
    except Exception as err:
        return f"error: {type(err).__name__}: {err}"


def _cudnn_version(torch: Any) -> str | None:
    if not torch.backends.cudnn.is_available():
        return None
    number = torch.backends.cudnn.version()
    # cuDNN 9 encodes 9.1.0 as 90100; cuDNN 8 encodes 8.9.2 as 8902.
    major, rest = (number // 10000, number % 10000) if number >= 90000 else \
        (number // 1000, number % 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def _nccl_version(torch: Any) -> str:
    version = torch.cuda.nccl.version()
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def _distributed_facts(torch: Any) -> dict[str, Any]:
    dist = torch.distributed
    if not dist.is_available():
        return {"available": False}
    backends = {name: bool(getattr(dist, f"is_{name}_available", lambda: False)())
                for name in ("gloo", "nccl", "mpi")}
    try:  # what distify's FSDP strategy needs
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        fsdp2 = False
    else:
        fsdp2 = True
    return {"available": True, "backends": backends, "fsdp2": fsdp2}


def _installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _launch_config(script: str | None, config_file: str | None) -> dict[str, Any]:
    """The config ``distify launch [--config_file F] SCRIPT`` would read (its sibling
    ``<stem>.yaml``, else ``./distify_config.yaml``): its text, or the error loading it gives;
    ``path`` is None when there is none. ``found_as`` is ``default`` for the default file."""
    from distify.commands.launch import find_config
    from distify.launch.config import load_config

    path, found_as = find_config(script, config_file)
    if path is None:
        looked_for = str(Path(script).with_suffix(".yaml")) if script else None
        return {"path": None, "looked_for": looked_for}
    extra = {"found_as": "default"} if found_as == "default" else {}
    try:
        load_config(path)
    except UserError as err:
        return {"path": path, **extra, "error": str(err)}
    return {"path": path, **extra, "content": Path(path).read_text(encoding="utf-8")}


def _torch_lines(torch: dict[str, Any]) -> list[str]:
    if torch["version"] is None:
        why = f"cannot be imported: {torch['error']}" if "error" in torch else "not installed"
        return [f"- torch: {why}"]
    cuda = torch["cuda_available"]
    build = (f"CUDA {torch['cuda_build']}" if torch["cuda_build"] else
             f"ROCm/HIP {torch['hip_build']}" if torch["hip_build"] else "built without CUDA")
    gpus = torch["gpus"]
    listed = f"{len(gpus)} ({', '.join(gpus)})" if isinstance(gpus, list) and gpus else gpus
    dist = torch["distributed"]
    if isinstance(dist, dict) and dist["available"]:
        backends = ", ".join(f"{name}: {_yes(ok)}" for name, ok in dist["backends"].items())
        if "fsdp2" in dist:
            backends += f"; FSDP2 fully_shard: {_yes(dist['fsdp2'])}"
        dist = f"available ({backends})"
    elif isinstance(dist, dict):
        dist = "not available in this build"
    return [
        f"- torch: {torch['version']} ({torch['location']})",
        f"- CUDA available: {_yes(cuda)} ({build})",
        f"- cuDNN: {torch['cudnn'] or 'none'}",
        f"- NCCL: {torch['nccl'] or 'none'}",
        f"- GPUs: {listed or 0}",
        f"- MPS available: {_yes(torch['mps_available'])}",
        f"- torch.distributed: {dist}",
    ]


def _config_lines(config: dict[str, Any]) -> list[str]:
    if config["path"] is None:
        where = (f"no {config['looked_for']} beside the script" if config["looked_for"] else
                 "give SCRIPT or --config_file")
        return [f"- Launch config: none found ({where})"]
    name = config["path"]
    if config.get("found_as") == "default":
        name += " (the default in this folder, which `distify launch` reads)"
    if "error" in config:
        return [f"- Launch config: {name} does not load: {config['error']}"]
    return _section(f"Launch config: {name}", config["content"].rstrip().splitlines(),
                    "(empty)")


def _section(title: str, items: list[str], empty: str) -> list[str]:
    if not items:
        return [f"- {title}: {empty}"]
    return [f"- {title}:", *(f"    {item}" for item in items)]


def _yes(value: Any) -> str:
    """yes/no for a boolean; a probe's error text as it is."""
    return "yes" if value is True else "no" if value is False else str(value)
