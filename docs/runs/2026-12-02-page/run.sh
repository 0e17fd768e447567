#!/bin/bash
cd "$(dirname "$0")"
K=./kreplay
stamp() { echo "== $1 $(date -u +%H:%M:%S) loadavg $(cut -d' ' -f1-3 /proc/loadavg) steal $(awk '/^cpu /{print $9}' /proc/stat)"; }
stamp start
$K bench --footprints 256M,1G --dirty 0,1,10,100 --passes 2,4,8,38 --replay-dirty 1,10 --replay-repeats 13 --replay-long-repeats 9 --csv matrix.csv > matrix.txt 2>&1
stamp matrix-done
$K bench-dispatch > dispatch.txt 2>&1
stamp dispatch-done
taskset -c 0 $K bench-dispatch > dispatch_pinned.txt 2>&1
stamp pinned-done
$K bench --footprints 1G --dirty 0 --tiers host --strategies full --passes 2,38 --replay-dirty 1,10 --replay-footprints 1G --replay-long-repeats 5 > replays_1g.txt 2>&1
stamp end
