"""Run each workload with and without kreplay injected and compare the printed checksums.

usage: python3 run_workloads.py LIBKREPLAY_CUDA_SO PASSES WORKLOAD_DIR [C_PROGRAM]
Prints one line per workload: PASS/FAIL, wall times, and kreplay's exit summary.
KREPLAY_WORKLOADS=a.py,b.py picks the scripts (default: all four). Each program runs once
unmeasured first (imports, caches, clocks), then plain and injected, each timed once.
"""
import os
import subprocess
import sys
import time

lib, passes, wdir = sys.argv[1], sys.argv[2], sys.argv[3]
names = os.environ.get("KREPLAY_WORKLOADS", "inplace.py,matmul_acc.py,index_add.py,feedback.py")
programs = [[sys.executable, os.path.join(wdir, f)] for f in names.split(",") if f]
if len(sys.argv) > 4:
    programs.insert(0, [sys.argv[4]])


def run(cmd, inject):
    env = dict(os.environ)
    env.pop("CUDA_INJECTION64_PATH", None)
    if inject:
        env["CUDA_INJECTION64_PATH"] = os.path.abspath(lib)
        env["KREPLAY_CUDA_PASSES"] = passes
    t = time.monotonic()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    wall = time.monotonic() - t
    sums = [l for l in p.stdout.splitlines() if l.startswith("checksum")]
    summary = [l for l in p.stderr.splitlines() if "kreplay-cuda" in l]
    return p.returncode, wall, sums, summary, p.stderr


failures = 0
for cmd in programs:
    name = os.path.basename(cmd[-1])
    run(cmd, False)  # warm-up, not measured
    rc0, t0, s0, _, e0 = run(cmd, False)
    rc1, t1, s1, k1, e1 = run(cmd, True)
    ok = rc0 == 0 and rc1 == 0 and s0 == s1 and len(s0) > 0
    failures += not ok
    print(f"{'PASS' if ok else 'FAIL'} {name}: plain {t0:.2f}s, kreplay N={passes} {t1:.2f}s "
          f"({t1 / t0:.2f}x)", flush=True)
    for line in s0:
        print(f"    plain   {line}")
    for line in s1:
        print(f"    kreplay {line}")
    for line in k1:
        print(f"    {line}")
    if not ok:
        print(f"    rc {rc0}/{rc1}\n    plain stderr tail: {e0[-1500:]}\n    kreplay stderr tail: {e1[-3000:]}")
sys.exit(1 if failures else 0)
