"""Wall time of one program run plain, under kreplay (N passes per launch) and under Nsight
Compute's kernel replay, all on the same machine in one call; checksums must match.

usage: python3 compare.py LIBKREPLAY_CUDA_SO PASSES REPEATS NCU(0/1) PROGRAM.py [...]
Each program: one unmeasured warm-up run, then REPEATS plain and REPEATS kreplay runs
interleaved (medians reported with every figure), then one `ncu --replay-mode kernel --set full
--clock-control none` run when NCU is 1 (extra ncu options from NCU_ARGS, e.g.
"--launch-skip 1 --launch-count 1"). COMPARE_WARMUP=0 skips the warm-up run. Prints one line
per run and a summary per program.
"""
import os
import statistics
import subprocess
import sys
import time

lib, passes, repeats, use_ncu = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
programs = sys.argv[5:]


def run(cmd, env_extra):
    env = dict(os.environ)
    env.pop("CUDA_INJECTION64_PATH", None)
    env.update(env_extra)
    t = time.monotonic()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    wall = time.monotonic() - t
    sums = [l for l in p.stdout.splitlines() if l.startswith("checksum")]
    return p.returncode, wall, sums, p.stdout, p.stderr


for prog in programs:
    name = os.path.basename(prog)
    py = [sys.executable, prog]
    if os.environ.get("COMPARE_WARMUP", "1") != "0":
        run(py, {})
    plain, kr = [], []
    ref = None
    ok = True
    for i in range(repeats):
        rc, t, sums, _, err = run(py, {})
        plain.append(t)
        ref = ref or sums
        ok &= rc == 0 and sums == ref and len(sums) > 0
        print(f"{name} plain run {i}: {t:.3f} s rc={rc}", flush=True)
        rc, t, sums, _, err = run(py, {"CUDA_INJECTION64_PATH": os.path.abspath(lib),
                                         "KREPLAY_CUDA_PASSES": passes})
        kr.append(t)
        same = rc == 0 and sums == ref
        ok &= same
        summary = [l for l in err.splitlines() if "summary" in l]
        print(f"{name} kreplay N={passes} run {i}: {t:.3f} s rc={rc} same_checksums={same}", flush=True)
        for l in summary:
            print(f"    {l}", flush=True)
        if not same:
            print(err[-3000:])
    mp, mk = statistics.median(plain), statistics.median(kr)
    print(f"SUMMARY {name}: plain median {mp:.3f} s (min {min(plain):.3f}, max {max(plain):.3f}); "
          f"kreplay N={passes} median {mk:.3f} s (min {min(kr):.3f}, max {max(kr):.3f}); "
          f"overhead {100 * (mk / mp - 1):+.1f}%; checksums {'identical' if ok else 'DIFFER'}", flush=True)
    for l in ref or []:
        print(f"    {l}")
    if use_ncu:
        cmd = ["ncu", "--replay-mode", "kernel", "--set", "full", "--clock-control", "none",
               "--target-processes", "all"] + os.environ.get("NCU_ARGS", "").split() + py
        rc, t, sums, out, err = run(cmd, {})
        npasses = sorted({l.split(" - ")[-1].strip() for l in (out + err).splitlines()
                          if "==PROF== Profiling" in l and " - " in l})
        kernels = sum(1 for l in (out + err).splitlines() if "==PROF== Profiling" in l)
        print(f"SUMMARY {name}: ncu --set full {t:.3f} s rc={rc} kernels profiled {kernels} "
              f"({', '.join(npasses)}); checksums {'identical' if sums == ref else 'DIFFER'}; "
              f"{t / mp:.1f}x the plain median", flush=True)
        if rc != 0 or sums != ref:
            print((out + err)[-3000:])
