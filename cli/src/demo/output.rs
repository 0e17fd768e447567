//! Machine-readable records of a demo run: CSV (one row per pass) and JSON (every dispatch with
//! its passes). Every per-pass record carries `replay_pass`; a dispatch that was not replayed
//! has one record whose `replay_pass` is empty (CSV) or `null` (JSON).

use std::fmt::Write as _;
use std::time::Duration;

use super::report::DispatchRow;

/// The CSV header.
pub const CSV_HEADER: &str = "dispatch_id,kernel,outcome,passes_run,replay_pass,contexts,records,\
pass_ns,restore_after_ns,restore_after_bytes,bytes_snapshotted,bytes_restored,tier,strategy,\
lock_wait_ns,drain_ns,snapshot_ns,snapshot_agent_regions,snapshot_agent_bytes,\
snapshot_referenced_regions,snapshot_referenced_bytes,snapshot_module_variable_regions,\
snapshot_module_variable_bytes,snapshot_adopted_regions,snapshot_adopted_bytes";

/// Names of the snapshot sources, in the order of `DispatchRow::snapshot_sources`.
pub const SOURCES: [&str; 4] = ["agent", "referenced", "module_variables", "adopted"];

/// One CSV line per pass of every dispatch (one line for a dispatch that ran once), after
/// [`CSV_HEADER`]. Contexts are listed as numbers separated by `;`.
pub fn csv(rows: &[DispatchRow]) -> String {
    let mut out = String::from(CSV_HEADER);
    out.push('\n');
    for row in rows {
        let common_head = [
            row.dispatch_id.to_string(),
            csv_field(&row.kernel),
            csv_field(&row.outcome),
            row.passes_run.to_string(),
        ];
        let common_tail = [
            row.bytes_snapshotted.to_string(),
            row.bytes_restored.to_string(),
            csv_field(&row.tier),
            csv_field(&row.strategy),
            nanos(row.lock_wait),
            nanos(row.drain),
            nanos(row.snapshot),
        ]
        .into_iter()
        .chain(
            row.snapshot_sources
                .iter()
                .flat_map(|(regions, bytes)| [regions.to_string(), bytes.to_string()]),
        )
        .collect::<Vec<_>>();
        for pass in passes(row) {
            let fields: Vec<String> = common_head
                .iter()
                .cloned()
                .chain([
                    pass.replay_pass.map_or_else(String::new, |p| p.to_string()),
                    join(&pass.contexts, ";"),
                    pass.records.to_string(),
                    pass.time.map_or_else(String::new, nanos),
                    pass.restore_time.map_or_else(String::new, nanos),
                    pass.restore_bytes
                        .map_or_else(String::new, |b| b.to_string()),
                ])
                .chain(common_tail.iter().cloned())
                .collect();
            out.push_str(&fields.join(","));
            out.push('\n');
        }
    }
    out
}

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

/// The whole run as one JSON document.
pub fn json(summary: &RunSummary<'_>, rows: &[DispatchRow]) -> String {
    let mut out = String::from("{\n");
    let _ = writeln!(out, "  \"command\": \"demo\",");
    let _ = writeln!(out, "  \"passes\": {},", summary.passes);
    let _ = writeln!(out, "  \"restore\": {},", summary.restore);
    let _ = writeln!(out, "  \"elements\": {},", summary.elements);
    out.push_str("  \"dispatches\": [");
    for (i, row) in rows.iter().enumerate() {
        out.push_str(if i == 0 { "\n" } else { ",\n" });
        let passes: Vec<String> = passes(row)
            .into_iter()
            .map(|p| {
                format!(
                    "{{\"replay_pass\": {}, \"contexts\": [{}], \"records\": {}, \
                     \"time_ns\": {}, \"restore_after_ns\": {}, \"restore_after_bytes\": {}}}",
                    p.replay_pass
                        .map_or_else(|| "null".into(), |v| v.to_string()),
                    join(&p.contexts, ", "),
                    p.records,
                    p.time.map_or_else(|| "null".into(), nanos),
                    p.restore_time.map_or_else(|| "null".into(), nanos),
                    p.restore_bytes
                        .map_or_else(|| "null".into(), |b| b.to_string()),
                )
            })
            .collect();
        let _ = write!(
            out,
            "    {{\"dispatch_id\": {}, \"kernel\": {}, \"outcome\": {}, \"passes_run\": {}, \
             \"bytes_snapshotted\": {}, \"bytes_restored\": {}, \"tier\": {}, \"strategy\": {}, \
             \"lock_wait_ns\": {}, \"drain_ns\": {}, \"snapshot_ns\": {}, \"passes_ns\": {}, \
             \"restores_ns\": {}, \"snapshot_sources\": {{{}}},\n     \"passes\": [\n       {}\n     ],\n     \
             \"problems\": [{}]}}",
            row.dispatch_id,
            json_string(&row.kernel),
            json_string(&row.outcome),
            row.passes_run,
            row.bytes_snapshotted,
            row.bytes_restored,
            json_string(&row.tier),
            json_string(&row.strategy),
            nanos(row.lock_wait),
            nanos(row.drain),
            nanos(row.snapshot),
            nanos(row.passes_total()),
            nanos(row.restores_total()),
            SOURCES
                .iter()
                .zip(row.snapshot_sources)
                .map(|(name, (regions, bytes))| format!(
                    "\"{name}\": {{\"regions\": {regions}, \"bytes\": {bytes}}}"
                ))
                .collect::<Vec<_>>()
                .join(", "),
            passes.join(",\n       "),
            string_list(&row.problems),
        );
    }
    out.push_str(if rows.is_empty() { "],\n" } else { "\n  ],\n" });
    let _ = writeln!(out, "  \"problems\": [{}],", string_list(summary.problems));
    let _ = writeln!(
        out,
        "  \"verification\": {{\"pass\": {}, \"line\": {}}}",
        summary.passed,
        json_string(summary.verification)
    );
    out.push_str("}\n");
    out
}

/// One pass of a row, or the single run of a dispatch that was not replayed.
struct PassLine {
    replay_pass: Option<u64>,
    contexts: Vec<usize>,
    records: u32,
    time: Option<Duration>,
    restore_time: Option<Duration>,
    restore_bytes: Option<u64>,
}

fn passes(row: &DispatchRow) -> Vec<PassLine> {
    if row.pass_contexts.is_empty() {
        return vec![PassLine {
            replay_pass: None,
            contexts: row.unreplayed_contexts.clone(),
            records: row.unreplayed_records,
            time: None,
            restore_time: None,
            restore_bytes: None,
        }];
    }
    row.pass_contexts
        .iter()
        .enumerate()
        .map(|(pass, contexts)| PassLine {
            replay_pass: Some(pass as u64),
            contexts: contexts.clone(),
            records: row.pass_records.get(pass).copied().unwrap_or(0),
            time: row.pass_times.get(pass).copied(),
            restore_time: row.restore_times.get(pass).copied(),
            restore_bytes: row.restore_bytes.get(pass).copied(),
        })
        .collect()
}

fn nanos(duration: Duration) -> String {
    duration.as_nanos().to_string()
}

fn join(values: &[usize], separator: &str) -> String {
    values
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(separator)
}

/// A CSV field, quoted when it holds a comma, a quote or a line break.
fn csv_field(value: &str) -> String {
    if value.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", value.replace('"', "\"\""))
    } else {
        value.to_string()
    }
}

/// A JSON string literal.
fn json_string(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn string_list(values: &[String]) -> String {
    values
        .iter()
        .map(|v| json_string(v))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn csv_has_one_line_per_pass_each_with_its_replay_pass() {
        let text = csv(&[replayed(), once()]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], CSV_HEADER);
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
    fn csv_fields_with_commas_or_quotes_are_quoted() {
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_field("plain"), "plain");
    }

    #[test]
    fn json_lists_every_pass_with_its_replay_pass() {
        let problems = vec!["one \"quoted\" problem".to_string()];
        let summary = RunSummary {
            passes: 3,
            restore: true,
            elements: 16,
            problems: &problems,
            passed: false,
            verification: "verification: FAIL — x",
        };
        let text = json(&summary, &[replayed(), once()]);
        assert_eq!(text.matches("\"replay_pass\"").count(), 4);
        assert!(text.contains("\"replay_pass\": 2, \"contexts\": [2]"));
        assert!(text.contains("\"replay_pass\": null, \"contexts\": [0], \"records\": 1"));
        assert!(text.contains("\"restore_after_ns\": 7, \"restore_after_bytes\": 100"));
        assert!(text.contains("\"problems\": [\"one \\\"quoted\\\" problem\"]"));
        assert!(text.contains("\"verification\": {\"pass\": false"));
        assert_eq!(text.matches('{').count(), text.matches('}').count());
        assert_eq!(text.matches('[').count(), text.matches(']').count());
    }

    #[test]
    fn json_strings_escape_control_characters() {
        assert_eq!(json_string("a\"b\\c\nd\u{1}"), "\"a\\\"b\\\\c\\nd\\u0001\"");
    }
}
