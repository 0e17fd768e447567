#!/bin/sh
# kreplay run over the CUDA workloads and a C tool, on a machine with a GPU.
#
# usage: sh cuda/tests/workloads/run_checks.sh BIN [PASSES]
#   BIN holds `kreplay` and `libkreplay.so` (cargo build --release -p kreplay -p kreplay-cli,
#   target/release/). Run from the repository root. Needs nvcc and cc for the C parts.
# device_counter.cu needs libcuda's development link (-lcuda).
# Every step runs `kreplay run --check`: the program's standard output (its checksums) must be
# the same with and without kreplay. Prints PASS/FAIL per step; exits 1 if any step failed.
set -u
BIN=$(cd "$1" && pwd)
PASSES=${2:-4}
OUT=${TMPDIR:-/tmp}/kreplay-run-checks
mkdir -p "$OUT"
failures=0

step() {
    name=$1
    shift
    echo "== $name: $*"
    if "$@"; then echo "PASS $name"; else echo "FAIL $name"; failures=$((failures + 1)); fi
}

# The example C tool's summary: every pass it ran got one ENQUEUE (ENTER/EXIT, user_data carried
# from one to the other) and one COMPLETE record, as on HSA, and so did every launch run once.
tool_records() {
    line=$(cat "$1") || return 1
    echo "$line"
    passes=$(echo "$line" | sed -n 's/.* \([0-9]*\) passes;.*/\1/p')
    single=$(echo "$line" | sed -n 's/.* completions in passes, \([0-9]*\) single;.*/\1/p')
    [ -n "$passes" ] && [ -n "$single" ] && [ "$passes" -gt 0 ] || return 1
    case "$line" in
    *"; $passes completions in passes, $single single; $passes enqueues in passes, $single single; 0 user_data errors"*) ;;
    *) return 1 ;;
    esac
}

# tool_work.c under `kreplay run --check` on add_one: its memsets write only its own buffer, so
# kreplay watches none of them (tool_work=0 in its summary) and reports no work lost.
tool_work_run() {
    "$BIN/kreplay" run --tool "$OUT/libtool_work.so" --check -- "$OUT/add_one" \
        2>"$OUT/tool_work.err"
    rc=$?
    tail -n 4 "$OUT/tool_work.err"
    [ "$rc" -eq 0 ] && grep -q " tool_work=0 .* tool_work_lost=0" "$OUT/tool_work.err" &&
        ! grep -q "may undo" "$OUT/tool_work.err"
}

# tool_work.c on tool_target.cu: the tool's two memsets into the application's buffer, made at
# PASS EXIT of pass 1, are kept by the restores after them (both quarters end at the tool's
# value plus the launches), the rest of the buffer holds one increment per launch, and kreplay's
# summary counts the two calls with nothing lost: 4 MiB kept from the 1D memset (its whole
# range), 3 MiB from the 2D one (the three bytes of each word it changed, found by comparison).
tool_target_run() {
    "$BIN/kreplay" run --tool "$OUT/libtool_work.so" -- "$OUT/tool_target" \
        >"$OUT/tool_target.out" 2>"$OUT/tool_target.err"
    rc=$?
    cat "$OUT/tool_target.out"
    tail -n 3 "$OUT/tool_target.err"
    [ "$rc" -eq 0 ] &&
        grep -q "set by cuMemsetD32 1048576 of 1048576, by cuMemsetD2D32 1048576 of 1048576, untouched 2097152 of 2097152" \
            "$OUT/tool_target.out" &&
        grep -q " tool_work=2 tool_work_kept_bytes=7340032 tool_work_lost=0" "$OUT/tool_target.err"
}

# tool_work.c's summary: memset pairs made, none failed, every read-back found its last value.
tool_work_counts() {
    line=$(cat "$1") || return 1
    echo "$line"
    case "$line" in
    "tool_work: 0 memset pairs"* | *": 0 kept, "*) return 1 ;;
    *" memset pairs, 0 failures; read back after the replay: "*" kept, 0 lost") ;;
    *) return 1 ;;
    esac
}

# cooperative.cu: the same cooperative kernel launched 12 times through the four entry points
# that make cooperative launches; every launch is replayed (12 launches, 12 replayed, PASSES
# passes each, none failed or declined) and the checksums are those of the run without kreplay.
cooperative_run() {
    env KREPLAY_SNAPSHOT_SCOPE="$1" "$BIN/kreplay" run --passes "$PASSES" --check \
        -o "$OUT/cooperative_$1.csv" -- "$OUT/cooperative" || return 1
    grep "^coop_step," "$OUT/cooperative_$1.csv"
    grep -q "^coop_step,12,12,$((12 * PASSES)),.*,0,-\$" "$OUT/cooperative_$1.csv"
}

# graph_alloc.cu: graph allocations written by kernels outside the graphs. The kernel given an
# allocation of a graph that has not run yet is declined (untracked_memory: no memory is behind
# it, so no snapshot may copy it); every launch that adds through the pointer kept in device
# memory is replayed (8 into the captured allocation, 8 into the node-by-node one), and the
# checksums are those of the run without kreplay.
graph_alloc_run() {
    "$BIN/kreplay" run --passes "$PASSES" --check -o "$OUT/graph_alloc.csv" \
        -- "$OUT/graph_alloc" || return 1
    grep -E "^_Z6add_ifPjmi,|^_Z11add_throughPKPjm," "$OUT/graph_alloc.csv"
    grep -q "^_Z6add_ifPjmi,1,0,.*untracked_memory:1\$" "$OUT/graph_alloc.csv" &&
        grep -q "^_Z11add_throughPKPjm,16,16,.*,0,-\$" "$OUT/graph_alloc.csv"
}

surface_reset_run() {
    "$BIN/kreplay" run --passes "$PASSES" --check -o "$OUT/surface_reset.csv" \
        -- "$OUT/surface" reset || return 1
    grep "^_Z4bumpPii," "$OUT/surface_reset.csv"
    grep -q "^_Z4bumpPii,4,4,.*,-\$" "$OUT/surface_reset.csv"
}

# threads.py: four Python threads on streams of their own, launching and allocating at once;
# run three times: a race between one thread's replay and another's launch need not show in one.
for w in inplace matmul_acc index_add feedback threads threads threads; do
    step "$w" "$BIN/kreplay" run --passes "$PASSES" --check -o "$OUT/$w.json" \
        -- python3 cuda/tests/workloads/$w.py
done

# PyTorch's expandable segments allocate with cuMemCreate/cuMemMap: the mapped ranges must be
# tracked and snapshotted like cuMemAlloc memory for the checksums to match.
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
step inplace_vmm "$BIN/kreplay" run --passes "$PASSES" --check -o "$OUT/inplace_vmm.json" \
    -- python3 cuda/tests/workloads/inplace.py
# The same under the referenced scope: a segment is mapped piece by piece, so a tensor spans
# several mappings and an argument pointing into its first must reach the ones after it.
step inplace_vmm_referenced env KREPLAY_SNAPSHOT_SCOPE=referenced "$BIN/kreplay" run \
    --passes "$PASSES" --check -o "$OUT/inplace_vmm_referenced.json" \
    -- python3 cuda/tests/workloads/inplace.py
unset PYTORCH_CUDA_ALLOC_CONF

# Half-precision GEMMs with accumulation: on Hopper cuBLAS stores through TMA descriptors, which
# the referenced scope must still find the output in.
step matmul_bf16_referenced env KREPLAY_SNAPSHOT_SCOPE=referenced "$BIN/kreplay" run \
    --passes "$PASSES" --check -o "$OUT/matmul_bf16_referenced.json" \
    -- python3 cuda/tests/workloads/matmul_bf16.py

# KREPLAY_SNAPSHOT_SCOPE=referenced: each launch snapshots what its arguments point into and its
# module's variables, not the device's every allocation.
step inplace_referenced env KREPLAY_SNAPSHOT_SCOPE=referenced "$BIN/kreplay" run \
    --passes "$PASSES" --check -o "$OUT/inplace_referenced.json" \
    -- python3 cuda/tests/workloads/inplace.py

if command -v nvcc >/dev/null; then
    nvcc -O2 -o "$OUT/add_one" cuda/tests/workloads/add_one.cu
    step add_one "$BIN/kreplay" run --passes "$PASSES" --check -o "$OUT/add_one.csv" \
        -- "$OUT/add_one"
    # __device__ variables written by kernels: restored between passes, or the counts are off.
    nvcc -O2 -o "$OUT/device_counter" cuda/tests/workloads/device_counter.cu -lcuda
    step device_counter "$BIN/kreplay" run --passes "$PASSES" --check \
        -o "$OUT/device_counter.csv" -- "$OUT/device_counter"
    step device_counter_referenced env KREPLAY_SNAPSHOT_SCOPE=referenced "$BIN/kreplay" run \
        --passes "$PASSES" --check -o "$OUT/device_counter_referenced.csv" \
        -- "$OUT/device_counter"
    # Device-side printf and malloc: kernels that call them run once (declined), and so does
    # every later launch once the device heap was used, so the lines print once and the heap
    # holds one run's blocks.
    nvcc -O2 -o "$OUT/device_runtime" cuda/tests/workloads/device_runtime.cu
    step device_runtime "$BIN/kreplay" run --passes "$PASSES" --check \
        -o "$OUT/device_runtime.csv" -- "$OUT/device_runtime"
    # A CUDA array written through a surface object: launches run once while it is live.
    nvcc -O2 -o "$OUT/surface" cuda/tests/workloads/surface.cu
    step surface "$BIN/kreplay" run --passes "$PASSES" --check -o "$OUT/surface.csv" \
        -- "$OUT/surface"
    # A surface object left live in a context that cudaDeviceReset destroys ends with it: the
    # four x += 1 launches (two before the reset, two after) are all replayed.
    step surface_reset surface_reset_run
    # A kernel waits for the host on one stream while the host launches on another: the drain
    # before a snapshot gives up after KREPLAY_DRAIN_TIMEOUT_MS and the launches run once.
    nvcc -O2 -o "$OUT/drain_stuck" cuda/tests/workloads/drain_stuck.cu
    step drain_stuck env KREPLAY_DRAIN_TIMEOUT_MS=2000 timeout 120 "$BIN/kreplay" run \
        --passes "$PASSES" --check -o "$OUT/drain_stuck.csv" -- "$OUT/drain_stuck"
    # Another thread is inside a synchronous copy that waits for such a kernel: the launches
    # waiting for the copy's call give up after KREPLAY_DRAIN_TIMEOUT_MS and run once.
    nvcc -O2 -o "$OUT/copy_stuck" cuda/tests/workloads/copy_stuck.cu
    step copy_stuck env KREPLAY_DRAIN_TIMEOUT_MS=2000 timeout 120 "$BIN/kreplay" run \
        --passes "$PASSES" --check -o "$OUT/copy_stuck.csv" -- "$OUT/copy_stuck"
    # One thread captures a graph in global mode while another launches x += 1: the capture
    # must succeed and every buffer hold its exact count of increments, as without kreplay.
    nvcc -O2 -o "$OUT/capture_overlap" cuda/tests/workloads/capture_overlap.cu
    step capture_overlap "$BIN/kreplay" run --passes "$PASSES" --check \
        -o "$OUT/capture_overlap.csv" -- "$OUT/capture_overlap"
    # While one thread's launches are replayed, another writes its own buffers by stream
    # memory operations, graph launches, cooperative launches (replayed themselves) and copies
    # from a CUDA array: each waits for the open replay window, so no restore undoes it.
    nvcc -O2 -o "$OUT/concurrent_writers" cuda/tests/workloads/concurrent_writers.cu -lcuda
    step concurrent_writers "$BIN/kreplay" run --passes "$PASSES" --check \
        -o "$OUT/concurrent_writers.csv" -- "$OUT/concurrent_writers"
    # Another thread queues waits on the replayed stream and then sets what they wait for with
    # a fenced stream write: each wait waits for the open window, so no pass waits for it. (A
    # wait queued just before a window may make its drain give up: the launch then runs once.)
    nvcc -O2 -o "$OUT/stream_wait" cuda/tests/workloads/stream_wait.cu -lcuda
    step stream_wait env KREPLAY_DRAIN_TIMEOUT_MS=500 timeout 300 "$BIN/kreplay" run \
        --passes "$PASSES" --check -o "$OUT/stream_wait.csv" -- "$OUT/stream_wait"
    # Cooperative launches (grid-wide synchronisation) are replayed like any other launch.
    nvcc -O2 -o "$OUT/cooperative" cuda/tests/workloads/cooperative.cu -lcuda
    step cooperative cooperative_run agent
    step cooperative_referenced cooperative_run referenced
    # A second context's kernels still running when a launch of the primary context is
    # replayed: the drain before its snapshot waits for every context of the device.
    nvcc -O2 -o "$OUT/two_contexts" cuda/tests/workloads/two_contexts.cu -lcuda
    step two_contexts "$BIN/kreplay" run --passes "$PASSES" --check \
        -o "$OUT/two_contexts.csv" -- "$OUT/two_contexts"
    # Two GPUs linked by peer access: kernels on each writing the other's memory, a peer copy,
    # and one thread per device launching at once. With one GPU it prints that it needs two.
    nvcc -O2 -o "$OUT/two_gpus" cuda/tests/workloads/two_gpus.cu
    step two_gpus "$BIN/kreplay" run --passes "$PASSES" --check \
        -o "$OUT/two_gpus.csv" -- "$OUT/two_gpus"
    # Peer access enabled on one thread while another's launches on GPU 0 are replayed, then
    # launches on GPU 1 that run once write GPU 0's memory: none lands inside a window on GPU 0.
    # With one GPU it prints that it needs two.
    nvcc -O2 -o "$OUT/peer_link" cuda/tests/workloads/peer_link.cu
    step peer_link "$BIN/kreplay" run --passes "$PASSES" --check \
        -o "$OUT/peer_link.csv" -- "$OUT/peer_link"
    # cudaDeviceReset and cuCtxDestroy between launches: kreplay lets go of what it held in
    # the context that ends, and of the allocations that end with it.
    nvcc -O2 -o "$OUT/device_reset" cuda/tests/workloads/device_reset.cu -lcuda
    step device_reset "$BIN/kreplay" run --passes "$PASSES" --check \
        -o "$OUT/device_reset.csv" -- "$OUT/device_reset"
    step device_reset_host env KREPLAY_SNAPSHOT_STORE=host "$BIN/kreplay" run \
        --passes "$PASSES" --check -o "$OUT/device_reset_host.csv" -- "$OUT/device_reset"
    # Kernels launched from device code: every pass of the parent starts its children again,
    # and their writes are restored with the parent's.
    nvcc -O2 -rdc=true -o "$OUT/device_launch" cuda/tests/workloads/device_launch.cu -lcudadevrt
    step device_launch "$BIN/kreplay" run --passes "$PASSES" --check \
        -o "$OUT/device_launch.csv" -- "$OUT/device_launch"
    step device_launch_referenced env KREPLAY_SNAPSHOT_SCOPE=referenced "$BIN/kreplay" run \
        --passes "$PASSES" --check -o "$OUT/device_launch_referenced.csv" \
        -- "$OUT/device_launch"
    # A graph runs a kernel that allocates from the device heap; later launches write the heap:
    # declined once the graph may have used it.
    nvcc -O2 -o "$OUT/device_heap_graph" cuda/tests/workloads/device_heap_graph.cu
    step device_heap_graph "$BIN/kreplay" run --passes "$PASSES" --check \
        -o "$OUT/device_heap_graph.csv" -- "$OUT/device_heap_graph"
    # Memory graphs allocate (captured cudaMallocAsync, cudaGraphAddMemAllocNode), written
    # directly and through a pointer kept in device memory once the graph ran; a launch between
    # the capture and the graph's first launch must never copy it.
    nvcc -O2 -o "$OUT/graph_alloc" cuda/tests/workloads/graph_alloc.cu
    step graph_alloc graph_alloc_run
    # Memory another process shares (CUDA IPC), written directly and through a pointer kept in
    # device memory: snapshotted as the opening process's device memory.
    nvcc -O2 -o "$OUT/ipc" cuda/tests/workloads/ipc.cu
    step ipc "$BIN/kreplay" run --passes "$PASSES" --check -o "$OUT/ipc.csv" -- "$OUT/ipc"
    # While one thread's launches are replayed, another launches kernels through the entry
    # points kreplay does not replay (cuLaunchGridAsync, cuLaunchCooperativeKernelMultiDevice):
    # each waits for the open replay window, so no restore undoes what it wrote.
    nvcc -O2 -o "$OUT/unreplayed_launches" cuda/tests/workloads/unreplayed_launches.cu -lcuda -ldl
    step unreplayed_launches "$BIN/kreplay" run --passes "$PASSES" --check \
        -o "$OUT/unreplayed_launches.csv" -- "$OUT/unreplayed_launches"
    # cudaDeviceReset with stream-ordered allocations live: the launches after it are
    # replayed, and no snapshot names memory the reset took (see the run's table).
    # A launch from a thread-local destructor at thread exit, and launches over memory whose
    # cuMemFree was refused during a capture (written through a pointer kept in memory).
    nvcc -O2 -o "$OUT/thread_exit" cuda/tests/workloads/thread_exit.cu
    step thread_exit "$BIN/kreplay" run --passes "$PASSES" --check \
        -o "$OUT/thread_exit.csv" -- "$OUT/thread_exit"
    nvcc -O2 -o "$OUT/reset_async" cuda/tests/workloads/reset_async.cu
    step reset_async "$BIN/kreplay" run --passes "$PASSES" --check \
        -o "$OUT/reset_async.csv" -- "$OUT/reset_async"
    # A VMM range mapped and left inaccessible while launches are replayed, made accessible
    # afterwards: no snapshot copies it before cuMemSetAccess.
    nvcc -O2 -o "$OUT/vmm_access" cuda/tests/workloads/vmm_access.cu -lcuda
    step vmm_access "$BIN/kreplay" run --passes "$PASSES" --check \
        -o "$OUT/vmm_access.csv" -- "$OUT/vmm_access"
    # An application allocating, in five ways, memory it has only while kreplay's kept shadow
    # is given back (a quarter of the device's memory replayed between the allocations), and
    # launches over a mapping whose cuMemUnmap was refused.
    nvcc -O2 -o "$OUT/shadow_room" cuda/tests/workloads/shadow_room.cu -lcuda
    step shadow_room "$BIN/kreplay" run --passes "$PASSES" --check \
        -o "$OUT/shadow_room.csv" -- "$OUT/shadow_room"
    # A kernel whose device-launched child prints: declined (run once), so each line is
    # printed once.
    nvcc -O2 -rdc=true -o "$OUT/device_launch_print" cuda/tests/workloads/device_launch_print.cu \
        -lcudadevrt
    step device_launch_print "$BIN/kreplay" run --passes "$PASSES" --check \
        -o "$OUT/device_launch_print.csv" -- "$OUT/device_launch_print"
    if command -v cc >/dev/null; then
        ln -sf libkreplay.so "$BIN/libkreplay.so.0"
        cc -std=c11 -O2 -fPIC -shared -I ffi/include examples/c-tool/pass_counter.c \
            -L "$BIN" -lkreplay -Wl,-rpath,"$BIN" -o "$OUT/libpass_counter.so"
        rm -f "$OUT/pass_counter.txt"
        export EXAMPLE_TOOL_PASSES="$PASSES" EXAMPLE_TOOL_OUTPUT="$OUT/pass_counter.txt"
        step c_tool "$BIN/kreplay" run --tool "$OUT/libpass_counter.so" --check \
            -- "$OUT/add_one"
        unset EXAMPLE_TOOL_PASSES EXAMPLE_TOOL_OUTPUT
        step c_tool_records tool_records "$OUT/pass_counter.txt"
        # A tool that sets a buffer of its own from every PASS EXIT: the memsets run once each,
        # the application's output is unchanged, and none of them is watched; then the same
        # tool writing into the application's buffer from PASS EXIT 1: that work is kept.
        cc -std=c11 -O2 -fPIC -shared -I ffi/include cuda/tests/workloads/tool_work.c \
            -L "$BIN" -lkreplay -ldl -Wl,-rpath,"$BIN" -o "$OUT/libtool_work.so"
        rm -f "$OUT/tool_work.txt"
        export TOOL_WORK_OUTPUT="$OUT/tool_work.txt"
        step tool_work tool_work_run
        unset TOOL_WORK_OUTPUT
        step tool_work_counts tool_work_counts "$OUT/tool_work.txt"
        nvcc -O2 -Xlinker --export-dynamic -o "$OUT/tool_target" \
            cuda/tests/workloads/tool_target.cu
        export TOOL_WORK_OUTPUT="$OUT/tool_target.txt"
        step tool_target tool_target_run
        unset TOOL_WORK_OUTPUT
    fi
fi
echo "$failures failure(s); outputs in $OUT"
[ "$failures" -eq 0 ]
