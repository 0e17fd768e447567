//! Every command that writes a file says so, naming the file, once the file is there.

mod support;

use std::path::PathBuf;
use std::process::Output;

fn kreplay(args: &[&str]) -> Output {
    support::kreplay_with(args, &[])
}

fn scratch(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("outputs-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path.to_str().unwrap().to_owned()
}

/// Runs `args`, which write `files`, and checks the report names each, after it was written.
fn assert_says_what_it_wrote(args: &[&str], files: &[&str]) {
    let output = kreplay(args);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{args:?}: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for file in files {
        let len = std::fs::metadata(file)
            .unwrap_or_else(|e| panic!("{args:?} wrote {file}: {e}"))
            .len();
        assert!(len > 0, "{file} is empty");
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with(&format!("wrote {file}"))),
            "{args:?} says it wrote {file}: {stdout}"
        );
        let _ = std::fs::remove_file(file);
    }
}

#[test]
fn demo_says_what_it_wrote() {
    let (csv, json) = (scratch("demo.csv"), scratch("demo.json"));
    assert_says_what_it_wrote(
        &["demo", "--elements", "1k", "--csv", &csv, "--json", &json],
        &[&csv, &json],
    );
}

#[test]
fn bench_dispatch_says_what_it_wrote() {
    let csv = scratch("dispatch.csv");
    assert_says_what_it_wrote(
        &[
            "bench-dispatch",
            "--dispatches",
            "10",
            "--allocations",
            "1",
            "--csv",
            &csv,
        ],
        &[&csv],
    );
}

#[test]
fn profile_says_what_it_wrote() {
    let (csv, json) = (scratch("profile.csv"), scratch("profile.json"));
    for file in [&csv, &json] {
        assert_says_what_it_wrote(
            &["profile", "--pmc", "SQ_WAVES", "-o", file, "--", "saxpy"],
            &[file],
        );
    }
}

#[test]
fn bench_says_what_it_wrote() {
    let (csv, svg) = (scratch("bench.csv"), scratch("bench.svg"));
    assert_says_what_it_wrote(
        &[
            "bench",
            "--footprints",
            "64K",
            "--dirty",
            "0,10",
            "--passes",
            "none",
            "--repeats",
            "1",
            "--csv",
            &csv,
            "--svg",
            &svg,
        ],
        &[&csv, &svg],
    );
}
