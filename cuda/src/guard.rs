//! The thread-local re-entry guard.
//!
//! Everything kreplay does inside a CUPTI callback (synchronizing, copying, allocating a
//! shadow, re-launching the kernel) goes through the driver API and so raises callbacks of its
//! own on the same thread. While a [`Guard`] is alive on a thread, the callback handler ignores
//! that thread's callbacks: kreplay's own allocations never enter the inventory and its
//! re-launches are never replayed again.

use std::cell::Cell;

thread_local! {
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Marks the current thread as inside kreplay until dropped. Nests.
#[derive(Debug)]
#[must_use = "the guard only holds while it lives"]
pub struct Guard {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Guard {
    /// Enter kreplay on this thread.
    pub fn enter() -> Guard {
        DEPTH.with(|d| d.set(d.get() + 1));
        Guard {
            _not_send: std::marker::PhantomData,
        }
    }

    /// Whether the current thread is inside kreplay.
    pub fn active() -> bool {
        DEPTH.with(|d| d.get() > 0)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_nests_and_is_per_thread() {
        assert!(!Guard::active());
        let outer = Guard::enter();
        {
            let _inner = Guard::enter();
            assert!(Guard::active());
            assert!(!std::thread::spawn(Guard::active).join().unwrap());
        }
        assert!(Guard::active(), "the outer guard still holds");
        drop(outer);
        assert!(!Guard::active());
    }
}
