"""`distify verify`: run the original and its conversion side by side and check them."""

from __future__ import annotations

import json
from pathlib import Path

import click

from distify.errors import UserError

_SCRIPT_ARGS = "distify_verify_script_args"


class _ScriptArgsAfterDashes(click.Command):
    """Everything after ``--`` goes to the script, untouched; before it, only verify's own
    arguments (an unknown option there is a usage error, exit 2)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            at = args.index("--")
            ctx.meta[_SCRIPT_ARGS] = tuple(args[at + 1:])
            args = args[:at]
        return super().parse_args(ctx, args)


@click.command(
    name="verify",
    cls=_ScriptArgsAfterDashes,
    epilog="""\b
Examples:
  distify verify train.py --cpu --steps 5 -- --epochs 1
                                  # converts in a temporary folder, runs, checks
  distify verify train.py train_dist.py --cpu --steps 5 --json -- --epochs 1
                                  # a conversion you made; JSON for CI; exit 1 if a check fails
                                  # (a notebook, nb.ipynb, is verified the same way)
""",
)
@click.argument("original", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("converted", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--num_processes", "--num-processes", "processes", type=click.IntRange(2),
              default=2, show_default=True, help="Processes of the distributed run.")
@click.option("--cpu", is_flag=True, help="Run on CPUs (Gloo) even where GPUs are present.")
@click.option("--steps", type=click.IntRange(1),
              help="Stop every training DataLoader loop after K batches per epoch, in every run "
                   "alike, and a training loop without a DataLoader after K optimizer steps "
                   "(the run ends there); evaluation loops stay whole. Default: whole loops.")
@click.option("--eval-steps", "--eval_steps", "eval_steps", type=click.IntRange(1),
              help="Stop every evaluation DataLoader loop (started under no_grad, or with every "
                   "trained model in eval mode) after E batches. Default: whole loops.")
@click.option("--timeout", type=click.FloatRange(1), default=600.0, show_default=True,
              help="Seconds each run may take; a run still going then is stopped (a hang).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output on stdout.")
def verify(original: Path, converted: Path | None, processes: int, cpu: bool, steps: int | None,
           eval_steps: int | None, timeout: float, as_json: bool) -> None:
    """Run ORIGINAL and its conversion for a few steps and check what an engineer checks by hand.

    Runs, each in its own temporary copy of the script's folder (nothing is written beside the
    script): ORIGINAL on 1 process, the conversion (CONVERTED, or ORIGINAL converted in a
    temporary folder) on 1 process with plain python, and on N processes as `distify launch`
    runs it; then ORIGINAL on 1 process and the conversion on N with frozen weights (optimizer
    steps undone, BatchNorm statistics kept). Script arguments go after `--`, the same for every
    run. Checks: (1) world size 1 unchanged: stdout, files written (tensor values of torch
    files), final parameters; (2) replicas identical at every training epoch end and at the
    end; (3) distinct data per rank (the first training inputs); (4) only the main process
    printed and wrote files; (5) the lines printed after each evaluation loop match with frozen
    weights (numbers within rtol 1e-4; the frozen pair runs only when the original evaluated);
    (6) no hang; (7) for information, the median time between optimizer steps on 1 and N
    processes. Exit 0 when every check passes, 1 when one fails (or the original fails on its
    own), 2 for usage errors.
    """
    from distify.verify.session import verify as run_verify

    script_args = click.get_current_context().meta.get(_SCRIPT_ARGS, ())
    for path in filter(None, (original, converted)):
        if not path.is_file():
            raise UserError("script not found", path=str(path))
    outcome = run_verify(original, converted, script_args, processes=processes, cpu=cpu,
                         steps=steps, eval_steps=eval_steps, timeout=timeout)
    if as_json:
        click.echo(json.dumps(_as_json(outcome), indent=1))
    else:
        _render(outcome, processes, steps, eval_steps)
    click.get_current_context().exit(0 if outcome.ok else 1)


def _render(outcome, processes: int, steps: int | None, eval_steps: int | None) -> None:
    first = outcome.runs[0]
    if outcome.original_failed:
        click.echo(first.stderr.rstrip()[-4000:], err=True)
        why = f"timed out after {first.seconds:.0f} s" if first.timed_out else \
            f"failed with exit code {first.code}"
        click.echo(f"distify: {outcome.original} {why} on its own (run in a temporary copy of "
                   "its folder): nothing to verify", err=True)
        return
    capped = f", training loops capped at {steps} batches" if steps else ""
    capped += f", evaluation loops capped at {eval_steps} batches" if eval_steps else ""
    click.echo(f"distify verify: {outcome.original} against {outcome.converted}; "
               f"{processes} processes{capped}")
    for run in outcome.runs:
        state = "ok" if run.ok else ("timed out" if run.timed_out else f"exit {run.code}")
        click.echo(f"  ran {run.name}: {state}, {run.seconds:.1f} s{_capped(run)}")
    for run in outcome.runs[1:]:
        if not run.ok and not run.timed_out:
            click.echo(f"  {run.name} failed; its stderr ends with:", err=True)
            tail = run.stderr.rstrip().splitlines()[-15:]
            click.echo("\n".join(f"    {line}" for line in tail), err=True)
    for check in outcome.checks:
        click.echo(check.line())
    failed = sum(not check.ok for check in outcome.checks)
    click.echo(f"distify verify: {failed} of {len(outcome.checks)} checks failed" if failed
               else f"distify verify: all {len(outcome.checks)} checks passed")


def _capped(run) -> str:
    steps = max((record.get("capped_steps") or 0 for record in run.records.values()), default=0)
    return f"; capped: stopped after {steps} optimizer steps of a training loop without a " \
        "DataLoader (--steps)" if steps else ""


def _as_json(outcome) -> dict:
    first = outcome.runs[0]
    return {
        "original": outcome.original, "converted": outcome.converted, "ok": outcome.ok,
        "original_failed": outcome.original_failed,
        "original_stderr": first.stderr[-4000:] if outcome.original_failed else None,
        "runs": [{"name": run.name, "processes": run.processes, "exit_code": run.code,
                  "timed_out": run.timed_out, "seconds": round(run.seconds, 3),
                  "capped_steps": max((r.get("capped_steps") or 0
                                       for r in run.records.values()), default=0) or None}
                 for run in outcome.runs],
        "checks": [{"number": c.number, "name": c.name, "ok": c.ok, "evidence": c.evidence}
                   for c in outcome.checks],
    }
