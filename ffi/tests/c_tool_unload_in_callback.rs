//! A tool calls OnUnload from inside one of its own callbacks (tests/c_probe_tools/
//! unload_from_callback.c), at each kind of record in turn. The call must return, finalize the
//! tool once, and leave the application's results those of one run; nothing of the tool may
//! begin after it.

mod common;
#[path = "c_probe_tools/harness.rs"]
mod harness;

use std::time::Duration;

use harness::*;

const DEADLINE: Duration = Duration::from_secs(60);

fn scenario(name: &str, at: &str) {
    let (problems, run) = run_scenario(
        name,
        &["unload_from_callback.c"],
        &[("PROBE_AT", at)],
        DEADLINE,
    );
    assert!(
        problems.is_empty(),
        "problems: {problems:#?}\n{}",
        run.report()
    );
}

macro_rules! unload_at {
    ($($test:ident => $at:literal,)*) => {$(
        #[test]
        fn $test() {
            let name = stringify!($test);
            if in_child(name) {
                return standard_child(2, 2);
            }
            scenario(name, $at);
        }
    )*};
}

unload_at! {
    unload_from_config_enter_returns_and_finalizes_the_tool_once => "config_enter",
    unload_from_pass_enter_returns_and_finalizes_the_tool_once => "pass_enter",
    unload_from_snapshot_exit_returns_and_finalizes_the_tool_once => "snapshot_exit",
    unload_from_restore_enter_returns_and_finalizes_the_tool_once => "restore_enter",
    unload_from_enqueue_enter_returns_and_finalizes_the_tool_once => "enqueue_enter",
    unload_from_complete_returns_and_finalizes_the_tool_once => "complete",
}
