//! An embedder's misuse and edge cases: guards released on other threads or in another order,
//! panics while a side is held, duplicate agents in a group, and lock requests from a
//! thread-local destructor at thread exit.

use std::sync::mpsc;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use kreplay_locks::{AgentLocks, TryWriteError};

const BOUND: Duration = Duration::from_secs(10);

/// A thread whose last act (a thread-local destructor, run after the crate's own thread-locals
/// were destroyed) is an ordinary dispatch whose submission asks for a replay on the same agent
/// (a tool dispatching from a callback). The replay request used to wait for the thread's own
/// reader side for ever, since the reader guards it holds were no longer recorded; it must be
/// reported as re-entrant instead.
#[test]
fn a_replay_asked_for_under_a_reader_guard_in_a_thread_local_destructor_is_reentrant() {
    static LOCKS: LazyLock<AgentLocks> = LazyLock::new(|| {
        let locks = AgentLocks::new();
        locks.set_enabled(true);
        locks
    });
    struct AtExit(mpsc::Sender<Result<(), TryWriteError>>);
    impl Drop for AtExit {
        fn drop(&mut self) {
            let dispatch = LOCKS.read(7).expect("reader side");
            assert!(dispatch.is_locked());
            let replay = LOCKS.try_write_for(7, Duration::from_secs(2)).map(drop);
            drop(dispatch);
            let _ = self.0.send(replay);
        }
    }
    thread_local! {
        static AT_EXIT: std::cell::RefCell<Option<AtExit>> = const { std::cell::RefCell::new(None) };
    }
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        // Registered first, so destroyed after the crate's thread-locals, which the read
        // below registers.
        AT_EXIT.with(|slot| *slot.borrow_mut() = Some(AtExit(tx)));
        drop(LOCKS.read(7).unwrap());
    });
    let replay = rx.recv_timeout(BOUND).expect("the destructor ran");
    assert!(
        matches!(replay, Err(TryWriteError::Reentrant(r)) if r.agent == 7),
        "{replay:?}"
    );
    // Nothing is left held.
    assert!(!LOCKS.agent_lock(7).is_locked());
}

/// The same agent listed twice in a group (a list built from a dispatch's devices without
/// removing repeats) is one writer side, not a re-entrant request.
#[test]
fn an_agent_listed_twice_in_a_group_is_locked_once() {
    let locks = AgentLocks::new();
    let guards = locks
        .write_all_until(&[3, 5, 3, 5], Duration::from_millis(1), || false)
        .expect("not re-entrant")
        .expect("nothing busy");
    assert_eq!(guards.iter().map(|g| g.agent()).collect::<Vec<_>>(), [3, 5]);
    assert!(locks.agent_lock(3).is_write_locked() && locks.agent_lock(5).is_write_locked());
    drop(guards);
    assert!(!locks.agent_lock(3).is_locked() && !locks.agent_lock(5).is_locked());
    let guards = locks
        .write_all_serving(&[9, 9], Duration::from_millis(1), || {})
        .expect("not re-entrant");
    assert_eq!(guards.len(), 1);
}

/// A replay window dropped on another thread than the one that opened it is released, and the
/// opening thread may take it again.
#[test]
fn a_window_released_from_another_thread_is_free_for_everyone() {
    let locks = Arc::new(AgentLocks::new());
    locks.set_enabled(true);
    let window = locks.write(1).unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        drop(window);
        tx.send(()).unwrap();
    });
    rx.recv_timeout(BOUND).unwrap();
    let again = locks.try_write_for(1, BOUND).expect("free again");
    drop(again);
    assert!(locks.read(1).unwrap().is_locked());
}

/// A panic while the writer side or reader guards are held releases them (no poisoning), and
/// the thread's bookkeeping does not leave it looking re-entrant.
#[test]
fn a_panic_while_holding_sides_releases_them_without_poisoning() {
    let locks = Arc::new(AgentLocks::new());
    locks.set_enabled(true);
    let l = locks.clone();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let _window = l.write(2).unwrap();
        let _other = l.read(4).unwrap();
        panic!("tool callback panicked");
    }));
    assert!(r.is_err());
    assert!(!locks.agent_lock(2).is_locked() && !locks.agent_lock(4).is_locked());
    // Same thread: not re-entrant any more.
    let window = locks.try_write_for(4, BOUND).expect("free");
    drop(window);
    assert!(locks.read(2).unwrap().is_locked());
}

/// Reader guards dropped in another order than taken leave no trace: the thread may then
/// open a window on each agent.
#[test]
fn reader_guards_dropped_out_of_order_leave_nothing_held() {
    let locks = AgentLocks::new();
    locks.set_enabled(true);
    let a = locks.read(1).unwrap();
    let b = locks.read(2).unwrap();
    let c = locks.read(1).unwrap();
    drop(a);
    drop(b);
    assert!(locks.write(2).is_ok(), "agent 2 is no longer read here");
    assert!(
        locks.write(1).is_err(),
        "one reader guard of agent 1 is still held"
    );
    drop(c);
    assert!(locks.write(1).is_ok());
}

/// A zero timeout takes a free side and reports a held one at once; `Duration::MAX` is a
/// wait without limit, not an overflow.
#[test]
fn zero_and_unbounded_timeouts_neither_wait_nor_overflow() {
    let locks = Arc::new(AgentLocks::new());
    locks.set_enabled(true);
    let w = locks.try_write_for(1, Duration::ZERO).expect("free");
    let (tx, rx) = mpsc::channel();
    let l = locks.clone();
    std::thread::spawn(move || {
        let busy = l.try_write_for(1, Duration::ZERO).err();
        let read = l.try_read_for(1, Duration::ZERO).map(|r| r.is_none());
        tx.send((busy, read)).unwrap();
        // Waits without limit until the window closes.
        let later = l.try_write_for(1, Duration::MAX).is_ok();
        tx.send((None, Ok(later))).unwrap();
    });
    let (busy, read) = rx.recv_timeout(BOUND).unwrap();
    assert!(matches!(
        busy,
        Some(TryWriteError::TimedOut { agent: 1, .. })
    ));
    assert_eq!(read, Ok(true));
    drop(w);
    assert_eq!(rx.recv_timeout(BOUND).unwrap().1, Ok(true));
}

/// A slot count past what a power of two can round up to used to overflow (a panic, and in a
/// release build an empty first table whose lookups never ended); a huge one tried to allocate
/// every slot up front. Both are capped.
#[test]
fn a_huge_slot_count_is_capped_instead_of_overflowing_or_allocating_it() {
    for slots in [usize::MAX, usize::MAX / 2 + 2, 1 << 40] {
        let locks = AgentLocks::with_slots(slots);
        locks.set_enabled(true);
        for agent in 0..100 {
            assert!(locks.read(agent).unwrap().is_locked());
        }
        assert_eq!(locks.len(), 100);
    }
}
