"""Conversion speed of `distify convert` against the floor of any LibCST tool.

The floor is LibCST's own ``parse_module`` + code generation (``.bytes``) of the same file.
Targets (issue 23, on the generated 5,000-line script): distify costs at most 2.0x the floor as
whole processes and at most 1.5x in process (PRODUCT.md's bar was 2.5x), and grows linearly
with the file's length. Every size is shown against the same bars, and the verdict gives both:
the issue's target, and the worst size (distify costs about the same per line at every size;
the floor costs less per line on the smaller scripts, so their ratios are higher).

Measured on generated training scripts of about 500, 2,000 and 5,000 lines (gen_scripts.py):

1. whole processes: ``distify convert train.py -o out.py`` against
   ``python -c "<read, libcst.parse_module, .bytes, write>"``;
2. in process: ``distify.convert.engine.convert_source(source, path)`` against
   ``libcst.parse_module(source).bytes`` (rules loaded and everything warmed up first);
3. where the time goes, in process, on the largest file: stage times (each stage timed by a
   thin wrapper, median of a few runs) and one cProfile run.

Runs alternate (floor first, then distify first) and every number reported is a median; a
ratio is the median of the rounds' ratios. What is timed is CPU time by default (``--clock
wall`` for elapsed time): on the shared 2-core machine, elapsed time also counts the time other
work holds the CPUs (load 3-14 during the sessions that recorded these results).

    python benchmarks/convert_speed.py              # about 2-3 minutes on 2 cores
    python benchmarks/convert_speed.py --quick      # a smoke run, records nothing
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import math
import pstats
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import libcst as cst
from _common import (
    RESULTS,
    WORK,
    machine,
    median,
    precompile_distify,
    run_timed,
    spread,
    table,
    today,
    venv_bin,
    versions,
    write_results,
)
from gen_scripts import generate

TARGET_PROCESS = 2.0  # whole processes, start-up included (issue 23)
TARGET_INPROC = 1.5  # the conversion alone
FLOOR_CODE = ("import sys, libcst; data = open(sys.argv[1], 'rb').read(); "
              "open(sys.argv[2], 'wb').write(libcst.parse_module(data).bytes)")


# --------------------------------------------------------------------------- inputs
def make_inputs(sizes: list[int]) -> list[tuple[int, Path, int]]:
    folder = WORK / "convert"
    folder.mkdir(parents=True, exist_ok=True)
    inputs = []
    for size in sizes:
        text = generate(size)
        path = folder / f"train_{size}.py"
        path.write_text(text, encoding="utf-8")
        inputs.append((size, path, text.count("\n")))
    return inputs


# --------------------------------------------------------------------------- processes
#: "cpu" (the default): CPU time of the measured process (``process_time`` in process, user +
#: system of the child as a whole process); "wall": elapsed time. Set from ``--clock``.
CLOCK = "cpu"
CLOCK_WORDS = {"cpu": "CPU time", "wall": "wall clock"}


def now() -> float:
    return time.process_time() if CLOCK == "cpu" else time.perf_counter()


def paired(conv: list[float], floor: list[float]) -> float:
    """The median of the rounds' distify/floor ratios (each round times both, alternated)."""
    return median([c / f for c, f in zip(conv, floor)])


def bench_processes(inputs, rounds: int) -> dict[int, dict[str, list[float]]]:
    distify = venv_bin("distify")
    times: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for round_ in range(rounds):
        for size, path, _ in inputs:
            floor_out = path.with_name(f"floor_{size}.py")
            out = path.with_name(f"out_{size}.py")
            runs = {
                "floor": [sys.executable, "-c", FLOOR_CODE, str(path), str(floor_out)],
                "distify": [distify, "convert", str(path), "-o", str(out)],
            }
            order = ["floor", "distify"] if round_ % 2 == 0 else ["distify", "floor"]
            for name in order:
                out.with_suffix(".yaml").unlink(missing_ok=True)  # same work every run
                times[size][name].append(run_timed(runs[name], cpu=CLOCK == "cpu"))
    return times


# --------------------------------------------------------------------------- in process
def bench_in_process(inputs, rounds: int) -> dict[int, dict[str, list[float]]]:
    from distify.convert.engine import convert_source

    times: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    sources = {size: path.read_bytes() for size, path, _ in inputs}
    for size, path, _ in inputs:  # warm up: rule packs, lazy imports, caches
        result = convert_source(sources[size], str(path))
        assert result.status == "converted", result.status
        _ = cst.parse_module(sources[size]).bytes

    def floor(source: bytes, size: int) -> None:
        start = now()
        module = cst.parse_module(source)
        parsed = now()
        _ = module.bytes
        end = now()
        times[size]["parse"].append(parsed - start)
        times[size]["codegen"].append(end - parsed)
        times[size]["floor"].append(end - start)

    def convert(source: bytes, size: int, path: Path) -> None:
        start = now()
        convert_source(source, str(path))
        times[size]["distify"].append(now() - start)

    for round_ in range(rounds):
        for size, path, _ in inputs:
            gc.collect()
            if round_ % 2 == 0:
                floor(sources[size], size)
                gc.collect()
                convert(sources[size], size, path)
            else:
                convert(sources[size], size, path)
                gc.collect()
                floor(sources[size], size)
    return times


# --------------------------------------------------------------------------- stages
def stage_times(path: Path, rounds: int) -> tuple[dict[str, float], float, list[str]]:
    """Median time (``--clock``) of each stage of ``convert_source``, timed by thin wrappers."""
    import distify.analysis.facts as facts_module
    import distify.convert.engine as engine

    source = path.read_bytes()
    acc: dict[str, float] = defaultdict(float)
    missing: list[str] = []
    patches: list[tuple[object, str, object]] = []

    def wrap(owner, name: str, label: str) -> None:
        original = getattr(owner, name, None)
        if original is None:
            missing.append(f"{getattr(owner, '__name__', owner)}.{name}")
            return

        def timed(*args, **kwargs):
            start = now()
            try:
                return original(*args, **kwargs)
            finally:
                acc[label] += now() - start

        patches.append((owner, name, original))
        setattr(owner, name, timed)

    wrap(engine, "parse_ast", "ast parse (`parse_ast`)")
    wrap(facts_module, "convert_facts", "whole-file facts (`FileModel.facts`)")
    wrap(engine, "_parse_cst", "LibCST parse (`_parse_cst`)")
    wrap(engine, "_add_import", "add the import (`_add_import`)")
    wrap(engine, "_located", "report lines: codegen with line recording (`_located`)")
    for name in ("stays_on_cpu", "forward_factories", "fresh_models"):
        wrap(engine, name, f"after the rewrite: `{name}` (a walk of the output)")

    base = engine.DistifyTransformer
    transform_label = "transform (`traverse.rewrite(module, DistifyTransformer)`)"

    class TimedTransformer(base):  # type: ignore[misc, valid-type]
        def visit_Module(self, node):
            self._bench_start = now()
            parent = getattr(super(), "visit_Module", None)
            return parent(node) if parent else True

        def leave_Module(self, original, updated):
            result = super().leave_Module(original, updated)
            acc[transform_label] += now() - self._bench_start
            return result

    patches.append((engine, "DistifyTransformer", base))
    engine.DistifyTransformer = TimedTransformer
    bytes_property = cst.Module.__dict__["bytes"]
    codegen_label = "final codegen (`updated.bytes`)"

    def timed_bytes(module):
        start = now()
        try:
            return bytes_property.fget(module)
        finally:
            acc[codegen_label] += now() - start

    cst.Module.bytes = property(timed_bytes)
    samples: dict[str, list[float]] = defaultdict(list)
    totals = []
    try:
        engine.convert_source(source, str(path))  # warm-up
        for _ in range(rounds):
            acc.clear()
            gc.collect()
            start = now()
            engine.convert_source(source, str(path))
            totals.append(now() - start)
            known = sum(acc.values())
            for label, value in acc.items():
                samples[label].append(value)
            samples["other (FileResult, report items, glue)"].append(totals[-1] - known)
    finally:
        cst.Module.bytes = bytes_property
        for owner, name, original in reversed(patches):
            setattr(owner, name, original)
    return {label: median(values) for label, values in samples.items()}, median(totals), missing


def profile(path: Path) -> tuple[list[tuple[str, float]], float, str, str]:
    """One cProfile run of ``convert_source``: time by direct callee, and the hottest functions."""
    from distify.convert.engine import convert_source

    source = path.read_bytes()
    convert_source(source, str(path))  # warm-up
    profiler = cProfile.Profile()
    profiler.enable()
    convert_source(source, str(path))
    profiler.disable()
    stats = pstats.Stats(profiler)
    root = next(key for key in stats.stats if key[2] == "convert_source"
                and key[0].endswith("engine.py"))
    total = stats.stats[root][3]
    by_callee: list[tuple[str, float]] = []

    def expand(parent, depth: int) -> None:
        """Callees of ``parent`` by time; the engine's own helpers are expanded in turn."""
        children = []
        for key, (_, _, _, _, callers) in stats.stats.items():
            if parent in callers and callers[parent][3] >= 0.001 * total:
                children.append((key, callers[parent][3]))
        for key, cumulative in sorted(children, key=lambda item: -item[1]):
            by_callee.append((f"{'↳ ' * depth}`{Path(key[0]).name}:{key[2]}`", cumulative))
            if key[0].endswith(("convert/engine.py",)) and depth < 3:
                expand(key, depth + 1)

    expand(root, 0)

    def listing(sort: str, limit: int, restrict: str | None = None) -> str:
        buffer = io.StringIO()
        view = pstats.Stats(profiler, stream=buffer)
        view.strip_dirs().sort_stats(sort)
        if restrict:
            view.print_stats(restrict, limit)
        else:
            view.print_stats(limit)
        lines = buffer.getvalue().splitlines()
        start = next(i for i, line in enumerate(lines) if line.strip().startswith("ncalls"))
        return "\n".join(lines[start:]).rstrip()

    hottest = listing("tottime", 20)
    distify_stats = pstats.Stats(profiler)
    distify_keys = [key for key in distify_stats.stats if "/distify/" in key[0]]
    rows = sorted(((distify_stats.stats[k][3], distify_stats.stats[k][2],
                    distify_stats.stats[k][1], f"{Path(k[0]).parent.name}/{Path(k[0]).name}"
                    f":{k[1]}({k[2]})") for k in distify_keys), reverse=True)[:20]
    own = "\n".join(f"{cum:8.3f}s cum {tot:8.3f}s own {calls:8d} calls  {name}"
                    for cum, tot, calls, name in rows)
    return by_callee, total, hottest, own


# --------------------------------------------------------------------------- report
def slope(points: list[tuple[int, float]]) -> float:
    """Exponent k in time ~ lines**k, from the smallest and largest sizes."""
    (l0, t0), (l1, t1) = points[0], points[-1]
    return math.log(t1 / t0) / math.log(l1 / l0)


def render(args, inputs, proc, inproc, stages, stage_total, missing, prof) -> str:
    distify = venv_bin("distify")
    out = ["# Conversion speed: `distify convert` vs the LibCST floor\n",
           f"- date: {today()}",
           f"- machine: {machine()}",
           f"- versions: {versions('libcst', 'click', 'pyyaml')}",
           f"- command: `python benchmarks/convert_speed.py"
           f"{' --rounds-process %d' % args.rounds_process if args.rounds_process != 7 else ''}"
           f"{' --rounds-inproc %d' % args.rounds_inproc if args.rounds_inproc != 9 else ''}`",
           f"- inputs: generated by `benchmarks/gen_scripts.py` "
           f"({', '.join(f'{lines} lines' for _, _, lines in inputs)})",
           f"- targets (issue 23, on the ~5,000-line script): distify ≤ {TARGET_PROCESS}× the "
           f"floor as whole processes, ≤ {TARGET_INPROC}× in process; linear in size (every "
           "size is shown against the same bars)",
           f"- {args.bytecode}",
           ""]

    out += ["## Whole processes\n",
            f"`{Path(distify).name} convert train_N.py -o out_N.py` (report to /dev/null, launch "
            "config written each run) against `python -c \"<read; libcst.parse_module(data).bytes;"
            f" write>\"`. {args.rounds_process} alternated rounds; {CLOCK_WORDS[CLOCK]}: medians "
            "(min–max) in ms, ratio the median of the rounds' ratios.\n"]
    rows = []
    for size, _, lines in inputs:
        floor, conv = proc[size]["floor"], proc[size]["distify"]
        ratio = paired(conv, floor)
        rows.append([str(lines), f"{median(floor) * 1e3:.0f} ({spread(floor)})",
                     f"{median(conv) * 1e3:.0f} ({spread(conv)})", f"{ratio:.2f}×",
                     "meets" if ratio <= TARGET_PROCESS else "**misses**"])
    out += [table(["lines", "floor process", "distify process", "ratio", f"≤ {TARGET_PROCESS}×"],
                  rows), ""]

    out += ["## In process\n",
            "`convert_source(source, path)` against `libcst.parse_module(source)` + `.bytes`, "
            f"warmed up, {args.rounds_inproc} alternated rounds; {CLOCK_WORDS[CLOCK]}: medians "
            "in ms, ratio the median of the rounds' ratios.\n"]
    rows = []
    conv_points, floor_points = [], []
    for size, _, lines in inputs:
        t = inproc[size]
        floor, conv = median(t["floor"]), median(t["distify"])
        ratio = paired(t["distify"], t["floor"])
        conv_points.append((lines, conv))
        floor_points.append((lines, floor))
        rows.append([str(lines), f"{median(t['parse']) * 1e3:.0f}",
                     f"{median(t['codegen']) * 1e3:.0f}",
                     f"{floor * 1e3:.0f} ({spread(t['floor'])})",
                     f"{conv * 1e3:.0f} ({spread(t['distify'])})", f"{ratio:.2f}×",
                     "meets" if ratio <= TARGET_INPROC else "**misses**",
                     f"{conv / lines * 1e6:.0f}", f"{floor / lines * 1e6:.0f}"])
    out += [table(["lines", "parse", "codegen", "floor", "distify", "ratio", f"≤ {TARGET_INPROC}×",
                   "distify µs/line", "floor µs/line"], rows), ""]
    k_conv, k_floor = slope(conv_points), slope(floor_points)
    linear = k_conv <= 1.10 or k_conv <= k_floor + 0.05
    drift = (conv_points[-1][1] / floor_points[-1][1]) / (conv_points[0][1] / floor_points[0][1])
    out += [f"Growth (time ∝ lines^k between the smallest and largest file): distify k = "
            f"{k_conv:.2f}, floor k = {k_floor:.2f}; the distify/floor ratio changes by "
            f"{drift:.2f}× from the smallest to the largest file — "
            f"{'linear' if linear else '**faster than linear**'} (linear: k ≤ 1.10, or no "
            "more than 0.05 above the floor's own k, since LibCST's parse itself is not "
            "perfectly linear here).", ""]

    worst_process = max(paired(proc[size]["distify"], proc[size]["floor"])
                        for size, _, _ in inputs)
    worst_inproc = max(paired(inproc[size]["distify"], inproc[size]["floor"])
                       for size, _, _ in inputs)
    def verdict(ratio: float, target: float) -> str:
        return f"{ratio:.2f}× ({'meets' if ratio <= target else '**misses**'} ≤ {target}×)"

    size, _, lines = inputs[-1]
    out += [f"**Verdict:** on the largest script ({lines} lines, issue 23's target): as whole "
            f"processes {verdict(paired(proc[size]['distify'], proc[size]['floor']), TARGET_PROCESS)}"
            f", in process "
            f"{verdict(paired(inproc[size]['distify'], inproc[size]['floor']), TARGET_INPROC)}; "
            f"growth {'linear' if linear else '**faster than linear**'}. Worst of every size: "
            f"whole processes {verdict(worst_process, TARGET_PROCESS)}, in process "
            f"{verdict(worst_inproc, TARGET_INPROC)}.", ""]

    largest = inputs[-1]
    out += [f"## Where the time goes ({largest[2]} lines, in process)\n",
            f"{CLOCK_WORDS[CLOCK][0].upper()}{CLOCK_WORDS[CLOCK][1:]}, each stage timed by a "
            "thin wrapper, median of "
            f"{args.rounds_stages} runs "
            f"(total {stage_total * 1e3:.0f} ms; floor for this file "
            f"{median(inproc[largest[0]]['floor']) * 1e3:.0f} ms):\n"]
    rows = [[label, f"{value * 1e3:.0f}", f"{value / stage_total * 100:.0f}%",
             f"{value / median(inproc[largest[0]]['floor']):.2f}×"]
            for label, value in sorted(stages.items(), key=lambda item: -item[1])]
    out += [table(["stage", "ms", "share", "× floor"], rows), ""]
    if missing:
        out += [f"(stages not found, so counted under other: {', '.join(missing)})", ""]
    by_callee, prof_total, hottest, own = prof
    out += [f"cProfile, one run (profiler overhead inflates Python-heavy stages; total "
            f"{prof_total:.2f} s). Cumulative time by callee of `convert_source` (the engine's "
            "own helpers expanded, ↳):\n"]
    out += [table(["callee", "s", "share"],
                  [[name, f"{value:.3f}", f"{value / prof_total * 100:.0f}%"]
                   for name, value in by_callee]), ""]
    out += ["Hottest functions by own time:\n", "```", hottest, "```", "",
            "distify's own functions by cumulative time:\n", "```", own, "```", ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[500, 2000, 5000])
    parser.add_argument("--rounds-process", type=int, default=7)
    parser.add_argument("--rounds-inproc", type=int, default=9)
    parser.add_argument("--rounds-stages", type=int, default=3)
    parser.add_argument("--quick", action="store_true",
                        help="1 round of everything, print only (a smoke run)")
    parser.add_argument("--results", type=Path, default=RESULTS / "convert.md")
    parser.add_argument("--no-record", action="store_true", help="print, do not write results")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                        help="what to time (cpu: not the time other work holds the CPUs)")
    args = parser.parse_args(argv)
    global CLOCK
    CLOCK = args.clock
    if args.quick:
        args.rounds_process = args.rounds_inproc = args.rounds_stages = 1
        args.no_record = True
    inputs = make_inputs(sorted(args.sizes))
    args.bytecode = precompile_distify()
    started = time.perf_counter()
    print("processes ...", file=sys.stderr)
    proc = bench_processes(inputs, args.rounds_process)
    print("in process ...", file=sys.stderr)
    inproc = bench_in_process(inputs, args.rounds_inproc)
    print("stages and profile ...", file=sys.stderr)
    stages, stage_total, missing = stage_times(inputs[-1][1], args.rounds_stages)
    prof = profile(inputs[-1][1])
    text = render(args, inputs, proc, inproc, stages, stage_total, missing, prof)
    text += f"\n(benchmark wall time {time.perf_counter() - started:.0f} s)\n"
    print(text)
    if not args.no_record:
        write_results(args.results, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
