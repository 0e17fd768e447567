#!/bin/bash
cd "$(dirname "$0")"
K=./kreplay
{ echo "1g start $(date -u +%T) loadavg $(cat /proc/loadavg)"; grep '^cpu ' /proc/stat; } >> meta.txt
$K bench-dispatch > dispatch.txt 2>&1
taskset -c 0 $K bench-dispatch > dispatch_pinned.txt 2>&1
$K bench --footprints 1G --dirty 0 --tiers host --strategies full --passes 2,38 --replay-dirty 1,10 --replay-footprints 1G --replay-long-repeats 5 > replays_1g.txt 2>&1
{ echo "1g end $(date -u +%T) loadavg $(cat /proc/loadavg)"; grep '^cpu ' /proc/stat; } >> meta.txt
echo done2 >> meta.txt
