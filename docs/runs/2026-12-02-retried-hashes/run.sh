#!/bin/bash
cd "$(dirname "$0")"
K=./kreplay
{ echo "start $(date -u +%T) loadavg $(cat /proc/loadavg)"; grep '^cpu ' /proc/stat; } > meta.txt
$K bench --footprints 256M,1G --dirty 0,1,10,100 --passes 2,4,8,38 --replay-dirty 1,10 --replay-repeats 13 --replay-long-repeats 9 --csv matrix.csv > matrix.txt 2>&1
{ echo "after matrix $(date -u +%T) loadavg $(cat /proc/loadavg)"; grep '^cpu ' /proc/stat; } >> meta.txt
echo done >> meta.txt
