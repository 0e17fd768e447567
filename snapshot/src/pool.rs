//! The thread pool of kreplay's data-parallel copies, hashes and page scans: a pool of its own,
//! not rayon's global one, which the application may be using (a replay waiting for the
//! global pool's workers while the application keeps them waiting for that very replay's
//! kernel would never end). Built on first use with rayon's default size; where it cannot be
//! built, the work runs on the calling thread's pool as before.

use std::sync::OnceLock;

static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();

/// Runs `work`, which iterates over `items` in parallel, inside kreplay's pool: the parallel
/// iterators it starts use that pool's workers. One item or none runs on the calling thread
/// (a parallel iterator over one item does not leave it), without the hand-off to a worker.
pub fn install_for<R: Send>(items: usize, work: impl FnOnce() -> R + Send) -> R {
    if items <= 1 { work() } else { install(work) }
}

/// Runs `work` inside kreplay's pool: the parallel iterators it starts use that pool's workers.
pub fn install<R: Send>(work: impl FnOnce() -> R + Send) -> R {
    let pool = POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .thread_name(|i| format!("kreplay-pool-{i}"))
            .build()
            .ok()
    });
    match pool {
        Some(pool) => pool.install(work),
        None => work(),
    }
}
