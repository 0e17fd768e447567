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
//! ([`hash_on_device_for`]) where that class has not measured both modes. The
//! choice is a function of the recorded costs alone, so it is deterministic.
//!
//! The two modes are two ways of restoring: a launch on the device is snapshotted for hash
//! restores (its snapshot hashed on the device, every restore hashing every chunk there and
//! writing back the changed ones, [`chosen_strategy`]); offering the kernels alone
//! left the snapshot crate's `auto` free to skip the hashes by its own rates, and its restores
//! were then full copies in both modes.

use kreplay_snapshot::RestoreStrategy;
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
/// restored by hash restores ([`chosen_strategy`]), which learn nothing, so its
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

/// What one restore of a device shadow costs: a fixed part per restore plus the footprint at a
/// rate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RestoreCost {
    /// Microseconds every restore costs (launches, copies of lists, the wait).
    pub fixed_us: f64,
    /// Bytes of footprint per microsecond (1e6 = 1 TB/s).
    pub bytes_per_us: f64,
}

impl RestoreCost {
    /// Microseconds of one restore of `footprint` bytes.
    pub fn at(&self, footprint: u64) -> f64 {
        self.fixed_us + footprint as f64 / self.bytes_per_us
    }
}

/// A full restore of a device shadow (copy engine), fitted to `kreplay bench --backend cuda` on
/// the H200 (one allocation; 64 MiB 0.043 ms, 256 MiB 0.142, 1 GiB 0.531, 32 GiB 16.38):
/// 20 us + footprint at 2.10 TB/s.
pub const FULL_RESTORE_COST: RestoreCost = RestoreCost {
    fixed_us: 20.0,
    bytes_per_us: 2.10e6,
};

/// A verified restore on the device (`kreplay_restore_verified` and `kreplay_gather_found`,
/// one wait) with little written, fitted to the same bench (0.1% written; 64 MiB 0.075 ms,
/// 256 MiB 0.103, 1 GiB 0.285, 32 GiB 7.85): 41 us + footprint at 4.40 TB/s.
pub const VERIFIED_RESTORE_COST: RestoreCost = RestoreCost {
    fixed_us: 41.0,
    bytes_per_us: 4.40e6,
};

/// Whether the device kernels are offered to the snapshot for a launch whose tracked footprint
/// on its device is `footprint` bytes. `hash`, `writeset` and `writeset-unverified` always
/// detect on the device. `auto` does where a verified restore on the device costs less than a
/// full copy by the measured costs above (from about 84 MB; smaller footprints are restored in
/// full); the snapshot crate's `auto` then chooses per restore between a full restore, a hash
/// restore and the learned write set from what the kernel's restores changed.
pub fn hash_on_device_for(strategy: RestoreStrategy, footprint: u64) -> bool {
    strategy != RestoreStrategy::Auto
        || VERIFIED_RESTORE_COST.at(footprint) < FULL_RESTORE_COST.at(footprint)
}

/// Whether a verified restore on the device can ever beat a full copy of `footprint` bytes: not
/// where the full copy costs less than a verified restore's fixed part alone (its launches, the
/// bitmap's round trip), whatever the launch writes (below about 44 MB by the costs above).
pub fn device_can_win(footprint: u64) -> bool {
    FULL_RESTORE_COST.at(footprint) > VERIFIED_RESTORE_COST.fixed_us
}

/// `auto`'s choice for a launch with key `key` over `footprint` bytes: never the device where it
/// cannot win ([`device_can_win`]: such launches are not spent measuring it), else what this
/// process measured (`measured`, see [`crate::choice`]) or the fitted model alone.
pub fn detection_for(
    choice: &DeviceChoice,
    key: ChoiceKey,
    footprint: u64,
    measured: bool,
) -> bool {
    let prior = hash_on_device_for(RestoreStrategy::Auto, footprint);
    if !device_can_win(footprint) {
        false
    } else if measured {
        choice.choose(key, prior)
    } else {
        prior
    }
}

/// The snapshot strategy of a launch `auto` chose to restore with detection on the device (`on`)
/// or not: hash restores (the snapshot hashed on the device, each restore hashing every chunk
/// there and writing back the changed ones in the same launches), so that the choice's two modes
/// are two different ways of restoring and what it measures of each is that way's cost; full
/// copies stay with `auto` (which copies a device shadow in full when the device offers no
/// hash). Not the verified write set: it writes the learned set and verifies only the rest,
/// which saves reading the set, but its lists cost host time per chunk of the set, and in
/// `kreplay bench --backend cuda`'s whole replays on the H200 it cost more than hash restores
/// wherever either beat full copies (38 passes, 10% written: 0.835 of N full restores against
/// 0.662 at 32 GiB, 15.6 against 13.9 ms at 1 GiB; 1.04-1.13 times at 0.1% and 1%).
pub fn chosen_strategy(on: bool) -> Option<RestoreStrategy> {
    on.then_some(RestoreStrategy::Hash)
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
    #[test]
    fn small_footprints_are_never_sent_to_the_device_to_be_measured() {
        let mut c = DeviceChoice::default();
        for mib in [2u64, 20, 40] {
            let key = ChoiceKey::new(7, mib << 20);
            // Measured with full copies: a key then measures the device, unless it cannot win.
            c.record(key, false, 40_000.0);
            assert!(!device_can_win(mib << 20), "{mib} MiB");
            assert!(!detection_for(&c, key, mib << 20, true), "{mib} MiB");
            assert!(!detection_for(&c, key, mib << 20, false), "{mib} MiB");
        }
        // From about 44 MB the device may win: measured there.
        let key = ChoiceKey::new(7, 60 << 20);
        assert!(device_can_win(60 << 20));
        c.record(key, false, 40_000.0);
        assert!(detection_for(&c, key, 60 << 20, true));
        assert!(!detection_for(&c, key, 60 << 20, false));
        assert!(detection_for(
            &c,
            ChoiceKey::new(8, 1 << 30),
            1 << 30,
            false
        ));
    }

    #[test]
    fn a_launch_auto_sends_to_the_device_is_snapshotted_for_hash_restores() {
        // On the device: hashed at the snapshot, every restore verified; full copies are left
        // to auto, which copies a shadow in full where the device offers no hash.
        assert_eq!(chosen_strategy(true), Some(RestoreStrategy::Hash));
        assert_eq!(chosen_strategy(false), None);
    }

    #[test]
    fn auto_detects_on_the_device_where_the_measured_costs_beat_a_full_copy() {
        assert!(!hash_on_device_for(RestoreStrategy::Auto, 0));
        // Measured on the H200: 64 MiB full 0.043 ms against 0.075 verified; 256 MiB 0.142
        // against 0.103.
        assert!(!hash_on_device_for(RestoreStrategy::Auto, 64 << 20));
        assert!(hash_on_device_for(RestoreStrategy::Auto, 256 << 20));
        assert!(hash_on_device_for(RestoreStrategy::Auto, 1 << 30));
        assert!(hash_on_device_for(RestoreStrategy::Auto, 32 << 30));
        let even = (VERIFIED_RESTORE_COST.fixed_us - FULL_RESTORE_COST.fixed_us)
            / (1.0 / FULL_RESTORE_COST.bytes_per_us - 1.0 / VERIFIED_RESTORE_COST.bytes_per_us);
        assert!((80e6..90e6).contains(&even), "break-even at {even} bytes");
        for s in [
            RestoreStrategy::Full,
            RestoreStrategy::Hash,
            RestoreStrategy::Writeset,
            RestoreStrategy::WritesetUnverified,
        ] {
            assert!(hash_on_device_for(s, 0), "{s}");
        }
    }
}
