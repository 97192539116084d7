"""Re-run the real-script judgement of benchmarks/results/realworld.md: for each script of
manifest.yaml, copy its folder out of a mirror (a bare git dir of the repository), prepare
synthetic data (prep.py), convert it with distify (report, diff) and run ``distify verify`` on it
with the stubs of stubs/ on PYTHONPATH (no torchvision wheel, no network here).

Usage:
  python benchmarks/realworld/run.py [--mirrors /work/.mirror] [--out /tmp/realworld]
                                     [--jobs 2] [--verify/--no-verify] [ID ...]

A mirror of github owner/name is looked up as MIRRORS/owner+name/repo (what `fetch` gives) or
MIRRORS/owner/name(.git). Per script, OUT/ID/ holds: orig/ (the copied folder, data prepared),
convert.txt (the converter's report), diff.txt (unified diff of the entry), conv/ (project mode:
the converted folder), verify.txt (verify's text output, exit status on the last line). The
verdicts themselves are a human's reading of those files: see realworld.md.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
TEXT = (".py", ".txt", ".sh", ".md", ".yaml", ".yml", ".json", ".cfg")


def mirror_dir(mirrors: Path, repo: str) -> Path:
    owner, name = repo.split("/")
    for cand in (mirrors / f"{owner}+{name}" / "repo", mirrors / owner / name,
                 mirrors / owner / f"{name}.git"):
        if cand.exists():
            return cand
    raise SystemExit(f"run.py: no mirror of {repo} under {mirrors} (fetch github:{repo})")


def git(gitdir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", f"--git-dir={gitdir}", *args], capture_output=True,
                          timeout=120)


def copy_out(gitdir: Path, commit: str, folder: str, dest: Path) -> None:
    """Text files of ``folder`` at ``commit`` into ``dest`` (large blobs a mirror lacks are
    skipped: data files are made by prep.py instead)."""
    if git(gitdir, "cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        raise SystemExit(f"run.py: commit {commit} not in {gitdir}; fetch a newer snapshot")
    names = git(gitdir, "ls-tree", "-r", "--name-only", commit,
                *([] if folder == "." else ["--", folder])).stdout.decode().splitlines()
    prefix = "" if folder == "." else folder.rstrip("/") + "/"
    for name in names:
        if not name.endswith(TEXT):
            continue
        blob = git(gitdir, "show", f"{commit}:{name}")
        if blob.returncode != 0:
            continue
        target = dest / name[len(prefix):]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(blob.stdout)


def environment(entry: dict) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE / "stubs" / "vision"),
                                                      env.get("PYTHONPATH")]))
    env["PATH"] = os.pathsep.join([str(HERE / "stubs" / "bin"), env.get("PATH", "")])
    env.setdefault("RW_SEED", "0")  # see stubs/vision/_rw_seed.py
    env.update({k: str(v) for k, v in (entry.get("env") or {}).items()})
    return env


def run_one(entry: dict, defaults: dict, mirrors: Path, out: Path, verify: bool) -> str:
    e = {**defaults, **entry}
    work = out / e["id"]
    shutil.rmtree(work, ignore_errors=True)
    orig = work / "orig"
    orig.mkdir(parents=True)
    copy_out(mirror_dir(mirrors, e["repo"]), e["commit"], e["dir"], orig)
    if e.get("head"):
        # an edited copy, said so in the table: the first `head` lines of the entry only
        lines = (orig / e["entry"]).read_text().splitlines(keepends=True)
        (orig / e["entry"]).write_text("".join(lines[: e["head"]]))
    env = environment(e)
    for step in e.get("prep") or []:
        cmd = ([sys.executable, *step[1:]] if step[0] == "python"
               else [sys.executable, str(HERE / "prep.py"), *step])
        subprocess.run(cmd, cwd=orig, env=env, check=True, timeout=300)
    distify = [sys.executable, "-m", "distify"]
    entry_path = orig / e["entry"]
    if e.get("project"):
        target = [str(orig), "-o", str(work / "conv")]
        converted = work / "conv" / e["entry"]
    else:
        target = [str(entry_path), "-o", str(work / "converted" / Path(e["entry"]).name)]
        converted = None
        (work / "converted").mkdir()
    conv = subprocess.run([*distify, "convert", *target], capture_output=True, text=True,
                          env=env, timeout=300)
    (work / "convert.txt").write_text(conv.stdout + conv.stderr + f"\nexit {conv.returncode}\n")
    diff = subprocess.run([*distify, "convert", str(entry_path), "--diff"], capture_output=True,
                          text=True, env={**env, "NO_COLOR": "1"}, timeout=300)
    (work / "diff.txt").write_text(diff.stdout + diff.stderr)
    if not verify or e.get("run") is False:
        return f"{e['id']}: convert exit {conv.returncode}; not run ({e.get('why', '--no-verify')})"
    cmd = [*distify, "verify", str(entry_path), *([str(converted)] if converted else []),
           "--cpu", "--steps", str(e["steps"]), "--timeout", str(e["timeout"])]
    if e.get("eval_steps"):
        cmd += ["--eval-steps", str(e["eval_steps"])]
    cmd += ["--", *[str(a) for a in e.get("args") or []]]
    try:
        ver = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=orig,
                             timeout=6 * e["timeout"])
        text, rc = ver.stdout + ver.stderr, ver.returncode
    except subprocess.TimeoutExpired as exc:
        text, rc = f"{exc}\n", "timeout"
    (work / "verify.txt").write_text(" ".join(cmd) + "\n" + text + f"\nexit {rc}\n")
    last = [ln for ln in text.splitlines() if ln.startswith("distify verify:")]
    return f"{e['id']}: convert exit {conv.returncode}; verify exit {rc}: {last[-1] if last else ''}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ids", nargs="*")
    ap.add_argument("--mirrors", type=Path, default=Path("/work/.mirror"))
    ap.add_argument("--out", type=Path, default=Path("/tmp/realworld"))
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--no-verify", dest="verify", action="store_false")
    args = ap.parse_args()
    manifest = yaml.safe_load((HERE / "manifest.yaml").read_text())
    by_id = {s["id"]: s for s in manifest["scripts"]}
    unknown = [i for i in args.ids if i not in by_id]
    if unknown:
        raise SystemExit(f"run.py: not in manifest.yaml: {', '.join(unknown)}")
    todo = [by_id[i] for i in args.ids] if args.ids else manifest["scripts"]  # in the order given
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(run_one, s, manifest.get("defaults", {}), args.mirrors, args.out,
                               args.verify) for s in todo]
        for fut in concurrent.futures.as_completed(futures):
            print(fut.result(), flush=True)


if __name__ == "__main__":
    main()
