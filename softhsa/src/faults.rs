//! Fault injection: makes softhsa fail or slow down the way a real runtime and a real GPU can,
//! so that what sits on top (kreplay, applications) can be tested against those failures.
//!
//! A [`FaultPlan`] gives each [`Fault`] a probability per opportunity (each call of the entry
//! point, each packet, each copy) and, for the slowing faults, a duration. Decisions are drawn
//! from a counter per fault mixed with the plan's seed, so one seed always gives the same
//! sequence of decisions per fault: the *n*-th `hsa_memory_copy` of a run fails or not
//! depending only on the seed and *n* (which call is the *n*-th still depends on how threads
//! interleave).
//!
//! A plan is switched on for the whole process with [`install`] (per test) or, at the `hsa_init`
//! that starts an instance, from the environment variable [`ENV_VAR`]
//! (`KREPLAY_SOFTHSA_FAULTS=copy:0.01,signal_create:0.001,queue_stall:0.001@500,seed:7`); a
//! malformed value makes that `hsa_init` fail and names the variable on stderr. Once
//! [`install`] has been called (with a plan or with `None`), the environment is no longer read.
//!
//! What each fault does, as an application sees it:
//!
//! | fault | where | effect |
//! |---|---|---|
//! | `copy` | `hsa_memory_copy` | returns `HSA_STATUS_ERROR`, moves nothing |
//! | `async_copy` | `hsa_amd_memory_async_copy(_rect)` | returns `HSA_STATUS_ERROR_OUT_OF_RESOURCES`, queues nothing |
//! | `signal_create` | `hsa_signal_create`, `hsa_amd_signal_create` | returns `HSA_STATUS_ERROR_OUT_OF_RESOURCES` |
//! | `pool_allocate` | `hsa_amd_memory_pool_allocate`, `hsa_memory_allocate` | returns `HSA_STATUS_ERROR_OUT_OF_RESOURCES` |
//! | `slow_kernel` | each kernel dispatch a packet processor runs | runs `@ms` later (default 20 ms) |
//! | `queue_stall` | each packet a packet processor takes | the queue stops for `@ms` first (default 2000 ms): it does not drain |
//! | `async_copy_delay` | each asynchronous copy an engine runs | lands `@ms` later (default 20 ms) |

use hsa_sys::{HSA_STATUS_ERROR, HSA_STATUS_ERROR_OUT_OF_RESOURCES, hsa_status_t};
use parking_lot::RwLock;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The environment variable read at the `hsa_init` that starts an instance.
pub const ENV_VAR: &str = "KREPLAY_SOFTHSA_FAULTS";

/// One kind of injected fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fault {
    /// `hsa_memory_copy` fails.
    Copy,
    /// An asynchronous copy cannot be submitted.
    AsyncCopy,
    /// A signal cannot be created.
    SignalCreate,
    /// A memory allocation fails.
    PoolAllocate,
    /// A kernel dispatch starts late.
    SlowKernel,
    /// A queue stops taking packets for a while.
    QueueStall,
    /// An asynchronous copy lands late.
    AsyncCopyDelay,
}

impl Fault {
    /// Every fault, in a fixed order.
    pub const ALL: [Fault; 7] = [
        Fault::Copy,
        Fault::AsyncCopy,
        Fault::SignalCreate,
        Fault::PoolAllocate,
        Fault::SlowKernel,
        Fault::QueueStall,
        Fault::AsyncCopyDelay,
    ];

    /// The name used in a fault spec.
    pub fn name(self) -> &'static str {
        match self {
            Fault::Copy => "copy",
            Fault::AsyncCopy => "async_copy",
            Fault::SignalCreate => "signal_create",
            Fault::PoolAllocate => "pool_allocate",
            Fault::SlowKernel => "slow_kernel",
            Fault::QueueStall => "queue_stall",
            Fault::AsyncCopyDelay => "async_copy_delay",
        }
    }

    /// The fault a spec name stands for.
    pub fn from_name(name: &str) -> Option<Fault> {
        Fault::ALL.into_iter().find(|f| f.name() == name)
    }

    fn index(self) -> usize {
        Fault::ALL.iter().position(|&f| f == self).unwrap_or(0)
    }

    /// Whether the fault slows something down (and so takes a duration) rather than failing.
    pub fn is_delay(self) -> bool {
        matches!(
            self,
            Fault::SlowKernel | Fault::QueueStall | Fault::AsyncCopyDelay
        )
    }

    /// How long a slowing fault lasts when the spec gives no `@ms`.
    pub fn default_delay(self) -> Duration {
        match self {
            Fault::QueueStall => Duration::from_millis(2000),
            _ => Duration::from_millis(20),
        }
    }
}

/// How often, and for how long, one fault strikes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FaultRate {
    /// Probability per opportunity, in `[0, 1]`.
    pub probability: f64,
    /// Opportunities at the start that are never faulted (lets a test aim at a later call).
    pub skip_first: u64,
    /// For the slowing faults: how long.
    pub delay: Duration,
    /// Strikes after which the fault stops (`u64::MAX`: never stops).
    pub at_most: u64,
}

/// Which faults strike, how often, from which seed.
#[derive(Clone, Debug, PartialEq)]
pub struct FaultPlan {
    /// The seed every decision is drawn from.
    pub seed: u64,
    rates: [Option<FaultRate>; 7],
}

impl Default for FaultPlan {
    fn default() -> Self {
        FaultPlan::new(0)
    }
}

impl FaultPlan {
    /// A plan with no faults, drawing from `seed`.
    pub fn new(seed: u64) -> Self {
        FaultPlan {
            seed,
            rates: [None; 7],
        }
    }

    /// Adds (or replaces) `fault` with `probability` (clamped to `[0, 1]`) and its default
    /// duration.
    pub fn with(mut self, fault: Fault, probability: f64) -> Self {
        self.rates[fault.index()] = Some(FaultRate {
            probability: probability.clamp(0.0, 1.0),
            skip_first: 0,
            at_most: u64::MAX,
            delay: fault.default_delay(),
        });
        self
    }

    /// Sets how long a slowing fault lasts (adds it with probability 1 if absent).
    pub fn with_delay(mut self, fault: Fault, delay: Duration) -> Self {
        let rate = self.rates[fault.index()].get_or_insert(FaultRate {
            probability: 1.0,
            skip_first: 0,
            at_most: u64::MAX,
            delay,
        });
        rate.delay = delay;
        self
    }

    /// Leaves the first `count` opportunities of `fault` alone (adds it with probability 1 if
    /// absent): `FaultPlan::new(0).skip_first(Fault::Copy, 2)` fails every copy from the third.
    pub fn skip_first(mut self, fault: Fault, count: u64) -> Self {
        let rate = self.rates[fault.index()].get_or_insert(FaultRate {
            probability: 1.0,
            skip_first: 0,
            at_most: u64::MAX,
            delay: fault.default_delay(),
        });
        rate.skip_first = count;
        self
    }

    /// Lets `fault` strike at most `count` times (adds it with probability 1 if absent):
    /// `FaultPlan::new(0).at_most(Fault::QueueStall, 1)` stalls one packet only.
    pub fn at_most(mut self, fault: Fault, count: u64) -> Self {
        let rate = self.rates[fault.index()].get_or_insert(FaultRate {
            probability: 1.0,
            skip_first: 0,
            at_most: u64::MAX,
            delay: fault.default_delay(),
        });
        rate.at_most = count;
        self
    }

    /// The rate of `fault`, if the plan has it.
    pub fn rate(&self, fault: Fault) -> Option<FaultRate> {
        self.rates[fault.index()]
    }

    /// Whether the plan injects nothing.
    pub fn is_empty(&self) -> bool {
        self.rates
            .iter()
            .all(|r| r.is_none_or(|r| r.probability == 0.0))
    }

    /// Parses a spec: comma-separated `name:probability[@milliseconds]` items and an optional
    /// `seed:N`. Names are those of [`Fault::name`]; `@milliseconds` only for the slowing
    /// faults. Whitespace around items is allowed; anything else is an error saying what is
    /// wrong.
    ///
    /// ```
    /// use kreplay_softhsa::faults::{Fault, FaultPlan};
    /// let plan = FaultPlan::parse("copy:0.5, queue_stall:0.01@300, seed:9").unwrap();
    /// assert_eq!(plan.seed, 9);
    /// assert_eq!(plan.rate(Fault::Copy).unwrap().probability, 0.5);
    /// assert!(FaultPlan::parse("copy:2").is_err());
    /// assert!(FaultPlan::parse("copies:0.1").is_err());
    /// ```
    pub fn parse(spec: &str) -> Result<FaultPlan, String> {
        let mut plan = FaultPlan::new(0);
        let mut seen = Vec::new();
        for item in spec.split(',') {
            let item = item.trim();
            if item.is_empty() {
                return Err(format!("empty item in fault spec '{spec}'"));
            }
            let Some((name, value)) = item.split_once(':') else {
                return Err(format!(
                    "'{item}' is not name:probability (known faults: {})",
                    known()
                ));
            };
            let (name, value) = (name.trim(), value.trim());
            if seen.contains(&name) {
                return Err(format!("'{name}' is given twice"));
            }
            seen.push(name);
            if name == "seed" {
                plan.seed = value
                    .parse()
                    .map_err(|_| format!("seed '{value}' is not an unsigned integer"))?;
                continue;
            }
            let fault = Fault::from_name(name)
                .ok_or_else(|| format!("unknown fault '{name}' (known: {}, seed)", known()))?;
            let (probability, delay) = match value.split_once('@') {
                Some((p, ms)) => {
                    if !fault.is_delay() {
                        return Err(format!("'{name}' takes no @milliseconds"));
                    }
                    let ms: u64 = ms.trim().parse().map_err(|_| {
                        format!("'{ms}' in '{item}' is not a whole number of milliseconds")
                    })?;
                    (p.trim(), Duration::from_millis(ms))
                }
                None => (value, fault.default_delay()),
            };
            let probability: f64 = probability
                .parse()
                .ok()
                .filter(|p: &f64| (0.0..=1.0).contains(p))
                .ok_or_else(|| {
                    format!("probability '{probability}' of '{name}' is not a number in [0, 1]")
                })?;
            plan.rates[fault.index()] = Some(FaultRate {
                probability,
                skip_first: 0,
                at_most: u64::MAX,
                delay,
            });
        }
        Ok(plan)
    }

    /// The plan named by [`ENV_VAR`]: `Ok(None)` when unset or empty, an error naming the
    /// variable when malformed.
    pub fn from_env() -> Result<Option<FaultPlan>, String> {
        match std::env::var(ENV_VAR) {
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => Err(format!("{ENV_VAR} is not UTF-8")),
            Ok(value) if value.trim().is_empty() => Ok(None),
            Ok(value) => FaultPlan::parse(&value)
                .map(Some)
                .map_err(|e| format!("{ENV_VAR}='{value}': {e}")),
        }
    }

    /// The plan back as a spec that [`FaultPlan::parse`] reads.
    pub fn to_spec(&self) -> String {
        let mut items = Vec::new();
        for fault in Fault::ALL {
            if let Some(rate) = self.rate(fault) {
                if fault.is_delay() {
                    items.push(format!(
                        "{}:{}@{}",
                        fault.name(),
                        rate.probability,
                        rate.delay.as_millis()
                    ));
                } else {
                    items.push(format!("{}:{}", fault.name(), rate.probability));
                }
            }
        }
        items.push(format!("seed:{}", self.seed));
        items.join(",")
    }
}

fn known() -> String {
    Fault::ALL.map(Fault::name).join(", ")
}

/// An installed plan with its decision counters.
struct Active {
    plan: FaultPlan,
    /// Opportunities seen, per fault.
    seen: [AtomicU64; 7],
    /// Strikes of this plan, per fault.
    struck: [AtomicU64; 7],
}

static ACTIVE: RwLock<Option<Arc<Active>>> = RwLock::new(None);
/// Whether [`install`] was called (then the environment is not consulted any more).
static INSTALLED_BY_API: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// Faults that struck since the last [`reset_counts`], per fault.
static FIRED: [AtomicU64; 7] = [const { AtomicU64::new(0) }; 7];

/// Switches `plan` on for the whole process (replacing any plan, from the environment too) and
/// restarts its decision sequence. `None` switches fault injection off. From the first call on,
/// the environment variable is no longer consulted: what was installed last is in force.
pub fn install(plan: Option<FaultPlan>) {
    INSTALLED_BY_API.store(true, Ordering::SeqCst);
    *ACTIVE.write() = plan.map(|plan| {
        Arc::new(Active {
            plan,
            seen: [const { AtomicU64::new(0) }; 7],
            struck: [const { AtomicU64::new(0) }; 7],
        })
    });
}

/// The plan in force, if any.
pub fn current() -> Option<FaultPlan> {
    ACTIVE.read().as_ref().map(|a| a.plan.clone())
}

/// How many times `fault` struck since the process started or [`reset_counts`].
pub fn fired(fault: Fault) -> u64 {
    FIRED[fault.index()].load(Ordering::SeqCst)
}

/// Sets every [`fired`] count back to 0.
pub fn reset_counts() {
    for count in &FIRED {
        count.store(0, Ordering::SeqCst);
    }
}

/// Reads [`ENV_VAR`] for a starting instance unless a plan was installed with [`install`].
pub(crate) fn init_from_env() -> Result<(), hsa_status_t> {
    if INSTALLED_BY_API.load(Ordering::SeqCst) {
        return Ok(());
    }
    match FaultPlan::from_env() {
        Ok(plan) => {
            *ACTIVE.write() = plan.map(|plan| {
                Arc::new(Active {
                    plan,
                    seen: [const { AtomicU64::new(0) }; 7],
                    struck: [const { AtomicU64::new(0) }; 7],
                })
            });
            Ok(())
        }
        Err(error) => {
            eprintln!("softhsa: error: {error}");
            Err(hsa_sys::HSA_STATUS_ERROR_INVALID_ARGUMENT)
        }
    }
}

/// A 64-bit mix (splitmix64's finalizer).
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Whether the `n`-th opportunity of `fault` strikes under `seed` at `probability`.
fn decides(seed: u64, fault: Fault, n: u64, probability: f64) -> bool {
    let draw = mix(seed ^ mix(((fault.index() as u64) << 56) ^ n));
    // 53 random bits as a number in [0, 1).
    let unit = (draw >> 11) as f64 / (1u64 << 53) as f64;
    unit < probability
}

/// Draws the next decision for `fault`: its duration when it strikes.
fn strikes(fault: Fault) -> Option<Duration> {
    let active = ACTIVE.read().clone()?;
    let rate = active.plan.rate(fault)?;
    if rate.probability <= 0.0 {
        return None;
    }
    let n = active.seen[fault.index()].fetch_add(1, Ordering::Relaxed);
    if n < rate.skip_first {
        return None;
    }
    if decides(active.plan.seed, fault, n, rate.probability) {
        let struck = &active.struck[fault.index()];
        if struck
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |s| {
                (s < rate.at_most).then_some(s + 1)
            })
            .is_err()
        {
            return None;
        }
        FIRED[fault.index()].fetch_add(1, Ordering::SeqCst);
        Some(rate.delay)
    } else {
        None
    }
}

/// The status an entry point returns when `fault` strikes now (one call of the entry point is
/// one opportunity). For the failing faults only.
pub(crate) fn check(fault: Fault) -> Result<(), hsa_status_t> {
    match strikes(fault) {
        None => Ok(()),
        Some(_) if fault == Fault::Copy => Err(HSA_STATUS_ERROR),
        Some(_) => Err(HSA_STATUS_ERROR_OUT_OF_RESOURCES),
    }
}

/// Waits out a slowing fault when it strikes now; returns early once `stop` says so.
pub(crate) fn delay(fault: Fault, stop: impl Fn() -> bool) {
    let Some(duration) = strikes(fault) else {
        return;
    };
    let until = Instant::now() + duration;
    // This is the injected slowness itself (a stalled queue or a slow engine), not a wait for a
    // condition: it sleeps in slices so a stopping runtime is not held up for long.
    while !stop() {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(Duration::from_millis(5)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsing_rejects_every_malformed_item_with_its_reason() {
        for (spec, needle) in [
            ("", "empty item"),
            ("copy", "not name:probability"),
            ("copy:x", "not a number"),
            ("copy:-0.1", "not a number in [0, 1]"),
            ("copy:1.5", "not a number in [0, 1]"),
            ("copy:NaN", "not a number in [0, 1]"),
            ("bogus:0.1", "unknown fault 'bogus'"),
            ("copy:0.1@5", "takes no @milliseconds"),
            ("slow_kernel:0.1@fast", "not a whole number"),
            ("seed:-1", "seed"),
            ("copy:0.1,copy:0.2", "given twice"),
            ("copy:0.1,,signal_create:0.1", "empty item"),
        ] {
            let error = FaultPlan::parse(spec).expect_err(spec);
            assert!(error.contains(needle), "{spec:?}: {error}");
        }
    }

    #[test]
    fn a_parsed_plan_round_trips_through_its_spec() {
        let plan = FaultPlan::parse(
            "copy:0.01,async_copy:0.02,signal_create:0.001,pool_allocate:0.5,slow_kernel:0.1@3,\
             queue_stall:0.001@250,async_copy_delay:1@7,seed:42",
        )
        .unwrap();
        assert_eq!(FaultPlan::parse(&plan.to_spec()).unwrap(), plan);
        assert_eq!(
            plan.rate(Fault::QueueStall).unwrap().delay,
            Duration::from_millis(250)
        );
        assert_eq!(plan.seed, 42);
    }

    #[test]
    fn the_same_seed_draws_the_same_decisions() {
        let draws = |seed: u64| -> Vec<bool> {
            (0..2000u64)
                .map(|n| decides(seed, Fault::Copy, n, 0.1))
                .collect()
        };
        assert_eq!(draws(7), draws(7));
        assert_ne!(draws(7), draws(8));
        let hits = draws(7).iter().filter(|&&b| b).count();
        assert!((120..280).contains(&hits), "about 10% of 2000, got {hits}");
    }
}
