//! The stress mix: many application threads × several queues (shared and private) × two agents
//! running a seeded random mix of kernel dispatches (some meant to be replayed, some opted
//! out), allocations and frees, `hsa_memory_copy`, asynchronous copies and fills.
//!
//! **Why the final memory is deterministic.** Every thread owns its buffers (two per agent) and
//! touches no one else's; every operation waits for its own completion before the next one
//! starts. Threads interleave on shared queues and agents, but their operations act on disjoint
//! bytes, so each buffer ends as the thread's own sequence of operations leaves it, whatever the
//! interleaving. A thread's sequence is a function of the seed and the thread's index only. A
//! run under kreplay ([`Limit::Time`]) records how many operations each thread did; the
//! reference run without kreplay ([`Limit::Ops`]) does exactly those, and [`compare`] checks the
//! two byte for byte.
//!
//! **Faults.** Every runtime call that can fail (allocation, signal and queue creation, copies,
//! fills) is retried a bounded number of times, so a run with softhsa's fault injection on ends
//! with the same bytes as one without, as long as kreplay loses nothing. Device buffers are
//! initialized and read back through the runtime's paths only (a kernel, and reads after every
//! thread finished): no plain CPU store touches device memory while other threads run.

pub mod kernels;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hsa_sys::{
    HSA_SIGNAL_CONDITION_LT, HsaApiTable, hsa_agent_t, hsa_amd_memory_pool_t, hsa_queue_t,
    hsa_signal_t, hsa_status_t,
};
use kreplay_softhsa::testing::{Dispatch, Hsa, PoolKind};

use kernels::{StressArgs, StressKernels, WORKGROUP, op};

/// Which operations the mix draws from. Each can be switched off to narrow a scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mix {
    /// Some dispatches use the opted-out kernel (else every dispatch asks for replay).
    pub opt_out: bool,
    /// Dispatches also go to queues every thread shares (else only to private queues).
    pub shared_queues: bool,
    /// Allocate a temporary buffer, fill it with a kernel, fold it into an owned buffer, free it.
    pub alloc_free: bool,
    /// `hsa_amd_memory_async_copy` between owned buffers (across agents too).
    pub async_copy: bool,
    /// `hsa_memory_copy` between owned buffers.
    pub memory_copy: bool,
    /// `hsa_amd_memory_fill` of an owned buffer.
    pub fill: bool,
    /// Every owned buffer is granted to every agent (`hsa_amd_agents_allow_access`, peer
    /// access), and some dispatches run on the other agent than the one owning their buffers.
    pub peers: bool,
}

impl Mix {
    /// Every operation on.
    pub const ALL: Mix = Mix {
        opt_out: true,
        shared_queues: true,
        alloc_free: true,
        async_copy: true,
        memory_copy: true,
        fill: true,
        peers: true,
    };
}

impl Default for Mix {
    fn default() -> Self {
        Mix::ALL
    }
}

/// The shape of a stress run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StressConfig {
    /// Application threads.
    pub threads: usize,
    /// Seed of every thread's operation sequence.
    pub seed: u64,
    /// `u32` words per buffer.
    pub words: u32,
    /// Queues per agent that every thread shares (besides one private queue per thread and
    /// agent).
    pub shared_queues: usize,
    /// What the mix draws from.
    pub mix: Mix,
    /// How long one operation may take before its completion counts as lost.
    pub op_deadline: Duration,
}

impl Default for StressConfig {
    fn default() -> Self {
        StressConfig {
            threads: 8,
            seed: 1,
            words: 1024,
            shared_queues: 2,
            mix: Mix::ALL,
            op_deadline: Duration::from_secs(60),
        }
    }
}

/// When the threads stop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Limit {
    /// Each thread runs operations until this much time has passed.
    Time(Duration),
    /// Thread *t* runs exactly `ops[t]` operations.
    Ops(Vec<u64>),
}

/// Operations done, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpCounts {
    /// Dispatches of the replayed kernel.
    pub replayed_dispatches: u64,
    /// Dispatches of the opted-out kernel.
    pub opted_out_dispatches: u64,
    /// Of all dispatches, those sent to a shared queue.
    pub shared_queue_dispatches: u64,
    /// Of all dispatches, those run on another agent than the one owning their buffers.
    pub peer_dispatches: u64,
    /// Temporary allocations (each freed again).
    pub alloc_frees: u64,
    /// Asynchronous copies.
    pub async_copies: u64,
    /// Of those, the ones issued as a batch of two operations (`hsa_amd_memory_async_batch_copy`,
    /// every other asynchronous copy where the table has it).
    pub batch_copies: u64,
    /// `hsa_memory_copy` calls.
    pub memory_copies: u64,
    /// Fills.
    pub fills: u64,
    /// Runtime calls that failed and were retried.
    pub retries: u64,
}

impl OpCounts {
    /// All dispatches.
    pub fn dispatches(&self) -> u64 {
        self.replayed_dispatches + self.opted_out_dispatches
    }

    fn add(&mut self, other: &OpCounts) {
        self.replayed_dispatches += other.replayed_dispatches;
        self.opted_out_dispatches += other.opted_out_dispatches;
        self.shared_queue_dispatches += other.shared_queue_dispatches;
        self.peer_dispatches += other.peer_dispatches;
        self.alloc_frees += other.alloc_frees;
        self.async_copies += other.async_copies;
        self.batch_copies += other.batch_copies;
        self.memory_copies += other.memory_copies;
        self.fills += other.fills;
        self.retries += other.retries;
    }
}

/// One owned buffer at the end of a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BufferImage {
    /// The owning thread.
    pub thread: usize,
    /// The agent index (0 or 1) it lives on.
    pub agent: usize,
    /// Which of the thread's buffers on that agent.
    pub slot: usize,
    /// Its bytes.
    pub bytes: Vec<u8>,
}

impl BufferImage {
    /// A 64-bit FNV-1a hash of the bytes.
    pub fn hash(&self) -> u64 {
        self.bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
    }
}

/// What a run did and left.
#[derive(Clone, Debug, Default)]
pub struct StressRun {
    /// Operations each thread completed.
    pub ops_per_thread: Vec<u64>,
    /// Operations by kind, over all threads.
    pub counts: OpCounts,
    /// Every owned buffer, thread-major.
    pub buffers: Vec<BufferImage>,
    /// Operations whose completion signal never reached 0 before the deadline.
    pub lost_completions: u64,
    /// Completion signals that went below 0 (fired more than once).
    pub extra_completions: u64,
    /// GPU agents used.
    pub agents: usize,
    /// Errors that stopped a thread (a runtime call that kept failing, a lost completion).
    pub errors: Vec<String>,
    /// Wall time of the operation phase.
    pub elapsed: Duration,
}

/// How a run's buffers compare with the reference's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Comparison {
    /// Buffers compared.
    pub buffers: usize,
    /// Buffers whose hash differs.
    pub differing: usize,
    /// Bytes that differ, over all buffers.
    pub bytes_differing: u64,
    /// The first few differences, described.
    pub details: Vec<String>,
}

impl Comparison {
    /// No byte differs and the same buffers exist on both sides.
    pub fn equal(&self) -> bool {
        self.differing == 0 && self.bytes_differing == 0
    }
}

/// Compares every buffer of `run` with the same buffer of `reference`.
pub fn compare(reference: &StressRun, run: &StressRun) -> Comparison {
    let mut comparison = Comparison {
        buffers: reference.buffers.len().max(run.buffers.len()),
        ..Comparison::default()
    };
    if reference.buffers.len() != run.buffers.len() {
        comparison.differing = comparison.buffers;
        comparison.details.push(format!(
            "the reference has {} buffers, the run {}",
            reference.buffers.len(),
            run.buffers.len()
        ));
        return comparison;
    }
    for (a, b) in reference.buffers.iter().zip(&run.buffers) {
        if a.hash() == b.hash() && a.bytes == b.bytes {
            continue;
        }
        comparison.differing += 1;
        let differing = a.bytes.iter().zip(&b.bytes).filter(|(x, y)| x != y).count() as u64
            + a.bytes.len().abs_diff(b.bytes.len()) as u64;
        comparison.bytes_differing += differing;
        if comparison.details.len() < 8 {
            let first = a.bytes.iter().zip(&b.bytes).position(|(x, y)| x != y);
            comparison.details.push(format!(
                "thread {} agent {} buffer {}: {differing} of {} bytes differ (first at byte {}), \
                 hash {:016x} expected {:016x}",
                b.thread,
                b.agent,
                b.slot,
                a.bytes.len(),
                first.map_or_else(|| "-".to_string(), |f| f.to_string()),
                b.hash(),
                a.hash()
            ));
        }
    }
    comparison
}

/// Owned buffers per thread and agent.
pub const BUFFERS_PER_AGENT: usize = 2;
/// Attempts of a failing runtime call before the thread gives up.
const ATTEMPTS: u32 = 400;
/// Slots per queue.
const QUEUE_SIZE: u32 = 64;

/// What the threads share.
struct Shared<'a> {
    hsa: Hsa,
    kernels: StressKernels,
    config: &'a StressConfig,
    agents: Vec<hsa_agent_t>,
    coarse: Vec<hsa_amd_memory_pool_t>,
    kernarg: hsa_amd_memory_pool_t,
    shared_queues: Vec<Vec<Queue>>,
    stop: AtomicBool,
    retries: AtomicU64,
}

#[derive(Clone, Copy)]
struct Queue(*mut hsa_queue_t);
// SAFETY: an HSA queue is a multi-producer object meant to be used from any thread; the pointer
// is only handed to the runtime's entry points and to `Hsa::submit`, which follows the AQL
// producer protocol.
unsafe impl Send for Queue {}
// SAFETY: as above.
unsafe impl Sync for Queue {}

impl Shared<'_> {
    /// Runs `f` until it succeeds, at most [`ATTEMPTS`] times; failures are counted as retries.
    fn retry<T>(
        &self,
        what: &str,
        mut f: impl FnMut() -> Result<T, hsa_status_t>,
    ) -> Result<T, String> {
        let mut last = 0;
        for _ in 0..ATTEMPTS {
            match f() {
                Ok(value) => return Ok(value),
                Err(status) => {
                    last = status;
                    self.retries.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        Err(format!(
            "{what} failed {ATTEMPTS} times in a row (last status {last:#x})"
        ))
    }
}

/// A deterministic generator (xorshift64*), one per thread.
struct Rng(u64);

impl Rng {
    fn new(seed: u64, thread: usize) -> Self {
        let mut x = seed ^ (thread as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5bd1_e995;
        for _ in 0..4 {
            x = (x ^ (x >> 31))
                .wrapping_mul(0xbf58_476d_1ce4_e5b9)
                .wrapping_add(1);
        }
        Rng(x | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Runs the stress mix through `table` (softhsa's own, or a copy kreplay is installed in).
///
/// The runtime is initialized here and shut down before returning.
///
/// # Safety
/// `table` must be a complete HSA API table whose entries stay callable during the run.
pub unsafe fn run(
    table: &HsaApiTable,
    kernels: StressKernels,
    config: &StressConfig,
    limit: &Limit,
) -> Result<StressRun, String> {
    if config.threads == 0 || config.words == 0 {
        return Err("a stress run needs at least one thread and one word per buffer".into());
    }
    if let Limit::Ops(ops) = limit
        && ops.len() != config.threads
    {
        return Err(format!(
            "{} operation counts for {} threads",
            ops.len(),
            config.threads
        ));
    }
    // SAFETY: forwarded from the caller.
    let hsa = unsafe { Hsa::from_table(table) };
    let _session = hsa
        .init()
        .map_err(|s| format!("hsa_init returned {s:#x}"))?;
    let gpus = hsa
        .gpu_agents()
        .map_err(|s| format!("cannot list the GPU agents: {s:#x}"))?;
    let agents: Vec<hsa_agent_t> = gpus.into_iter().take(2).collect();
    if agents.is_empty() {
        return Err("the runtime has no GPU agent".into());
    }
    let coarse = agents
        .iter()
        .map(|&a| hsa.coarse_pool(a))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|s| format!("no coarse-grained pool: {s:#x}"))?;
    let kernarg = kernarg_pool(&hsa)?;
    let mut shared = Shared {
        hsa,
        kernels,
        config,
        agents,
        coarse,
        kernarg,
        shared_queues: Vec::new(),
        stop: AtomicBool::new(false),
        retries: AtomicU64::new(0),
    };
    let mut queues = Vec::new();
    for &agent in &shared.agents {
        let mut on_agent = Vec::new();
        for _ in 0..config.shared_queues.max(1) {
            let queue = shared.retry("hsa_queue_create", || {
                shared.hsa.queue_create(agent, QUEUE_SIZE)
            })?;
            on_agent.push(Queue(queue));
        }
        queues.push(on_agent);
    }
    shared.shared_queues = queues;

    let start = Instant::now();
    let results: Vec<ThreadResult> = std::thread::scope(|scope| {
        let shared = &shared;
        let handles: Vec<_> = (0..config.threads)
            .map(|t| {
                let budget = match limit {
                    Limit::Ops(ops) => Some(ops[t]),
                    Limit::Time(_) => None,
                };
                std::thread::Builder::new()
                    .name(format!("stress-app-{t}"))
                    .spawn_scoped(scope, move || app_thread(shared, t, budget))
            })
            .collect();
        if let Limit::Time(duration) = limit {
            // The operation phase is bounded by the wall clock: the threads check `stop` between
            // operations. This waits for the clock, not for a condition of the threads.
            let until = start + *duration;
            while Instant::now() < until
                && handles
                    .iter()
                    .any(|h| h.as_ref().is_ok_and(|h| !h.is_finished()))
            {
                std::thread::park_timeout(Duration::from_millis(20));
            }
            shared.stop.store(true, Ordering::SeqCst);
        }
        handles
            .into_iter()
            .enumerate()
            .map(|(t, h)| match h {
                Ok(h) => h.join().unwrap_or_else(|_| ThreadResult {
                    error: Some(format!("thread {t} panicked")),
                    ..ThreadResult::default()
                }),
                Err(e) => ThreadResult {
                    error: Some(format!("thread {t} could not start: {e}")),
                    ..ThreadResult::default()
                },
            })
            .collect()
    });
    let elapsed = start.elapsed();
    for queue in shared.shared_queues.iter().flatten() {
        // SAFETY: created above, idle (every thread waited for its operations), destroyed once.
        let _ = unsafe { shared.hsa.queue_destroy(queue.0) };
    }

    let mut run = StressRun {
        agents: shared.agents.len(),
        elapsed,
        ..StressRun::default()
    };
    for (t, result) in results.into_iter().enumerate() {
        run.ops_per_thread.push(result.ops);
        run.counts.add(&result.counts);
        run.lost_completions += result.lost_completions;
        run.extra_completions += result.extra_completions;
        run.buffers.extend(result.buffers);
        if let Some(error) = result.error {
            run.errors.push(format!("thread {t}: {error}"));
        }
    }
    run.counts.retries = shared.retries.load(Ordering::Relaxed);
    Ok(run)
}

fn kernarg_pool(hsa: &Hsa) -> Result<hsa_amd_memory_pool_t, String> {
    let agents = hsa
        .agents()
        .map_err(|s| format!("cannot list the agents: {s:#x}"))?;
    agents
        .into_iter()
        .find_map(|a| hsa.pool(a, PoolKind::Kernarg).ok())
        .ok_or_else(|| "no kernarg pool".to_string())
}

#[derive(Default)]
struct ThreadResult {
    ops: u64,
    counts: OpCounts,
    buffers: Vec<BufferImage>,
    lost_completions: u64,
    extra_completions: u64,
    error: Option<String>,
}

/// The per-thread objects.
struct Thread<'s, 'c> {
    shared: &'s Shared<'c>,
    index: usize,
    /// `buffers[agent][slot]`.
    buffers: Vec<Vec<*mut u32>>,
    private_queues: Vec<Queue>,
    kernarg: *mut StressArgs,
    done: hsa_signal_t,
    counts: OpCounts,
    lost_completions: u64,
    extra_completions: u64,
}

fn app_thread(shared: &Shared<'_>, index: usize, budget: Option<u64>) -> ThreadResult {
    let mut result = ThreadResult::default();
    let mut thread = match Thread::set_up(shared, index) {
        Ok(thread) => thread,
        Err(error) => {
            result.error = Some(error);
            return result;
        }
    };
    let mut rng = Rng::new(shared.config.seed, index);
    let outcome = thread.initialize().and_then(|()| {
        loop {
            let more = match budget {
                Some(budget) => result.ops < budget,
                None => !shared.stop.load(Ordering::SeqCst),
            };
            if !more {
                break Ok(());
            }
            thread.step(&mut rng)?;
            result.ops += 1;
        }
    });
    if let Err(error) = outcome {
        result.error = Some(error);
    }
    result.counts = thread.counts;
    result.lost_completions = thread.lost_completions;
    result.extra_completions = thread.extra_completions;
    // Every operation of this thread has completed (or was counted lost and the thread stopped):
    // read the owned buffers back.
    let bytes = shared.config.words as usize * 4;
    for (agent, slots) in thread.buffers.iter().enumerate() {
        for (slot, &ptr) in slots.iter().enumerate() {
            // SAFETY: an owned, live allocation of `words` u32s; softhsa's device memory is host
            // memory, and no operation on it is in flight.
            let image = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), bytes) }.to_vec();
            result.buffers.push(BufferImage {
                thread: index,
                agent,
                slot,
                bytes: image,
            });
        }
    }
    if result.lost_completions == 0 {
        thread.tear_down();
    }
    result
}

impl<'s, 'c> Thread<'s, 'c> {
    fn set_up(shared: &'s Shared<'c>, index: usize) -> Result<Self, String> {
        let hsa = &shared.hsa;
        let bytes = shared.config.words as usize * 4;
        let mut buffers = Vec::new();
        for &pool in &shared.coarse {
            let mut slots = Vec::new();
            for _ in 0..BUFFERS_PER_AGENT {
                let ptr =
                    shared.retry("hsa_amd_memory_pool_allocate", || hsa.allocate(pool, bytes))?;
                if shared.config.mix.peers && shared.agents.len() > 1 {
                    shared.retry("hsa_amd_agents_allow_access", || {
                        hsa.allow_access(&shared.agents, ptr)
                    })?;
                }
                slots.push(ptr.cast::<u32>());
            }
            buffers.push(slots);
        }
        let mut private_queues = Vec::new();
        for &agent in &shared.agents {
            let queue = shared.retry("hsa_queue_create", || hsa.queue_create(agent, QUEUE_SIZE))?;
            private_queues.push(Queue(queue));
        }
        let kernarg = shared
            .retry("kernarg allocation", || {
                hsa.allocate(shared.kernarg, size_of::<StressArgs>())
            })?
            .cast::<StressArgs>();
        let done = shared.retry("hsa_signal_create", || hsa.signal_create(0))?;
        Ok(Thread {
            shared,
            index,
            buffers,
            private_queues,
            kernarg,
            done,
            counts: OpCounts::default(),
            lost_completions: 0,
            extra_completions: 0,
        })
    }

    fn tear_down(&mut self) {
        let hsa = &self.shared.hsa;
        for queue in &self.private_queues {
            // SAFETY: created by this thread, idle, destroyed once.
            let _ = unsafe { hsa.queue_destroy(queue.0) };
        }
        let _ = hsa.signal_destroy(self.done);
        let _ = hsa.free(self.kernarg.cast());
        // The owned buffers stay allocated until the runtime shuts down: their images were
        // taken, and freeing them is exercised by the temporary allocations.
    }

    fn words(&self) -> u32 {
        self.shared.config.words
    }

    /// Gives every owned buffer its starting contents with a kernel (opted out).
    fn initialize(&mut self) -> Result<(), String> {
        for agent in 0..self.buffers.len() {
            for slot in 0..BUFFERS_PER_AGENT {
                let constant =
                    (self.index * 16 + agent * 4 + slot) as u32 ^ self.shared.config.seed as u32;
                let dst = self.buffers[agent][slot];
                self.dispatch(
                    agent,
                    false,
                    false,
                    dst,
                    std::ptr::null(),
                    op::INIT,
                    constant,
                )?;
            }
        }
        Ok(())
    }

    /// One operation drawn from the mix.
    fn step(&mut self, rng: &mut Rng) -> Result<(), String> {
        let mix = self.shared.config.mix;
        let agents = self.buffers.len() as u64;
        let agent = rng.below(agents) as usize;
        let slot = rng.below(BUFFERS_PER_AGENT as u64) as usize;
        let other_agent = rng.below(agents) as usize;
        let other_slot =
            (slot + 1 + rng.below(BUFFERS_PER_AGENT as u64 - 1) as usize) % BUFFERS_PER_AGENT;
        let constant = rng.next() as u32;
        let shared_queue = mix.shared_queues && rng.chance(50);
        let replayed = !mix.opt_out || rng.chance(60);
        let roll = rng.below(100);
        let dst = self.buffers[agent][slot];
        // The operation is chosen from the roll; one that is switched off falls back to a
        // dispatch, so the sequence of draws (and so the reference) stays a function of the seed.
        match roll {
            0..=9 if mix.alloc_free => {
                self.alloc_free(agent, shared_queue, replayed, dst, constant)
            }
            10..=24 if mix.async_copy => {
                let src = self.buffers[other_agent][other_slot];
                self.async_copy(agent, dst, other_agent, src)
            }
            25..=34 if mix.memory_copy => {
                let src = self.buffers[other_agent][other_slot];
                self.memory_copy(dst, src)
            }
            35..=39 if mix.fill => self.fill(dst, constant),
            _ => {
                let (op, src) = if roll.is_multiple_of(3) {
                    (op::ACCUMULATE, self.buffers[agent][other_slot].cast_const())
                } else {
                    (op::MUTATE, std::ptr::null())
                };
                // With peer access, one dispatch in five runs on the agent drawn for the other
                // operand (no extra draw: the reference sees the same sequence).
                let on = if mix.peers && roll % 5 == 2 {
                    other_agent
                } else {
                    agent
                };
                if on != agent {
                    self.counts.peer_dispatches += 1;
                }
                self.dispatch(on, shared_queue, replayed, dst, src, op, constant)
            }
        }
    }

    /// Sets the completion signal to 1 before an operation, checking that the previous one
    /// fired it exactly once.
    fn arm(&mut self) {
        self.arm_for(1);
    }

    /// Arms the completion signal for `completions` completions (a batch's operations).
    fn arm_for(&mut self, completions: i64) {
        let hsa = &self.shared.hsa;
        let value = hsa.signal_load(self.done);
        if value < 0 {
            self.extra_completions += value.unsigned_abs();
        }
        hsa.signal_store(self.done, completions);
    }

    /// Waits for the armed completion; a completion that never comes stops the thread.
    fn wait(&mut self, what: &str) -> Result<(), String> {
        let hsa = &self.shared.hsa;
        let value = hsa.signal_wait(
            self.done,
            HSA_SIGNAL_CONDITION_LT,
            1,
            self.shared.config.op_deadline,
        );
        if value >= 1 {
            self.lost_completions += 1;
            return Err(format!(
                "the completion of {what} did not fire within {:?}",
                self.shared.config.op_deadline
            ));
        }
        if value < 0 {
            self.extra_completions += value.unsigned_abs();
            hsa.signal_store(self.done, 0);
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn dispatch(
        &mut self,
        agent: usize,
        shared_queue: bool,
        replayed: bool,
        dst: *mut u32,
        src: *const u32,
        operation: u32,
        constant: u32,
    ) -> Result<(), String> {
        let queue = if shared_queue {
            let queues = &self.shared.shared_queues[agent];
            queues[self.index % queues.len()]
        } else {
            self.private_queues[agent]
        };
        let args = StressArgs {
            dst: dst as u64,
            src: src as u64,
            words: self.words(),
            op: operation,
            constant,
            pad: 0,
        };
        // SAFETY: the thread's own kernarg block; the previous dispatch that read it completed.
        unsafe { self.kernarg.write(args) };
        let kernel = if replayed {
            self.counts.replayed_dispatches += 1;
            self.shared.kernels.replayed
        } else {
            self.counts.opted_out_dispatches += 1;
            self.shared.kernels.opted_out
        };
        if shared_queue {
            self.counts.shared_queue_dispatches += 1;
        }
        let grid = self.words().next_multiple_of(u32::from(WORKGROUP));
        let dispatch = Dispatch::linear(kernel, grid, WORKGROUP, self.kernarg.cast(), self.done);
        self.arm();
        // SAFETY: a live queue of this runtime; the kernarg block and the buffers stay valid
        // until the completion, which is waited for right below.
        unsafe { self.shared.hsa.dispatch(queue.0, &dispatch) };
        self.wait("a kernel dispatch")
    }

    fn alloc_free(
        &mut self,
        agent: usize,
        shared_queue: bool,
        replayed: bool,
        dst: *mut u32,
        constant: u32,
    ) -> Result<(), String> {
        let shared = self.shared;
        let bytes = self.words() as usize * 4;
        let pool = shared.coarse[agent];
        let temp = shared
            .retry("hsa_amd_memory_pool_allocate", || {
                shared.hsa.allocate(pool, bytes)
            })?
            .cast::<u32>();
        let result = self
            .dispatch(
                agent,
                shared_queue,
                replayed,
                temp,
                std::ptr::null(),
                op::INIT,
                constant,
            )
            .and_then(|()| {
                self.dispatch(
                    agent,
                    shared_queue,
                    replayed,
                    dst,
                    temp,
                    op::ACCUMULATE,
                    constant,
                )
            });
        if result.is_ok() {
            shared
                .retry("hsa_amd_memory_pool_free", || shared.hsa.free(temp.cast()))
                .map_err(|e| format!("freeing a temporary buffer: {e}"))?;
            self.counts.alloc_frees += 1;
        }
        result
    }

    fn async_copy(
        &mut self,
        dst_agent: usize,
        dst: *mut u32,
        src_agent: usize,
        src: *const u32,
    ) -> Result<(), String> {
        let shared = self.shared;
        let bytes = self.words() as usize * 4;
        if let Some(batch) = shared.hsa.batch_copy()
            && self.counts.async_copies % 2 == 1
        {
            return self.batch_copy(batch, dst_agent, dst, src_agent, src);
        }
        let copy = shared
            .hsa
            .amd()
            .hsa_amd_memory_async_copy_fn
            .ok_or("the table has no hsa_amd_memory_async_copy")?;
        self.arm();
        let done = self.done;
        shared.retry("hsa_amd_memory_async_copy", || {
            // SAFETY: both ranges are owned, live buffers of `bytes` bytes on the named agents;
            // they stay valid until the completion, waited for below.
            let status = unsafe {
                copy(
                    dst.cast(),
                    shared.agents[dst_agent],
                    src.cast(),
                    shared.agents[src_agent],
                    bytes,
                    0,
                    std::ptr::null(),
                    done,
                )
            };
            status_result(status)
        })?;
        self.counts.async_copies += 1;
        self.wait("an asynchronous copy")
    }

    /// The same copy as [`Self::async_copy`] as a ROCm 7 batch of two linear operations, one per
    /// half of the buffer, sharing one completion signal set to 2.
    fn batch_copy(
        &mut self,
        batch: kreplay_softhsa::testing::BatchCopy,
        dst_agent: usize,
        dst: *mut u32,
        src_agent: usize,
        src: *const u32,
    ) -> Result<(), String> {
        use hsa_sys::layouts::{
            HSA_AMD_MEMORY_COPY_OP_LINEAR, HSA_AMD_MEMORY_COPY_OP_VERSION, hsa_amd_memory_copy_op_t,
        };
        let shared = self.shared;
        let half = self.words() as u64 * 2;
        let op = |offset: u64| hsa_amd_memory_copy_op_t {
            version: HSA_AMD_MEMORY_COPY_OP_VERSION,
            type_: HSA_AMD_MEMORY_COPY_OP_LINEAR,
            completion_signal: self.done,
            src: src as u64 + offset,
            src_agent: shared.agents[src_agent].handle,
            dst_agent: shared.agents[dst_agent].handle,
            dst: dst as u64 + offset,
            size: [half, 0],
            ..Default::default()
        };
        let ops = [op(0), op(half)];
        self.arm_for(2);
        shared.retry("hsa_amd_memory_async_batch_copy", || {
            // SAFETY: two operations over the halves of owned, live buffers of the named
            // agents, valid until the completion, waited for below; `ops` outlives the call.
            status_result(unsafe { batch(ops.as_ptr(), 2, 0, std::ptr::null()) })
        })?;
        self.counts.async_copies += 1;
        self.counts.batch_copies += 1;
        self.wait("a batch copy")
    }

    fn memory_copy(&mut self, dst: *mut u32, src: *const u32) -> Result<(), String> {
        let shared = self.shared;
        let bytes = self.words() as usize * 4;
        let copy = shared
            .hsa
            .core()
            .hsa_memory_copy_fn
            .ok_or("the table has no hsa_memory_copy")?;
        shared.retry("hsa_memory_copy", || {
            // SAFETY: both ranges are owned, live buffers of `bytes` bytes.
            status_result(unsafe { copy(dst.cast(), src.cast(), bytes) })
        })?;
        self.counts.memory_copies += 1;
        Ok(())
    }

    fn fill(&mut self, dst: *mut u32, value: u32) -> Result<(), String> {
        let shared = self.shared;
        let words = self.words() as usize;
        let fill = shared
            .hsa
            .amd()
            .hsa_amd_memory_fill_fn
            .ok_or("the table has no hsa_amd_memory_fill")?;
        shared.retry("hsa_amd_memory_fill", || {
            // SAFETY: an owned, live buffer of `words` u32s.
            status_result(unsafe { fill(dst.cast(), value, words) })
        })?;
        self.counts.fills += 1;
        Ok(())
    }
}

fn status_result(status: hsa_status_t) -> Result<(), hsa_status_t> {
    if status == hsa_sys::HSA_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(status)
    }
}

/// What a tool needs to dispatch [`StressKernels::tool_add`] from inside its callbacks, on the
/// same table as the application (so the dispatch goes through kreplay like any other).
pub mod tool_side {
    use super::*;
    use kernels::AddOneArgs;

    /// A buffer, a queue per agent and a signal a tool dispatches `tool_add` with.
    pub struct ToolDispatcher {
        hsa: Hsa,
        kernel: u64,
        queues: Vec<Queue>,
        buffer: *mut u32,
        words: u32,
        kernarg: *mut AddOneArgs,
        done: hsa_signal_t,
        _session: kreplay_softhsa::testing::Session,
    }

    // SAFETY: every field is a runtime object usable from any thread; `dispatch` is serialized
    // by the caller (it takes `&mut self`).
    unsafe impl Send for ToolDispatcher {}

    impl ToolDispatcher {
        /// Creates the objects through `table` (holding one `hsa_init` reference until dropped).
        ///
        /// # Safety
        /// As [`run`].
        pub unsafe fn new(table: &HsaApiTable, kernel: u64, words: u32) -> Result<Self, String> {
            // SAFETY: forwarded from the caller.
            let hsa = unsafe { Hsa::from_table(table) };
            let session = hsa
                .init()
                .map_err(|s| format!("hsa_init returned {s:#x}"))?;
            let agents: Vec<hsa_agent_t> = hsa
                .gpu_agents()
                .map_err(|s| format!("cannot list the GPU agents: {s:#x}"))?
                .into_iter()
                .take(2)
                .collect();
            let first = *agents.first().ok_or("the runtime has no GPU agent")?;
            let pool = hsa
                .coarse_pool(first)
                .map_err(|s| format!("no coarse-grained pool: {s:#x}"))?;
            let buffer = hsa
                .allocate(pool, words as usize * 4)
                .map_err(|s| format!("cannot allocate the tool's buffer: {s:#x}"))?
                .cast::<u32>();
            let kernarg = hsa
                .allocate(kernarg_pool(&hsa)?, size_of::<AddOneArgs>())
                .map_err(|s| format!("cannot allocate the tool's kernargs: {s:#x}"))?
                .cast::<AddOneArgs>();
            let queues = agents
                .iter()
                .map(|&a| hsa.queue_create(a, QUEUE_SIZE).map(Queue))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|s| format!("cannot create the tool's queues: {s:#x}"))?;
            let done = hsa
                .signal_create(0)
                .map_err(|s| format!("cannot create the tool's signal: {s:#x}"))?;
            Ok(ToolDispatcher {
                hsa,
                kernel,
                queues,
                buffer,
                words,
                kernarg,
                done,
                _session: session,
            })
        }

        /// Agents the dispatcher has a queue on.
        pub fn agents(&self) -> usize {
            self.queues.len()
        }

        /// Dispatches `data[i] += 1` over the tool's buffer on the queue of `agent` and waits
        /// for it up to `deadline`; `Ok(true)` when it completed, `Ok(false)` when it did not
        /// (the dispatcher must then not be used again).
        pub fn add_one(&mut self, agent: usize, deadline: Duration) -> Result<bool, String> {
            let queue = self.queues[agent % self.queues.len()];
            // SAFETY: the dispatcher's own kernarg block; the previous dispatch completed.
            unsafe {
                self.kernarg.write(AddOneArgs {
                    data: self.buffer as u64,
                    words: self.words,
                    pad: 0,
                });
            }
            self.hsa.signal_store(self.done, 1);
            let grid = self.words.next_multiple_of(u32::from(WORKGROUP));
            let dispatch =
                Dispatch::linear(self.kernel, grid, WORKGROUP, self.kernarg.cast(), self.done);
            // SAFETY: a live queue; kernargs and buffer outlive the dispatch (waited for below,
            // and the dispatcher is not used again if the wait fails).
            unsafe { self.hsa.dispatch(queue.0, &dispatch) };
            let value = self
                .hsa
                .signal_wait(self.done, HSA_SIGNAL_CONDITION_LT, 1, deadline);
            Ok(value < 1)
        }

        /// The tool buffer's words (each equals the number of `add_one` runs that reached it).
        pub fn values(&self) -> Vec<u32> {
            // SAFETY: a live allocation of `words` u32s; the caller has no dispatch in flight.
            unsafe { std::slice::from_raw_parts(self.buffer, self.words as usize) }.to_vec()
        }
    }
}

/// Deterministic sequences: the same seed and thread give the same draws.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_sequence_depends_only_on_seed_and_thread() {
        let draws = |seed, t| {
            let mut rng = Rng::new(seed, t);
            (0..64).map(|_| rng.next()).collect::<Vec<_>>()
        };
        assert_eq!(draws(1, 0), draws(1, 0));
        assert_ne!(draws(1, 0), draws(1, 1));
        assert_ne!(draws(1, 0), draws(2, 0));
    }

    #[test]
    fn compare_counts_differing_bytes_per_buffer() {
        let image = |bytes: Vec<u8>| BufferImage {
            thread: 0,
            agent: 0,
            slot: 0,
            bytes,
        };
        let a = StressRun {
            buffers: vec![image(vec![1, 2, 3, 4]), image(vec![0; 4])],
            ..StressRun::default()
        };
        let mut b = a.clone();
        assert!(compare(&a, &b).equal());
        b.buffers[1].bytes[2] = 9;
        let c = compare(&a, &b);
        assert_eq!((c.differing, c.bytes_differing), (1, 1));
        assert!(!c.equal());
    }
}
