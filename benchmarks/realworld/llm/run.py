"""Convert and run the LLM / transformer / Fabric scripts of manifest.yaml, for the judgement
table in benchmarks/results/realworld.md (part 2).

For each entry: the files are taken from a bare mirror (`fetch` gives /work/.mirror/OWNER+NAME/repo)
at the recorded commit into WORK/ID/, the `edits` of the entry (literal replacements, only to
shrink or unpin what cannot run on this CPU box) are applied to the copy, the data is prepared,
then `distify convert` (report and diff kept), and, unless `run: false`, a world-size-1 comparison
(original vs conversion with plain python, lines compared after masking timings) and
`distify verify --cpu`. Everything lands in WORK/ID/*.txt; the judging is done by reading them.

The distify judged is a commit of the repository, exported with `git archive` to
WORK/distify_SHA and put first on PYTHONPATH (`python -m distify`), so that uncommitted changes
in a shared working tree never leak into a row; `--distify-commit` picks it (default HEAD).

Usage: python benchmarks/realworld/llm/run.py [--work /tmp/rwl/run] [--mirrors /work/.mirror]
       [--distify-commit REV] [ID ...]
"""
from __future__ import annotations

import argparse
import difflib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
STUBS = HERE / "stubs"
DISTIFY = [sys.executable, "-m", "distify"]
SOURCE: list[Path] = []  # the exported distify, set by main()
TIMING = re.compile(r"(time|dt|ms|tok/sec|iter_dt|elapsed)[^|,;]*?\d[\d.,]*", re.IGNORECASE)


def git_show(git_dir: Path, commit: str, path: str) -> bytes:
    return subprocess.run(["git", f"--git-dir={git_dir}", "show", f"{commit}:{path}"],
                          check=True, capture_output=True, timeout=60).stdout


def prepare_data(kind: str, folder: Path) -> None:
    rng = np.random.default_rng(0)
    if kind == "nanogpt_bins":  # nanoGPT-style memmaps for --dataset='tiny'
        (folder / "data" / "tiny").mkdir(parents=True, exist_ok=True)
        rng.integers(0, 50257, 20000, dtype=np.uint16).tofile(folder / "data/tiny/train.bin")
        rng.integers(0, 50257, 4000, dtype=np.uint16).tofile(folder / "data/tiny/val.bin")
    elif kind == "input_txt":  # a small English-like text for char / byte models
        words = ["the", "king", "shall", "speak", "of", "love", "and", "war", "O", "God,",
                 "my", "lord", "thou", "art", "here.", "God!", "\n"]
        text = " ".join(words[i] for i in rng.integers(0, len(words), 6000))
        (folder / "input.txt").write_text(text)
    elif kind != "none":
        raise SystemExit(f"manifest: unknown data kind {kind!r}")


def run(cmd: list[str], cwd: Path, out: Path, timeout: int) -> int:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, [*SOURCE, STUBS, cwd])))
    env.pop("WORLD_SIZE", None)
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)
        code, text = proc.returncode, proc.stdout + "\n--- stderr ---\n" + proc.stderr
    except subprocess.TimeoutExpired as exc:
        code, text = 124, f"timed out after {timeout} s\n{exc.stdout or ''}"
    out.write_text(f"$ {' '.join(cmd)}\nexit {code}\n{text}")
    return code


def world_size_1(entry: dict, folder: Path, script: str, dist: str) -> str:
    args = entry.get("args", [])
    codes = []
    for name, target in (("orig", script), ("dist", dist)):
        cwd = (folder / target).parent  # scripts read their data relative to their folder
        codes.append(run([sys.executable, Path(target).name, *args], cwd,
                         folder / f"ws1_{name}.txt", entry.get("timeout", 300)))
    if codes != [0, 0]:
        return f"exit codes original/conversion: {codes}"
    outs = []
    for name in ("orig", "dist"):
        text = (folder / f"ws1_{name}.txt").read_text().split("--- stderr ---")[0]
        outs.append([TIMING.sub("<t>", line) for line in text.splitlines()[2:]])
    diff = list(difflib.unified_diff(outs[0], outs[1], "original", "conversion", lineterm=""))
    return "stdout equal after masking timings" if not diff else "\n".join(diff[:40])


def judge(entry: dict, work: Path, mirrors: Path) -> None:
    folder = work / entry["id"]
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    git_dir = mirrors / entry["repo"].replace("/", "+") / "repo"
    base = folder / "orig" if entry.get("project") else folder
    for path in [entry["path"], *entry.get("files", [])]:
        src, _, dest = path.partition("=")  # "src=dest": placed at dest, else under root
        dest = base / (dest or Path(src).relative_to(entry.get("root", ".")))
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(git_show(git_dir, entry["commit"], src))
    target = base / Path(entry["path"]).relative_to(entry.get("root", "."))
    for old, new in entry.get("edits", []):
        text = target.read_text()
        if old not in text:
            raise SystemExit(f"{entry['id']}: edit target not found: {old!r}")
        target.write_text(text.replace(old, new))
    prepare_data(entry.get("data", "none"), base)
    script = str(target.relative_to(folder))
    if entry.get("project"):  # the whole folder converts, orig/ -> dist/
        convert_src, dist = "orig", "dist"
        dist_entry = "dist" + script[len("orig"):]
    else:
        convert_src = script
        dist = dist_entry = script[:-3] + "_dist.py"
    run([*DISTIFY, "convert", convert_src, "-o", dist, "--force", "--verbose"], folder,
        folder / "convert.txt", 120)
    subprocess.run(["diff", "-ru", convert_src, dist], cwd=folder, timeout=60,
                   stdout=(folder / "diff.txt").open("w"))
    summary = [f"{entry['id']}: converted by distify {SOURCE[0].name.split('_')[1]}"]
    if entry.get("run", True):
        summary.append("world size 1: " + world_size_1(entry, folder, script, dist_entry))
        verify = [*DISTIFY, "verify", script, dist_entry, "--cpu", "--timeout",
                  str(entry.get("timeout", 300))]
        if "steps" in entry:
            verify += ["--steps", str(entry["steps"])]
        run([*verify, "--", *entry.get("args", [])], folder, folder / "verify.txt",
            6 * entry.get("timeout", 300))
        summary.append((folder / "verify.txt").read_text().split("--- stderr ---")[0])
    (folder / "summary.txt").write_text("\n".join(summary) + "\n")
    print("\n".join(summary), flush=True)


def export_distify(rev: str, work: Path) -> Path:
    sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", rev], check=True,
                         capture_output=True, text=True, timeout=60).stdout.strip()
    dest = work / f"distify_{sha}"
    if not (dest / "distify" / "__init__.py").exists():
        dest.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", sha, "distify"], check=True,
                                 capture_output=True, timeout=120).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True, timeout=120)
    return dest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ids", nargs="*")
    parser.add_argument("--work", type=Path, default=Path("/tmp/rwl/run"))
    parser.add_argument("--mirrors", type=Path, default=Path("/work/.mirror"))
    parser.add_argument("--distify-commit", default="HEAD")
    opts = parser.parse_args()
    SOURCE.append(export_distify(opts.distify_commit, opts.work))
    entries = yaml.safe_load((HERE / "manifest.yaml").read_text())["scripts"]
    for entry in entries:
        if not opts.ids or entry["id"] in opts.ids:
            judge(entry, opts.work, opts.mirrors)


if __name__ == "__main__":
    main()
