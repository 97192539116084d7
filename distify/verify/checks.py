"""The checks of ``distify verify``, each on the runs' results (:class:`distify.verify.runs.Run`).

Each returns a :class:`Check`: passed or not, and one line of evidence. A check whose runs did
not finish fails, saying which run; it never passes for want of evidence.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from distify.verify.runs import Run


@dataclass(frozen=True)
class Check:
    number: int
    name: str
    ok: bool
    evidence: str

    def line(self) -> str:
        return f"{'✓' if self.ok else '✗'} {self.name}: {self.evidence}"


def _not_run(number: int, name: str, *runs: Run) -> Check | None:
    for run in runs:
        if run.timed_out:
            return Check(number, name, False, f"not checked: {run.name} timed out")
        if run.code != 0:
            return Check(number, name, False, f"not checked: {run.name} failed "
                                              f"(exit {run.code})")
        missing = [r for r in range(run.processes) if r not in run.records]
        if missing:
            return Check(number, name, False, f"not checked: {run.name} left no record for "
                                              f"rank {missing[0]}")
    return None


# ------------------------------------------------------------------- 1: world size 1 unchanged


def world_size_1(original: Run, converted: Run) -> Check:
    """Same stdout, same files (names, then bytes or tensor values), same final parameters."""
    name = "world size 1 unchanged"
    skipped = _not_run(1, name, original, converted)
    if skipped:
        return skipped
    ours, theirs = original.stdout[0].splitlines(), converted.stdout[0].splitlines()
    for number, (a, b) in enumerate(zip(ours, theirs), 1):
        if a != b:
            return Check(1, name, False, f"stdout line {number} differs: {a!r} (original) vs "
                                         f"{b!r} (conversion)")
    if len(ours) != len(theirs):
        return Check(1, name, False, f"stdout has {len(ours)} lines (original) vs "
                                     f"{len(theirs)} (conversion)")
    if original.files != converted.files:
        only = sorted(set(original.files) ^ set(converted.files))
        by = "the original" if only[0] in original.files else "the conversion"
        return Check(1, name, False, f"files written differ: {only[0]} is written by {by} only")
    for relative in original.files:
        difference = _file_difference(original.folder / relative, converted.folder / relative)
        if difference:
            return Check(1, name, False, f"{relative}: {difference}")
    a, b = original.records[0]["trained"], converted.records[0]["trained"]
    if not a:
        return Check(1, name, False, "the original trained no parameter that verify could see "
                                     "(no optimizer step, no training forward)")
    differing = _first_difference(a, b)
    if differing:
        return Check(1, name, False, f"final parameters differ: {differing}")
    named = f": {', '.join(original.files[:3])}" if original.files else ""
    files = f"{len(original.files)} file(s) written{named} (equal bytes, or equal values)"
    return Check(1, name, True, f"stdout identical ({len(ours)} lines), {files}, "
                                f"{len(a)} final parameters bit-identical")


def _file_difference(ours: Path, theirs: Path) -> str | None:
    if ours.read_bytes() == theirs.read_bytes():
        return None
    values = _torch_values(ours), _torch_values(theirs)
    if values[0] is None or values[1] is None:
        return "contents differ (neither a torch file nor a pickle: compared byte for byte)"
    if isinstance(values[0], _Pickled) or isinstance(values[1], _Pickled):
        return _tensors_difference(values[0], values[1])
    difference = _value_difference(values[0], values[1], "")
    return f"values differ at {difference or 'the top level'}" if difference is not False \
        else None


def _torch_values(path: Path):
    """What a ``torch.save`` file holds, else what a pickle holds (pickled tensors differ in
    bytes between runs with equal values), else None. A pickle is loaded as it is: the script
    that wrote it, in this run's folder, has just run with the same trust. A torch file that
    holds more than tensors and containers (a whole ``nn.Module``, ``torch.save(model)``) is
    loaded with its classes replaced by :class:`_Pickled` records (the script's classes live in
    its ``__main__``): only its tensors are compared then."""
    import pickle

    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception:
        pass
    try:
        return torch.load(path, map_location="cpu", weights_only=False,
                          pickle_module=_RecordingPickle)
    except Exception:
        pass
    try:
        with open(path, "rb") as file:
            return pickle.load(file)
    except Exception:
        return None


class _Pickled:
    """An object of a class found in the pickle (by name); its state as unpickled."""

    def __init__(self, *args, **kwargs) -> None:
        self.__dict__["_args"] = args

    def __setstate__(self, state) -> None:
        self.__dict__["_state"] = state


class _RecordingPickle:
    """A ``pickle_module`` for ``torch.load``: torch's own classes load as they are, every
    other class as a :class:`_Pickled` subclass named after it."""

    import pickle as _pickle

    class Unpickler(_pickle.Unpickler):
        def find_class(self, module: str, name: str):
            if module.split(".")[0] in ("torch", "collections", "builtins", "copyreg",
                                        "_codecs", "numpy"):
                return super().find_class(module, name)
            return type(name, (_Pickled,), {"__module__": module})

    load = staticmethod(lambda file, **kwargs: _RecordingPickle.Unpickler(file, **kwargs).load())
    __name__ = "distify_verify_pickle"


def _tensors_difference(a, b) -> str | None:
    """Where the tensors of two loaded torch files differ (by their path in the objects)."""
    ours, theirs = _tensor_leaves(a), _tensor_leaves(b)
    if not ours and not theirs:
        return "contents differ (pickled objects without tensors: compared byte for byte)"
    if set(ours) != set(theirs):
        only = sorted(set(ours) ^ set(theirs))[0]
        return f"tensor {only} is in {'the original' if only in ours else 'the conversion'}'s " \
               "file only (a pickled object: its tensors compared)"
    for where, tensor in ours.items():
        other = theirs[where]
        if tensor.dtype != other.dtype or tensor.shape != other.shape or \
                not __import__("torch").equal(tensor, other):
            return f"values differ at {where} (a pickled object: its tensors compared)"
    return None


def _tensor_leaves(obj, where: str = "", depth: int = 0) -> dict:
    import torch

    if isinstance(obj, torch.Tensor):
        return {where or "the top level": obj.detach()}
    if depth > 20:
        return {}
    if isinstance(obj, _Pickled):
        obj = obj.__dict__.get("_state", obj.__dict__.get("_args"))
    elif not isinstance(obj, (dict, list, tuple, type)) and isinstance(
            getattr(obj, "__dict__", None), dict):  # torch's own objects: an nn.Linear
        obj = obj.__dict__
    found: dict = {}
    if isinstance(obj, dict):
        for key, value in obj.items():
            found.update(_tensor_leaves(value, f"{where}[{key!r}]", depth + 1))
    elif isinstance(obj, (list, tuple)):
        for index, value in enumerate(obj):
            found.update(_tensor_leaves(value, f"{where}[{index}]", depth + 1))
    return found


def _value_difference(a, b, where: str):
    """False when equal; else where they first differ (a key path)."""
    import torch

    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        same = a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        return False if same else (where or "a tensor")
    if isinstance(a, dict) and isinstance(b, dict):
        if list(a) != list(b):
            return f"{where} keys {sorted(map(str, set(a) ^ set(b)))[:3]}" if set(a) != set(b) \
                else f"{where} key order"
        for key in a:
            found = _value_difference(a[key], b[key], f"{where}[{key!r}]")
            if found is not False:
                return found
        return False
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b) \
            and type(a) is type(b):
        for index, (x, y) in enumerate(zip(a, b)):
            found = _value_difference(x, y, f"{where}[{index}]")
            if found is not False:
                return found
        return False
    return False if type(a) is type(b) and a == b else (where or "the top level")


def _first_difference(a: list[dict], b: list[dict]) -> str | None:
    if len(a) != len(b):
        return f"{len(a)} trained parameters vs {len(b)}"
    for x, y in zip(a, b):
        if x["shape"] != y["shape"] or x["sha256"] != y["sha256"]:
            return f"first {x['name']} (shape {x['shape']})"
    return None


# ------------------------------------------------------------------------ 2: replicas identical


def replicas(job: Run, script: str = "") -> Check:
    """Every rank has the same trained parameters as rank 0 at the end of each training
    DataLoader iteration (the hooks' ``epochs``: digests taken where each rank's loop ended) and
    at the end; a failure names the first epoch end and parameter that differ."""
    name = "replicas identical"
    skipped = _not_run(2, name, job)
    if skipped:
        return skipped
    first = job.records[0]["trained"]
    if not first:
        return Check(2, name, False, "rank 0 trained no parameter that verify could see")
    epochs = job.records[0].get("epochs", [])
    for rank in range(1, job.processes):
        theirs = job.records[rank].get("epochs", [])
        for index, (ours, other) in enumerate(zip(epochs, theirs), 1):
            differing = _first_digest_difference(ours["params"], other["params"])
            if differing:
                where = f" (the loop over the DataLoader at {script}:{ours['line']})" \
                    if script and ours.get("line") else ""
                return Check(2, name, False, f"rank {rank} differs from rank 0 at the end of "
                                             f"training epoch {index}{where}: {differing}")
        if len(epochs) != len(theirs):
            return Check(2, name, False, f"rank 0 ended {len(epochs)} training DataLoader "
                                         f"loop(s), rank {rank} {len(theirs)}")
        differing = _first_difference(first, job.records[rank]["trained"])
        if differing:
            return Check(2, name, False, f"rank {rank} differs from rank 0 at the end: "
                                         f"{differing}")
    at = f"at {len(epochs)} training epoch end(s) and at the end" if epochs else \
        "at the end (no training DataLoader loop ended)"
    return Check(2, name, True, f"{len(first)} parameters bit-identical on {job.processes} "
                                f"ranks {at}")


def _first_digest_difference(a: list, b: list) -> str | None:
    if len(a) != len(b):
        return f"{len(a)} trained parameters vs {len(b)}"
    for (name, x), (_, y) in zip(a, b):
        if x != y:
            return f"first {name}"
    return None


# -------------------------------------------------------------------- 3: distinct data per rank


def distinct_data(job: Run, script: str, original: Run | None = None) -> Check:
    """The inputs of each of the first training forwards differ between every pair of ranks;
    or, where the original on 1 process itself fed every training forward the same inputs
    (full-batch training: a graph, a whole small data set), every rank does the same."""
    name = "distinct data per rank"
    skipped = _not_run(3, name, job)
    if skipped:
        return skipped
    inputs = {rank: job.records[rank]["inputs"] for rank in range(job.processes)}
    if not inputs[0]:
        return Check(3, name, False, "rank 0 ran no training forward that verify could see")
    full = _full_batch(original, inputs)
    if full:
        return Check(3, name, True, full)
    for index, first in enumerate(inputs[0]):
        seen: dict[str, int] = {}
        for rank in range(job.processes):
            if index >= len(inputs[rank]):
                continue
            digest = inputs[rank][index]["sha256"]
            if digest in seen:
                where = f" ({script}:{first['line']})" if first.get("line") else ""
                return Check(3, name, False, f"ranks {seen[digest]} and {rank} fed "
                                             f"{first['module']} the same batch (training "
                                             f"forward {index + 1}){where}: the data is not "
                                             "sharded")
            seen[digest] = rank
    count = min(len(found) for found in inputs.values())
    line = inputs[0][0].get("line")
    where = f" ({script}:{line})" if line else ""
    return Check(3, name, True, f"the first {count} training inputs of {inputs[0][0]['module']}"
                                f"{where} differ between the {job.processes} ranks")


def _full_batch(original: Run | None, inputs: dict[int, list[dict]]) -> str | None:
    """The evidence of full-batch training, or None: the original's first training forwards
    (2 or more) all had the same inputs, and so did every rank's of the conversion."""
    if original is None or not original.ok or 0 not in original.records:
        return None
    ours = {entry["sha256"] for entry in original.records[0]["inputs"]}
    theirs = {entry["sha256"] for found in inputs.values() for entry in found}
    if len(original.records[0]["inputs"]) < 2 or len(ours) != 1 or len(theirs) != 1 or \
            min(len(found) for found in inputs.values()) < 2:
        return None
    return (f"full-batch training: the original fed {inputs[0][0]['module']} the same inputs in "
            f"each of its first {len(original.records[0]['inputs'])} training forwards, and "
            f"every rank of the conversion does the same (nothing to shard; the ranks compute "
            "what 1 process does)")


# ------------------------------------------------------------------- 4: one printer, one writer


def one_writer(job: Run) -> Check:
    """Ranks other than 0 printed nothing on stdout and opened no file for writing."""
    name = "only the main process printed and wrote files"
    skipped = _not_run(4, name, job)
    if skipped:
        return skipped
    problems = []
    for rank in range(1, job.processes):
        printed = [line for line in job.stdout.get(rank, "").splitlines() if line.strip()]
        if printed:
            problems.append(f"rank {rank} printed {len(printed)} line(s), the first: "
                            f"{printed[0][:80]!r}")
        writes = job.records[rank]["writes"]
        if writes:
            more = f" and {len(writes) - 1} more file(s)" if len(writes) > 1 else ""
            problems.append(f"rank {rank} wrote {_shown(writes[0]['path'], job.folder)} "
                            f"({writes[0]['at']}){more}")
    if problems:
        return Check(4, name, False, "; ".join(problems[:2]))
    others = "rank 1" if job.processes == 2 else f"ranks 1-{job.processes - 1}"
    return Check(4, name, True, f"{others} printed nothing and wrote no file")


def _shown(path: str, folder: Path) -> str:
    try:
        return Path(path).resolve().relative_to(folder.resolve()).as_posix()
    except ValueError:
        return path


# ------------------------------------------------------- 5: evaluation metrics, frozen weights

RTOL = 1e-4
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


def eval_metrics(original: Run, job: Run) -> Check:
    """With frozen weights, the lines printed after each evaluation loop (see the hooks'
    ``after_eval``) are the same, with the same numbers within :data:`RTOL` (or one unit in the
    last printed digit, for numbers printed with a decimal point), in the original on 1 process
    and on rank 0 of the conversion on N processes."""
    name = "evaluation metrics equal with frozen weights"
    skipped = _not_run(5, name, original, job)
    if skipped:
        return skipped
    if not original.records[0].get("evaluations"):
        return Check(5, name, True, f"nothing to compare: {original.name} ran no evaluation "
                                    "loop (a DataLoader loop under no_grad or with the model in "
                                    "eval mode)")
    ours = _after_eval(original.stdout[0], original.records[0])
    theirs = _after_eval(job.stdout.get(0, ""), job.records[0])
    where = f"rank 0 of {job.name}"
    for (number, a), (_, b) in zip(ours, theirs):
        difference = _line_difference(a, b)
        if difference:
            return Check(5, name, False, f"stdout line {number} (after evaluation) differs: "
                                         f"{a.strip()!r} (the original) vs {b.strip()!r} "
                                         f"({where}){difference}")
    if len(ours) != len(theirs):
        return Check(5, name, False, f"{len(ours)} line(s) printed after evaluation by the "
                                     f"original vs {len(theirs)} by {where}")
    count = sum(len(_NUMBER.findall(line)) for _, line in ours)
    return Check(5, name, True, f"{len(ours)} line(s) printed after "
                                f"{original.records[0]['evaluations']} evaluation loop(s), "
                                f"{count} number(s) equal within rtol {RTOL:g}")


def _after_eval(stdout: str, record: dict) -> list[tuple[int, str]]:
    """(stdout line number from 1, line) of the non-blank lines printed after evaluation."""
    lines = stdout.split("\n")
    found = []
    for first, end in record.get("after_eval", []):
        for index in range(first, len(lines) if end is None else min(end, len(lines))):
            if lines[index].strip():
                found.append((index + 1, lines[index]))
    return found


def _line_difference(a: str, b: str) -> str | None:
    if _NUMBER.sub("#", a).strip() != _NUMBER.sub("#", b).strip():
        return ": the text differs"
    for x, y in zip(_NUMBER.findall(a), _NUMBER.findall(b)):
        if not _close(x, y):
            return f": {x} vs {y}"
    return None


def _close(x: str, y: str) -> bool:
    a, b = float(x), float(y)
    unit = max(_last_digit(x), _last_digit(y))
    return abs(a - b) <= RTOL * max(abs(a), abs(b)) + unit


def _last_digit(token: str) -> float:
    """One unit in the last printed digit of a number printed with a decimal point, else 0."""
    mantissa, _, exponent = token.lower().partition("e")
    if "." not in mantissa:
        return 0.0
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** (int(exponent or 0) - decimals)


# ---------------------------------------------------------------- 7: throughput (information)


def throughput(original: Run, job: Run) -> Check:
    """For information (always passes): the median time between optimizer steps of the original
    on 1 process and of rank 0 of the conversion on N processes."""
    name = "throughput (information)"
    times = [run.records.get(0, {}).get("step_seconds") for run in (original, job)]
    if None in times:
        return Check(7, name, True, "not measured: fewer than 2 optimizer steps in "
                                    f"{(original, job)[times.index(None)].name}")
    single, multiple = times
    threads = [run.records[0].get("threads") for run in (original, job)]
    shown = [f", {n} thread{'s' if n != 1 else ''}" if n else "" for n in threads]
    return Check(7, name, True, f"median time between optimizer steps: {single * 1e3:.1f} ms "
                                f"(the original, 1 process{shown[0]}), {multiple * 1e3:.1f} ms "
                                f"(rank 0 of the conversion, {job.processes} processes"
                                f"{shown[1]} each)" + (
                                    "; not like for like: the thread counts differ (torchrun "
                                    "sets OMP_NUM_THREADS=1), and a loaded CPU slows the "
                                    "multi-threaded run most" if len(set(threads)) > 1 else ""))


# ------------------------------------------------------------------------------- 6: no hang


def no_hang(runs: list[Run], timeout: float) -> Check:
    """Every run ended within the timeout; else the first that did not, with where each of its
    ranks was when it was stopped (their stacks, taken just before)."""
    name = "no hang"
    for run in runs:
        if run.timed_out:
            where = "; ".join(_position(run, rank) for rank in range(run.processes))
            return Check(6, name, False, f"{run.name} was still running after {timeout:g} s "
                                         f"and was stopped; {where}")
    longest = max(runs, key=lambda run: run.seconds)
    return Check(6, name, True, f"{len(runs)} runs ended within {timeout:g} s each (longest: "
                                f"{longest.name}, {longest.seconds:.1f} s)")


_FRAME = re.compile(r'\s*File "(.*)", line (\d+) in (\S+)')


def _position(run: Run, rank: int) -> str:
    """Where ``rank`` of ``run`` was: the innermost line of the script (or a module of its
    folder), the distify call it made, and the innermost call it was in (a collective)."""
    text = run.stacks.get(rank)
    if not text:
        return f"rank {rank} had ended (or showed no stack)"
    folder = str(run.folder.resolve()) + "/"
    for block in re.split(r"\n\s*\n", text):
        frames = [match.groups() for match in map(_FRAME.match, block.splitlines()) if match]
        ours = [index for index, frame in enumerate(frames) if frame[0].startswith(folder)]
        if not ours:
            continue  # a thread of a library (a watchdog, a loader's pin-memory thread)
        path, line, _ = frames[ours[0]]
        shown = f"rank {rank} at {path[len(folder):]}:{line}"
        inner = frames[:ours[0]]
        if not inner:
            return shown
        called = next((f"distify.{function}" for file, _, function in reversed(inner)
                       if f"{os.sep}distify{os.sep}runtime{os.sep}" in file), None)
        file, number, function = inner[0]
        waiting = f"waiting in {function} ({_short(file)}:{number})"
        return f"{shown}, {waiting}" + (f", called through {called}" if called else "")
    return f"rank {rank} was outside the script's code (its stack shows no line of it)"


def _short(path: str) -> str:
    for marker in (f"{os.sep}site-packages{os.sep}", f"{os.sep}lib{os.sep}python"):
        if marker in path:
            return path.rpartition(marker)[2]
    return os.path.basename(path)
