"""How fast is `distify check`? Against TorchFix and against LibCST's bare parse, same files.

Generates a corpus of distributed training scripts (raw DDP, Accelerate, distify runtime; 100 to
500 lines, with the usual model/data/helper code around the loop) plus files that never mention
torch, then times whole processes, alternating the commands in each round, and reports medians:

- ``distify check --jobs 1`` and ``--jobs 2``;
- ``torchfix --jobs 1`` and ``--jobs 2`` (from PyPI, in its own virtual environment under
  ``benchmarks/.work/``, since its LibCST pin differs);
- a bare LibCST parse of every file (one process, ``libcst.parse_module``, nothing else): the
  floor for any LibCST-based linter.

Usage::

    python benchmarks/check_speed.py                 # 300 + 60 files, 3 rounds
    python benchmarks/check_speed.py --files 100 --rounds 3 --write benchmarks/results/check.md
    python benchmarks/check_speed.py --corpus DIR --no-torchfix   # real files instead

``--corpus DIR`` times the same commands on every ``*.py`` under DIR (real repositories' files,
extracted outside this checkout; the files LibCST cannot parse, Python 2 say, are listed, and
the floor's parse of one stops at its error). Target (issue 23): ``distify check -j1`` at most
0.35x the bare parse on about 200 real files.

Needs network access to PyPI the first time (to install torchfix); ``--no-torchfix`` leaves it
out.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from _common import children_cpu, precompile_distify

HERE = Path(__file__).resolve().parent
WORK = HERE / ".work"
TORCHFIX_VENV = WORK / "torchfix-venv"

HEADER = {
    "ddp": """\
        import argparse
        import json
        import os
        import time

        import torch
        import torch.distributed as dist
        import torch.nn as nn
        import torch.nn.functional as F
        from torch.nn.parallel import DistributedDataParallel as DDP
        from torch.utils.data import DataLoader, TensorDataset
        from torch.utils.data.distributed import DistributedSampler
        """,
    "accelerate": """\
        import argparse
        import json
        import os

        import torch
        import torch.nn as nn
        import torch.nn.functional as F
        from accelerate import Accelerator
        from torch.utils.data import DataLoader, TensorDataset
        """,
    "runtime": """\
        import argparse
        import json
        import os

        import torch
        import torch.nn as nn
        import torch.nn.functional as F
        import distify.runtime as distify
        from torch.utils.data import DataLoader, TensorDataset
        """,
}

HELPER = """\
class Block{i}(nn.Module):
    \"\"\"A residual block ({i}).\"\"\"

    def __init__(self, dim={dim}, hidden={hidden}, dropout=0.1):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        h = self.fc1(self.norm(x))
        h = F.gelu(h)
        h = self.drop(self.fc2(h))
        return x + h


def build_features_{i}(rows, columns={dim}):
    features = []
    for row in rows:
        values = [float(v) for v in row[:columns]]
        if len(values) < columns:
            values += [0.0] * (columns - len(values))
        features.append(values)
    return torch.tensor(features)


def schedule_{i}(step, warmup={warmup}, total=10000):
    if step < warmup:
        return step / max(1, warmup)
    progress = (step - warmup) / max(1, total - warmup)
    return max(0.0, 0.5 * (1.0 + torch.cos(torch.tensor(progress * 3.14159)).item()))

"""

MAIN = {
    "ddp": """\
def evaluate(model, loader, device):
    model.eval()
    counts = torch.zeros(2, device=device)
    with torch.no_grad():
        for x, y in loader:
            pred = model(x.to(device)).argmax(dim=1)
            counts[0] += (pred == y.to(device)).sum()
            counts[1] += y.numel()
    dist.all_reduce(counts)
    return (counts[0] / counts[1]).item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default={epochs})
    parser.add_argument("--lr", type=float, default={lr})
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    data = TensorDataset(torch.randn(512, {dim}), torch.randint(0, 10, (512,)))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    model = DDP(nn.Sequential(Block0(), nn.Linear({dim}, 10)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    for epoch in range(args.epochs):
        {set_epoch}
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
        accuracy = evaluate(model, loader, torch.device("cpu"))
        if rank == 0:
            print(f"epoch {{epoch}} accuracy {{accuracy:.3f}}")
        {save}
    with open("history.json", "w") as f:
        json.dump({{"epochs": args.epochs}}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
""",
    "accelerate": """\
def main():
    accelerator = Accelerator()
    data = TensorDataset(torch.randn(512, {dim}), torch.randint(0, 10, (512,)))
    loader = DataLoader(data, batch_size=32, shuffle=True)
    model = nn.Sequential(Block0(), nn.Linear({dim}, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr={lr})
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for epoch in range({epochs}):
        model.train()
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            {backward}
            optimizer.step()
            optimizer.zero_grad()
        model.eval()
        correct = 0
        for x, y in loader:
            with torch.no_grad():
                pred = model(x).argmax(dim=1)
            correct += (pred == y).sum().item()
        accelerator.print(f"epoch {{epoch}}: {{correct}}")
    accelerator.wait_for_everyone()
    {save}


if __name__ == "__main__":
    main()
""",
    "runtime": """\
def main():
    data = TensorDataset(torch.randn(512, {dim}), torch.randint(0, 10, (512,)))
    loader = DataLoader(data, batch_size=32, shuffle=True)
    model = nn.Sequential(Block0(), nn.Linear({dim}, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr={lr})
    model, optimizer, loader = distify.prepare(model, optimizer, loader)
    for epoch in range({epochs}):
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            distify.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        if distify.is_main_process():
            print(epoch, loss.item())
        {save}


if __name__ == "__main__":
    main()
""",
}

PLAIN = """\
\"\"\"Utilities that never touch tensors ({i}).\"\"\"
import collections
import re


def tokenize_{i}(text):
    return [word.lower() for word in re.findall(r"[A-Za-z]+", text)]


def count_{i}(texts):
    counts = collections.Counter()
    for text in texts:
        counts.update(tokenize_{i}(text))
    return counts


class Vocabulary{i}:
    def __init__(self, counts, minimum={minimum}):
        self.words = sorted(word for word, n in counts.items() if n >= minimum)
        self.index = {{word: i for i, word in enumerate(self.words)}}

    def encode(self, text):
        return [self.index.get(word, -1) for word in tokenize_{i}(text)]

"""


def generate(folder: Path, files: int, plain: int, seed: int = 0) -> int:
    """Write the corpus; returns its total line count."""
    rng = random.Random(seed)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    lines = 0
    for index in range(files):
        style = ("ddp", "accelerate", "runtime")[index % 3]
        dim = rng.choice([64, 128, 256])
        helpers = "".join(HELPER.format(i=i, dim=dim, hidden=dim * 4, warmup=rng.randint(10, 500))
                          for i in range(rng.randint(2, 14)))
        buggy = rng.random() < 0.5
        fields = {
            "dim": dim, "lr": rng.choice([1e-3, 3e-4]), "epochs": rng.randint(2, 20),
            "set_epoch": "pass" if buggy else "sampler.set_epoch(epoch)",
            "backward": "loss.backward()" if buggy else "accelerator.backward(loss)",
            "save": ('torch.save(model.state_dict(), "model.pt")' if buggy else
                     'pass  # saved by the main process elsewhere'),
        }
        text = textwrap.dedent(HEADER[style]) + "\n\n" + helpers + MAIN[style].format(**fields)
        (folder / f"train_{index:04d}.py").write_text(text)
        lines += text.count("\n")
    for index in range(plain):
        text = "".join(PLAIN.format(i=f"{index}_{k}", minimum=k + 1) for k in range(8))
        (folder / f"util_{index:04d}.py").write_text(text)
        lines += text.count("\n")
    return lines


def ensure_torchfix() -> Path:
    exe = TORCHFIX_VENV / "bin" / "torchfix"
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", str(TORCHFIX_VENV)], check=True)
        subprocess.run([str(TORCHFIX_VENV / "bin" / "pip"), "install", "-q", "torchfix"],
                       check=True)
    return exe


TARGET = 0.35  # distify check -j1 / bare LibCST parse (issue 23)


def parse_only(folder: str) -> None:
    """The floor: LibCST parses every file, nothing else (run as its own process)."""
    import libcst

    for path in sorted(Path(folder).rglob("*.py")):
        # a real corpus may hold Python 2: such a file costs what it cost until the error
        with contextlib.suppress(libcst.ParserSyntaxError, UnicodeDecodeError):
            libcst.parse_module(path.read_bytes())


def describe_corpus(folder: Path) -> tuple[int, int, list[str]]:
    """Files, lines, and the files LibCST cannot parse (relative paths)."""
    import libcst

    files = sorted(folder.rglob("*.py"))
    lines = 0
    unparsed = []
    for path in files:
        data = path.read_bytes()
        lines += data.count(b"\n")
        try:
            libcst.parse_module(data)
        except (libcst.ParserSyntaxError, UnicodeDecodeError):
            unparsed.append(str(path.relative_to(folder)))
    return len(files), lines, unparsed


def timed(command: list[str], ok: tuple[int, ...] = (0, 1), cpu: bool = False) -> float:
    """Elapsed seconds, or with ``cpu`` the CPU seconds (user + system, its worker processes'
    included) the command used: on a shared machine elapsed time also counts other work."""
    start, start_cpu = time.perf_counter(), children_cpu()
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    elapsed = children_cpu() - start_cpu if cpu else time.perf_counter() - start
    if proc.returncode not in ok:
        raise SystemExit(f"{command[:3]} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=300)
    parser.add_argument("--plain", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--write", type=Path, help="write the Markdown report here")
    parser.add_argument("--corpus", type=Path,
                        help="time these files (every *.py under the folder) instead of a "
                             "generated corpus")
    parser.add_argument("--no-torchfix", action="store_true", help="leave TorchFix out")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                        help="what to time (cpu: not the time other work holds the CPUs)")
    parser.add_argument("--parse-only", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.parse_only:
        parse_only(args.parse_only)
        return

    if args.corpus is not None:
        corpus = args.corpus.resolve()
        args.count, lines, args.unparsed = describe_corpus(corpus)
    else:
        corpus = WORK / "corpus"
        lines = generate(corpus, args.files, args.plain)
        args.count, args.unparsed = None, []
    env_python = sys.executable
    args.bytecode = precompile_distify()
    commands = {
        "distify check -j1": [env_python, "-m", "distify", "check", "--jobs", "1", str(corpus)],
        "distify check -j2": [env_python, "-m", "distify", "check", "--jobs", "2", str(corpus)],
    }
    if not args.no_torchfix:
        torchfix = str(ensure_torchfix())
        commands["torchfix -j1"] = [torchfix, "--jobs", "1", str(corpus)]
        commands["torchfix -j2"] = [torchfix, "--jobs", "2", str(corpus)]
    commands["libcst parse (1 process)"] = [env_python, __file__, "--parse-only", str(corpus)]
    times: dict[str, list[float]] = {name: [] for name in commands}
    load_before = os.getloadavg()[0]
    for round_ in range(args.rounds):
        order = list(commands) if round_ % 2 == 0 else list(reversed(commands))
        for name in order:
            times[name].append(timed(commands[name], cpu=args.clock == "cpu"))
    medians = {name: statistics.median(values) for name, values in times.items()}
    args.load = (load_before, os.getloadavg()[0])
    report = render(medians, times, args, lines)
    print(report)
    if args.write:
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(report)


def render(medians: dict, times: dict, args, lines: int) -> str:
    parse = medians["libcst parse (1 process)"]
    rows = "\n".join(
        f"| {name} | {medians[name]:.2f} | {min(times[name]):.2f} | {max(times[name]):.2f} "
        f"| {medians[name] / parse:.2f}× |" for name in medians)
    one, two = medians["distify check -j1"], medians["distify check -j2"]
    ratios = [f"- distify check -j1 / bare LibCST parse: **{one / parse:.2f}** "
              f"({'meets' if one / parse <= TARGET else '**misses**'} the ≤ {TARGET} target)",
              f"- distify check -j2 / bare LibCST parse: **{two / parse:.2f}**"]
    if "torchfix -j1" in medians:
        ratios += [
            (f"- distify check / TorchFix, 1 job: **{one / medians['torchfix -j1']:.3f}** "
             f"(TorchFix takes {medians['torchfix -j1'] / one:.1f}× as long)"),
            f"- distify check / TorchFix, 2 jobs: **{two / medians['torchfix -j2']:.3f}**",
            f"- TorchFix -j1 / bare LibCST parse: **{medians['torchfix -j1'] / parse:.1f}**"]
    if args.corpus is not None:
        command = f"python benchmarks/check_speed.py --corpus {args.corpus} --rounds {args.rounds}"
        command += " --clock wall" if args.clock == "wall" else ""
        command += " --no-torchfix" if args.no_torchfix else ""
        corpus = (f"Corpus: {args.count} real files (every `*.py` under `{args.corpus}`), "
                  f"{lines:,} lines in all.")
        if args.unparsed:
            corpus += (f" LibCST cannot parse {len(args.unparsed)} of them (the floor stops at "
                       f"the error there): {', '.join(args.unparsed)}.")
    else:
        command = (f"python benchmarks/check_speed.py --files {args.files} --plain {args.plain} "
                   f"--rounds {args.rounds}")
        corpus = (f"Corpus: {args.files} generated distributed training scripts (raw DDP, "
                  "Accelerate, distify runtime; 100-500 lines each, half of them with bugs to "
                  f"report) and {args.plain} files that never mention torch; {lines:,} lines in "
                  "all.")
    return f"""# `distify check` speed

Recorded with `{command}` on {platform.system()} {platform.machine()}, {os.cpu_count()} CPUs,
Python {platform.python_version()}
(1-minute load average {args.load[0]:.1f} before and {args.load[1]:.1f} after: other work shares the
machine, so absolute times vary; the ratios between alternated commands are what to compare).
{args.bytecode}.

{corpus} Every command runs as a whole process (start-up included) on the
whole corpus; the commands alternate within each round; times are {"CPU seconds (user + system; for `-j2`, its workers' added up)" if args.clock == "cpu" else "elapsed seconds"} over {args.rounds} rounds.

| command | median | min | max | / parse |
|---|---|---|---|---|
{rows}

{chr(10).join(ratios)}
"""


if __name__ == "__main__":
    main()
