//! The order KERNEL_REPLAY callbacks of one dispatch must come in (docs/abi.md §2, callback flow),
//! checked one event at a time.
//!
//! ```text
//! CONFIG ENTER → pass count → [SNAPSHOT ENTER → SNAPSHOT EXIT →
//!     PASS ENTER 0 → PASS EXIT 0 → (RESTORE ENTER 0 → RESTORE EXIT 0) → PASS ENTER 1 → ...]
//! → CONFIG EXIT
//! ```
//! Restores are optional in the order (a replay that skips them is caught by counting them).

/// One KERNEL_REPLAY event of a dispatch, as the tool sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplayEvent {
    /// CONFIG ENTER.
    ConfigEnter,
    /// The pass-count callback was called.
    PassCount,
    /// SNAPSHOT ENTER.
    SnapshotEnter,
    /// SNAPSHOT EXIT.
    SnapshotExit,
    /// PASS ENTER of pass `pass` of `total` (0 = indefinite).
    PassEnter {
        /// 0-based pass index.
        pass: u64,
        /// `total_passes` of the payload.
        total: u64,
    },
    /// PASS EXIT of pass `pass`.
    PassExit {
        /// 0-based pass index.
        pass: u64,
    },
    /// RESTORE ENTER undoing pass `after_pass`.
    RestoreEnter {
        /// The pass whose writes are undone.
        after_pass: u64,
    },
    /// RESTORE EXIT undoing pass `after_pass`.
    RestoreExit {
        /// The pass whose writes are undone.
        after_pass: u64,
    },
    /// CONFIG EXIT.
    ConfigExit,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Start,
    ConfigEntered,
    SnapshotEntered,
    SnapshotExited,
    PassEntered(u64),
    PassExited(u64),
    RestoreEntered(u64),
    RestoreExited(u64),
    ConfigExited,
}

/// Follows the events of one dispatch and reports each one that comes out of order.
#[derive(Clone, Debug)]
pub struct OrderCheck {
    stage: Stage,
    expected_total: u64,
    pass_count_calls: u32,
}

impl OrderCheck {
    /// A check for a dispatch the tool asked `expected_total` passes for.
    pub fn new(expected_total: u64) -> Self {
        OrderCheck {
            stage: Stage::Start,
            expected_total,
            pass_count_calls: 0,
        }
    }

    /// How often the pass-count callback was called.
    pub fn pass_count_calls(&self) -> u32 {
        self.pass_count_calls
    }

    /// Whether CONFIG EXIT has been seen.
    pub fn finished(&self) -> bool {
        self.stage == Stage::ConfigExited
    }

    /// Takes `event`; `Err` describes why it is out of order (the check then follows the event
    /// anyway, so one mistake is reported once).
    pub fn advance(&mut self, event: ReplayEvent) -> Result<(), String> {
        use ReplayEvent as E;
        use Stage as S;
        let ok = match (event, self.stage) {
            (E::ConfigEnter, S::Start) => true,
            (E::PassCount, S::ConfigEntered) => self.pass_count_calls == 0,
            (E::SnapshotEnter, S::ConfigEntered) => self.pass_count_calls == 1,
            (E::SnapshotExit, S::SnapshotEntered) => true,
            (E::PassEnter { pass: 0, .. }, S::SnapshotExited) => true,
            (E::PassEnter { pass, .. }, S::PassExited(prev) | S::RestoreExited(prev)) => {
                pass == prev + 1
            }
            (E::PassExit { pass }, S::PassEntered(current)) => pass == current,
            (E::RestoreEnter { after_pass }, S::PassExited(pass)) => after_pass == pass,
            (E::RestoreExit { after_pass }, S::RestoreEntered(pass)) => after_pass == pass,
            (
                E::ConfigExit,
                S::ConfigEntered | S::SnapshotExited | S::PassExited(_) | S::RestoreExited(_),
            ) => true,
            _ => false,
        };
        let mut problem = (!ok).then(|| format!("{event:?} after {:?}", self.stage));
        if let E::PassEnter { pass, total } = event
            && total != self.expected_total
        {
            problem.get_or_insert(format!(
                "pass {pass} reports total_passes {total}, expected {}",
                self.expected_total
            ));
        }
        self.stage = match event {
            E::ConfigEnter => S::ConfigEntered,
            E::PassCount => {
                self.pass_count_calls += 1;
                self.stage
            }
            E::SnapshotEnter => S::SnapshotEntered,
            E::SnapshotExit => S::SnapshotExited,
            E::PassEnter { pass, .. } => S::PassEntered(pass),
            E::PassExit { pass } => S::PassExited(pass),
            E::RestoreEnter { after_pass } => S::RestoreEntered(after_pass),
            E::RestoreExit { after_pass } => S::RestoreExited(after_pass),
            E::ConfigExit => S::ConfigExited,
        };
        match problem {
            Some(problem) => Err(problem),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ReplayEvent as E;
    use super::*;

    fn run(total: u64, events: &[E]) -> Vec<String> {
        let mut check = OrderCheck::new(total);
        events
            .iter()
            .filter_map(|&e| check.advance(e).err())
            .collect()
    }

    fn replay(total: u64, restores: bool) -> Vec<E> {
        let mut events = vec![
            E::ConfigEnter,
            E::PassCount,
            E::SnapshotEnter,
            E::SnapshotExit,
        ];
        for pass in 0..total {
            events.push(E::PassEnter { pass, total });
            events.push(E::PassExit { pass });
            if restores && pass + 1 < total {
                events.push(E::RestoreEnter { after_pass: pass });
                events.push(E::RestoreExit { after_pass: pass });
            }
        }
        events.push(E::ConfigExit);
        events
    }

    #[test]
    fn the_spec_flow_is_in_order_with_or_without_restores() {
        assert!(run(4, &replay(4, true)).is_empty());
        assert!(run(3, &replay(3, false)).is_empty());
        let mut check = OrderCheck::new(4);
        for event in replay(4, true) {
            check.advance(event).unwrap();
        }
        assert!(check.finished());
        assert_eq!(check.pass_count_calls(), 1);
    }

    #[test]
    fn a_dispatch_run_once_goes_from_config_enter_to_config_exit() {
        assert!(run(1, &[E::ConfigEnter, E::PassCount, E::ConfigExit]).is_empty());
    }

    #[test]
    fn skipped_or_repeated_passes_are_reported() {
        let problems = run(
            3,
            &[
                E::ConfigEnter,
                E::PassCount,
                E::SnapshotEnter,
                E::SnapshotExit,
                E::PassEnter { pass: 0, total: 3 },
                E::PassExit { pass: 0 },
                E::PassEnter { pass: 2, total: 3 },
            ],
        );
        assert_eq!(problems.len(), 1);
        assert!(problems[0].contains("pass: 2"), "{problems:?}");
    }

    #[test]
    fn a_pass_before_the_snapshot_is_reported() {
        let problems = run(
            2,
            &[
                E::ConfigEnter,
                E::PassCount,
                E::PassEnter { pass: 0, total: 2 },
            ],
        );
        assert_eq!(problems.len(), 1);
    }

    #[test]
    fn a_snapshot_before_the_pass_count_is_reported() {
        assert_eq!(run(2, &[E::ConfigEnter, E::SnapshotEnter]).len(), 1);
        assert_eq!(
            run(2, &[E::ConfigEnter, E::PassCount, E::PassCount]).len(),
            1,
            "the pass count is asked once"
        );
    }

    #[test]
    fn a_wrong_total_or_restore_index_is_reported() {
        let mut events = replay(2, true);
        events[4] = E::PassEnter { pass: 0, total: 5 };
        let problems = run(2, &events);
        assert_eq!(problems.len(), 1);
        assert!(problems[0].contains("total_passes 5"));

        let mut events = replay(2, true);
        events[6] = E::RestoreEnter { after_pass: 1 };
        events[7] = E::RestoreExit { after_pass: 1 };
        assert!(!run(2, &events).is_empty());
    }

    #[test]
    fn a_second_config_enter_is_reported() {
        let mut events = replay(2, true);
        events.push(E::ConfigEnter);
        assert_eq!(run(2, &events).len(), 1);
    }
}
