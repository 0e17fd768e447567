#!/bin/bash
# 04:58-05:03 UTC, build 71400c3 (the whole replays at 256 MiB and 38 passes only)
kreplay bench --footprints 256M --dirty 0 --tiers host --strategies full --passes 38 --replay-dirty 1,10 --replay-long-repeats 7 > replays_256m_38.txt 2>&1
