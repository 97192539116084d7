"""Launch configs and launching: config file in Accelerate's schema, torchrun jobs, Slurm scripts.

Nothing here imports torch: `distify launch` only needs it in the job it starts.
"""

from distify.launch.config import (
    LaunchConfig,
    default_config,
    dump_config,
    load_config,
    make_config,
    with_overrides,
    write_config,
)

__all__ = ["LaunchConfig", "default_config", "dump_config", "load_config", "make_config",
           "with_overrides", "write_config"]
