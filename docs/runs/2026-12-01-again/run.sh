#!/bin/bash
cd /tmp/qrun5
K=/tmp/qrun5/kreplay
stamp() { echo "== $1 $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) steal $(awk '/^cpu /{print $9}' /proc/stat)"; }
stamp start > stamps.txt
$K bench --footprints 1G --dirty 0 --tiers host --strategies full --passes 2,38 --replay-dirty 1,10 --replay-footprints 1G > replay1g.txt 2>&1
stamp replay1g-done >> stamps.txt
$K bench --footprints 256M,1G --dirty 0,1,10,100 --passes 2,4,8,38 --replay-dirty 1,10 --replay-repeats 13 --replay-long-repeats 9 --csv matrix.csv > matrix.txt 2>&1
stamp matrix-done >> stamps.txt
echo finished >> stamps.txt
