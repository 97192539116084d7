"""`distify launch`: run a script on N processes through torchrun, from a launch config."""

from __future__ import annotations

import ast
import difflib
import importlib.util
import sys
import tempfile
from pathlib import Path

import click

from distify.errors import UserError
from distify.launch import fsdp


def accelerate_option(name: str, *decls: str, **kwargs):
    """A click option spelled like Accelerate's, with underscores and with dashes."""
    dashed = name.replace("_", "-")
    spellings = [f"--{name}"] + ([f"--{dashed}"] if dashed != name else [])
    return click.option(*spellings, *decls, name, **kwargs)


def config_options(func):
    """The options that set launch-config values, shared by `launch` and `config`."""
    options = [
        accelerate_option("num_processes", type=click.IntRange(1),
                          help="Processes in total, over all machines."),
        accelerate_option("num_machines", type=click.IntRange(1), help="Machines in the job."),
        accelerate_option("machine_rank", type=click.IntRange(0),
                          help="This machine's rank (0 hosts the main process)."),
        accelerate_option("main_process_ip", help="Address of the machine with rank 0."),
        accelerate_option("main_process_port", type=click.IntRange(0, 65535),
                          help="Port on the machine with rank 0 for the rendezvous."),
        accelerate_option("rdzv_backend", type=click.Choice(["static", "c10d"]),
                          help="How machines meet: static ranks, or c10d (elastic)."),
        accelerate_option("mixed_precision", type=click.Choice(["no", "fp16", "bf16"]),
                          help="Autocast precision, passed to the runtime."),
        accelerate_option("gpu_ids", help="GPUs to use on each machine: 'all' or ids like 0,1."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def fsdp_options(func):
    """FSDP's options (Accelerate's names), shared by `launch` and `config`: any of them makes
    the job an FSDP one (``distributed_type: FSDP``)."""
    options = [
        accelerate_option("use_fsdp", is_flag=True, default=None,
                          help="Shard the model, its gradients and optimizer state over the "
                               "processes (FSDP2) instead of replicating it (DDP)."),
        accelerate_option("fsdp_version", type=click.IntRange(1, 2),
                          help="Accepted for Accelerate's configs; distify runs FSDP2."),
        accelerate_option("fsdp_auto_wrap_policy", type=click.Choice(fsdp.WRAP_POLICIES),
                          help="Which sub-modules are sharded on their own."),
        accelerate_option("fsdp_transformer_layer_cls_to_wrap",
                          help="Layer classes sharded on their own, e.g. Block (comma-separated)."),
        accelerate_option("fsdp_min_num_params", type=click.IntRange(0),
                          help="SIZE_BASED_WRAP: parameters for a sub-module to be sharded alone."),
        accelerate_option("fsdp_reshard_after_forward", type=click.BOOL,
                          help="Free gathered weights after each forward (default true)."),
        accelerate_option("fsdp_offload_params", type=click.BOOL,
                          help="Keep the sharded weights on the CPU."),
        accelerate_option("fsdp_activation_checkpointing", type=click.BOOL,
                          help="Recompute the wrapped layers' activations in the backward."),
        accelerate_option("fsdp_state_dict_type", type=click.Choice(fsdp.STATE_DICT_TYPES),
                          help="What distify.save_state writes: full weights or one shard per "
                               "process."),
        accelerate_option("fsdp_sharding_strategy", type=click.Choice(fsdp.SHARDING_STRATEGIES),
                          help="FSDP1's name for reshard_after_forward (FULL_SHARD: true)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


@click.command(
    name="launch",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
    epilog="""\b
Examples:
  distify launch train_dist.py                      # uses train_dist.yaml beside it, else
                                                    # ./distify_config.yaml (distify config)
  distify launch --num_processes 2 train_dist.py --epochs 3
  distify launch --num_machines 2 --machine_rank 0 --num_processes 16 \\
      --main_process_ip 10.0.0.1 --main_process_port 29500 train_dist.py
  distify launch --dry-run train_dist.py            # print the torchrun command
  distify launch --all-ranks train_dist.py          # every process's stdout, [rankN]: lines
                                                    # (default: the main process's only)
  distify launch --debug train_dist.py              # fail fast on mismatched collectives
  distify launch --use_fsdp --fsdp_transformer_layer_cls_to_wrap Block train_dist.py
                                                    # shard the model (FSDP2), layer by layer
  distify launch --slurm --num_machines 4 train_dist.py > job.sbatch
                                                    # 1 process per node from a login node
                                                    # without GPUs; --num_processes 32 for 8
  distify launch --num_proceses 2 train_dist.py     # error: no such option: --num_proceses
                                                    # (did you mean --num_processes?)
  distify launch --num_processes 2 train.py         # warns: not converted, every process
                                                    # trains on the full data on its own
  distify launch --gpu_ids 0,1 train_dist.py        # error on a machine without GPUs
  distify launch --num_processes 2 train_dist.py    # a failed job ends with its first failure:
      # distify: rank 1 failed first: KeyError: 'lr'
      # distify:   at train_dist.py:41: lr = cfg["lr"]
      # distify: the job failed with exit code 1; its full stderr, every rank's: /tmp/...log
      # or, for a rank the OOM killer ended (distify exits 137):
      # distify: rank 1 was killed by SIGKILL (exit -9): out of memory or preempted?
  distify launch --num_machines 2 --machine_rank 1 --num_processes 16 \\
      --main_process_ip 10.0.0.1 --main_process_port 29500 train_dist.py
      # on the second machine: says so while it waits for machine_rank 0
""",
)
@accelerate_option("config_file", type=click.Path(dir_okay=False),
                   help="Launch config (YAML, Accelerate's schema). Default: the script's "
                        "sibling <stem>.yaml when present, else ./distify_config.yaml (what "
                        "`distify config` writes) when present, else all local GPUs (or 1 "
                        "process).")
@config_options
@fsdp_options
@click.option("--cpu", "use_cpu", is_flag=True, default=None,
              help="Run on CPUs (Gloo) even where GPUs are present.")
@click.option("--debug", "debug", is_flag=True, default=None,
              help="Check that the processes make the same collectives and keep identical "
                   "weights, naming the script lines where they differ (slower; sets "
                   "DISTIFY_DEBUG=1 and TORCH_DISTRIBUTED_DEBUG=DETAIL).")
@accelerate_option("max_restarts", type=click.IntRange(0),
                   help="Restart the workers up to N times after a failure (elastic).")
@click.option("--all-ranks", "--all_ranks", "all_ranks", is_flag=True,
              help="Show every process's stdout on the console, each line prefixed [rankN]:, "
                   "not only the main process's (global rank 0). Either way every process's "
                   "output is kept in the launch's log folder.")
@click.option("--dry-run", "--dry_run", "dry_run", is_flag=True,
              help="Print the torchrun command and its environment instead of running it.")
@click.option("--slurm", is_flag=True,
              help="Print a Slurm batch script for num_machines nodes instead of running. "
                   "Each node runs num_processes / num_machines processes (one per GPU); "
                   "without --num_processes, as many as the config's machine, or this one, "
                   "has (1 where it has no GPUs, as on a login node).")
@click.argument("script", type=click.Path(dir_okay=False))
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
def launch(config_file: str | None, script: str, script_args: tuple[str, ...], dry_run: bool,
           slurm: bool, all_ranks: bool, **overrides: object) -> None:
    """Run SCRIPT on N processes through torchrun (torch.distributed.run), on one machine or many.

    Options override the launch config (--config_file, else SCRIPT's sibling <stem>.yaml,
    else ./distify_config.yaml). Everything after SCRIPT (or after `--`) goes to the script,
    which is compiled (not run) first: a syntax error stops the launch. The job runs in the
    foreground; it exits with the code of the process that failed first (128 + N if killed by
    signal N; 130 after Ctrl-C). The console shows the main process's stdout (global rank 0;
    --all-ranks: every process's) and every process's stderr; a log folder keeps every
    process's output. A failed job ends with the rank that failed first, its exception and the
    script line (or the signal that killed it), and the log's path.
    """
    from distify.launch.config import default_config, load_config, with_overrides

    if script_args[:1] == ("--",):
        script_args = script_args[1:]
    if dry_run and slurm:
        raise UserError("--dry-run and --slurm both print instead of running: use one")
    if script.startswith("-") and not Path(script).is_file():
        raise UserError(_no_such_option(script))
    if not Path(script).is_file():
        raise UserError("script not found", path=script)
    from distify.notebook import is_notebook

    notebook = script if is_notebook(script) else None
    if notebook and (dry_run or slurm):
        raise UserError("--dry-run and --slurm print a command for a script: convert the "
                        f"notebook to one first: distify convert {notebook} -o NAME.py",
                        path=notebook)
    source, found_as = find_config(script, config_file)
    cfg = load_config(source) if source else default_config()
    if slurm:
        _print_slurm(cfg, source, script, script_args, overrides)
        return
    cfg = with_overrides(cfg, **overrides)
    if notebook:  # its code cells, as a script beside it, removed when the launch ends
        from distify.launch.notebook import write_script

        script = write_script(notebook)
        click.get_current_context().call_on_close(
            lambda written=Path(script): written.unlink(missing_ok=True))
    _check_syntax(script)
    gpu_ids_option = overrides.get("gpu_ids") is not None
    if gpu_ids_option or not dry_run:
        # a config's gpu_ids may be meant for another machine: --dry-run shows it anyway
        _check_gpus(cfg, source, from_option=gpu_ids_option,
                    cpu_from_option=bool(overrides.get("use_cpu")))
    _warn_if_not_distributed(script, cfg.num_processes, shown=notebook)

    from distify.launch.torchrun import (
        build_plan,
        console_for,
        failure_summary,
        hidden_output_note,
        interrupt_summary,
        job_exit_code,
        render_plan,
        run_plan,
    )

    plan = build_plan(cfg, script, script_args)  # a config error stops here, before any output
    if dry_run:
        if found_as == "default":
            click.echo(f"distify: config: {source} ({_DEFAULT_NOTE})", err=True)
        click.echo(render_plan(plan), nl=False)
        return
    if importlib.util.find_spec("torch") is None:
        raise UserError(f"distify launch needs torch, which this Python ({sys.executable}) "
                        "does not have: pip install torch")
    where = {"option": source, "sibling": f"{source}, beside the script",
             "default": f"{source}, {_DEFAULT_NOTE}"}.get(found_as, "defaults for this machine")
    click.echo(f"distify: {_summary(cfg)} (config: {where})", err=True)
    log_dir = tempfile.mkdtemp(prefix="distify-launch-")
    console = console_for(cfg, log_dir, all_ranks=all_ranks)
    plan = build_plan(cfg, script, script_args, log_dir=log_dir)
    waiting = None
    if cfg.num_machines > 1 and cfg.machine_rank > 0:
        waiting = (f"waiting for the main machine {cfg.main_process_ip}:{cfg.main_process_port} "
                   "(machine_rank 0) to start its job; it keeps waiting (Ctrl-C to stop)")
    result = run_plan(plan, console=console, waiting_notice=waiting)
    if notebook:
        from distify.launch.notebook import in_notebook
    named = (lambda line: in_notebook(line, script, notebook)) if notebook else str
    if result.interrupted:
        for line in interrupt_summary(result, script):
            click.echo(f"distify: {named(line)}", err=True)
        click.echo(f"distify: interrupted; the job's stderr is in {result.log}", err=True)
    elif result.code:
        for line in failure_summary(result, script):
            click.echo(f"distify: {named(line)}", err=True)
    elif (note := hidden_output_note(console)) is not None:
        click.echo(f"distify: {note}", err=True)
    click.get_current_context().exit(job_exit_code(result))


#: The file `distify config` writes; `launch` reads it from the current folder when neither
#: --config_file nor the script's sibling <stem>.yaml names a config (as `accelerate launch`
#: reads its default config).
DEFAULT_CONFIG = "distify_config.yaml"
_DEFAULT_NOTE = "the default config in this folder; --config_file to use another"


def find_config(script: str | None, config_file: str | None) -> tuple[str | None, str]:
    """The launch config `distify launch [--config_file F] SCRIPT` reads, and how it was found:
    ``option`` (--config_file), ``sibling`` (SCRIPT's <stem>.yaml), ``default``
    (./distify_config.yaml, which `distify config` writes) or ``none`` (path None: the defaults
    for this machine)."""
    if config_file:
        return config_file, "option"
    sibling = _sibling_config(script) if script else None
    if sibling:
        return sibling, "sibling"
    if Path(DEFAULT_CONFIG).is_file():
        return DEFAULT_CONFIG, "default"
    return None, "none"


def _check_syntax(script: str) -> None:
    """Compile the script (never run it): a syntax error is one line with its position, before
    any process starts."""
    try:
        source = Path(script).read_bytes()
    except OSError as err:
        raise UserError(f"cannot read the script: {err.strerror}", path=script) from None
    try:
        compile(source, script, "exec", dont_inherit=True)
    except SyntaxError as err:
        col = err.offset if err.offset and err.offset > 0 else None
        raise UserError(f"{type(err).__name__}: {err.msg}; nothing was launched", path=script,
                        line=err.lineno or None, col=col if err.lineno else None) from None
    except ValueError as err:  # null bytes (Python < 3.12)
        raise UserError(f"SyntaxError: {err}; nothing was launched", path=script) from None


def _print_slurm(cfg, source: str | None, script: str, script_args: tuple[str, ...],
                 overrides: dict[str, object]) -> None:
    """Print the batch script, or fail before printing anything (stdout is often a file)."""
    from distify.launch.config import with_overrides
    from distify.launch.slurm import render_slurm

    per_node = cfg.nproc_per_node
    if overrides.get("num_processes") is None and overrides.get("num_machines") is not None:
        # The config (or this machine, often a login node without GPUs) describes one
        # machine: every node Slurm gives gets as many processes as it has.
        overrides = {**overrides, "num_processes": per_node * overrides["num_machines"]}
        click.echo(f"distify: {per_node} process(es) per node, as "
                   f"{source or 'this machine'} has; pass --num_processes <total> to change it",
                   err=True)
    try:
        cfg = with_overrides(cfg, **overrides)
        text = render_slurm(cfg, script, script_args)
    except UserError as err:
        raise UserError(f"{err.message}; no batch script was printed", path=err.path,
                        line=err.line, col=err.col) from None
    _warn_if_not_distributed(script, cfg.num_processes)
    click.echo(text, nl=False)


def _no_such_option(arg: str) -> str:
    """The error for an option `launch` does not know, met where the script was expected."""
    name = arg.split("=", 1)[0]
    known = [opt for param in click.get_current_context().command.params
             for opt in param.opts if opt.startswith("--")]
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]}?)" if close else " (see distify launch --help)"
    return f"no such option: {name}{hint}; options for the script go after it"


def _warn_if_not_distributed(script: str, num_processes: int, shown: str | None = None) -> None:
    """Warn when the script does not use ``torch.distributed`` (or distify, Accelerate, ...):
    the same answer as ``convert``'s "already distributed" (an import left unused is no use).
    ``shown``: the name the user gave (a notebook whose cells ``script`` holds)."""
    if num_processes < 2:
        return
    try:
        source = Path(script).read_bytes()
        tree = ast.parse(source)
    except (OSError, SyntaxError, ValueError, RecursionError):
        return  # unreadable: the job's own error says more
    from distify.analysis.filemodel import FileModel
    from distify.rules import default_rules

    found = FileModel(tree, source, default_rules()).parallel  # convert's answer, line and all
    if found is None or found.imported_only:
        imported = (f" (it {found.why} but never uses it)"
                    if found is not None else "")
        name = shown or script
        click.echo(f"distify: warning: {name} does not use torch.distributed, distify or "
                   f"Accelerate{imported}: each of the {num_processes} processes will train "
                   f"on the full data on its own; convert it first: distify convert {name}",
                   err=True)


def _check_gpus(cfg, source: str | None, *, from_option: bool, cpu_from_option: bool) -> None:
    """GPUs chosen by id must exist here: without any, the job would run on CPUs unasked; and
    --gpu_ids on a job that runs on CPUs would be ignored. --gpu_ids is checked for --dry-run
    too."""
    from distify.launch.config import local_gpu_count

    if from_option and cfg.on_cpu and cfg.gpu_ids != "all":
        why = ("--cpu" if cpu_from_option else
               f"{'use_cpu: true' if cfg.use_cpu else 'distributed_type: MULTI_CPU'} in {source}")
        raise UserError(f"--gpu_ids {cfg.gpu_ids}: the job runs on CPUs ({why}), where GPU ids "
                        "mean nothing; drop --gpu_ids, or the CPU setting to run on GPUs")
    if cfg.on_cpu or cfg.gpu_ids == "all" or local_gpu_count():
        return
    where = f"--gpu_ids {cfg.gpu_ids}" if from_option else f"gpu_ids '{cfg.gpu_ids}' in {source}"
    raise UserError(f"{where}: this machine has no GPUs (none visible); drop it to run where "
                    "the runtime finds a device, or pass --cpu to run on CPUs")


def _sibling_config(script: str) -> str | None:
    sibling = Path(script).with_suffix(".yaml")
    return str(sibling) if sibling.is_file() else None


def _summary(cfg) -> str:
    where = ("CPUs only" if cfg.on_cpu else
             "every GPU (CPU where none)" if cfg.gpu_ids == "all" else f"GPUs {cfg.gpu_ids}")
    machines = (f"{cfg.num_machines} machines, this one rank {cfg.machine_rank}"
                if cfg.num_machines > 1 else "1 machine")
    sharded = "; FSDP (sharded model)" if cfg.distributed_type == "FSDP" else ""
    return (f"{cfg.num_processes} process(es) on {machines}; {where}; "
            f"mixed precision {cfg.mixed_precision}{sharded}")
