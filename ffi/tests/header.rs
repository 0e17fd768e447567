//! The C header against the Rust side: it compiles as strict C99, C11 and C++, its layouts match
//! what it documents (tests/c/layout.c), its constants equal the Rust constants, and a C program built
//! against it runs correctly against the libkreplay.so of this build.

mod common;

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::PathBuf;

use kreplay::abi::{
    CallbackKind, CallbackPhase, DEFAULT_MAX_PASSES, DeclineReason, KernelDispatchOperation,
    KernelReplayOperation, REPLAY_PASS_NONE, ReplayEnd, ReplayOutcomeKind, RestoreStrategy,
    SnapshotTier, Status, VERSION, VERSION_MAJOR, VERSION_MINOR, VERSION_PATCH,
};

fn compile_only(compiler: &str, standard: &str, source: &str) {
    let include = common::include_dir();
    let source = common::c_source(source);
    let object = common::scratch_dir("header").join(format!("{standard}.o"));
    common::run_ok(
        compiler,
        &[
            OsStr::new(&format!("-std={standard}")),
            "-Wall".as_ref(),
            "-Wextra".as_ref(),
            "-Werror".as_ref(),
            "-pedantic".as_ref(),
            "-I".as_ref(),
            include.as_os_str(),
            "-c".as_ref(),
            source.as_os_str(),
            "-o".as_ref(),
            object.as_os_str(),
        ],
    );
}

#[test]
fn header_layouts_match_spec_when_compiled_as_strict_c99() {
    if !common::have_compiler("cc") {
        return;
    }
    compile_only("cc", "c99", "layout.c");
}

#[test]
fn header_layouts_and_distinct_id_types_hold_in_c11() {
    if !common::have_compiler("cc") {
        return;
    }
    compile_only("cc", "c11", "layout.c");
}

#[test]
fn header_compiles_as_cxx_with_c_linkage() {
    if !common::have_compiler("c++") {
        return;
    }
    compile_only("c++", "c++11", "cxx_check.cpp");
}

/// Every `KREPLAY_*` enumerator and object-like macro of the header, by name.
fn header_constant_names() -> Vec<String> {
    let header = std::fs::read_to_string(kreplay::HEADER_PATH).expect("read kreplay.h");
    let mut names = Vec::new();
    for line in header.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("#define ") {
            let name = rest.split_whitespace().next().unwrap_or("");
            if name.starts_with("KREPLAY_") && !name.contains('(') && name != "KREPLAY_H" {
                names.push(name.to_owned());
            }
        } else if line.starts_with("KREPLAY_") && line.contains(" = ") {
            names.push(line.split(" = ").next().unwrap().trim().to_owned());
        }
    }
    names
}

fn rust_constants() -> BTreeMap<String, u64> {
    fn add<T: Copy>(
        map: &mut BTreeMap<String, u64>,
        prefix: &str,
        values: &[(&str, T)],
        raw: impl Fn(T) -> u64,
    ) {
        for &(suffix, value) in values {
            let previous = map.insert(format!("{prefix}{suffix}"), raw(value));
            assert!(previous.is_none(), "{prefix}{suffix} listed twice");
        }
    }
    let mut map = BTreeMap::new();
    add(&mut map, Status::C_PREFIX, Status::VALUES, |v| v.0 as u64);
    add(
        &mut map,
        CallbackKind::C_PREFIX,
        CallbackKind::VALUES,
        |v| u64::from(v.0),
    );
    add(
        &mut map,
        KernelDispatchOperation::C_PREFIX,
        KernelDispatchOperation::VALUES,
        |v| u64::from(v.0),
    );
    add(
        &mut map,
        KernelReplayOperation::C_PREFIX,
        KernelReplayOperation::VALUES,
        |v| u64::from(v.0),
    );
    add(
        &mut map,
        CallbackPhase::C_PREFIX,
        CallbackPhase::VALUES,
        |v| u64::from(v.0),
    );
    add(
        &mut map,
        DeclineReason::C_PREFIX,
        DeclineReason::VALUES,
        |v| u64::from(v.0),
    );
    add(
        &mut map,
        SnapshotTier::C_PREFIX,
        SnapshotTier::VALUES,
        |v| u64::from(v.0),
    );
    add(
        &mut map,
        RestoreStrategy::C_PREFIX,
        RestoreStrategy::VALUES,
        |v| u64::from(v.0),
    );
    add(
        &mut map,
        ReplayOutcomeKind::C_PREFIX,
        ReplayOutcomeKind::VALUES,
        |v| u64::from(v.0),
    );
    add(&mut map, ReplayEnd::C_PREFIX, ReplayEnd::VALUES, |v| {
        u64::from(v.0)
    });
    map.insert("KREPLAY_VERSION_MAJOR".into(), u64::from(VERSION_MAJOR));
    map.insert("KREPLAY_VERSION_MINOR".into(), u64::from(VERSION_MINOR));
    map.insert("KREPLAY_VERSION_PATCH".into(), u64::from(VERSION_PATCH));
    map.insert("KREPLAY_VERSION".into(), u64::from(VERSION));
    map.insert("KREPLAY_REPLAY_PASS_NONE".into(), REPLAY_PASS_NONE);
    map.insert("KREPLAY_DEFAULT_MAX_PASSES".into(), DEFAULT_MAX_PASSES);
    map
}

#[test]
fn header_constants_equal_rust_constants() {
    if !common::have_compiler("cc") {
        return;
    }
    let names = header_constant_names();
    assert!(names.len() > 50, "parsed only {} constants", names.len());

    // A C program printing every constant the header defines, as the C compiler sees it.
    let mut program =
        String::from("#include <stdio.h>\n#include \"kreplay.h\"\nint main(void) {\n");
    for name in &names {
        program.push_str(&format!(
            "    printf(\"%s %llu\\n\", \"{name}\", (unsigned long long)({name}));\n"
        ));
    }
    program.push_str("    return 0;\n}\n");
    let dir = common::scratch_dir("header");
    // Named for this process: another copy of this test binary may write and build its own
    // at the same time (built under a name of its own and renamed, so that no process runs a
    // program another is still writing: "Text file busy").
    let source = dir.join(format!("constants-{}.c", std::process::id()));
    let binary = dir.join("constants");
    std::fs::write(&source, program).unwrap();
    let include = common::include_dir();
    common::build_atomically(&binary, |binary| {
        common::run_ok(
            "cc",
            &[
                "-std=c99".as_ref(),
                "-Wall".as_ref(),
                "-Werror".as_ref(),
                "-I".as_ref(),
                include.as_os_str(),
                source.as_os_str(),
                "-o".as_ref(),
                binary.as_os_str(),
            ],
        );
    });
    let _ = std::fs::remove_file(&source);
    let output = common::run_ok(binary.to_str().unwrap(), &[]);
    let from_header: BTreeMap<String, u64> = output
        .lines()
        .map(|line| {
            let (name, value) = line.split_once(' ').unwrap();
            (name.to_owned(), value.parse().unwrap())
        })
        .collect();

    let from_rust = rust_constants();
    let only_header: Vec<_> = from_header
        .keys()
        .filter(|k| !from_rust.contains_key(*k))
        .collect();
    let only_rust: Vec<_> = from_rust
        .keys()
        .filter(|k| !from_header.contains_key(*k))
        .collect();
    assert!(
        only_header.is_empty(),
        "not mirrored in Rust: {only_header:?}"
    );
    assert!(
        only_rust.is_empty(),
        "missing from the header: {only_rust:?}"
    );
    for (name, value) in &from_rust {
        assert_eq!(from_header[name], *value, "{name}");
    }
}

#[test]
fn spec_values_of_kernel_replay_operations_and_phases_are_fixed() {
    assert_eq!(KernelReplayOperation::NONE.0, 0);
    assert_eq!(KernelReplayOperation::CONFIG.0, 1);
    assert_eq!(KernelReplayOperation::PASS.0, 2);
    assert_eq!(KernelReplayOperation::SNAPSHOT.0, 3);
    assert_eq!(KernelReplayOperation::RESTORE.0, 4);
    assert_eq!(KernelReplayOperation::LAST.0, 5);
    assert_eq!(CallbackPhase::NONE.0, 0);
    assert_eq!(CallbackPhase::ENTER.0, 1);
    assert_eq!(CallbackPhase::EXIT.0, 2);
    assert_eq!(CallbackKind::NONE.0, 0);
    assert_eq!(Status::SUCCESS.0, 0);
}

/// libkreplay.so built by this `cargo test` run (beside this test binary in `deps/`).
fn built_cdylib() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let deps = exe.parent()?;
    let candidates = [
        deps.join("libkreplay.so"),
        deps.parent()?.join("libkreplay.so"),
    ];
    candidates.into_iter().find(|path| path.is_file())
}

#[test]
fn c_program_built_against_header_runs_against_libkreplay() {
    if !common::have_compiler("cc") {
        return;
    }
    let Some(library) = built_cdylib() else {
        eprintln!("skipped: libkreplay.so of this build not found beside the test binary");
        return;
    };
    let dir = common::scratch_dir("header");
    let binary = dir.join("abi_smoke");
    let include = common::include_dir();
    let source = common::c_source("abi_smoke.c");
    // The program records the library's SONAME (libkreplay.so.0), which is looked up at run
    // time: install that name beside the program, as a package would.
    let soname = dir.join(format!("libkreplay.so.{}", kreplay::abi::VERSION_MAJOR));
    // Made under a name of this process's own and renamed over the SONAME, as the program is
    // built, so that copies of this test binary running at once never meet half-done files.
    common::build_atomically(&soname, |link| {
        std::os::unix::fs::symlink(&library, link).expect("install the SONAME link");
    });
    let rpath = format!("-Wl,-rpath,{}", dir.display());
    common::build_atomically(&binary, |binary| {
        common::run_ok(
            "cc",
            &[
                "-std=c99".as_ref(),
                "-Wall".as_ref(),
                "-Wextra".as_ref(),
                "-Werror".as_ref(),
                "-pedantic".as_ref(),
                "-I".as_ref(),
                include.as_os_str(),
                source.as_os_str(),
                library.as_os_str(),
                rpath.as_ref(),
                "-o".as_ref(),
                binary.as_os_str(),
            ],
        );
    });
    let output = common::run_ok(binary.to_str().unwrap(), &[]);
    assert!(output.contains("abi smoke: ok"), "{output}");
}
