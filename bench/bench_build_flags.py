"""Build flags, measured: what link-time optimisation costs at build time and gives at run
time, in one run.

    python bench/bench_build_flags.py [--variants PYBIND11,OFF,ON] [--rounds 3] [--jobs N]
    python bench/bench_build_flags.py --reuse --rounds 5     # runtime again, same builds

Each variant is a value of the CMake option STOKER_LTO (CMakeLists.txt): PYBIND11 (the
default: pybind11_add_module's own -flto on the extension's sources, the bindings), OFF, ON
(CMAKE_INTERPROCEDURAL_OPTIMIZATION: every target, the core too). For each, in one run:

  (a) the wheel built from this tree in a fresh build directory, as README's install does
      in a new clone (pip wheel --no-build-isolation, Release, without stoker._testing):
      wall time, CPU time of the build's processes, and the load average before and after
      (the CPU time grows less than the wall time on a machine busy with other work);
      the extension's size;
  (b) each variant's wheel installed into a folder of its own (pip --target), and, for
      --rounds rounds, variant after variant (in turn, the order reversed every round):
      `stoker bench` (fixed-size records, stoker num_threads 1 and 2, DataLoader
      num_workers=0 beside them) and bench/bench_images.py (JPEGs, RandomResizedCrop(224) +
      flip; stoker num_threads 1 and 2, the decoded cache, the bare per-image loop).

It prints each figure's median over the rounds with its range, and every variant's ratio to
the first. Runtime figures differ between variants only where the flags changed the code
that runs: a ratio inside the rounds' range is no difference. Needs the development venv
(scikit-build-core, pybind11, ninja) and Pillow for bench/make_jpegs.py; takes about 5
minutes per variant on 2 idle cores.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parent.parent


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def build(variant: str, work: Path, jobs: int) -> Dict[str, object]:
    """The wheel of one variant from a fresh build directory, timed; installed into
    work/<variant>/site."""
    out = work / variant
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in
           ("CMAKE_CXX_COMPILER_LAUNCHER", "CMAKE_C_COMPILER_LAUNCHER", "SKBUILD_CMAKE_DEFINE")}
    env["CMAKE_BUILD_PARALLEL_LEVEL"] = str(jobs)  # no compiler cache: a first build
    before, cpu0, t0 = load(), children_cpu(), time.perf_counter()
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation",
                    "--no-deps", f"-Cbuild-dir={out / 'build'}",
                    f"-Ccmake.define.STOKER_LTO={variant}",
                    "-Ccmake.define.STOKER_TESTING_MODULE=OFF", "-w", str(out / "wheel"),
                    str(ROOT)], check=True, env=env, cwd=out)
    wall, cpu, after = time.perf_counter() - t0, children_cpu() - cpu0, load()
    wheel = next((out / "wheel").glob("stoker-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(out / "site"), str(wheel)], check=True)
    core = next((out / "site" / "stoker").glob("_core*.so"))
    return {"wall": wall, "cpu": cpu, "load": f"{before} before, {after} after",
            "core_kib": core.stat().st_size / 1024, "wheel_kib": wheel.stat().st_size / 1024}


STOKER_BENCH = re.compile(r"^\s+(stoker threads=\d+)\s+([\d,]+) samples/s", re.M)
IMAGES_BENCH = re.compile(r"^\s+((?:stoker|ceiling)[^\n]*?)\s{2,}(\d+)$", re.M)


def run_benches(variant: str, work: Path, jpegs: Path, images: int) -> Dict[str, float]:
    """images/s and samples/s of one variant, one round (each benchmark is the median or
    best of its own repeats)."""
    env = {**os.environ, "PYTHONPATH": str(work / variant / "site")}
    check = subprocess.run([sys.executable, "-c", "import stoker, sys; print(stoker.__file__)"],
                           env=env, capture_output=True, text=True, check=True, cwd=work)
    assert str(work / variant / "site") in check.stdout, check.stdout  # this variant's build
    out: Dict[str, float] = {}
    r = subprocess.run([sys.executable, "-m", "stoker", "bench", "--workers", "0",
                        "--repeats", "3", "--quiet"], env=env, capture_output=True, text=True,
                       check=True, cwd=work)
    for name, value in STOKER_BENCH.findall(r.stdout):
        out[f"records: {name} (samples/s)"] = float(value.replace(",", ""))
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_images.py"), str(jpegs),
                        "--limit", str(images), "--skip-dataloader", "--repeats", "3"],
                       env=env, capture_output=True, text=True, check=True, cwd=work)
    for name, value in IMAGES_BENCH.findall(r.stdout):
        out[f"images: {name} (images/s)"] = float(value)
    if not out:
        raise RuntimeError(f"no figures in the benchmarks' output:\n{r.stdout}")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", default="PYBIND11,OFF,ON",
                   help="STOKER_LTO values to compare, the first the reference "
                        "(default PYBIND11,OFF,ON)")
    p.add_argument("--rounds", type=int, default=3, help="runtime rounds per variant")
    p.add_argument("--images", type=int, default=600, help="JPEGs for bench_images.py")
    p.add_argument("--jobs", type=int, default=os.cpu_count(), help="build jobs (all cores)")
    p.add_argument("--work", default=str(ROOT / "build" / "bench-build-flags"),
                   help="where the builds and data go")
    p.add_argument("--reuse", action="store_true",
                   help="runtime only: take each variant's build from an earlier run in --work")
    args = p.parse_args()
    variants: List[str] = args.variants.split(",")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    print(f"{os.cpu_count()} cores, load average {load()}; variants (STOKER_LTO): "
          f"{', '.join(variants)}", flush=True)

    builds = {}
    for v in variants:
        if args.reuse:
            if not (work / v / "site").is_dir():
                sys.exit(f"--reuse: no build of {v} in {work}")
            continue
        builds[v] = build(v, work, args.jobs)
        b = builds[v]
        print(f"build {v:<9} {b['wall'] / 60:5.2f} min wall, {b['cpu'] / 60:5.2f} min CPU "
              f"(load average {b['load']}); _core {b['core_kib']:,.0f} KiB, wheel "
              f"{b['wheel_kib']:,.0f} KiB", flush=True)

    jpegs = work / "jpegs"
    if len(list(jpegs.glob("*.jpg"))) < args.images:
        subprocess.run([sys.executable, str(ROOT / "bench" / "make_jpegs.py"), str(jpegs),
                        "--n", str(args.images)], check=True, stdout=subprocess.DEVNULL)
    runs: Dict[str, Dict[str, List[float]]] = {v: {} for v in variants}
    for r in range(args.rounds):
        order = variants if r % 2 == 0 else variants[::-1]
        for v in order:
            for name, value in run_benches(v, work, jpegs, args.images).items():
                runs[v].setdefault(name, []).append(value)
        print(f"round {r + 1}/{args.rounds} done (load average {load()})", flush=True)

    ref = variants[0]
    names = list(runs[ref])
    width = max(map(len, names))
    print(f"\nruntime, median of {args.rounds} rounds [range]; ratio to STOKER_LTO={ref}: "
          "the median of the rounds' ratios (each round runs the variants back to back, so "
          "its ratio is less at the mercy of the machine's load) [their range]")
    for name in names:
        cells = []
        for v in variants:
            vals = runs[v].get(name, [])
            if not vals:
                cells.append(f"{v}: -")
                continue
            cell = f"{v}: {statistics.median(vals):>9,.0f} [{min(vals):,.0f}-{max(vals):,.0f}]"
            base = runs[ref].get(name, [])
            if v != ref and len(base) == len(vals):
                ratios = [a / b for a, b in zip(vals, base)]
                cell += (f" {statistics.median(ratios):.2f}x [{min(ratios):.2f}-"
                         f"{max(ratios):.2f}]")
            cells.append(cell)
        print(f"  {name:<{width}}  " + "   ".join(cells))
    if builds:
        print(f"\nbuild time ratio to STOKER_LTO={ref} (wall, CPU): " + ", ".join(
            f"{v} {builds[v]['wall'] / builds[ref]['wall']:.2f}x, "
            f"{builds[v]['cpu'] / builds[ref]['cpu']:.2f}x" for v in variants[1:]))
    print(f"load average at the end: {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
