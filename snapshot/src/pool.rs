//! The thread pool of kreplay's data-parallel copies, hashes and page scans: a pool of its own,
//! not rayon's global one, which the application may be using (a replay waiting for the
//! global pool's workers while the application keeps them waiting for that very replay's
//! kernel would never end). Built on first use with rayon's default size, else with one
//! thread; where no thread can be started (an address-space or thread limit), it is tried
//! again at the next use, and [`ready`] says so: a snapshot checks it before it copies, so such
//! a process has its replays declined rather than its copies sent to rayon's global pool (whose
//! creation would fail too, and panic).

use std::sync::OnceLock;

use parking_lot::Mutex;
use rayon::prelude::*;

static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();
/// Held while the pool is built, so two threads never start two pools.
static BUILDING: Mutex<()> = Mutex::new(());

/// kreplay's pool, started now if it was not; `None` while its threads cannot be started.
fn pool() -> Option<&'static rayon::ThreadPool> {
    if let Some(pool) = POOL.get() {
        return Some(pool);
    }
    let _building = BUILDING.lock();
    if let Some(pool) = POOL.get() {
        return Some(pool);
    }
    let build = |threads| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("kreplay-pool-{i}"))
            .build()
    };
    // Its workers start with the application's asynchronous signals blocked, whatever the
    // mask of the thread that first needs them (`kreplay_wtrack::threads`).
    let pool = kreplay_wtrack::threads::with_async_signals_blocked(|| {
        build(0).or_else(|_| build(1)).ok()
    })?;
    Some(POOL.get_or_init(|| pool))
}

/// Whether kreplay's pool runs (it is started now if it was not): once it does, it runs for
/// the rest of the process, so every later [`install`] has it.
pub fn ready() -> Result<(), String> {
    pool().map(|_| ()).ok_or_else(|| {
        "kreplay's copy pool cannot start a thread (address-space or thread limit)".into()
    })
}

/// Runs `work`, which iterates over `items` in parallel, inside kreplay's pool: the parallel
/// iterators it starts use that pool's workers. One item or none runs on the calling thread,
/// without the hand-off to a worker, so `work` must then start no parallel iterator: outside
/// a pool, rayon's would run on (and create) rayon's global pool, which is the application's
/// to build. Work split into a list uses [`map`], which keeps to that.
pub fn install_for<R: Send>(items: usize, work: impl FnOnce() -> R + Send) -> R {
    if items <= 1 { work() } else { install(work) }
}

/// `f` over each of `items`, the answers in order: one item or none on the calling thread
/// without touching any pool (a parallel iterator would create rayon's global pool there),
/// more on kreplay's pool, in parallel. Called on one of the pool's workers, it stays there.
pub fn map<I: Send, R: Send>(items: Vec<I>, f: impl Fn(I) -> R + Sync + Send) -> Vec<R> {
    if items.len() <= 1 {
        return items.into_iter().map(f).collect();
    }
    install(|| items.into_par_iter().map(f).collect())
}

/// [`map`] with a scratch value made by `init` and reused by the items one thread runs.
pub fn map_init<I: Send, R: Send, S>(
    items: Vec<I>,
    init: impl Fn() -> S + Sync + Send,
    f: impl Fn(&mut S, I) -> R + Sync + Send,
) -> Vec<R> {
    if items.len() <= 1 {
        let mut scratch = init();
        return items.into_iter().map(|i| f(&mut scratch, i)).collect();
    }
    install(|| items.into_par_iter().map_init(init, f).collect())
}

/// Runs `work` inside kreplay's pool: the parallel iterators it starts use that pool's workers.
/// Where the pool cannot be started (which [`ready`] reports first), on the calling thread's.
pub fn install<R: Send>(work: impl FnOnce() -> R + Send) -> R {
    match pool() {
        Some(pool) => pool.install(work),
        None => work(),
    }
}
