//! kreplay loaded into a command's own copy of softhsa's HSA table, the way a runtime loads a
//! tools library, for the commands that run a tool of their own (`stress`, `profile`,
//! `bench-dispatch`), and the check of the pass count such a tool will ask for against the cap
//! kreplay will apply.

use hsa_sys::HsaApiTable;

/// Runs kreplay's `OnLoad` on `table`, naming on stderr each tool that chose to stay inactive.
/// A `KREPLAY_TOOL_LIBRARIES` tool that could not be used
/// (a library that does not load, a tool rejected or failed at its initialize) is an error and
/// kreplay is unloaded again: the command would otherwise run without a tool it was asked to run
/// beside its own and end as if nothing were wrong.
///
/// # Safety
/// `table` must be a complete, writable HSA table that stays alive for every later call made
/// through it, until after `kreplay::hsa_tool::on_unload` (the `OnLoad` contract).
pub(crate) unsafe fn load_kreplay(table: *mut HsaApiTable) -> Result<(), String> {
    // SAFETY: forwarded from the caller.
    unsafe { kreplay::hsa_tool::on_load(table) }
        .map_err(|e| format!("cannot set up kreplay: {e}"))?;
    // A tool that chose to stay inactive is not an error, but is named (as `kreplay run` does).
    for note in kreplay::lifecycle::notes() {
        eprintln!("kreplay: {note}");
    }
    let problems = kreplay::lifecycle::problems();
    if problems.is_empty() {
        return Ok(());
    }
    kreplay::hsa_tool::on_unload();
    Err(format!(
        "not running without a tool asked for: {}",
        problems.join("; ")
    ))
}

/// Checks, before a command runs anything, that its own tool's pass count `passes` is within
/// the cap on passes per dispatch kreplay will apply (`KREPLAY_MAX_PASSES`): above it every
/// dispatch would be declined (`invalid_pass_count`) and run once, and the command would run to
/// its end for a list of declines. `what` says where the count comes from; `fix` what to do. A malformed setting is left to the load of kreplay, which names it.
pub(crate) fn check_pass_cap(passes: u64, what: &str, fix: &str) -> Result<(), String> {
    let Ok(config) = kreplay::config::Config::from_env() else {
        return Ok(());
    };
    if passes <= config.max_passes {
        return Ok(());
    }
    Err(format!(
        "{what} {passes} passes per dispatch, above the cap on passes per dispatch, \
         KREPLAY_MAX_PASSES={}: every dispatch would be declined and run once; {fix}",
        config.max_passes
    ))
}
