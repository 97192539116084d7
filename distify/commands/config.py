"""`distify config`: the wizard that writes a launch config."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from distify.commands.launch import (
    DEFAULT_CONFIG,
    accelerate_option,
    config_options,
    fsdp_options,
)

DEFAULT_PATH = DEFAULT_CONFIG  # `distify launch` reads it from the current folder


def _stdin_is_terminal() -> bool:
    return sys.stdin.isatty()


@click.command(
    name="config",
    epilog="""\b
Examples:
  distify config                                    # answer the questions
  distify config --num_processes 8 --mixed_precision bf16 --yes
  distify config --num_processes 8 --use_fsdp --fsdp_transformer_layer_cls_to_wrap Block --yes
  distify config --num_machines 2 --machine_rank 1 --main_process_ip 10.0.0.1 \\
      --num_processes 16 --config_file node1.yaml --yes
  distify launch train_dist.py                      # reads ./distify_config.yaml
  distify launch --config_file node1.yaml train_dist.py
""",
)
@accelerate_option("config_file", type=click.Path(dir_okay=False), default=DEFAULT_PATH,
                   show_default=True, help="Where to write the config.")
@config_options
@fsdp_options
@click.option("--cpu/--no-cpu", " /--no_cpu", "use_cpu", default=None,
              help="Run on CPUs only, even where GPUs are present.")
@click.option("--debug/--no-debug", " /--no_debug", "debug", default=None,
              help="Check distributed operations for mismatches while running (slower).")
@click.option("-y", "--yes", is_flag=True,
              help="Ask nothing: take the defaults for every question not given as a flag.")
def config(config_file: str, yes: bool, **answers: object) -> None:
    """Write a launch config (YAML, Accelerate's schema) by asking a few questions.

    Every question is also a flag; a question answered by a flag is not asked. Without a
    terminal on stdin, or with --yes, nothing is asked and the rest take their defaults. The
    file works with `distify launch --config_file` and `accelerate launch --config_file`;
    `distify launch` run from this folder reads ./distify_config.yaml without the option.
    """
    from distify.launch.config import write_config
    from distify.launch.wizard import run_wizard

    cfg = run_wizard(answers, interactive=not yes and _stdin_is_terminal())
    write_config(cfg, config_file)
    machines = f"{cfg.num_machines} machines" if cfg.num_machines > 1 else "1 machine"
    sharded = ", FSDP" if cfg.distributed_type == "FSDP" else ""
    click.echo(f"distify: wrote {config_file} ({cfg.num_processes} process(es) on {machines}, "
               f"mixed precision {cfg.mixed_precision}{sharded})")
    if Path(config_file).resolve() == Path(DEFAULT_PATH).resolve():
        # launch reads it from this folder, unless the script has a sibling <stem>.yaml
        click.echo(f"Launch with: distify launch SCRIPT (from this folder; from elsewhere: "
                   f"distify launch --config_file {config_file} SCRIPT)")
    else:
        click.echo(f"Launch with: distify launch --config_file {config_file} SCRIPT")
