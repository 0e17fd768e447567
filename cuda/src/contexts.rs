//! The contexts kreplay has seen, with their devices, and the drain of a whole device.
//!
//! A snapshot in the default scope holds every allocation of the launch's device, and work of
//! any context on that device may write some of it: its own allocations, and the virtual-memory
//! mappings and pool allocations every context of the device reaches. `cuCtxSynchronize` waits
//! only for the current context's streams, so the drain before a snapshot synchronises every
//! context kreplay has seen on the device, the launch's own first ([`Contexts::drain_device`]).
//! Drained only in its own context, a launch on the H200 had its snapshot taken while a kernel
//! of a second context still ran, and its restores undid what that kernel wrote
//! (`two_contexts.cu`).
//!
//! A context is seen at the first call of it that kreplay handles; every call that puts work on
//! a device (a launch, a copy, a memset, a stream write, a graph launch) is one. `cuCtxDestroy`
//! forgets a context, and says which `cuMemAlloc` and `cuMemAllocManaged` allocations die with it (the driver frees
//! them without a `cuMemFree`); one the driver says no longer exists when it is drained is
//! forgotten too.
//! Contexts are opaque handles here, so the rules run without a GPU.

use std::collections::HashMap;

use parking_lot::Mutex;

/// Why one context could not be synchronised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyncError {
    /// The context no longer exists (destroyed, or a primary context that was reset).
    Gone,
    /// Any other failure, as the driver described it.
    Failed(String),
}

/// The contexts seen, each with its device ordinal.
#[derive(Debug, Default)]
pub struct Contexts {
    seen: Mutex<Vec<(usize, i32)>>,
    /// The context of each live `cuMemAlloc`, `cuMemAllocPitch` and `cuMemAllocManaged`
    /// allocation, by base.
    owners: Mutex<HashMap<u64, usize>>,
    /// How many times a context of each handle was forgotten (a handle may be a new context's
    /// after one ended). Locked inside `owners`, never the other way round.
    ends: Mutex<HashMap<usize, u64>>,
}

/// The context a freed allocation was noted in, as its free's API ENTER found it
/// ([`Contexts::note_free_in`]): a free the driver refuses puts the allocation back only while
/// that context lives ([`Contexts::ended_since`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FreedIn {
    /// The context.
    pub ctx: usize,
    /// How many times a context of that handle had ended then.
    ends: u64,
}

impl Contexts {
    /// The device of context `ctx`: the one noted, or else `ask()`'s answer, then noted.
    pub fn ordinal(&self, ctx: usize, ask: impl FnOnce() -> Option<i32>) -> Option<i32> {
        if let Some(&(_, o)) = self.seen.lock().iter().find(|(c, _)| *c == ctx) {
            return Some(o);
        }
        let o = ask()?;
        let mut seen = self.seen.lock();
        if !seen.iter().any(|(c, _)| *c == ctx) {
            seen.push((ctx, o));
        }
        Some(o)
    }

    /// Notes that `base` was allocated in context `ctx` and dies with it.
    pub fn note_allocation(&self, ctx: usize, base: u64) {
        self.owners.lock().insert(base, ctx);
    }

    /// Notes that `base` was freed; returns the context it was noted in.
    pub fn note_free(&self, base: u64) -> Option<usize> {
        self.owners.lock().remove(&base)
    }

    /// Notes that `base` was freed, as [`note_free`](Self::note_free), and returns the context
    /// it was noted in with that context's ends so far.
    pub fn note_free_in(&self, base: u64) -> Option<FreedIn> {
        let mut owners = self.owners.lock();
        let ctx = owners.remove(&base)?;
        let ends = self.ends.lock().get(&ctx).copied().unwrap_or(0);
        Some(FreedIn { ctx, ends })
    }

    /// Whether the context of `freed` ended after the free that returned it noted it (its
    /// allocations ended with it, that one too).
    pub fn ended_since(&self, freed: &FreedIn) -> bool {
        self.ends.lock().get(&freed.ctx).copied().unwrap_or(0) != freed.ends
    }

    /// Forgets context `ctx` (it is being destroyed) and returns the bases of the allocations
    /// made in it that are still live, which die with it.
    pub fn forget(&self, ctx: usize) -> Vec<u64> {
        self.seen.lock().retain(|(c, _)| *c != ctx);
        let mut owners = self.owners.lock();
        *self.ends.lock().entry(ctx).or_default() += 1;
        let mut dying: Vec<u64> = owners
            .iter()
            .filter(|&(_, &c)| c == ctx)
            .map(|(&b, _)| b)
            .collect();
        owners.retain(|_, c| *c != ctx);
        dying.sort_unstable();
        dying
    }

    /// The contexts seen on device `ordinal`.
    pub fn on_device(&self, ordinal: i32) -> Vec<usize> {
        self.seen
            .lock()
            .iter()
            .filter(|(_, o)| *o == ordinal)
            .map(|(c, _)| *c)
            .collect()
    }

    /// Synchronises context `ctx`, then every other context seen on its device, with `sync`.
    /// The first failure ends the drain and is returned; another context that is gone is
    /// forgotten and skipped (the launch's own context is alive: its call is in progress).
    pub fn drain_device(
        &self,
        ctx: usize,
        sync: impl Fn(usize) -> Result<(), SyncError>,
    ) -> Result<(), String> {
        let describe = |c: usize, e: SyncError| match e {
            SyncError::Gone => format!("context {c:#x} no longer exists"),
            SyncError::Failed(why) => why,
        };
        sync(ctx).map_err(|e| describe(ctx, e))?;
        let Some(ordinal) = self.ordinal(ctx, || None) else {
            return Ok(());
        };
        for other in self.on_device(ordinal) {
            if other == ctx {
                continue;
            }
            match sync(other) {
                Ok(()) => {}
                Err(SyncError::Gone) => {
                    self.forget(other);
                }
                Err(e) => return Err(describe(other, e)),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(pairs: &[(usize, i32)]) -> Contexts {
        let c = Contexts::default();
        for &(ctx, o) in pairs {
            assert_eq!(c.ordinal(ctx, || Some(o)), Some(o));
        }
        c
    }

    #[test]
    fn a_context_is_asked_its_device_once() {
        let c = Contexts::default();
        assert_eq!(c.ordinal(1, || Some(3)), Some(3));
        assert_eq!(c.ordinal(1, || panic!("asked again")), Some(3));
        assert_eq!(
            c.ordinal(2, || None),
            None,
            "an unknown device is not noted"
        );
        assert_eq!(c.ordinal(2, || Some(0)), Some(0));
    }

    #[test]
    fn a_drain_synchronises_every_context_of_the_launchs_device_and_no_other() {
        let c = seen(&[(10, 0), (20, 1), (30, 0), (40, 0)]);
        let order = Mutex::new(Vec::new());
        let r = c.drain_device(30, |ctx| {
            order.lock().push(ctx);
            Ok(())
        });
        assert_eq!(r, Ok(()));
        assert_eq!(
            *order.lock(),
            [30, 10, 40],
            "the launch's own context first"
        );
    }

    #[test]
    fn a_context_gone_is_forgotten_and_a_failure_ends_the_drain() {
        let c = seen(&[(10, 0), (20, 0), (30, 0)]);
        let r = c.drain_device(10, |ctx| match ctx {
            20 => Err(SyncError::Gone),
            _ => Ok(()),
        });
        assert_eq!(r, Ok(()));
        assert_eq!(c.on_device(0), [10, 30]);
        let e = c
            .drain_device(10, |ctx| match ctx {
                30 => Err(SyncError::Failed(
                    "cuCtxSynchronize: an illegal address".into(),
                )),
                _ => Ok(()),
            })
            .unwrap_err();
        assert!(e.contains("illegal address"), "{e}");
        let e = c.drain_device(10, |_| Err(SyncError::Gone)).unwrap_err();
        assert!(e.contains("no longer exists"), "{e}");
    }

    #[test]
    fn a_destroyed_context_is_not_drained_and_its_allocations_die_with_it() {
        let c = seen(&[(10, 0), (20, 0)]);
        c.note_allocation(20, 0x3000);
        c.note_allocation(10, 0x1000);
        c.note_allocation(20, 0x2000);
        c.note_allocation(20, 0x4000);
        c.note_free(0x4000);
        assert_eq!(c.forget(20), [0x2000, 0x3000]);
        assert_eq!(c.forget(20), [] as [u64; 0], "forgotten once");
        let order = Mutex::new(Vec::new());
        c.drain_device(10, |ctx| {
            order.lock().push(ctx);
            Ok(())
        })
        .unwrap();
        assert_eq!(*order.lock(), [10]);
    }
}
