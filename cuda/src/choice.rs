//! `auto`'s choice, per launch, between restoring a device shadow in full (copy engine or one
//! gather launch) and offering the device kernels to the snapshot (hash at the snapshot, verified
//! restores that read the footprint and copy what changed), from what this process measured.
//!
//! A fixed cost model cannot know the program: what a verified restore saves depends on how much
//! of the footprint its kernel writes, and its fixed costs on the GPU and the driver. So each
//! launch's cost per restore (its snapshot and all its restores, over the number of restores) is
//! recorded under the mode it ran in, keyed by the launched function (its kernel key,
//! `ModuleRegistry::kernel_key`: its handle, renewed at a module unload) and the footprint's size
//! class (a power of two). A key is decided once it ran once with full copies and once on the
//! device (hash restores learn nothing, so one launch says what the next costs), by the latest
//! cost of each mode; until
//! then it runs in the mode still missing a measurement. A key never seen takes what its size
//! class measured over all functions (the mean of each mode), and the fitted model
//! ([`crate::inject::hash_on_device_for`]) where that class has not measured both modes. The
//! choice is a function of the recorded costs alone, so it is deterministic.
//!
//! The two modes are two ways of restoring: a launch on the device is snapshotted for hash
//! restores (its snapshot hashed on the device, every restore hashing every chunk there and
//! writing back the changed ones, [`crate::inject::chosen_strategy`]); offering the kernels alone
//! left the snapshot crate's `auto` free to skip the hashes by its own rates, and its restores
//! were then full copies in both modes.

use std::collections::HashMap;

/// What a choice is about: the launched function and the footprint's size class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ChoiceKey {
    function: usize,
    class: u32,
}

impl ChoiceKey {
    /// The key of a launch of `function` (its handle) over `footprint` bytes.
    pub fn new(function: usize, footprint: u64) -> ChoiceKey {
        ChoiceKey {
            function,
            class: size_class(footprint),
        }
    }
}

/// The power-of-two size class of `footprint` (0 for nothing, else 1 + floor(log2)).
pub fn size_class(footprint: u64) -> u32 {
    u64::BITS - footprint.leading_zeros()
}

/// Measured cost per restore of one mode: the sum, the count of launches and the latest.
#[derive(Clone, Copy, Debug, Default)]
struct Measured {
    ns: f64,
    launches: u32,
    last: f64,
}

impl Measured {
    fn add(&mut self, ns: f64) {
        self.ns += ns;
        self.launches += 1;
        self.last = ns;
    }

    fn mean(&self) -> Option<f64> {
        (self.launches > 0).then(|| self.ns / f64::from(self.launches))
    }
}

/// Both modes' measurements: `[full copy, on the device]`.
type Pair = [Measured; 2];

/// Launches on the device a key needs before it is decided. One: a launch on the device is
/// restored by hash restores ([`crate::inject::chosen_strategy`]), which learn nothing, so its
/// second launch costs what its first did. (Two while the device mode was the verified write
/// set, whose first launch learned the set: a kernel launched four times then spent two of them
/// measuring the device, and in `kreplay bench --backend cuda`'s whole replays of two passes
/// with a tenth or all of the footprint written `auto` cost 1.08-1.12 and 1.65 times full
/// copies over four dispatches.)
pub const DEVICE_LAUNCHES_TO_DECIDE: u32 = 1;

/// A key's mode: the cheaper by the latest costs once decided (ties keep full copies), else the
/// mode still to measure.
fn key_mode(pair: &Pair) -> bool {
    let [full, device] = pair;
    if full.launches == 0 {
        return false;
    }
    if device.launches < DEVICE_LAUNCHES_TO_DECIDE {
        return true;
    }
    device.last < full.last
}

/// A size class's mode when both were measured: the cheaper by their means.
fn class_mode(pair: &Pair) -> Option<bool> {
    Some(pair[1].mean()? < pair[0].mean()?)
}

/// Measured choices of one device.
#[derive(Debug, Default)]
pub struct DeviceChoice {
    keys: HashMap<ChoiceKey, Pair>,
    classes: HashMap<u32, Pair>,
}

impl DeviceChoice {
    /// Whether a launch with key `key` detects on the device; `prior` is the fitted model's
    /// answer for its footprint (see the module docs for the order of the rules).
    pub fn choose(&self, key: ChoiceKey, prior: bool) -> bool {
        if let Some(pair) = self.keys.get(&key) {
            return key_mode(pair);
        }
        self.classes
            .get(&key.class)
            .and_then(class_mode)
            .unwrap_or(prior)
    }

    /// Record a launch with key `key` that ran with detection on the device (`on`) or not and
    /// cost `ns` nanoseconds per restore (its snapshot and restores over its restores).
    pub fn record(&mut self, key: ChoiceKey, on: bool, ns: f64) {
        if !ns.is_finite() || ns < 0.0 {
            return;
        }
        let i = usize::from(on);
        self.keys.entry(key).or_default()[i].add(ns);
        self.classes.entry(key.class).or_default()[i].add(ns);
    }

    /// How many keys have been measured enough to be decided.
    pub fn decided(&self) -> usize {
        self.keys
            .values()
            .filter(|[f, d]| f.launches > 0 && d.launches >= DEVICE_LAUNCHES_TO_DECIDE)
            .count()
    }
}

/// The cost per restore of a replay whose snapshot took `snapshot_ns` and whose `restores`
/// restores took `restore_ns` in all; `None` without restores (nothing to learn from).
pub fn per_restore_ns(snapshot_ns: u64, restore_ns: u64, restores: usize) -> Option<f64> {
    (restores > 0).then(|| (snapshot_ns + restore_ns) as f64 / restores as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_key_measures_both_modes_once_then_keeps_the_cheaper_by_the_latest_costs() {
        let mut c = DeviceChoice::default();
        let k = ChoiceKey::new(0x10, 200 * MIB);
        // The fitted model says "on the device" for 200 MiB: the first launch follows it.
        assert!(c.choose(k, true));
        c.record(k, true, 60_000.0);
        assert_eq!(c.decided(), 0);
        // Then full copies once, whatever the model says.
        assert!(!c.choose(k, true));
        c.record(k, false, 80_000.0);
        // Decided after one launch in each mode: the device was cheaper.
        assert_eq!(c.decided(), 1);
        assert!(c.choose(k, true));
        assert!(c.choose(k, false));
        // The device's next launch costs more than the full copies did: full copies.
        c.record(k, true, 90_000.0);
        assert!(!c.choose(k, true));
        c.record(k, false, 100_000.0);
        assert!(c.choose(k, true));
    }

    #[test]
    fn a_kernel_that_writes_much_spends_one_launch_on_the_device_not_two() {
        // Four launches whose full copies are cheaper (as where a tenth or all is written): the
        // model sends none to the device, the key measures it once, then keeps full copies.
        let mut c = DeviceChoice::default();
        let k = ChoiceKey::new(0x11, 1 << 30);
        let mut on_device = 0;
        for _ in 0..4 {
            let on = c.choose(k, false);
            on_device += u32::from(on);
            c.record(k, on, if on { 1_600_000.0 } else { 520_000.0 });
        }
        assert_eq!(on_device, 1);
    }

    #[test]
    fn a_small_footprint_measured_cheaper_on_the_device_leaves_full_copies() {
        // The fitted model keeps 40 MiB in full copies; this process measures otherwise.
        let mut c = DeviceChoice::default();
        let k = ChoiceKey::new(0x20, 40 * MIB);
        assert!(!c.choose(k, false));
        c.record(k, false, 60_000.0);
        assert!(c.choose(k, false));
        c.record(k, true, 35_000.0);
        assert!(c.choose(k, false));
        c.record(k, true, 38_000.0);
        assert!(c.choose(k, false));
    }

    #[test]
    fn a_new_function_takes_what_its_size_class_measured_or_the_model() {
        let mut c = DeviceChoice::default();
        let a = ChoiceKey::new(0x30, 70 * MIB);
        c.record(a, false, 90_000.0);
        // One mode measured in the class: an unseen function still follows the model.
        let b = ChoiceKey::new(0x40, 100 * MIB);
        assert_eq!(size_class(70 * MIB), size_class(100 * MIB));
        assert!(!c.choose(b, false));
        assert!(c.choose(b, true));
        c.record(a, true, 50_000.0);
        // Both measured in the class: the cheaper, whatever the model says.
        assert!(c.choose(b, false));
        // Another size class knows nothing yet.
        let d = ChoiceKey::new(0x40, 300 * MIB);
        assert!(!c.choose(d, false));
    }

    #[test]
    fn ties_and_unusable_figures_keep_full_copies() {
        let mut c = DeviceChoice::default();
        let k = ChoiceKey::new(1, 64 * MIB);
        c.record(k, true, f64::NAN);
        c.record(k, true, -1.0);
        // Nothing recorded: the model.
        assert!(!c.choose(k, false));
        c.record(k, false, 50_000.0);
        c.record(k, true, 50_000.0);
        c.record(k, true, 50_000.0);
        assert!(!c.choose(k, true));
        assert_eq!(per_restore_ns(1_000, 9_000, 0), None);
        assert_eq!(per_restore_ns(1_000, 9_000, 10), Some(1_000.0));
    }
}
