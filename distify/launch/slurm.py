"""A Slurm batch script that runs a launch config's job on ``num_machines`` nodes.

``srun`` starts one torchrun per node. Slurm only knows the node names once the job runs, so the
nodes always meet through c10d rendezvous on the first node's hostname (whatever
``rdzv_backend`` says: a static rendezvous would need each node's rank in advance), with the
Slurm job id as the rendezvous id. Slurm chooses each node's GPUs, so ``gpu_ids`` is not applied.

What it deliberately does not do: pick a partition, an account or a time limit (site-specific:
add ``#SBATCH`` lines), or activate a Python environment (``sbatch`` passes on the environment it
was submitted from, so ``python`` is the one active then).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

from distify.launch.config import LaunchConfig
from distify.launch.torchrun import TORCHRUN, launch_env

DEFAULT_PORT = 29500


def render_slurm(cfg: LaunchConfig, script: str, script_args: Sequence[str] = (), *,
                 job_name: str | None = None) -> str:
    """The batch script's text, ready for ``sbatch``.

    Args:
        cfg: a validated launch config (``machine_rank`` and ``main_process_ip`` are not used:
            Slurm decides both).
        script: path of the training script, as it will be seen from the submission folder.
        script_args: passed to the script unchanged.
        job_name: Slurm job name; defaults to the script's stem.
    """
    port = cfg.main_process_port or DEFAULT_PORT
    per_node = cfg.nproc_per_node
    header = [
        "#!/bin/bash",
        f"#SBATCH --job-name={job_name or Path(script).stem}",
        f"#SBATCH --nodes={cfg.num_machines}",
        "#SBATCH --ntasks-per-node=1",
    ]
    if not cfg.on_cpu:
        header.append(f"#SBATCH --gpus-per-node={per_node}")
    notes = [
        "#",
        ("# Written by `distify launch --slurm`: srun starts one torchrun per node, "
         f"{per_node} process(es) each,"),
        f"# {cfg.num_processes} in all; the nodes meet through c10d rendezvous on the first node.",
    ]
    if cfg.gpu_ids != "all" and not cfg.on_cpu:
        notes.append(f"# gpu_ids '{cfg.gpu_ids}' is not applied: Slurm chooses each node's GPUs.")
    exports = [f"export {name}={shlex.quote(value)}" for name, value in launch_env(cfg).items()
               if name != "CUDA_VISIBLE_DEVICES"]
    torchrun = shlex.join(["python", *TORCHRUN, "--nnodes", str(cfg.num_machines),
                           "--nproc-per-node", str(per_node), "--rdzv-backend", "c10d"])
    rendezvous = f'--rdzv-endpoint "$head_node:{port}" --rdzv-id "$SLURM_JOB_ID"'
    restarts = f" --max-restarts {cfg.max_restarts}" if cfg.max_restarts else ""
    command = [
        'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "",
        f"srun {torchrun} \\",
        f"  {rendezvous}{restarts} \\",
        f"  {shlex.join([script, *script_args])}",
    ]
    return "\n".join([*header, *notes, "", "set -euo pipefail", *exports, *command]) + "\n"
