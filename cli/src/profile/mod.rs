//! `kreplay profile`: hardware-like counters of every dispatch of a workload
//! ([`kreplay_workloads::profile`]), more of them than one pass can count.
//!
//! Counter groups come from `--pmc` (each group must fit one pass, else the error names the
//! block and its limit) or from a flat `--counters` list split by the planner into the fewest
//! passes. With kernel replay (the default) the workload runs once and every dispatch is
//! replayed once per group, pass `p` counting group `p`. With application replay the workload
//! runs once per group, the classic way. `--check` does both and says whether the values are
//! the same (duration excluded: it is the one counter that is not deterministic).
//!
//! Every value stays its own row, keyed by (dispatch, pass, counter): a counter requested in two
//! groups is reported once per pass and never added up. Derived metrics (bytes per work-item,
//! atomic fraction, work-items per wavefront) are computed per dispatch from counters of
//! different passes of that same dispatch.

pub mod tool;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use kreplay_hsa::CounterDesc;
use kreplay_softhsa::OwnedApiTable;
use kreplay_softhsa::testing::Hsa;
use kreplay_workloads::profile::{self as workload, Workload};

pub use tool::Row;

/// How passes are obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplayMode {
    /// Every dispatch replayed once per group, in one run of the workload.
    Kernel,
    /// The workload run once per group.
    Application,
}

/// How the counters were asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CounterRequest {
    /// `--pmc` groups, each counted in one pass.
    Groups(Vec<Vec<String>>),
    /// `--counters`: a flat list the planner splits.
    Flat(Vec<String>),
}

/// Options of `kreplay profile`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProfileOptions {
    /// The counters.
    pub counters: CounterRequest,
    /// `--replay-mode`.
    pub mode: ReplayMode,
    /// `-o`: a `.csv` or `.json` file.
    pub output: Option<PathBuf>,
    /// `--check`: compare kernel replay with application replay.
    pub check: bool,
    /// The workload after `--`.
    pub workload: Workload,
    /// `--elements`: work-items of each classic kernel.
    pub elements: u32,
}

/// What a profile produced.
#[derive(Clone, Debug)]
pub struct ProfileOutcome {
    /// The counter groups, by name, in pass order.
    pub groups: Vec<Vec<String>>,
    /// Runs of the workload made for the reported mode.
    pub runs: usize,
    /// The rows of the reported mode.
    pub rows: Vec<Row>,
    /// `--check`: whether kernel and application replay agreed (and the differences).
    pub check: Option<Result<(), Vec<String>>>,
    /// Each agent's counters (a row's `counter` indexes its agent's list).
    pub catalogues: HashMap<u64, Vec<CounterDesc>>,
    /// Dispatches that did not count every group they should have (kernel replay declined or
    /// ended early, or counters kreplay could not collect in either mode), one line each; the
    /// profile is incomplete and the command fails.
    pub incomplete: Vec<String>,
}

impl ProfileOutcome {
    /// Whether the profile is whole: every dispatch counted every group, and `--check` (if
    /// asked) found kernel and application replay alike.
    pub fn passed(&self) -> bool {
        self.incomplete.is_empty() && self.check.as_ref().is_none_or(Result::is_ok)
    }
}

static RAN: AtomicBool = AtomicBool::new(false);

/// The counter whose value differs from run to run.
const NONDETERMINISTIC: &str = "GRBM_DURATION_NS";

/// Resolves the requested names into groups of ids on `agent`, planning a flat list.
pub fn resolve_groups(
    agent: u64,
    catalogue: &[CounterDesc],
    request: &CounterRequest,
) -> Result<Vec<Vec<u32>>, String> {
    let id_of = |name: &str| {
        catalogue
            .iter()
            .find(|c| c.name.eq_ignore_ascii_case(name))
            .map(|c| c.id)
            .ok_or_else(|| {
                let names: Vec<&str> = catalogue.iter().map(|c| c.name.as_str()).collect();
                format!("unknown counter '{name}'; counters: {}", names.join(", "))
            })
    };
    match request {
        CounterRequest::Groups(groups) => groups
            .iter()
            .enumerate()
            .map(|(g, names)| {
                let mut ids: Vec<u32> = Vec::with_capacity(names.len());
                for name in names {
                    // A group is a set: a counter given twice is counted (and listed) once.
                    let id = id_of(name)?;
                    if !ids.contains(&id) {
                        ids.push(id);
                    }
                }
                kreplay_hsa::check_counters(agent, &ids).map_err(|e| {
                    format!(
                        "--pmc group {} ({}) does not fit one pass: {e}; split it into more \
                         --pmc groups, or pass the counters with --counters to have them planned",
                        g + 1,
                        names.join(" ")
                    )
                })?;
                Ok(ids)
            })
            .collect(),
        CounterRequest::Flat(names) => {
            let ids = names
                .iter()
                .map(|n| id_of(n))
                .collect::<Result<Vec<_>, _>>()?;
            kreplay::counting::plan(agent, &ids).map_err(|e| e.message)
        }
    }
}

/// Runs `kreplay profile`, printing the tables to `out` and writing `-o`.
pub fn run(options: &ProfileOptions, out: &mut dyn Write) -> Result<ProfileOutcome, String> {
    if RAN.swap(true, Ordering::SeqCst) {
        return Err(
            "a profile already ran in this process (kreplay installs into one HSA \
                    table per process)"
                .into(),
        );
    }
    if let Some(path) = &options.output {
        output_format(path)?;
    }
    tool::register()?;
    let source = kreplay_softhsa::api_table();
    let mut table = OwnedApiTable::softhsa();
    // SAFETY: softhsa's own table is complete and static.
    let hold = unsafe { Hsa::from_table(source) }
        .init()
        .map_err(|s| format!("hsa_init returned {s:#x}"))?;
    // SAFETY: `table` is a complete, writable copy of softhsa's table that outlives every call
    // made through it (dropped at the end of this function, after on_unload).
    unsafe { crate::hosted::load_kreplay(table.as_mut_ptr()) }?;
    let result = profile(options, &table);
    tool::end_progress();
    kreplay::hsa_tool::on_unload();
    drop(hold);
    let outcome = result?;
    write_report(options, &outcome, out)?;
    drop(table);
    Ok(outcome)
}

struct Catalogues {
    by_agent: HashMap<u64, Vec<CounterDesc>>,
}

impl Catalogues {
    fn name(&self, agent: u64, id: u32) -> &str {
        self.by_agent
            .get(&agent)
            .and_then(|c| c.get(id as usize))
            .map_or("?", |c| c.name.as_str())
    }
}

fn profile(options: &ProfileOptions, table: &OwnedApiTable) -> Result<ProfileOutcome, String> {
    // SAFETY: the table kreplay is installed in, alive for this call.
    let hsa = unsafe { Hsa::from_table(table.table()) };
    let agents = hsa
        .gpu_agents()
        .map_err(|s| format!("listing agents failed ({s:#x})"))?;
    let mut catalogues = Catalogues {
        by_agent: HashMap::new(),
    };
    let mut groups_by_agent: Vec<(u64, Vec<Vec<u32>>)> = Vec::new();
    for agent in &agents {
        let catalogue = kreplay::counting::agent_counters(agent.handle).map_err(|e| e.message)?;
        let groups = resolve_groups(agent.handle, &catalogue, &options.counters)?;
        catalogues.by_agent.insert(agent.handle, catalogue);
        groups_by_agent.push((agent.handle, groups));
    }
    let (first_agent, groups) = groups_by_agent
        .first()
        .cloned()
        .ok_or("the runtime has no GPU agent")?;
    if options.mode == ReplayMode::Kernel || options.check {
        // Kernel replay counts group `p` in pass `p` of every dispatch.
        // `--check` runs kernel replay whatever the mode: only leaving it out avoids that.
        let fix = if options.check {
            "use fewer counter groups, run without --check (application replay needs no \
             replayed passes), or raise the cap"
        } else {
            "use fewer counter groups, --replay-mode application, or raise the cap"
        };
        crate::hosted::check_pass_cap(
            groups.len() as u64,
            &format!("kernel replay of {} counter groups needs", groups.len()),
            fix,
        )?;
    }
    let mut configs: Vec<HashMap<u64, kreplay::abi::CounterConfigId>> =
        vec![HashMap::new(); groups.len()];
    for (agent, groups) in &groups_by_agent {
        for (g, ids) in groups.iter().enumerate() {
            let config = kreplay::counting::create_config(*agent, ids).map_err(|e| e.message)?;
            if let Some(slot) = configs.get_mut(g) {
                slot.insert(*agent, config);
            }
        }
    }
    tool::set_configs(configs);
    let group_names: Vec<Vec<String>> = groups
        .iter()
        .map(|g| {
            g.iter()
                .map(|&id| catalogues.name(first_agent, id).to_owned())
                .collect()
        })
        .collect();

    // Each run's rows and the fingerprint of the workload's results.
    let incomplete = std::cell::RefCell::new(Vec::new());
    let run_kernel = || -> Result<(Vec<Row>, Vec<u64>), String> {
        tool::start_run(tool::Mode::Kernel, 0);
        // SAFETY: the table kreplay is installed in, alive for this call.
        let run = unsafe { workload::run(table.table(), options.workload, options.elements) }?;
        let (rows, missing) = finish_run()?;
        incomplete.borrow_mut().extend(missing);
        Ok((rows, vec![run.checksum]))
    };
    let run_application = || -> Result<(Vec<Row>, Vec<u64>), String> {
        let mut rows = Vec::new();
        let mut sums = Vec::new();
        for g in 0..groups.len() {
            tool::start_run(tool::Mode::Application(g), g);
            // SAFETY: as above.
            let run = unsafe { workload::run(table.table(), options.workload, options.elements) }?;
            let (run_rows, missing) = finish_run()?;
            rows.extend(run_rows);
            incomplete.borrow_mut().extend(missing);
            sums.push(run.checksum);
        }
        Ok((rows, sums))
    };
    let (rows, runs, check) = match (options.mode, options.check) {
        (ReplayMode::Kernel, false) => (run_kernel()?.0, 1, None),
        (ReplayMode::Application, false) => (run_application()?.0, groups.len(), None),
        (mode, true) => {
            let (kernel, kernel_sums) = run_kernel()?;
            let (application, application_sums) = run_application()?;
            let mut check = compare(&kernel, &application, &catalogues);
            // The results too: replay must leave the application's memory as one run does.
            if application_sums
                .iter()
                .any(|s| Some(s) != kernel_sums.first())
            {
                let difference = format!(
                    "the workload's results differ: kernel replay {:016x}, application runs {}",
                    kernel_sums.first().copied().unwrap_or_default(),
                    application_sums
                        .iter()
                        .map(|s| format!("{s:016x}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                match &mut check {
                    Ok(()) => check = Err(vec![difference]),
                    Err(list) => list.push(difference),
                }
            }
            match mode {
                ReplayMode::Kernel => (kernel, 1, Some(check)),
                ReplayMode::Application => (application, groups.len(), Some(check)),
            }
        }
    };
    let mut rows = rows;
    rows.sort_by_key(|r| (r.run, r.dispatch_id, r.group, r.counter));
    Ok(ProfileOutcome {
        groups: group_names,
        runs,
        rows,
        check,
        catalogues: catalogues.by_agent,
        incomplete: incomplete.into_inner(),
    })
}

/// The rows of a run, and the dispatches whose counters are incomplete.
fn finish_run() -> Result<(Vec<Row>, Vec<String>), String> {
    let taken = tool::take();
    if let Some(problem) = taken.problems.first() {
        return Err(format!("the profiling tool failed: {problem}"));
    }
    Ok((taken.rows, taken.incomplete))
}

/// The position of each dispatch within its run (dispatch ids grow in submission order).
fn ordinals(rows: &[Row]) -> HashMap<(usize, u64), usize> {
    let mut by_run: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
    for r in rows {
        by_run.entry(r.run).or_default().push(r.dispatch_id);
    }
    let mut out = HashMap::new();
    for (run, mut ids) in by_run {
        ids.sort_unstable();
        ids.dedup();
        for (i, id) in ids.into_iter().enumerate() {
            out.insert((run, id), i);
        }
    }
    out
}

/// Kernel replay against application replay: the same rows, keyed by (dispatch in order, group,
/// counter), and the same value in each, the duration excepted (its rows must exist in both, but
/// its value differs from run to run).
fn compare(
    kernel: &[Row],
    application: &[Row],
    catalogues: &Catalogues,
) -> Result<(), Vec<String>> {
    let key_of = |rows: &[Row]| {
        let ordinal = ordinals(rows);
        rows.iter()
            .map(|r| {
                let value =
                    (catalogues.name(r.agent, r.counter) != NONDETERMINISTIC).then_some(r.value);
                (
                    (ordinal[&(r.run, r.dispatch_id)], r.group, r.counter),
                    value,
                )
            })
            .collect::<BTreeMap<_, _>>()
    };
    let (k, a) = (key_of(kernel), key_of(application));
    let mut differences = Vec::new();
    for (key, value) in &k {
        match a.get(key) {
            Some(other) if other == value => {}
            Some(other) => differences.push(format!(
                "dispatch #{} group {} counter {}: kernel replay {}, application replay {}",
                key.0 + 1,
                key.1 + 1,
                key.2,
                value.map_or_else(|| "?".to_owned(), value_text),
                other.map_or_else(|| "?".to_owned(), value_text),
            )),
            None => differences.push(format!(
                "dispatch #{} group {} counter {}: missing from application replay",
                key.0 + 1,
                key.1 + 1,
                key.2
            )),
        }
    }
    for key in a.keys().filter(|key| !k.contains_key(key)) {
        differences.push(format!(
            "dispatch #{} group {} counter {}: missing from kernel replay",
            key.0 + 1,
            key.1 + 1,
            key.2
        ));
    }
    if k.is_empty() {
        differences.push("no counter was collected".into());
    }
    if differences.is_empty() {
        Ok(())
    } else {
        Err(differences)
    }
}

enum Format {
    Csv,
    Json,
}

fn output_format(path: &Path) -> Result<Format, String> {
    match path.extension().and_then(|e| e.to_str()) {
        Some(e) if e.eq_ignore_ascii_case("csv") => Ok(Format::Csv),
        Some(e) if e.eq_ignore_ascii_case("json") => Ok(Format::Json),
        _ => Err(format!(
            "-o {}: the output file must end in .csv or .json",
            path.display()
        )),
    }
}

/// How the report introduces a kernel: `kernel NAME`, or `kernel 0x...` without a name.
fn kernel_title(kernel_id: u64) -> String {
    kreplay_softhsa::kernel_name(kernel_id).map_or_else(
        || format!("kernel {kernel_id:#x}"),
        |n| format!("kernel {n}"),
    )
}

fn kernel_name(kernel_id: u64) -> String {
    kreplay_softhsa::kernel_name(kernel_id)
        .map_or_else(|| format!("kernel {kernel_id:#x}"), str::to_owned)
}

/// Derived metrics of one dispatch from its counters, each taken from the first pass that counted
/// it (values of two passes are never added).
pub fn derived(values: &[(String, f64)]) -> Vec<(&'static str, f64, String)> {
    let get = |name: &str| values.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
    let mut out = Vec::new();
    let ratio = |n: f64, d: f64| if d == 0.0 { 0.0 } else { n / d };
    if let (Some(r), Some(w), Some(items)) = (
        get("TCP_READ_BYTES"),
        get("TCP_WRITE_BYTES"),
        get("SQ_WORK_ITEMS"),
    ) {
        out.push((
            "bytes_per_work_item",
            ratio(r + w, items),
            "(TCP_READ_BYTES + TCP_WRITE_BYTES) / SQ_WORK_ITEMS".to_owned(),
        ));
    }
    if let (Some(atomics), Some(rd), Some(wr)) = (
        get("TCC_ATOMIC"),
        get("SQ_INSTS_VMEM_RD"),
        get("SQ_INSTS_VMEM_WR"),
    ) {
        out.push((
            "atomic_fraction",
            ratio(atomics, atomics + rd + wr),
            "TCC_ATOMIC / (SQ_INSTS_VMEM_RD + SQ_INSTS_VMEM_WR + TCC_ATOMIC)".to_owned(),
        ));
    }
    if let (Some(items), Some(waves)) = (get("SQ_WORK_ITEMS"), get("SQ_WAVES")) {
        out.push((
            "work_items_per_wave",
            ratio(items, waves),
            "SQ_WORK_ITEMS / SQ_WAVES".to_owned(),
        ));
    }
    out
}

fn value_text(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        format!("{v:.4}")
    }
}

fn write_report(
    options: &ProfileOptions,
    o: &ProfileOutcome,
    out: &mut dyn Write,
) -> Result<(), String> {
    let name = |agent: u64, id: u32| -> String {
        o.catalogues
            .get(&agent)
            .and_then(|c| c.get(id as usize))
            .map_or_else(|| format!("counter {id}"), |c| c.name.clone())
    };
    let mut text = String::new();
    let mode = match options.mode {
        ReplayMode::Kernel => "kernel replay",
        ReplayMode::Application => "application replay",
    };
    let _ = writeln!(
        text,
        "kreplay profile: {} counter group(s), {mode}, {} run(s) of the workload",
        o.groups.len(),
        o.runs
    );
    for (g, names) in o.groups.iter().enumerate() {
        let _ = writeln!(text, "  group {} (pass {g}): {}", g + 1, names.join(" "));
    }
    // Per kernel, per dispatch.
    let mut kernels: Vec<u64> = Vec::new();
    for r in &o.rows {
        if !kernels.contains(&r.kernel_id) {
            kernels.push(r.kernel_id);
        }
    }
    for kernel in kernels {
        let rows: Vec<&Row> = o.rows.iter().filter(|r| r.kernel_id == kernel).collect();
        let mut dispatches: Vec<(usize, u64)> =
            rows.iter().map(|r| (r.run, r.dispatch_id)).collect();
        dispatches.dedup();
        let _ = writeln!(text, "\nkernel {}", kernel_name(kernel));
        let _ = writeln!(
            text,
            "  {:>8} {:>4} {:>5} {:<20} {:>14}",
            "dispatch", "run", "pass", "counter", "value"
        );
        let mut seen_dispatches: Vec<u64> = Vec::new();
        for r in &rows {
            let pass = r
                .replay_pass
                .map_or_else(|| "-".to_owned(), |p| p.to_string());
            let _ = writeln!(
                text,
                "  {:>8} {:>4} {:>5} {:<20} {:>14}",
                r.dispatch_id,
                r.run,
                pass,
                name(r.agent, r.counter),
                value_text(r.value)
            );
            if !seen_dispatches.contains(&r.dispatch_id) {
                seen_dispatches.push(r.dispatch_id);
            }
        }
        // Derived metrics per dispatch (kernel replay: passes of the same dispatch).
        if options.mode == ReplayMode::Kernel {
            for id in seen_dispatches {
                let mut values: Vec<(String, f64, usize)> = Vec::new();
                for r in rows.iter().filter(|r| r.dispatch_id == id) {
                    let n = name(r.agent, r.counter);
                    if !values.iter().any(|(v, _, _)| *v == n) {
                        values.push((n, r.value, r.group));
                    }
                }
                let plain: Vec<(String, f64)> =
                    values.iter().map(|(n, v, _)| (n.clone(), *v)).collect();
                for (metric, value, formula) in derived(&plain) {
                    let _ = writeln!(
                        text,
                        "  dispatch {id}: {metric} = {} ({formula}, from passes of this dispatch)",
                        value_text(value)
                    );
                }
            }
        }
    }
    if let Some(check) = &o.check {
        match check {
            Ok(())
                if o.rows
                    .iter()
                    .all(|r| name(r.agent, r.counter) == NONDETERMINISTIC) =>
            {
                let _ = writeln!(
                    text,
                    "\ncheck: kernel replay and application replay give the same rows and the \
                     same results; no value was compared (only {NONDETERMINISTIC} was counted, \
                     which differs from run to run)"
                );
            }
            Ok(()) => {
                let _ = writeln!(
                    text,
                    "\ncheck: kernel replay values equal application replay values for every \
                     dispatch and counter ({NONDETERMINISTIC} excluded), and the results are \
                     the same"
                );
            }
            Err(differences) => {
                let _ = writeln!(
                    text,
                    "\ncheck: kernel replay and application replay DIFFER ({} difference(s)):",
                    differences.len()
                );
                for d in differences.iter().take(20) {
                    let _ = writeln!(text, "  {d}");
                }
            }
        }
    }
    if !o.incomplete.is_empty() {
        let _ = writeln!(
            text,
            "\nINCOMPLETE: {} dispatch(es) did not count every counter group (their values are \
             missing above and from the output file):",
            o.incomplete.len()
        );
        for line in o.incomplete.iter().take(20) {
            let _ = writeln!(text, "  {line}");
        }
        if o.incomplete.len() > 20 {
            let _ = writeln!(text, "  ... and {} more", o.incomplete.len() - 20);
        }
    }
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| format!("cannot write the report: {e}"))?;
    if let Some(path) = &options.output {
        let rows: Vec<(String, String, &Row)> = o
            .rows
            .iter()
            .map(|r| (kernel_name(r.kernel_id), name(r.agent, r.counter), r))
            .collect();
        let records = records(&rows);
        let count = records.len();
        let body = match output_format(path)? {
            Format::Csv => csv(&records)?,
            Format::Json => json(options.mode, records)?,
        };
        crate::output::write_whole(path, &body)?;
        writeln!(out, "wrote {} ({count} value(s))", path.display())
            .map_err(|e| format!("cannot write the report: {e}"))?;
    }
    Ok(())
}

/// One line of `-o out.csv`, one element of `rows` in `-o out.json`: one counter value of one
/// pass of one dispatch. The field names are the CSV header and the JSON keys; a value that is
/// not a finite number is an empty CSV field and a JSON `null`.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ProfileRecord {
    /// The dispatch.
    pub dispatch_id: u64,
    /// The pass, `None` (empty, `null`) when the dispatch was not replayed.
    pub replay_pass: Option<u64>,
    /// The run of the workload it came from (0-based).
    pub run: usize,
    /// The counter group (0-based).
    pub group: usize,
    /// The kernel's name.
    pub kernel: String,
    /// The agent's handle.
    pub agent: u64,
    /// The counter's name.
    pub counter: String,
    /// The value.
    pub value: Option<f64>,
}

/// The whole of `-o out.json`.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ProfileDocument {
    /// `kernel` or `application`.
    pub replay_mode: String,
    /// Every value, as in the CSV.
    pub rows: Vec<ProfileRecord>,
}

/// The header of `-o out.csv`: the fields of [`ProfileRecord`].
pub const CSV_HEADER: [&str; 8] = [
    "dispatch_id",
    "replay_pass",
    "run",
    "group",
    "kernel",
    "agent",
    "counter",
    "value",
];

fn records(rows: &[(String, String, &Row)]) -> Vec<ProfileRecord> {
    rows.iter()
        .map(|(kernel, counter, r)| ProfileRecord {
            dispatch_id: r.dispatch_id,
            replay_pass: r.replay_pass,
            run: r.run,
            group: r.group,
            kernel: kernel.clone(),
            agent: r.agent,
            counter: counter.clone(),
            value: r.value.is_finite().then_some(r.value),
        })
        .collect()
}

fn csv(records: &[ProfileRecord]) -> Result<Vec<u8>, String> {
    let mut writer = csv::Writer::from_writer(Vec::new());
    if records.is_empty() {
        writer.write_record(CSV_HEADER).map_err(|e| e.to_string())?;
    }
    for record in records {
        writer
            .serialize(record)
            .map_err(|e| format!("cannot write the values as CSV: {e}"))?;
    }
    writer.into_inner().map_err(|e| e.to_string())
}

fn json(mode: ReplayMode, records: Vec<ProfileRecord>) -> Result<Vec<u8>, String> {
    let document = ProfileDocument {
        replay_mode: match mode {
            ReplayMode::Kernel => "kernel",
            ReplayMode::Application => "application",
        }
        .to_owned(),
        rows: records,
    };
    let mut text = serde_json::to_vec(&document)
        .map_err(|e| format!("cannot write the values as JSON: {e}"))?;
    text.push(b'\n');
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(value: f64, replay_pass: Option<u64>) -> Row {
        Row {
            run: 0,
            dispatch_id: 3,
            replay_pass,
            group: 1,
            kernel_id: 9,
            agent: 77,
            counter: 2,
            value,
        }
    }

    #[test]
    fn csv_and_json_read_back_to_the_same_records_whatever_the_names_hold() {
        let (a, b) = (row(1.5, Some(1)), row(f64::NAN, None));
        let awkward = "k,\"quoted\"\nname\\".to_owned();
        let rows = vec![
            (awkward.clone(), "SQ_WAVES".to_owned(), &a),
            ("saxpy".to_owned(), "A,B".to_owned(), &b),
        ];
        let expected = records(&rows);
        assert_eq!(expected[0].value, Some(1.5));
        assert_eq!(expected[1].value, None, "NaN is no value");

        let csv_bytes = csv(&expected).unwrap();
        let mut reader = csv::Reader::from_reader(csv_bytes.as_slice());
        assert!(reader.headers().unwrap().iter().eq(CSV_HEADER));
        let back: Vec<ProfileRecord> = reader.deserialize().map(Result::unwrap).collect();
        assert_eq!(back, expected);

        let json_bytes = json(ReplayMode::Application, expected.clone()).unwrap();
        let value: serde_json::Value = serde_json::from_slice(&json_bytes).unwrap();
        assert_eq!(value["replay_mode"], "application");
        assert_eq!(value["rows"][0]["kernel"], awkward.as_str());
        assert!(value["rows"][1]["value"].is_null());
        assert!(value["rows"][1]["replay_pass"].is_null());
        let back: ProfileDocument = serde_json::from_value(value).unwrap();
        assert_eq!(back.rows, expected);
    }

    #[test]
    fn an_empty_profile_still_writes_the_csv_header() {
        let text = String::from_utf8(csv(&[]).unwrap()).unwrap();
        assert_eq!(text.trim_end(), CSV_HEADER.join(","));
    }
}
