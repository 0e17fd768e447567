"""Wall time of one program run plain, under kreplay (N passes per launch) and under Nsight
Compute's kernel replay, all on the same machine in one call; checksums must match.

usage: python3 compare.py LIBKREPLAY_CUDA_SO PASSES REPEATS NCU(0/1) PROGRAM.py [...]
Each program: one unmeasured warm-up run, then REPEATS plain and REPEATS kreplay runs
interleaved (plain, kreplay, plain, ...), then one `ncu --replay-mode kernel --set full
--clock-control none` run when NCU is 1 (extra ncu options from NCU_ARGS, e.g.
"--launch-skip 1 --launch-count 1"). Use 5 or more repeats: plain runs of a PyTorch program
vary by up to 40% between runs, nearly all of it in `import torch`.

Environment:
  COMPARE_WARMUP=0      skip the warm-up run;
  COMPARE_ENV="K=V,..." set for the kreplay runs only (e.g. KREPLAY_SNAPSHOT_SCOPE=referenced,
                        KREPLAY_RESTORE=writeset);
  COMPARE_SPLIT=0       run the program as it is; by default a Python program is started
                        through a wrapper that imports torch first and reports when the import
                        finished, so that the time after it (CUDA start, the program's work,
                        exit: all that kreplay can change) is reported beside the whole wall.

Prints one line per run (with kreplay's exit summary), then per program the median and the
spread (min-max) of each figure and the overhead of the medians, on the whole wall and on the
time after the import.
"""
import os
import re
import statistics
import subprocess
import sys
import time

lib, passes, repeats, use_ncu = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
programs = sys.argv[5:]
extra_env = dict(kv.split("=", 1) for kv in os.environ.get("COMPARE_ENV", "").split(",") if kv)
split = os.environ.get("COMPARE_SPLIT", "1") != "0"

# Imports torch, says on stderr how long after its start that took, then runs the program as
# `python3 PROGRAM` would (its own `import torch` finds the module loaded).
WRAPPER = (
    "import os, runpy, sys, time; t = time.time(); import torch; "
    "print(f'compare-import {time.time() - float(os.environ[\"COMPARE_T0\"]):.6f}', "
    "file=sys.stderr, flush=True); p = sys.argv[1]; sys.argv = sys.argv[1:]; "
    "sys.path.insert(0, os.path.dirname(os.path.abspath(p))); "
    "runpy.run_path(p, run_name='__main__')"
)

# Fields of kreplay's exit summary worth a median.
FIELDS = ("snapshot_ms", "restore_ms", "relaunch_ms", "drain_ms", "replay_ms", "restores",
          "copies", "copy_ms", "copy_wait_ms", "verified", "verified_ms", "verified_wait_ms",
          "hashes", "hash_ms", "hash_wait_ms", "auto_device", "auto_full", "callbacks",
          "callback_ms", "intercept_ms", "module_callbacks", "module_ms", "init_ms")


def run(cmd, env_extra):
    env = dict(os.environ)
    env.pop("CUDA_INJECTION64_PATH", None)
    env.update(env_extra)
    env["COMPARE_T0"] = repr(time.time())
    t = time.monotonic()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    wall = time.monotonic() - t
    sums = [l for l in p.stdout.splitlines() if l.startswith("checksum")]
    figures = {"wall": wall}
    for l in p.stderr.splitlines():
        if l.startswith("compare-import "):
            figures["after_import"] = wall - float(l.split()[1])
        if "summary" in l:
            for k, v in re.findall(r"(\w+)=([\d.]+)(?=\s|$)", l):
                if k in FIELDS:
                    figures[k] = float(v)
    return p.returncode, figures, sums, p.stdout, p.stderr


def spread(values):
    """median [min-max] of a list of figures."""
    return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


for prog in programs:
    name = os.path.basename(prog)
    py = [sys.executable, "-c", WRAPPER, prog] if split and prog.endswith(".py") else \
        [sys.executable, prog]
    if os.environ.get("COMPARE_WARMUP", "1") != "0":
        run(py, {})
    plain, kr = [], []
    ref = None
    ok = True
    kenv = {"CUDA_INJECTION64_PATH": os.path.abspath(lib), "KREPLAY_PASSES": passes,
            **extra_env}
    for i in range(repeats):
        rc, f, sums, _, err = run(py, {})
        plain.append(f)
        ref = ref or sums
        ok &= rc == 0 and sums == ref and len(sums) > 0
        print(f"{name} plain run {i}: {f['wall']:.3f} s rc={rc}"
              + (f" after_import={f['after_import']:.3f} s" if "after_import" in f else ""),
              flush=True)
        rc, f, sums, _, err = run(py, kenv)
        kr.append(f)
        same = rc == 0 and sums == ref
        ok &= same
        print(f"{name} kreplay N={passes} run {i}: {f['wall']:.3f} s rc={rc} same_checksums={same}"
              + (f" after_import={f['after_import']:.3f} s" if "after_import" in f else ""),
              flush=True)
        for l in err.splitlines():
            if "summary" in l:
                print(f"    {l}", flush=True)
        if not same:
            print(err[-3000:])
    label = f"kreplay N={passes}" + (f" ({os.environ['COMPARE_ENV']})" if extra_env else "")
    for key in ("wall", "after_import"):
        p = [f[key] for f in plain if key in f]
        k = [f[key] for f in kr if key in f]
        if len(p) == len(plain) and len(k) == len(kr) and p:
            mp, mk = statistics.median(p), statistics.median(k)
            print(f"SUMMARY {name} {key}: plain {spread(p)} s; {label} {spread(k)} s; "
                  f"overhead of the medians {100 * (mk / mp - 1):+.1f}% "
                  f"({mk - mp:+.3f} s)", flush=True)
    for key in FIELDS:
        k = [f[key] for f in kr if key in f]
        if k:
            print(f"SUMMARY {name} {key}: {spread(k)}", flush=True)
    mp = statistics.median(f["wall"] for f in plain)
    print(f"SUMMARY {name}: {repeats} + {repeats} runs; checksums "
          f"{'identical' if ok else 'DIFFER'}", flush=True)
    for l in ref or []:
        print(f"    {l}")
    if use_ncu:
        cmd = ["ncu", "--replay-mode", "kernel", "--set", "full", "--clock-control", "none",
               "--target-processes", "all"] + os.environ.get("NCU_ARGS", "").split() + \
            [sys.executable, prog]
        rc, f, sums, out, err = run(cmd, {})
        t = f["wall"]
        npasses = sorted({l.split(" - ")[-1].strip() for l in (out + err).splitlines()
                          if "==PROF== Profiling" in l and " - " in l})
        kernels = sum(1 for l in (out + err).splitlines() if "==PROF== Profiling" in l)
        print(f"SUMMARY {name}: ncu --set full {t:.3f} s rc={rc} kernels profiled {kernels} "
              f"({', '.join(npasses)}); checksums {'identical' if sums == ref else 'DIFFER'}; "
              f"{t / mp:.1f}x the plain median", flush=True)
        if rc != 0 or sums != ref:
            print((out + err)[-3000:])
