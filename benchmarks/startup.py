"""CLI start-up: `distify --help` and `distify convert --help` against `python -c pass`.

PRODUCT.md: the CLI never imports torch (`distify --help`, `convert`, `check` start fast and run
where torch is not installed). This benchmark

1. times each command as a whole process, alternating the order every round, medians;
2. lists the heaviest imports of ``import distify.cli`` (``python -X importtime``) and checks
   that torch is not among them;
3. runs ``distify convert`` in a process where ``import torch`` fails, and checks that torch is
   not imported by ``convert``/``check``/``config --help`` either.

    python benchmarks/startup.py            # about 30-60 s on 2 cores
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    RESULTS,
    WORK,
    machine,
    median,
    run_timed,
    spread,
    table,
    today,
    venv_bin,
    versions,
    write_results,
)

NO_TORCH = """\
import sys
sys.modules["torch"] = None  # any `import torch` now raises ImportError
from distify.cli import main
try:
    main(sys.argv[1:], standalone_mode=False)
finally:
    loaded = sorted(name for name, module in sys.modules.items() if module is not None
                    and (name == "torch" or name.startswith("torch.")))
    print("TORCH_MODULES", loaded, file=sys.stderr)
"""

SAMPLE = '''\
import torch
from torch.utils.data import DataLoader

model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(list(range(8)), batch_size=2)
for x in loader:
    loss = model(torch.randn(2, 4)).sum()
    loss.backward()
    optimizer.step()
print("done")
'''


def commands() -> dict[str, list[str]]:
    distify = venv_bin("distify")
    return {
        "python -c pass": [sys.executable, "-c", "pass"],
        "python -c 'import click'": [sys.executable, "-c", "import click"],
        "python -c 'import libcst'": [sys.executable, "-c", "import libcst"],
        "distify --help": [distify, "--help"],
        "distify convert --help": [distify, "convert", "--help"],
        "distify check --help": [distify, "check", "--help"],
    }


def bench(rounds: int) -> dict[str, list[float]]:
    cmds = commands()
    names = list(cmds)
    times: dict[str, list[float]] = defaultdict(list)
    for name in names:  # warm the file cache once
        run_timed(cmds[name])
    for round_ in range(rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:  # rotate the order every round
            times[name].append(run_timed(cmds[name]))
    return times


def import_profile(limit: int = 12) -> tuple[list[tuple[str, int]], list[str], int]:
    """The heaviest imports of ``import distify.cli`` (cumulative µs), and any torch module."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", "import distify.cli"],
                          capture_output=True, text=True, check=True)
    rows = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = (part.strip() for part in line[len("import time:"):].split("|"))
        if cumulative.isdigit():
            rows.append((name, int(cumulative)))
    total = next((us for name, us in rows if name == "distify.cli"), 0)
    torch_modules = [name for name, _ in rows if name == "torch" or name.startswith("torch.")]
    top_level = [(name, us) for name, us in rows if name.startswith("distify") or "." not in name]
    top_level.sort(key=lambda item: -item[1])
    return top_level[:limit], torch_modules, total


def torch_free_runs() -> list[tuple[str, str, int]]:
    """Run subcommands where torch cannot be imported; report exit code and torch modules."""
    folder = WORK / "startup"
    folder.mkdir(parents=True, exist_ok=True)
    sample = folder / "train.py"
    sample.write_text(SAMPLE, encoding="utf-8")
    runs = {
        "distify --help": ["--help"],
        "distify convert train.py -o out.py": ["convert", str(sample), "-o",
                                               str(folder / "out.py")],
        "distify convert train.py --diff": ["convert", str(sample), "--diff"],
        "distify check train.py": ["check", str(sample)],
        "distify config --help": ["config", "--help"],
        "distify launch --help": ["launch", "--help"],
    }
    results = []
    for label, argv in runs.items():
        (folder / "out.yaml").unlink(missing_ok=True)
        proc = subprocess.run([sys.executable, "-c", NO_TORCH, *argv], capture_output=True,
                              text=True, cwd=folder)
        loaded = next((line.split(" ", 1)[1] for line in proc.stderr.splitlines()
                       if line.startswith("TORCH_MODULES")), "?")
        tail = [line for line in proc.stderr.splitlines() if not line.startswith("TORCH_MODULES")]
        note = tail[-1][:120] if proc.returncode not in (0, 1) and tail else ""
        loaded = "none" if loaded == "[]" else loaded
        results.append((label, f"{proc.returncode}{' — ' + note if note else ''}", loaded))
    return results


def render(args, times, imports, torch_modules, import_total, torch_free) -> str:
    base = median(times["python -c pass"])
    out = ["# CLI start-up\n",
           f"- date: {today()}",
           f"- machine: {machine()}",
           f"- versions: {versions('click', 'libcst', 'pyyaml', 'torch')}",
           "- command: `python benchmarks/startup.py"
           f"{' --rounds %d' % args.rounds if args.rounds != 15 else ''}`",
           "- target (PRODUCT.md): the CLI never imports torch and starts fast", "",
           f"## Whole processes ({args.rounds} rounds, order rotated every round; medians, "
           "min–max in ms)\n"]
    rows = []
    for name, values in times.items():
        m = median(values)
        rows.append([f"`{name}`", f"{m * 1e3:.0f}", spread(values), f"{m / base:.1f}×",
                     f"+{(m - base) * 1e3:.0f}"])
    out += [table(["command", "median ms", "min–max", "× python -c pass", "ms over python"],
                  rows), ""]
    extra = median(times["distify --help"]) - base
    libcst_cost = median(times["python -c 'import libcst'"]) - base
    click_cost = median(times["python -c 'import click'"]) - base
    out += [f"`distify --help` costs {extra * 1e3:.0f} ms over a bare interpreter; importing "
            f"LibCST alone costs {libcst_cost * 1e3:.0f} ms ({libcst_cost / extra:.0%} of it), "
            f"click {click_cost * 1e3:.0f} ms. Help and `--version` need neither LibCST nor the "
            "rule packs: importing each subcommand's module only when that subcommand runs "
            "would bring `distify --help` close to `import click`.", ""]
    out += ["## Imports of `import distify.cli` (`python -X importtime`, one run)\n",
            f"Total {import_total / 1e3:.0f} ms (importtime's own overhead included). Heaviest "
            "top-level and distify modules, cumulative:\n"]
    out += [table(["module", "ms"], [[f"`{name}`", f"{us / 1e3:.0f}"] for name, us in imports]),
            ""]
    out += [f"torch modules imported by `import distify.cli`: "
            f"{', '.join(torch_modules) if torch_modules else 'none'} — "
            f"{'**fails**' if torch_modules else 'meets'} \"never imports torch\".", ""]
    out += ["## Subcommands with torch made unimportable (`sys.modules['torch'] = None`)\n"]
    out += [table(["command", "exit code", "torch modules loaded"],
                  [[f"`{label}`", code, loaded] for label, code, loaded in torch_free]), ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--results", type=Path, default=RESULTS / "startup.md")
    parser.add_argument("--no-record", action="store_true", help="print, do not write results")
    args = parser.parse_args(argv)
    os.environ.pop("DISTIFY_DEBUG", None)
    started = time.perf_counter()
    times = bench(args.rounds)
    imports, torch_modules, total = import_profile()
    torch_free = torch_free_runs()
    text = render(args, times, imports, torch_modules, total, torch_free)
    text += f"\n(benchmark wall time {time.perf_counter() - started:.0f} s)\n"
    print(text)
    if not args.no_record:
        write_results(args.results, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
