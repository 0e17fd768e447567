//! `kreplay demo`: kernel replay of a real HSA program on the software HSA runtime, verified.
//!
//! 1. The application ([`app`]) runs once through softhsa's own table: the unprofiled reference.
//! 2. The demo tool ([`tool`]) is registered with `kreplay_force_configure`; kreplay is loaded
//!    into a private, writable copy of the table (softhsa's `OwnedApiTable`: the root plus its
//!    own copies of every sub-table) the way a runtime loads a tools library, and the
//!    application runs again through that copy: every dispatch is replayed in N passes.
//! 3. The tool's observations, kreplay's cost records and the two runs' buffers are joined into
//!    a table and checked ([`report`]); `--json` / `--csv` write them out ([`output`]).
//!
//! Tool libraries given with `--tool` or `KREPLAY_TOOL_LIBRARIES` are loaded first and run
//! against the same kreplay ([`host`]); when one of them drives kernel replay, the demo's tool
//! steps aside and the table shows what its tracing context observed.
//!
//! kreplay installs into one HSA table per process, so the demo runs once per process.
//!
//! `kreplay demo --backend cuda` runs `x += 1` on a GPU instead ([`cuda`]).

pub use kreplay_workloads::demo::{app, kernels};
pub mod cuda;
pub mod host;
pub mod order;
pub mod output;
pub mod report;
pub mod tool;

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::args::DemoOptions;
use crate::format::{format_bytes, format_duration};
use app::{AppConfig, AppRun, DISPATCHES_PER_ROUND};
use kernels::KernelSet;
use kreplay_softhsa::OwnedApiTable;
use report::{DispatchRow, Plan, Verification};

/// Rounds of four dispatches the application runs.
pub const ROUNDS: u32 = 3;

/// How a demo run ended (when it ran to the end).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DemoOutcome {
    /// Verification passed: equal results and every dispatch replayed as planned.
    pub passed: bool,
    /// The verification line that was printed.
    pub verification: String,
}

/// Why the demo could not run to the end.
#[derive(Debug)]
pub enum DemoError {
    /// The demo already ran in this process.
    AlreadyRan,
    /// The application failed (an HSA call returned an error).
    App(app::AppError),
    /// kreplay or the tool could not be set up.
    Setup(String),
    /// A tool library asked for with `--tool` or `KREPLAY_TOOL_LIBRARIES` cannot be used.
    Tool(String),
    /// Writing the output (terminal, `--json`, `--csv`) failed.
    Output(String),
    /// The options cannot work with kreplay's settings (more passes than its cap allows).
    Options(String),
}

impl std::fmt::Display for DemoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DemoError::AlreadyRan => f.write_str(
                "the demo already ran in this process (kreplay installs into one HSA table per process)",
            ),
            DemoError::App(e) => write!(f, "the application failed: {e}"),
            DemoError::Setup(e) => write!(f, "cannot set up kreplay: {e}"),
            DemoError::Tool(e) => f.write_str(e),
            DemoError::Output(e) | DemoError::Options(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for DemoError {}

impl From<app::AppError> for DemoError {
    fn from(e: app::AppError) -> Self {
        DemoError::App(e)
    }
}

static RAN: AtomicBool = AtomicBool::new(false);

/// Runs the demo, printing the table, the summary and the verification line to `out`.
pub fn run(options: &DemoOptions, out: &mut dyn Write) -> Result<DemoOutcome, DemoError> {
    if RAN.swap(true, Ordering::SeqCst) {
        return Err(DemoError::AlreadyRan);
    }
    let plan = Plan {
        passes: u64::from(options.passes),
        restore: options.restore,
    };
    let config = AppConfig {
        elements: options.elements,
        rounds: ROUNDS,
    };
    // Tool libraries are checked before any work starts.
    let requested = host::requested(&options.tools);
    if requested.is_empty() {
        // With a tool library, the passes may be that tool's to choose.
        crate::hosted::check_pass_cap(
            plan.passes,
            "--passes asks for",
            "lower --passes or raise the cap",
        )
        .map_err(DemoError::Options)?;
    }
    let external = host::ExternalTools::load(&requested).map_err(DemoError::Tool)?;
    let kernels = KernelSet::register();

    // 1. Unprofiled reference, straight through softhsa's table.
    let reference = app::run(kreplay_softhsa::api_table(), &kernels, &config)?;

    // 2. Profiled run through a copy of the table kreplay is installed in.
    let (profiled, external_names) =
        profiled_run(plan, options.passes_given, &external, &kernels, &config)?;
    let records = kreplay::hsa_tool::take_replay_records();
    let tool = tool::report();

    // 3. Join, check, print.
    let (rows, problems) = report::build_rows(
        plan,
        &profiled.dispatches,
        &tool,
        &records,
        kreplay_softhsa::kernel_name,
    );
    let verification = report::compare(&reference.buffers, &profiled.buffers);
    let problem_count = problems.len() + rows.iter().map(|r| r.problems.len()).sum::<usize>();
    let (passed, line) = report::verdict_line(&verification, problem_count);

    let text = render(
        options,
        plan,
        &reference,
        &profiled,
        &rows,
        &problems,
        &verification,
        &line,
        tool.replay_by_other.then_some(external_names.as_slice()),
    );
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| DemoError::Output(format!("cannot write the report: {e}")))?;

    let summary = output::RunSummary {
        passes: plan.passes,
        restore: plan.restore,
        elements: options.elements,
        problems: &problems,
        passed,
        verification: &line,
    };
    let wrote = |out: &mut dyn Write, path: &std::path::Path| {
        writeln!(out, "wrote {}", path.display())
            .and_then(|()| out.flush())
            .map_err(|e| DemoError::Output(format!("cannot write the report: {e}")))
    };
    if let Some(path) = &options.json {
        crate::output::write_whole(path, output::json(&summary, &rows).as_bytes())
            .map_err(DemoError::Output)?;
        wrote(out, path)?;
    }
    if let Some(path) = &options.csv {
        crate::output::write_whole(path, output::csv(&rows).as_bytes())
            .map_err(DemoError::Output)?;
        wrote(out, path)?;
    }
    Ok(DemoOutcome {
        passed,
        verification: line,
    })
}

/// Loads kreplay into a copy of softhsa's table, as a runtime loads a tools library, and runs
/// the application through it.
///
/// Returns the run and the names of the external tools (checked active after initialization).
fn profiled_run(
    plan: Plan,
    passes_given: bool,
    external: &host::ExternalTools,
    kernels: &KernelSet,
    config: &AppConfig,
) -> Result<(AppRun, Vec<String>), DemoError> {
    tool::register(plan.passes).map_err(DemoError::Setup)?;
    if !plan.restore {
        kreplay::hsa_tool::set_skip_restore_for_demo(true);
    }
    kreplay::hsa_tool::set_collect_replay_records(true);
    // The demo knows its kernels: kreplay's warnings name them.
    kreplay::hsa_tool::set_kernel_names(kreplay_softhsa::kernel_name);
    let source = kreplay_softhsa::api_table();
    // The table a runtime hands to OnLoad: kreplay rewrites entries of this copy only, so
    // softhsa's own table (used by the reference run) stays untouched.
    let mut table = OwnedApiTable::softhsa();

    // A real runtime calls a tool's OnLoad from inside hsa_init, with the runtime up, and
    // OnUnload from hsa_shut_down before tearing it down. Holding one reference of our own
    // around on_load .. on_unload gives kreplay the same situation.
    let runtime = RuntimeHold::acquire(source)?;
    // SAFETY: `table` is a complete, writable copy of softhsa's table that outlives every call
    // made through it (it is dropped after on_unload, and only this function uses it).
    unsafe { kreplay::hsa_tool::on_load(table.as_mut_ptr()) }.map_err(DemoError::Setup)?;
    let names = match external.check_initialized() {
        Ok(names) => names,
        Err(why) => {
            kreplay::hsa_tool::on_unload();
            runtime.release()?;
            return Err(DemoError::Tool(why));
        }
    };
    if passes_given && tool::replay_by_other() {
        // The demo's tool would only observe: the pass count asked for could not be used.
        kreplay::hsa_tool::on_unload();
        runtime.release()?;
        return Err(DemoError::Options(format!(
            "--passes {} cannot be used: tool {} drives kernel replay and chooses the passes \
             itself; leave out --passes, or the tool",
            plan.passes,
            names.join(", ")
        )));
    }
    let run = app::run(table.table(), kernels, config);
    kreplay::hsa_tool::on_unload();
    runtime.release()?;
    Ok((run?, names))
}

/// One `hsa_init` reference on softhsa's own table, released once.
struct RuntimeHold {
    shut_down: Option<unsafe extern "C" fn() -> hsa_sys::hsa_status_t>,
}

impl RuntimeHold {
    fn acquire(table: &hsa_sys::HsaApiTable) -> Result<Self, DemoError> {
        // SAFETY: softhsa's table points at its static core table.
        let core = unsafe { table.core_.as_ref() }
            .ok_or_else(|| DemoError::Setup("softhsa's table has no core table".into()))?;
        let (Some(init), Some(shut_down)) = (core.hsa_init_fn, core.hsa_shut_down_fn) else {
            return Err(DemoError::Setup(
                "softhsa's table lacks hsa_init / hsa_shut_down".into(),
            ));
        };
        // SAFETY: hsa_init has no preconditions.
        let status = unsafe { init() };
        if status != hsa_sys::HSA_STATUS_SUCCESS {
            return Err(DemoError::Setup(format!("hsa_init returned {status:#x}")));
        }
        Ok(RuntimeHold {
            shut_down: Some(shut_down),
        })
    }

    fn release(mut self) -> Result<(), DemoError> {
        match self.shut_down.take() {
            // SAFETY: balances the hsa_init of `acquire`.
            Some(shut_down) => match unsafe { shut_down() } {
                hsa_sys::HSA_STATUS_SUCCESS => Ok(()),
                status => Err(DemoError::Setup(format!(
                    "hsa_shut_down returned {status:#x}"
                ))),
            },
            None => Ok(()),
        }
    }
}

impl Drop for RuntimeHold {
    fn drop(&mut self) {
        if let Some(shut_down) = self.shut_down.take() {
            // SAFETY: balances the hsa_init of `acquire` (on an error path).
            unsafe { shut_down() };
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn render(
    options: &DemoOptions,
    plan: Plan,
    reference: &AppRun,
    profiled: &AppRun,
    rows: &[DispatchRow],
    problems: &[String],
    verification: &Verification,
    line: &str,
    replay_driven_by: Option<&[String]>,
) -> String {
    let mut text = String::new();
    let dispatches = profiled.dispatches.len();
    let passes = match replay_driven_by {
        Some(tools) => format!("passes chosen by tool {}", tools.join(", ")),
        None => format!(
            "{} pass{} each",
            plan.passes,
            if plan.passes == 1 { "" } else { "es" }
        ),
    };
    text.push_str(&format!(
        "kreplay demo: {dispatches} dispatches ({ROUNDS} rounds of {DISPATCHES_PER_ROUND} kernels) on \
         softhsa agent '{}' ({} GPU agents), {passes}{}; {} elements per buffer, {} of \
         device memory\n\n",
        profiled.agent_name,
        profiled.gpu_agents,
        if plan.restore { "" } else { ", restores SKIPPED (--no-restore)" },
        options.elements,
        format_bytes(profiled.device_bytes),
    ));
    text.push_str(&report::render_table(rows));
    text.push_str(&format!(
        "(per dispatch; 'total' adds up every dispatch; '-': ran once, nothing to measure; {}\
         'kreplay demo --help' explains every column)\n\n",
        if replay_driven_by.is_some() {
            "'?': chosen in a replay another tool drove, whose records the demo does not see; "
        } else {
            ""
        }
    ));

    let replayed = rows.iter().filter(|r| r.pass_contexts.len() > 1).count();
    let as_planned = rows.iter().filter(|r| r.problems.is_empty()).count();
    let kernel_runs: u64 = rows.iter().map(|r| r.passes_run).sum();
    let sum = |f: fn(&DispatchRow) -> Duration| rows.iter().map(f).sum::<Duration>();
    text.push_str(&format!(
        "dispatches: {dispatches}, {replayed} replayed, {as_planned} as planned; {kernel_runs} \
         kernel runs\n"
    ));
    text.push_str(&format!(
        "memory (total, all dispatches): {} snapshotted, {} restored\n",
        format_bytes(rows.iter().map(|r| r.bytes_snapshotted).sum()),
        format_bytes(rows.iter().map(|r| r.bytes_restored).sum()),
    ));
    let source = |i: usize| {
        let (regions, bytes) = rows.iter().fold((0u64, 0u64), |(r, b), row| {
            (r + row.snapshot_sources[i].0, b + row.snapshot_sources[i].1)
        });
        format!("{regions} region(s), {}", format_bytes(bytes))
    };
    match replay_driven_by {
        Some(tools) => text.push_str(&format!(
            "snapshot sources: not seen by the demo (tool {} drove replay; its SNAPSHOT records \
             carry them)\n",
            tools.join(", ")
        )),
        None => text.push_str(&format!(
            "snapshot sources (total, all dispatches): agent memory {}; referenced {}; module \
             variables {}; adopted {}\n",
            source(0),
            source(1),
            source(2),
            source(3)
        )),
    }
    if replayed > 0 {
        text.push_str(&format!(
            "replay time (total, all dispatches): lock wait {}, drain {}, snapshot {}, passes {}, \
             restores {}\n",
            format_duration(sum(|r| r.lock_wait)),
            format_duration(sum(|r| r.drain)),
            format_duration(sum(|r| r.snapshot)),
            format_duration(sum(DispatchRow::passes_total)),
            format_duration(sum(DispatchRow::restores_total)),
        ));
    } else {
        text.push_str("replay time: none (no dispatch was replayed)\n");
    }
    text.push_str(&format!(
        "wall time: unprofiled run {}, profiled run {}\n",
        format_duration(reference.elapsed),
        format_duration(profiled.elapsed),
    ));
    let masking_ok = rows.iter().all(|r| {
        r.pass_contexts
            .iter()
            .enumerate()
            .all(|(i, c)| c == &[i % plan.passes.max(1) as usize])
    });
    // Only passes that ran can have reached a context: with no replayed dispatch there is
    // nothing to claim.
    if plan.passes > 1 && replayed > 0 && replay_driven_by.is_none() {
        text.push_str(&format!(
            "per-pass masking: {}\n",
            if masking_ok {
                "every pass reached exactly its own context (pass i → context c(i mod N))"
            } else {
                "WRONG — see the rows marked above"
            }
        ));
    }
    text.push_str(&format!(
        "checksums ({}): unprofiled {}, profiled {}\n",
        profiled
            .buffers
            .iter()
            .map(|b| b.name)
            .collect::<Vec<_>>()
            .join(", "),
        checksums(reference),
        checksums(profiled)
    ));
    let all_problems: Vec<String> = problems
        .iter()
        .cloned()
        .chain(rows.iter().flat_map(|r| {
            r.problems
                .iter()
                .map(move |p| format!("dispatch {} ({}): {p}", r.dispatch_id, r.kernel))
        }))
        .collect();
    if !all_problems.is_empty() {
        const SHOWN: usize = 20;
        text.push_str(&format!("\nnot as planned ({}):\n", all_problems.len()));
        for problem in all_problems.iter().take(SHOWN) {
            text.push_str(&format!("  - {problem}\n"));
        }
        if all_problems.len() > SHOWN {
            text.push_str(&format!("  ... and {} more\n", all_problems.len() - SHOWN));
        }
    }
    text.push('\n');
    text.push_str(line);
    text.push('\n');
    if !plan.restore {
        let explanation = match verification {
            Verification::Different { .. } => format!(
                "why: replay ran without restoring memory between passes (--no-restore), so each \
                 of the {} passes started from what the previous pass left: in-place updates and \
                 atomics were applied {} times instead of once. Restoring the snapshot before \
                 every pass is what prevents this.",
                plan.passes, plan.passes
            ),
            Verification::Equal { .. } => "note: --no-restore changed nothing because no dispatch \
                                           ran more than once"
                .to_string(),
        };
        text.push_str(&explanation);
        text.push('\n');
    }
    text
}

fn checksums(run: &AppRun) -> String {
    run.buffers
        .iter()
        .map(|b| format!("{:08x}", b.checksum() >> 32))
        .collect::<Vec<_>>()
        .join("/")
}
