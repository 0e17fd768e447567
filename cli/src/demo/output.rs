//! Machine-readable records of a demo run: CSV (one row per pass) and JSON (every dispatch with
//! its passes). Every per-pass record carries `replay_pass`; a dispatch that was not replayed
//! has one record whose `replay_pass` is empty (CSV) or `null` (JSON).
//!
//! Each output has one record type, and serde writes it: [`Document`] (with [`DispatchRecord`]
//! and [`PassRecord`]) is the JSON schema, [`CsvRecord`] the CSV schema (its field names are
//! the header). A CSV record is made from the JSON records, so both carry the same values.

use std::time::Duration;

use serde::Serialize;

use super::report::DispatchRow;

/// Settings and outcome of the run, for the JSON document.
#[derive(Clone, Debug)]
pub struct RunSummary<'a> {
    /// Passes asked per dispatch.
    pub passes: u64,
    /// Whether restores were on.
    pub restore: bool,
    /// Elements per buffer.
    pub elements: usize,
    /// Problems not tied to one dispatch.
    pub problems: &'a [String],
    /// Whether verification passed.
    pub passed: bool,
    /// The verification line.
    pub verification: &'a str,
}

/// The JSON document of a run.
#[derive(Clone, Debug, Serialize)]
pub struct Document<'a> {
    /// Always `demo`.
    pub command: &'static str,
    /// Passes asked per dispatch.
    pub passes: u64,
    /// Whether restores were on.
    pub restore: bool,
    /// Elements per buffer.
    pub elements: usize,
    /// Every dispatch, in order.
    pub dispatches: Vec<DispatchRecord<'a>>,
    /// Problems not tied to one dispatch.
    pub problems: &'a [String],
    /// The verdict.
    pub verification: Verification<'a>,
}

/// The verdict of a run.
#[derive(Clone, Debug, Serialize)]
pub struct Verification<'a> {
    /// Whether the results equal an unprofiled run and nothing went wrong.
    pub pass: bool,
    /// The verification line the table ends with.
    pub line: &'a str,
}

/// One dispatch with its passes.
#[derive(Clone, Debug, Serialize)]
pub struct DispatchRecord<'a> {
    pub dispatch_id: u64,
    pub kernel: &'a str,
    pub outcome: &'a str,
    pub passes_run: u64,
    pub bytes_snapshotted: u64,
    pub bytes_restored: u64,
    pub tier: &'a str,
    pub strategy: &'a str,
    pub lock_wait_ns: u64,
    pub drain_ns: u64,
    pub snapshot_ns: u64,
    /// Sum of the pass times.
    pub passes_ns: u64,
    /// Sum of the restore times.
    pub restores_ns: u64,
    pub snapshot_sources: SnapshotSources,
    pub passes: Vec<PassRecord<'a>>,
    pub problems: &'a [String],
}

/// What a snapshot held, per source.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct SnapshotSources {
    pub agent: SourceSize,
    pub referenced: SourceSize,
    pub module_variables: SourceSize,
    pub adopted: SourceSize,
}

/// Regions and bytes of one snapshot source.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct SourceSize {
    pub regions: u64,
    pub bytes: u64,
}

/// One pass of a dispatch, or the single run of a dispatch that was not replayed
/// (`replay_pass` is then `None`).
#[derive(Clone, Debug, Serialize)]
pub struct PassRecord<'a> {
    pub replay_pass: Option<u64>,
    /// The tracing contexts (by number) that got a record of this pass.
    pub contexts: &'a [usize],
    /// Dispatch records delivered for this pass.
    pub records: u32,
    /// How long the pass took.
    pub time_ns: Option<u64>,
    /// How long the restore after this pass took (none after the last pass).
    pub restore_after_ns: Option<u64>,
    /// Bytes the restore after this pass wrote back.
    pub restore_after_bytes: Option<u64>,
}

/// One CSV line: one pass of a dispatch, with the dispatch's fields repeated. Contexts are
/// numbers separated by `;`; an absent value is an empty field.
#[derive(Clone, Debug, Serialize)]
pub struct CsvRecord<'a> {
    pub dispatch_id: u64,
    pub kernel: &'a str,
    pub outcome: &'a str,
    pub passes_run: u64,
    pub replay_pass: Option<u64>,
    pub contexts: String,
    pub records: u32,
    pub pass_ns: Option<u64>,
    pub restore_after_ns: Option<u64>,
    pub restore_after_bytes: Option<u64>,
    pub bytes_snapshotted: u64,
    pub bytes_restored: u64,
    pub tier: &'a str,
    pub strategy: &'a str,
    pub lock_wait_ns: u64,
    pub drain_ns: u64,
    pub snapshot_ns: u64,
    pub snapshot_agent_regions: u64,
    pub snapshot_agent_bytes: u64,
    pub snapshot_referenced_regions: u64,
    pub snapshot_referenced_bytes: u64,
    pub snapshot_module_variable_regions: u64,
    pub snapshot_module_variable_bytes: u64,
    pub snapshot_adopted_regions: u64,
    pub snapshot_adopted_bytes: u64,
}

impl<'a> CsvRecord<'a> {
    fn new(dispatch: &DispatchRecord<'a>, pass: &PassRecord<'a>) -> Self {
        let sources = &dispatch.snapshot_sources;
        Self {
            dispatch_id: dispatch.dispatch_id,
            kernel: dispatch.kernel,
            outcome: dispatch.outcome,
            passes_run: dispatch.passes_run,
            replay_pass: pass.replay_pass,
            contexts: pass
                .contexts
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(";"),
            records: pass.records,
            pass_ns: pass.time_ns,
            restore_after_ns: pass.restore_after_ns,
            restore_after_bytes: pass.restore_after_bytes,
            bytes_snapshotted: dispatch.bytes_snapshotted,
            bytes_restored: dispatch.bytes_restored,
            tier: dispatch.tier,
            strategy: dispatch.strategy,
            lock_wait_ns: dispatch.lock_wait_ns,
            drain_ns: dispatch.drain_ns,
            snapshot_ns: dispatch.snapshot_ns,
            snapshot_agent_regions: sources.agent.regions,
            snapshot_agent_bytes: sources.agent.bytes,
            snapshot_referenced_regions: sources.referenced.regions,
            snapshot_referenced_bytes: sources.referenced.bytes,
            snapshot_module_variable_regions: sources.module_variables.regions,
            snapshot_module_variable_bytes: sources.module_variables.bytes,
            snapshot_adopted_regions: sources.adopted.regions,
            snapshot_adopted_bytes: sources.adopted.bytes,
        }
    }
}

/// The records of every dispatch, in order.
pub fn records(rows: &[DispatchRow]) -> Vec<DispatchRecord<'_>> {
    rows.iter().map(DispatchRecord::new).collect()
}

impl<'a> DispatchRecord<'a> {
    fn new(row: &'a DispatchRow) -> Self {
        let source = |i: usize| SourceSize {
            regions: row.snapshot_sources[i].0,
            bytes: row.snapshot_sources[i].1,
        };
        Self {
            dispatch_id: row.dispatch_id,
            kernel: &row.kernel,
            outcome: &row.outcome,
            passes_run: row.passes_run,
            bytes_snapshotted: row.bytes_snapshotted,
            bytes_restored: row.bytes_restored,
            tier: &row.tier,
            strategy: &row.strategy,
            lock_wait_ns: nanos(row.lock_wait),
            drain_ns: nanos(row.drain),
            snapshot_ns: nanos(row.snapshot),
            passes_ns: nanos(row.passes_total()),
            restores_ns: nanos(row.restores_total()),
            snapshot_sources: SnapshotSources {
                agent: source(0),
                referenced: source(1),
                module_variables: source(2),
                adopted: source(3),
            },
            passes: passes(row),
            problems: &row.problems,
        }
    }
}

/// One CSV line per pass of every dispatch (one line for a dispatch that ran once), after a
/// header naming [`CsvRecord`]'s fields (the header alone when there is no dispatch).
pub fn csv(rows: &[DispatchRow]) -> String {
    // With no dispatch, one blank record is written for its header and then dropped, so the
    // header always comes from the record type.
    let blank = [DispatchRow::default()];
    let header_only = rows.is_empty();
    let rows = if header_only { &blank[..] } else { rows };
    let mut writer = csv::Writer::from_writer(Vec::new());
    for dispatch in records(rows) {
        for pass in &dispatch.passes {
            writer
                .serialize(CsvRecord::new(&dispatch, pass))
                .expect("a CSV record of plain fields always serializes");
        }
    }
    let bytes = writer.into_inner().expect("writing to memory cannot fail");
    let mut text = String::from_utf8(bytes).expect("the CSV is made of UTF-8 strings");
    if header_only {
        text.truncate(text.find('\n').map_or(text.len(), |end| end + 1));
    }
    text
}

/// The whole run as one JSON document ([`Document`]).
pub fn json(summary: &RunSummary<'_>, rows: &[DispatchRow]) -> String {
    let document = Document {
        command: "demo",
        passes: summary.passes,
        restore: summary.restore,
        elements: summary.elements,
        dispatches: records(rows),
        problems: summary.problems,
        verification: Verification {
            pass: summary.passed,
            line: summary.verification,
        },
    };
    let mut text =
        serde_json::to_string_pretty(&document).expect("a document of plain fields serializes");
    text.push('\n');
    text
}

/// The pass records of a row: one per replayed pass, or the single run of a dispatch that was
/// not replayed.
fn passes(row: &DispatchRow) -> Vec<PassRecord<'_>> {
    if row.pass_contexts.is_empty() {
        return vec![PassRecord {
            replay_pass: None,
            contexts: &row.unreplayed_contexts,
            records: row.unreplayed_records,
            time_ns: None,
            restore_after_ns: None,
            restore_after_bytes: None,
        }];
    }
    row.pass_contexts
        .iter()
        .enumerate()
        .map(|(pass, contexts)| PassRecord {
            replay_pass: Some(pass as u64),
            contexts,
            records: row.pass_records.get(pass).copied().unwrap_or(0),
            time_ns: row.pass_times.get(pass).copied().map(nanos),
            restore_after_ns: row.restore_times.get(pass).copied().map(nanos),
            restore_after_bytes: row.restore_bytes.get(pass).copied(),
        })
        .collect()
}

/// Nanoseconds, saturating (a u64 of nanoseconds holds 584 years).
fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn replayed() -> DispatchRow {
        DispatchRow {
            dispatch_id: 3,
            kernel: "axpy".into(),
            outcome: "replayed".into(),
            passes_run: 3,
            pass_contexts: vec![vec![0], vec![1], vec![2]],
            pass_records: vec![2, 2, 2],
            bytes_snapshotted: 100,
            snapshot_sources: [(2, 60), (1, 32), (1, 4), (1, 4)],
            bytes_restored: 200,
            restore_bytes: vec![100, 100],
            tier: "host".into(),
            strategy: "full".into(),
            pass_times: vec![Duration::from_nanos(10); 3],
            restore_times: vec![Duration::from_nanos(7); 2],
            ..DispatchRow::default()
        }
    }

    fn once() -> DispatchRow {
        DispatchRow {
            dispatch_id: 4,
            kernel: "remix".into(),
            outcome: "ran once".into(),
            passes_run: 1,
            unreplayed_contexts: vec![0],
            unreplayed_records: 1,
            tier: "-".into(),
            strategy: "-".into(),
            ..DispatchRow::default()
        }
    }

    const HEADER: &str = "dispatch_id,kernel,outcome,passes_run,replay_pass,contexts,records,\
pass_ns,restore_after_ns,restore_after_bytes,bytes_snapshotted,bytes_restored,tier,strategy,\
lock_wait_ns,drain_ns,snapshot_ns,snapshot_agent_regions,snapshot_agent_bytes,\
snapshot_referenced_regions,snapshot_referenced_bytes,snapshot_module_variable_regions,\
snapshot_module_variable_bytes,snapshot_adopted_regions,snapshot_adopted_bytes";

    #[test]
    fn csv_has_one_line_per_pass_each_with_its_replay_pass() {
        let text = csv(&[replayed(), once()]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], HEADER);
        let header: Vec<&str> = lines[0].split(',').collect();
        let pass_column = header.iter().position(|h| *h == "replay_pass").unwrap();
        assert_eq!(lines.len(), 1 + 3 + 1);
        let passes: Vec<&str> = lines[1..]
            .iter()
            .map(|l| l.split(',').nth(pass_column).unwrap())
            .collect();
        assert_eq!(passes, ["0", "1", "2", ""]);
        assert_eq!(
            lines[2],
            "3,axpy,replayed,3,1,1,2,10,7,100,100,200,host,full,0,0,0,2,60,1,32,1,4,1,4"
        );
        assert_eq!(
            lines[3],
            "3,axpy,replayed,3,2,2,2,10,,,100,200,host,full,0,0,0,2,60,1,32,1,4,1,4"
        );
        assert_eq!(
            lines[4],
            "4,remix,ran once,1,,0,1,,,,0,0,-,-,0,0,0,0,0,0,0,0,0,0,0"
        );
        assert!(lines.iter().all(|l| l.split(',').count() == header.len()));
    }

    #[test]
    fn csv_without_dispatches_is_the_header_alone() {
        assert_eq!(csv(&[]), format!("{HEADER}\n"));
    }

    #[test]
    fn csv_fields_with_commas_quotes_or_line_breaks_read_back_unchanged() {
        let mut row = once();
        row.kernel = "say \"hi\", twice".into();
        row.outcome = "declined: one\ntwo".into();
        let text = csv(&[row]);
        let mut reader = csv::Reader::from_reader(text.as_bytes());
        let records: Vec<csv::StringRecord> = reader.records().map(Result::unwrap).collect();
        assert_eq!(records.len(), 1, "{text}");
        assert_eq!(&records[0][1], "say \"hi\", twice");
        assert_eq!(&records[0][2], "declined: one\ntwo");
        assert_eq!(records[0].len(), HEADER.split(',').count());
    }

    #[test]
    fn json_lists_every_pass_with_its_replay_pass() {
        let problems = vec!["one \"quoted\" problem\u{1}".to_string()];
        let summary = RunSummary {
            passes: 3,
            restore: true,
            elements: 16,
            problems: &problems,
            passed: false,
            verification: "verification: FAIL — x",
        };
        let value: Value = serde_json::from_str(&json(&summary, &[replayed(), once()])).unwrap();
        assert_eq!(value["command"], "demo");
        assert_eq!(value["passes"], 3);
        let dispatches = value["dispatches"].as_array().unwrap();
        assert_eq!(dispatches.len(), 2);
        assert_eq!(
            dispatches[0]["passes"][1],
            json!({"replay_pass": 1, "contexts": [1], "records": 2, "time_ns": 10,
                   "restore_after_ns": 7, "restore_after_bytes": 100})
        );
        assert_eq!(dispatches[0]["passes"][2]["restore_after_ns"], Value::Null);
        assert_eq!(
            dispatches[1]["passes"],
            json!([{"replay_pass": null, "contexts": [0], "records": 1, "time_ns": null,
                    "restore_after_ns": null, "restore_after_bytes": null}])
        );
        assert_eq!(dispatches[0]["passes_ns"], 30);
        assert_eq!(dispatches[0]["restores_ns"], 14);
        assert_eq!(
            dispatches[0]["snapshot_sources"]["module_variables"],
            json!({"regions": 1, "bytes": 4})
        );
        assert_eq!(value["problems"], json!(["one \"quoted\" problem\u{1}"]));
        assert_eq!(
            value["verification"],
            json!({"pass": false, "line": "verification: FAIL — x"})
        );
    }
}
