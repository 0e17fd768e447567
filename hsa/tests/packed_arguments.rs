//! Kernel arguments the scan used to miss: a pointer at a 4-byte boundary (a packed struct
//! passed by value) and a pointer one past an allocation's end (a kernel walking back from it):
//! both were replayed with their memory unrestored (x += 3 after 3 passes). Beside them, cases
//! that behaved as documented.

#[macro_use]
#[allow(dead_code)]
mod support;

use std::sync::atomic::{AtomicU32, Ordering};

use kreplay_drain::DrainConfig;
use kreplay_hsa::InstallOptions;
use kreplay_passloop::{LoopEnd, ReplayOutcome};
use kreplay_snapshot::{SnapshotConfig, SnapshotScope};
use kreplay_softhsa::WorkGroup;
use support::app::{self, App, Aql, Pools, Ptr, WAIT};
use support::tool::{Script, TestHooks};

static RUNS: AtomicU32 = AtomicU32::new(0);

/// Packed: the pointer sits at offset 4 (4-byte aligned, not 8).
#[repr(C, packed)]
#[derive(Clone, Copy)]
struct Packed {
    len: u32,
    buf: u64,
    pad: u32,
}

fn add_one_packed(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries this argument block.
    let args: Packed = unsafe { group.kernargs() };
    if group.group_id() == [0, 0, 0] {
        RUNS.fetch_add(1, Ordering::SeqCst);
    }
    let (len, buf) = (args.len, args.buf);
    for [i, _, _] in group.work_items() {
        if i < len {
            // SAFETY: the buffer holds `len` u32; each work-item owns index `i`.
            unsafe { *(buf as *mut u32).add(i as usize) += 1 };
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy)]
struct EndArgs {
    end: u64,
    len: u32,
    pad: u32,
}

/// `end[-1 - i] += 1`: the argument is one past the end of the buffer.
fn add_one_before_end(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries this argument block.
    let args: EndArgs = unsafe { group.kernargs() };
    if group.group_id() == [0, 0, 0] {
        RUNS.fetch_add(1, Ordering::SeqCst);
    }
    for [i, _, _] in group.work_items() {
        if i < args.len {
            // SAFETY: `len` u32 lie before `end`; each work-item owns one.
            unsafe { *(args.end as *mut u32).sub(1 + i as usize) += 1 };
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy)]
struct TableArgs {
    table: u64,
    len: u32,
    pad: u32,
}

/// `table[0][i] += 1`: the buffer is reached only through a pointer stored in memory.
fn add_one_through_table(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries this argument block.
    let args: TableArgs = unsafe { group.kernargs() };
    if group.group_id() == [0, 0, 0] {
        RUNS.fetch_add(1, Ordering::SeqCst);
    }
    // SAFETY: the table holds one pointer, written before the dispatch.
    let buf = unsafe { *(args.table as *const u64) };
    for [i, _, _] in group.work_items() {
        if i < args.len {
            // SAFETY: the buffer holds `len` u32; each work-item owns index `i`.
            unsafe { *(buf as *mut u32).add(i as usize) += 1 };
        }
    }
}

struct Env {
    app: App,
    hooks: std::sync::Arc<TestHooks>,
    pools: [Pools; 2],
}

fn setup(snapshot: SnapshotConfig) -> Env {
    let hooks = TestHooks::new(0);
    let app = app::install(
        hooks.clone(),
        InstallOptions {
            snapshot,
            drain: DrainConfig::new(WAIT),
            ..Default::default()
        },
    );
    hooks.configure_replay(true);
    hooks.set_script(Script::passes(3));
    let pools = [app.pools(app.gpus[0]), app.pools(app.gpus[1])];
    Env { app, hooks, pools }
}

fn values(len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| 7 + 5 * i).collect()
}

fn plus_one(v: &[u32]) -> Vec<u32> {
    v.iter().map(|x| x + 1).collect()
}

impl Env {
    fn run<T: Copy>(&self, name: &'static str, f: fn(&WorkGroup), args: T, len: u32) -> u64 {
        let kernel = kreplay_softhsa::register_kernel(name, f);
        let q = self.app.queue(self.app.gpus[0]);
        let done = self.app.signal(1);
        let args = self.app.kernargs(&self.pools[0], args);
        self.app
            .dispatch(q, Aql::dispatch(kernel, len.max(1), 64, args, done));
        assert_eq!(self.app.wait_zero(done), 0);
        let ids: Vec<u64> = self
            .hooks
            .configured_dispatches()
            .iter()
            .map(|i| i.dispatch_id)
            .collect();
        assert_eq!(ids.len(), 1);
        ids[0]
    }
    fn outcome(&self, id: u64) -> ReplayOutcome {
        self.hooks.finished_record(id).outcome
    }
}

fn assert_once(env: &Env, id: u64, buf: Ptr, init: &[u32]) {
    let got = env.app.read(buf, init.len());
    let outcome = env.outcome(id);
    let runs = RUNS.load(Ordering::SeqCst);
    assert_eq!(
        got[..4],
        plus_one(init)[..4],
        "one run's result expected; outcome {outcome:?}, kernel ran {runs} times"
    );
    assert_eq!(got, plus_one(init));
}

scenarios! {
    /// A packed argument block: the pointer is 4-byte aligned. Host memory (never in agent scope).
    fn packed_pointer_into_host_memory_is_applied_once() {
        let env = setup(SnapshotConfig::default());
        let init = values(64);
        let buf = env.app.buffer(env.app.host_pool(), &init);
        let id = env.run("packed_add_one_packed", add_one_packed, Packed { len: 64, buf: buf.0, pad: 0 }, 64);
        assert_once(&env, id, buf, &init);
    }

    /// The same, fine-grained memory of the agent.
    fn packed_pointer_into_fine_memory_is_applied_once() {
        let env = setup(SnapshotConfig::default());
        let init = values(64);
        let buf = env.app.buffer(env.pools[0].fine, &init);
        let id = env.run("packed_add_one_packed", add_one_packed, Packed { len: 64, buf: buf.0, pad: 0 }, 64);
        assert_once(&env, id, buf, &init);
    }

    /// The same, agent coarse memory under `referenced` scope.
    fn packed_pointer_into_coarse_memory_under_referenced_scope_is_applied_once() {
        let env = setup(SnapshotConfig::default().with_scope(SnapshotScope::Referenced));
        let init = values(64);
        let buf = env.app.buffer(env.pools[0].coarse, &init);
        let id = env.run("packed_add_one_packed", add_one_packed, Packed { len: 64, buf: buf.0, pad: 0 }, 64);
        assert_once(&env, id, buf, &init);
    }

    /// Control: an aligned pointer into the middle of a fine-grained buffer.
    fn middle_pointer_into_fine_memory_is_applied_once() {
        let env = setup(SnapshotConfig::default());
        let init = values(64);
        let buf = env.app.buffer(env.pools[0].fine, &init);
        // end pointer = base + 64 elements is the end; use a middle pointer: base + 32 elements,
        // the kernel writes the 32 before it and... use end-style kernel over 32 elements.
        let id = env.run("packed_add_one_before_end", add_one_before_end, EndArgs { end: buf.0 + 4 * 32, len: 32, pad: 0 }, 32);
        let mut expected = init.clone();
        for x in &mut expected[..32] { *x += 1; }
        assert_eq!(env.app.read(buf, 64), expected, "outcome {:?}", env.outcome(id));
    }

    /// One past the end of a fine-grained buffer (a C++ `end()` pointer): the kernel writes
    /// `end[-1-i]`.
    fn one_past_end_pointer_into_fine_memory_is_applied_once() {
        let env = setup(SnapshotConfig::default());
        let init = values(64);
        let buf = env.app.buffer(env.pools[0].fine, &init);
        let size = env.app.allocation_size(buf);
        assert_eq!(size, 256, "the allocation is exactly the buffer");
        let id = env.run("packed_add_one_before_end", add_one_before_end, EndArgs { end: buf.0 + size, len: 64, pad: 0 }, 64);
        let got = env.app.read(buf, 64);
        assert_eq!(got, plus_one(&init), "outcome {:?}, runs {}", env.outcome(id), RUNS.load(Ordering::SeqCst));
    }

    /// Just inside the documented limit: a pointer table (fine-grained, an argument) pointing at
    /// the agent's own coarse memory, agent scope: covered.
    fn table_to_own_coarse_memory_under_agent_scope_is_applied_once() {
        let env = setup(SnapshotConfig::default());
        let init = values(64);
        let buf = env.app.buffer(env.pools[0].coarse, &init);
        let table = env.app.alloc(env.pools[0].fine, 8);
        // SAFETY: the table is this test's allocation of at least 8 bytes.
        unsafe { *(table.0 as *mut u64) = buf.0 };
        let id = env.run("packed_add_one_through_table", add_one_through_table, TableArgs { table: table.0, len: 64, pad: 0 }, 64);
        assert_eq!(env.outcome(id), ReplayOutcome::Replayed { passes: 3, end: LoopEnd::LastPass });
        assert_once(&env, id, buf, &init);
    }

    /// XNACK on: a 4-byte aligned pointer into malloc'ed memory must decline, like an aligned one.
    fn packed_pointer_into_malloced_memory_declines_where_agents_reach_host_memory() {
        kreplay_softhsa::configure(kreplay_softhsa::SoftHsaConfig {
            svm_accessible_by_default: true,
            ..Default::default()
        })
        .expect("softhsa configured");
        let env = setup(SnapshotConfig::default());
        let init = values(64);
        let heap: &'static mut [u32] = Box::leak(init.clone().into_boxed_slice());
        let id = env.run("packed_add_one_packed", add_one_packed, Packed { len: 64, buf: heap.as_mut_ptr() as u64, pad: 0 }, 64);
        let outcome = env.outcome(id);
        assert_eq!(heap.to_vec(), plus_one(&init), "outcome {outcome:?}, runs {}", RUNS.load(Ordering::SeqCst));
    }
}
