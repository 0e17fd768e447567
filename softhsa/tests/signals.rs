//! Signals through the API table: every operation and memory order, waits, handlers.

mod common;

use common::*;
use hsa_sys::*;
use kreplay_softhsa::testing::{Hsa, Session};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

/// The tests of this file run side by side, but for the one that waits on a destroyed
/// signal's handle, which runs alone: softhsa hands a destroyed signal's memory, and with it its
/// handle (the address of its ABI block, as on ROCm), to the next signal created anywhere in the
/// process, so a test creating a signal meanwhile would make that handle name its own, live
/// signal.
static HANDLES: RwLock<()> = RwLock::new(());

/// A session of a test that runs beside the others (see [`HANDLES`]).
struct Shared {
    _session: Session,
    _shared: RwLockReadGuard<'static, ()>,
}

/// A session of a test that runs alone (see [`HANDLES`]).
struct Alone {
    _session: Session,
    _alone: RwLockWriteGuard<'static, ()>,
}

/// `common::open` for a test that runs beside the others.
fn open() -> (Hsa, Shared) {
    let shared = HANDLES
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let (hsa, session) = common::open();
    (
        hsa,
        Shared {
            _session: session,
            _shared: shared,
        },
    )
}

/// `common::open` for a test that no other test of this file runs beside.
fn open_alone() -> (Hsa, Alone) {
    let alone = HANDLES
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let (hsa, session) = common::open();
    (
        hsa,
        Alone {
            _session: session,
            _alone: alone,
        },
    )
}

type Op = unsafe extern "C" fn(hsa_signal_t, hsa_signal_value_t);
type Xchg = unsafe extern "C" fn(hsa_signal_t, hsa_signal_value_t) -> hsa_signal_value_t;
type Cas = unsafe extern "C" fn(
    hsa_signal_t,
    hsa_signal_value_t,
    hsa_signal_value_t,
) -> hsa_signal_value_t;

#[test]
fn every_operation_in_every_memory_order_changes_the_value() {
    let (hsa, _session) = open();
    let c = *hsa.core();
    let s = hsa.signal_create(0).unwrap();
    let loads = [
        c.hsa_signal_load_relaxed_fn.unwrap(),
        c.hsa_signal_load_scacquire_fn.unwrap(),
    ];
    let load = |s| {
        // SAFETY: table entries with the HSA signature.
        let values = loads.map(|f| unsafe { f(s) });
        assert_eq!(values[0], values[1]);
        values[0]
    };
    let stores: [Op; 4] = [
        c.hsa_signal_store_relaxed_fn.unwrap(),
        c.hsa_signal_store_screlease_fn.unwrap(),
        c.hsa_signal_silent_store_relaxed_fn.unwrap(),
        c.hsa_signal_silent_store_screlease_fn.unwrap(),
    ];
    for (i, f) in stores.iter().enumerate() {
        // SAFETY: table entry with the HSA signature on a live signal.
        unsafe { f(s, 100 + i as i64) };
        assert_eq!(load(s), 100 + i as i64);
    }
    // (operation, operand, expected result from a start value of 0b1100)
    let groups: [([Op; 4], i64, i64); 5] = [
        (
            [
                c.hsa_signal_add_relaxed_fn.unwrap(),
                c.hsa_signal_add_scacquire_fn.unwrap(),
                c.hsa_signal_add_screlease_fn.unwrap(),
                c.hsa_signal_add_scacq_screl_fn.unwrap(),
            ],
            3,
            15,
        ),
        (
            [
                c.hsa_signal_subtract_relaxed_fn.unwrap(),
                c.hsa_signal_subtract_scacquire_fn.unwrap(),
                c.hsa_signal_subtract_screlease_fn.unwrap(),
                c.hsa_signal_subtract_scacq_screl_fn.unwrap(),
            ],
            5,
            7,
        ),
        (
            [
                c.hsa_signal_and_relaxed_fn.unwrap(),
                c.hsa_signal_and_scacquire_fn.unwrap(),
                c.hsa_signal_and_screlease_fn.unwrap(),
                c.hsa_signal_and_scacq_screl_fn.unwrap(),
            ],
            0b0110,
            0b0100,
        ),
        (
            [
                c.hsa_signal_or_relaxed_fn.unwrap(),
                c.hsa_signal_or_scacquire_fn.unwrap(),
                c.hsa_signal_or_screlease_fn.unwrap(),
                c.hsa_signal_or_scacq_screl_fn.unwrap(),
            ],
            0b0011,
            0b1111,
        ),
        (
            [
                c.hsa_signal_xor_relaxed_fn.unwrap(),
                c.hsa_signal_xor_scacquire_fn.unwrap(),
                c.hsa_signal_xor_screlease_fn.unwrap(),
                c.hsa_signal_xor_scacq_screl_fn.unwrap(),
            ],
            0b1010,
            0b0110,
        ),
    ];
    for (fs, operand, expected) in groups {
        for f in fs {
            hsa.signal_store(s, 0b1100);
            // SAFETY: table entry with the HSA signature on a live signal.
            unsafe { f(s, operand) };
            assert_eq!(load(s), expected);
        }
    }
    let exchanges: [Xchg; 4] = [
        c.hsa_signal_exchange_relaxed_fn.unwrap(),
        c.hsa_signal_exchange_scacquire_fn.unwrap(),
        c.hsa_signal_exchange_screlease_fn.unwrap(),
        c.hsa_signal_exchange_scacq_screl_fn.unwrap(),
    ];
    for (i, f) in exchanges.iter().enumerate() {
        hsa.signal_store(s, i as i64);
        // SAFETY: table entry with the HSA signature on a live signal.
        assert_eq!(unsafe { f(s, 42) }, i as i64);
        assert_eq!(load(s), 42);
    }
    let cases: [Cas; 4] = [
        c.hsa_signal_cas_relaxed_fn.unwrap(),
        c.hsa_signal_cas_scacquire_fn.unwrap(),
        c.hsa_signal_cas_screlease_fn.unwrap(),
        c.hsa_signal_cas_scacq_screl_fn.unwrap(),
    ];
    for f in cases {
        hsa.signal_store(s, 7);
        // SAFETY: table entry with the HSA signature on a live signal.
        unsafe {
            assert_eq!(f(s, 8, 9), 7, "a failed cas returns the current value");
            assert_eq!(load(s), 7);
            assert_eq!(f(s, 7, 9), 7);
        }
        assert_eq!(load(s), 9);
    }
    hsa.signal_destroy(s).unwrap();
}

#[test]
fn waits_honour_every_condition() {
    let (hsa, _session) = open();
    let s = hsa.signal_create(5).unwrap();
    let t = Duration::from_secs(1);
    assert_eq!(hsa.signal_wait(s, HSA_SIGNAL_CONDITION_EQ, 5, t), 5);
    assert_eq!(hsa.signal_wait(s, HSA_SIGNAL_CONDITION_NE, 4, t), 5);
    assert_eq!(hsa.signal_wait(s, HSA_SIGNAL_CONDITION_LT, 6, t), 5);
    assert_eq!(hsa.signal_wait(s, HSA_SIGNAL_CONDITION_GTE, 5, t), 5);
    hsa.signal_destroy(s).unwrap();
}

#[test]
fn a_wait_that_times_out_returns_the_current_value_after_the_timeout() {
    let (hsa, _session) = open();
    let c = *hsa.core();
    let s = hsa.signal_create(3).unwrap();
    for (state, f) in [
        (
            HSA_WAIT_STATE_BLOCKED,
            c.hsa_signal_wait_scacquire_fn.unwrap(),
        ),
        (HSA_WAIT_STATE_ACTIVE, c.hsa_signal_wait_relaxed_fn.unwrap()),
    ] {
        let start = Instant::now();
        // SAFETY: table entry with the HSA signature; timeout is 10 ms in 1 GHz ticks.
        let v = unsafe { f(s, HSA_SIGNAL_CONDITION_EQ, 0, 10_000_000, state) };
        assert_eq!(v, 3);
        assert!(
            start.elapsed() >= Duration::from_millis(10),
            "waited the whole timeout"
        );
    }
    hsa.signal_destroy(s).unwrap();
}

#[test]
fn a_blocked_waiter_is_woken_by_a_store_from_another_thread() {
    let (hsa, _session) = open();
    let s = hsa.signal_create(1).unwrap();
    let go = hsa.signal_create(1).unwrap();
    let waiter = std::thread::spawn(move || {
        hsa.signal_store(go, 0);
        let start = Instant::now();
        let v = hsa.signal_wait(s, HSA_SIGNAL_CONDITION_LT, 1, PROMPT);
        (v, start.elapsed())
    });
    assert!(hsa.wait_zero(go, PROMPT));
    // Stores that do not satisfy the condition wake the waiter, which keeps waiting...
    for value in [5, 9, 1] {
        hsa.signal_store(s, value);
    }
    // ...until one does.
    hsa.signal_store(s, -4);
    let (v, waited) = waiter.join().unwrap();
    assert_eq!(v, -4);
    assert!(waited < PROMPT, "woken by the store, not by the timeout");
    hsa.signal_destroy(s).unwrap();
    hsa.signal_destroy(go).unwrap();
}

#[test]
fn wait_any_returns_the_index_of_the_satisfied_signal() {
    let (hsa, _session) = open();
    let f = hsa.amd().hsa_amd_signal_wait_any_fn.unwrap();
    let mut signals = [
        hsa.signal_create(1).unwrap(),
        hsa.signal_create(1).unwrap(),
        hsa.signal_create(1).unwrap(),
    ];
    let mut conds = [HSA_SIGNAL_CONDITION_EQ; 3];
    let mut values = [0i64; 3];
    let target = signals[2];
    let setter = std::thread::spawn(move || hsa.signal_store(target, 0));
    let mut satisfying = -1;
    // SAFETY: table entry; the arrays hold three elements each.
    let index = unsafe {
        f(
            3,
            signals.as_mut_ptr(),
            conds.as_mut_ptr(),
            values.as_mut_ptr(),
            u64::MAX,
            HSA_WAIT_STATE_BLOCKED,
            &mut satisfying,
        )
    };
    setter.join().unwrap();
    assert_eq!(index, 2);
    assert_eq!(satisfying, 0);
    // A timeout yields u32::MAX.
    hsa.signal_store(signals[2], 1);
    // SAFETY: as above, 1 ms timeout.
    let index = unsafe {
        f(
            3,
            signals.as_mut_ptr(),
            conds.as_mut_ptr(),
            values.as_mut_ptr(),
            1_000_000,
            HSA_WAIT_STATE_BLOCKED,
            &mut satisfying,
        )
    };
    assert_eq!(index, u32::MAX);
}

#[test]
fn wait_any_skips_null_and_destroyed_signals() {
    // ROCm's hsa_amd_signal_wait_any ignores null and invalid signals (indices still refer to
    // the caller's array) and returns u32::MAX at once when no valid signal is left.
    // Alone: a signal another test created meanwhile could take the destroyed one's handle.
    let (hsa, _session) = open_alone();
    let f = hsa.amd().hsa_amd_signal_wait_any_fn.unwrap();
    // `live` first, so it cannot reuse the destroyed signal's handle.
    let live = hsa.signal_create(1).unwrap();
    let gone = hsa.signal_create(0).unwrap();
    hsa.signal_destroy(gone).unwrap();
    let mut signals = [hsa_signal_t { handle: 0 }, gone, live];
    let mut conds = [HSA_SIGNAL_CONDITION_EQ; 3];
    let mut values = [0i64; 3];
    let setter = std::thread::spawn(move || hsa.signal_store(live, 0));
    let mut satisfying = -1;
    // SAFETY: table entry; the arrays hold three elements each; bounded by a 5 s timeout.
    let index = unsafe {
        f(
            3,
            signals.as_mut_ptr(),
            conds.as_mut_ptr(),
            values.as_mut_ptr(),
            PROMPT.as_nanos() as u64,
            HSA_WAIT_STATE_BLOCKED,
            &mut satisfying,
        )
    };
    setter.join().unwrap();
    assert_eq!(index, 2, "the live signal satisfied the wait");
    assert_eq!(satisfying, 0);
    let start = Instant::now();
    // SAFETY: as above, over the first two (null and destroyed) entries only.
    let index = unsafe {
        f(
            2,
            signals.as_mut_ptr(),
            conds.as_mut_ptr(),
            values.as_mut_ptr(),
            PROMPT.as_nanos() as u64,
            HSA_WAIT_STATE_BLOCKED,
            &mut satisfying,
        )
    };
    assert_eq!(index, u32::MAX);
    assert!(
        start.elapsed() < PROMPT,
        "nothing to wait for returns at once"
    );
}

#[test]
fn signal_groups_wait_for_any_member() {
    let (hsa, _session) = open();
    let c = *hsa.core();
    let members = [hsa.signal_create(1).unwrap(), hsa.signal_create(0).unwrap()];
    let mut group = hsa_signal_group_t { handle: 0 };
    let conds = [HSA_SIGNAL_CONDITION_EQ; 2];
    let values = [0i64; 2];
    let mut which = hsa_signal_t { handle: 0 };
    let mut value = -1;
    // SAFETY: table entries; the arrays hold two elements each.
    unsafe {
        assert_eq!(
            c.hsa_signal_group_create_fn.unwrap()(
                2,
                members.as_ptr(),
                0,
                std::ptr::null(),
                &mut group
            ),
            HSA_STATUS_SUCCESS
        );
        let wait = c.hsa_signal_group_wait_any_scacquire_fn.unwrap();
        assert_eq!(
            wait(
                group,
                conds.as_ptr(),
                values.as_ptr(),
                HSA_WAIT_STATE_BLOCKED,
                &mut which,
                &mut value
            ),
            HSA_STATUS_SUCCESS
        );
        assert_eq!((which.handle, value), (members[1].handle, 0));
        assert_eq!(
            c.hsa_signal_group_destroy_fn.unwrap()(group),
            HSA_STATUS_SUCCESS
        );
        assert_eq!(
            c.hsa_signal_group_destroy_fn.unwrap()(group),
            HSA_STATUS_ERROR_INVALID_SIGNAL_GROUP
        );
    }
}

/// Per-handler state: how often it ran, and when to stop.
struct HandlerState {
    calls: AtomicU32,
    keep_until: u32,
    notify: hsa_signal_t,
}

unsafe extern "C" fn counting_handler(value: hsa_signal_value_t, arg: *mut c_void) -> bool {
    // SAFETY: registered with a pointer to a HandlerState that outlives the test.
    let state = unsafe { &*arg.cast::<HandlerState>() };
    let calls = state.calls.fetch_add(1, Ordering::AcqRel) + 1;
    let hsa = kreplay_softhsa::testing::Hsa::softhsa();
    hsa.signal_store(state.notify, value);
    calls < state.keep_until
}

#[test]
fn an_async_handler_runs_when_its_condition_holds_until_it_returns_false() {
    let (hsa, _session) = open();
    let register = hsa.amd().hsa_amd_signal_async_handler_fn.unwrap();
    let s = hsa.signal_create(1).unwrap();
    let notify = hsa.signal_create(-1).unwrap();
    let state = HandlerState {
        calls: AtomicU32::new(0),
        keep_until: 1,
        notify,
    };
    // SAFETY: table entry; `state` outlives the handler, which unregisters itself (returns
    // false) on its first call, before the test ends.
    let status = unsafe {
        register(
            s,
            HSA_SIGNAL_CONDITION_LT,
            1,
            Some(counting_handler),
            std::ptr::from_ref(&state).cast_mut().cast(),
        )
    };
    assert_eq!(status, HSA_STATUS_SUCCESS);
    assert_eq!(
        state.calls.load(Ordering::Acquire),
        0,
        "not called while the condition is false"
    );
    hsa.signal_store(s, 0);
    assert_eq!(
        hsa.signal_wait(notify, HSA_SIGNAL_CONDITION_EQ, 0, PROMPT),
        0
    );
    assert_eq!(state.calls.load(Ordering::Acquire), 1);
    // Returned false: unregistered. A second handler on the same signal proves later
    // satisfying changes were seen by the handler thread without calling the first one again.
    hsa.signal_store(s, 1);
    let notify2 = hsa.signal_create(-1).unwrap();
    let second = HandlerState {
        calls: AtomicU32::new(0),
        keep_until: 1,
        notify: notify2,
    };
    // SAFETY: as above; this handler unregisters itself on its first call.
    let status = unsafe {
        register(
            s,
            HSA_SIGNAL_CONDITION_LT,
            1,
            Some(counting_handler),
            std::ptr::from_ref(&second).cast_mut().cast(),
        )
    };
    assert_eq!(status, HSA_STATUS_SUCCESS);
    hsa.signal_store(s, -7);
    assert_eq!(
        hsa.signal_wait(notify2, HSA_SIGNAL_CONDITION_EQ, -7, PROMPT),
        -7
    );
    assert_eq!(
        state.calls.load(Ordering::Acquire),
        1,
        "the first handler stayed unregistered"
    );
}

unsafe extern "C" fn done_on_third_call(_value: hsa_signal_value_t, arg: *mut c_void) -> bool {
    // SAFETY: registered with a pointer to a HandlerState that outlives the test.
    let state = unsafe { &*arg.cast::<HandlerState>() };
    let calls = state.calls.fetch_add(1, Ordering::AcqRel) + 1;
    if calls < 3 {
        return true;
    }
    kreplay_softhsa::testing::Hsa::softhsa().signal_store(state.notify, 0);
    false
}

#[test]
fn an_async_handler_that_returns_true_is_called_again_while_its_condition_holds() {
    // hsa_ext_amd.h: returning true "resumes monitoring the signal with this handler (as if
    // calling hsa_amd_signal_async_handler again with identical parameters)"; a registration
    // whose condition already holds is called, so ROCm calls the handler again at once while
    // the signal keeps a satisfying value, without any further change.
    let (hsa, _session) = open();
    let register = hsa.amd().hsa_amd_signal_async_handler_fn.unwrap();
    let s = hsa.signal_create(0).unwrap();
    let notify = hsa.signal_create(1).unwrap();
    let state = HandlerState {
        calls: AtomicU32::new(0),
        keep_until: 0,
        notify,
    };
    // SAFETY: table entry; `state` outlives the handler, which unregisters itself (returns
    // false) on its third call; the test waits for that call.
    let status = unsafe {
        register(
            s,
            HSA_SIGNAL_CONDITION_EQ,
            0,
            Some(done_on_third_call),
            std::ptr::from_ref(&state).cast_mut().cast(),
        )
    };
    assert_eq!(status, HSA_STATUS_SUCCESS);
    assert!(
        hsa.wait_zero(notify, PROMPT),
        "called three times for one unchanged value (calls: {})",
        state.calls.load(Ordering::Acquire)
    );
    assert_eq!(state.calls.load(Ordering::Acquire), 3);
}

unsafe extern "C" fn never_called(_value: hsa_signal_value_t, _arg: *mut c_void) -> bool {
    false
}

#[test]
fn signals_the_host_does_not_consume_take_no_async_handler() {
    // ROCm backs a signal with an interrupt only when the host may wait for it (no consumer
    // list, or one naming a CPU agent, and not HSA_AMD_SIGNAL_AMD_GPU_ONLY); its
    // hsa_amd_signal_async_handler refuses any other signal with HSA_STATUS_ERROR_INVALID_SIGNAL.
    let (hsa, _session) = open();
    let (c, a) = (*hsa.core(), *hsa.amd());
    let gpu = hsa.gpu_agents().unwrap()[0];
    let cpu = hsa.cpu_agent().unwrap();
    let create = |consumers: &[hsa_agent_t]| {
        let mut signal = hsa_signal_t { handle: 0 };
        // SAFETY: table entry; the consumer list and out value are live.
        let status = unsafe {
            c.hsa_signal_create_fn.unwrap()(
                1,
                consumers.len() as u32,
                consumers.as_ptr(),
                &mut signal,
            )
        };
        assert_eq!(status, HSA_STATUS_SUCCESS);
        signal
    };
    let mut gpu_only = hsa_signal_t { handle: 0 };
    // SAFETY: table entry; the out value is live.
    let status = unsafe {
        a.hsa_amd_signal_create_fn.unwrap()(
            1,
            0,
            std::ptr::null(),
            u64::from(HSA_AMD_SIGNAL_AMD_GPU_ONLY),
            &mut gpu_only,
        )
    };
    assert_eq!(status, HSA_STATUS_SUCCESS);
    let register = |signal: hsa_signal_t| {
        // SAFETY: table entry; the handler never runs (the value stays 1) and takes no data.
        unsafe {
            a.hsa_amd_signal_async_handler_fn.unwrap()(
                signal,
                HSA_SIGNAL_CONDITION_EQ,
                0,
                Some(never_called),
                std::ptr::null_mut(),
            )
        }
    };
    assert_eq!(register(create(&[gpu])), HSA_STATUS_ERROR_INVALID_SIGNAL);
    assert_eq!(register(gpu_only), HSA_STATUS_ERROR_INVALID_SIGNAL);
    assert_eq!(register(create(&[gpu, cpu])), HSA_STATUS_SUCCESS);
    assert_eq!(register(create(&[])), HSA_STATUS_SUCCESS);
}

#[test]
fn a_consumer_list_with_duplicates_is_an_invalid_argument() {
    // hsa.h, hsa_signal_create: INVALID_ARGUMENT when "consumers contains duplicates" (ROCm's
    // hsa_amd_signal_create checks the same).
    let (hsa, _session) = open();
    let (c, a) = (*hsa.core(), *hsa.amd());
    let gpu = hsa.gpu_agents().unwrap()[0];
    let twice = [gpu, gpu];
    let mut signal = hsa_signal_t { handle: 0 };
    // SAFETY: table entries; the consumer list and out value are live.
    unsafe {
        assert_eq!(
            c.hsa_signal_create_fn.unwrap()(1, 2, twice.as_ptr(), &mut signal),
            HSA_STATUS_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            a.hsa_amd_signal_create_fn.unwrap()(1, 2, twice.as_ptr(), 0, &mut signal),
            HSA_STATUS_ERROR_INVALID_ARGUMENT
        );
    }
}

unsafe extern "C" fn bump(arg: *mut c_void) {
    // SAFETY: called with a pointer to the test's signal handle.
    let signal = unsafe { *arg.cast::<hsa_signal_t>() };
    kreplay_softhsa::testing::Hsa::softhsa().signal_store(signal, 0);
}

#[test]
fn async_functions_run_on_the_handler_thread() {
    let (hsa, _session) = open();
    let mut s = hsa.signal_create(1).unwrap();
    let f = hsa.amd().hsa_amd_async_function_fn.unwrap();
    // SAFETY: table entry; `s` outlives the call (we wait for it below).
    let value = unsafe { f(Some(bump), (&raw mut s).cast()) };
    assert_eq!(value, HSA_STATUS_SUCCESS);
    assert!(hsa.wait_zero(s, PROMPT));
}

#[test]
fn the_value_pointer_addresses_the_signal_value() {
    let (hsa, _session) = open();
    let s = hsa.signal_create(11).unwrap();
    let mut ptr: *mut hsa_signal_value_t = std::ptr::null_mut();
    let f = hsa.amd().hsa_amd_signal_value_pointer_fn.unwrap();
    // SAFETY: table entry with the HSA signature.
    assert_eq!(unsafe { f(s, &mut ptr) }, HSA_STATUS_SUCCESS);
    // SAFETY: the pointer addresses the live signal's value.
    assert_eq!(unsafe { ptr.read_volatile() }, 11);
    hsa.signal_store(s, 12);
    // SAFETY: as above.
    assert_eq!(unsafe { ptr.read_volatile() }, 12);
}

#[test]
fn amd_signal_create_makes_an_ordinary_signal() {
    let (hsa, _session) = open();
    let f = hsa.amd().hsa_amd_signal_create_fn.unwrap();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let mut s = hsa_signal_t { handle: 0 };
    // SAFETY: table entry; one consumer agent.
    assert_eq!(unsafe { f(9, 1, &gpu, 0, &mut s) }, HSA_STATUS_SUCCESS);
    assert_eq!(hsa.signal_load(s), 9);
    let bad = hsa_agent_t { handle: 77 };
    // SAFETY: as above.
    let value = unsafe { f(9, 1, &bad, 0, &mut s) };
    assert_eq!(value, HSA_STATUS_ERROR_INVALID_AGENT);
}
