//! kreplay loaded into a command's own copy of softhsa's HSA table, the way a runtime loads a
//! tools library, for the commands that run a tool of their own (`stress`, `profile`,
//! `bench-dispatch`).

use hsa_sys::HsaApiTable;

/// Runs kreplay's `OnLoad` on `table`. A `KREPLAY_TOOL_LIBRARIES` tool that could not be used
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
