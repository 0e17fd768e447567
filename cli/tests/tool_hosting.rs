//! `kreplay demo --tool PATH` (and `KREPLAY_TOOL_LIBRARIES`) hosts tools written in C against the
//! one kreplay of the `kreplay` process: the example tool of examples/c-tool, compiled here with
//! the system C compiler, replays the demo's dispatches, and the demo still verifies the
//! application. A tool that cannot be used stops the demo with a non-zero exit and a message
//! naming it.

#[path = "../../ffi/tests/common/mod.rs"]
mod common;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const KREPLAY: &str = env!("CARGO_BIN_EXE_kreplay");

fn scratch(test: &str) -> PathBuf {
    common::scratch_dir(&format!("tool_hosting/{test}"))
}

/// The example tool's summary in `dir`, named for this process: another copy of this test
/// binary running the same test at once writes its own.
fn summary_file(dir: &Path) -> PathBuf {
    dir.join(format!("summary-{}.txt", std::process::id()))
}

/// Writes `text` to `path` so that a process reading it (the C compiler of another copy of this
/// test binary) sees it whole or not at all.
fn write_source(path: &Path, text: &str) {
    common::build_atomically(path, |partial| {
        std::fs::write(partial, text).expect("write")
    });
}

/// Points `link` at `target`, replacing what was there in one step (never missing meanwhile
/// for another copy of this test binary).
fn install_link(target: &Path, link: &Path) {
    common::build_atomically(link, |partial| {
        std::os::unix::fs::symlink(target, partial).expect("symlink");
    });
}

/// examples/c-tool/pass_counter.c as a shared library that resolves kreplay's functions from
/// the process that loads it.
fn example_tool(dir: &Path) -> PathBuf {
    assert!(common::have_compiler("cc"), "these tests need `cc`");
    let out = dir.join("libpass_counter.so");
    common::build_c_library_from(
        &common::example_source("c-tool/pass_counter.c"),
        &out,
        "c11",
        &[],
    );
    out
}

/// The libkreplay.so cargo built for this test run (the cdylib of the kreplay package).
fn libkreplay() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("deps folder");
    [
        deps.join("libkreplay.so"),
        deps.parent().expect("target folder").join("libkreplay.so"),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .expect("cargo builds libkreplay.so (the cdylib of a dependency) into deps/")
}

/// The example tool linked with `-lkreplay`, its run path pointing at `lib_dir` (where
/// `libkreplay.so.0`, the SONAME, may or may not be installed).
fn example_tool_linked(dir: &Path, lib_dir: &Path) -> PathBuf {
    assert!(common::have_compiler("cc"), "these tests need `cc`");
    let link_dir = dir.join("link");
    std::fs::create_dir_all(&link_dir).expect("link folder");
    let link_name = link_dir.join("libkreplay.so");
    install_link(&libkreplay(), &link_name);
    let out = dir.join("libpass_counter_linked.so");
    let rpath = format!("-Wl,-rpath,{}", lib_dir.display());
    common::build_c_library_from(
        &common::example_source("c-tool/pass_counter.c"),
        &out,
        "c11",
        &[
            "-L".as_ref(),
            link_dir.as_os_str(),
            "-lkreplay".as_ref(),
            rpath.as_ref(),
        ],
    );
    out
}

fn kreplay(args: &[&OsStr], env: &[(&str, &OsStr)]) -> Output {
    let mut command = Command::new(KREPLAY);
    command
        .args(args)
        .env_remove("KREPLAY_TOOL_LIBRARIES")
        .env_remove("EXAMPLE_TOOL_PASSES");
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().expect("run kreplay")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn assert_replayed_by_example(output: &Output, summary: &Path, passes: u64) {
    let stdout = text(&output.stdout);
    let stderr = text(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(0),
        "kreplay demo with the example tool must pass:\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("passes chosen by tool pass_counter"),
        "the demo names the tool that drives replay:\n{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "dispatches: 12, 12 replayed, 12 as planned; {} kernel runs",
            12 * passes
        )),
        "every dispatch replayed in the tool's {passes} passes, seen by the demo:\n{stdout}"
    );
    assert!(
        stdout.contains("verification: PASS"),
        "results equal the unprofiled run:\n{stdout}"
    );
    assert!(
        !stdout.contains("per-pass masking"),
        "the demo's masking check does not apply to another tool's passes:\n{stdout}"
    );
    let summary = std::fs::read_to_string(summary).expect("the example tool wrote its summary");
    assert!(
        summary.contains(&format!(
            "pass_counter: 12 dispatches, 12 replayed, 0 declined; {} passes;",
            12 * passes
        )),
        "the C tool itself saw every dispatch replayed: {summary}"
    );
    assert!(
        summary.contains(&format!(
            "0 restore failures; {runs} completions in passes, 0 single; \
             {runs} enqueues in passes, 0 single; 0 user_data errors",
            runs = 12 * passes
        )),
        "the C tool's dispatch tracing saw one submission and one completion per pass: {summary}"
    );
}

#[test]
fn demo_tool_option_hosts_a_c_tool_that_takes_its_kreplay_functions_from_the_binary() {
    let dir = scratch("from_binary");
    let tool = example_tool(&dir);
    let summary = summary_file(&dir);
    let _ = std::fs::remove_file(&summary);
    let output = kreplay(
        &[
            "demo".as_ref(),
            "--elements".as_ref(),
            "4k".as_ref(),
            "--tool".as_ref(),
            tool.as_os_str(),
        ],
        &[("EXAMPLE_TOOL_OUTPUT", summary.as_os_str())],
    );
    assert_replayed_by_example(&output, &summary, 3);
}

#[test]
fn tool_libraries_variable_hosts_a_c_tool_linked_with_lkreplay_against_the_same_kreplay() {
    let dir = scratch("linked");
    // libkreplay.so.0 (the SONAME) installed where the tool's run path points.
    let lib_dir = dir.join("lib");
    std::fs::create_dir_all(&lib_dir).expect("lib folder");
    let soname = lib_dir.join("libkreplay.so.0");
    install_link(&libkreplay(), &soname);
    let tool = example_tool_linked(&dir, &lib_dir);
    let summary = summary_file(&dir);
    let _ = std::fs::remove_file(&summary);
    let output = kreplay(
        &["demo".as_ref(), "--elements".as_ref(), "4k".as_ref()],
        &[
            ("KREPLAY_TOOL_LIBRARIES", tool.as_os_str()),
            ("EXAMPLE_TOOL_PASSES", "2".as_ref()),
            ("EXAMPLE_TOOL_OUTPUT", summary.as_os_str()),
        ],
    );
    assert_replayed_by_example(&output, &summary, 2);
}

/// Runs the demo with a tool that cannot be used: exit status 1, no verification line, and
/// stderr names the tool and says why.
fn assert_refused(output: &Output, tool: &Path, why: &str) {
    let stdout = text(&output.stdout);
    let stderr = text(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(1),
        "an unusable tool must fail the demo:\n{stdout}\n{stderr}"
    );
    assert!(
        !stdout.contains("verification:"),
        "the demo does not run without its tool:\n{stdout}"
    );
    let expected = format!("kreplay: error: cannot use tool {}: ", tool.display());
    assert!(
        stderr.contains(&expected) && stderr.contains(why),
        "stderr must say `{expected}...{why}`, it says:\n{stderr}"
    );
}

#[test]
fn demo_fails_loudly_when_a_requested_tool_cannot_be_used() {
    let dir = scratch("refused");
    let demo = |tool: &Path, env: &[(&str, &OsStr)]| {
        kreplay(
            &[
                "demo".as_ref(),
                "--elements".as_ref(),
                "1k".as_ref(),
                "--tool".as_ref(),
                tool.as_os_str(),
            ],
            env,
        )
    };

    let missing = dir.join("no-such-tool.so");
    assert_refused(&demo(&missing, &[]), &missing, "no such file");

    let not_a_tool_source = dir.join("not_a_tool.c");
    write_source(&not_a_tool_source, "int not_a_tool(void) { return 1; }\n");
    let not_a_tool = dir.join("libnot_a_tool.so");
    common::build_c_library_from(&not_a_tool_source, &not_a_tool, "c99", &[]);
    assert_refused(
        &demo(&not_a_tool, &[]),
        &not_a_tool,
        "does not define kreplay_configure",
    );

    let tool = example_tool(&dir);
    assert_refused(
        &demo(&tool, &[("EXAMPLE_TOOL_PASSES", "0".as_ref())]),
        &tool,
        "its initialize returned non-zero",
    );

    // Linked with -lkreplay, but libkreplay.so.0 is nowhere the loader looks.
    let nowhere = dir.join("empty-lib");
    std::fs::create_dir_all(&nowhere).expect("empty folder");
    let linked = example_tool_linked(&dir, &nowhere);
    assert_refused(&demo(&linked, &[]), &linked, "libkreplay.so.0");
}

#[test]
fn a_bad_entry_in_the_tool_libraries_variable_fails_the_demo() {
    let dir = scratch("bad_variable");
    let missing = dir.join("missing.so");
    let output = kreplay(
        &["demo".as_ref(), "--elements".as_ref(), "1k".as_ref()],
        &[("KREPLAY_TOOL_LIBRARIES", missing.as_os_str())],
    );
    assert_refused(&output, &missing, "no such file");
    // Where the path came from, as for every other malformed setting: it was not on the
    // command line.
    assert!(
        text(&output.stderr).contains("KREPLAY_TOOL_LIBRARIES"),
        "names the variable: {}",
        text(&output.stderr)
    );
}

#[test]
fn demo_says_a_tool_path_that_names_a_folder_is_a_folder_not_a_missing_file() {
    let dir = scratch("folder");
    let folder = dir.join("libtool.so");
    std::fs::create_dir_all(&folder).expect("a folder where the tool should be");
    let output = kreplay(
        &[
            "demo".as_ref(),
            "--elements".as_ref(),
            "1k".as_ref(),
            "--tool".as_ref(),
            folder.as_os_str(),
        ],
        &[],
    );
    assert_refused(&output, &folder, "is a folder, not a library file");
    assert!(
        !text(&output.stderr).contains("no such file"),
        "the folder exists: {}",
        text(&output.stderr)
    );
}

#[test]
fn demo_with_another_tool_driving_replay_claims_no_tier_strategy_or_sources_it_did_not_see() {
    let dir = scratch("unseen");
    let tool = example_tool(&dir);
    let summary = summary_file(&dir);
    let output = kreplay(
        &[
            "demo".as_ref(),
            "--elements".as_ref(),
            "4k".as_ref(),
            "--tool".as_ref(),
            tool.as_os_str(),
        ],
        &[("EXAMPLE_TOOL_OUTPUT", summary.as_os_str())],
    );
    assert_replayed_by_example(&output, &summary, 3);
    let stdout = text(&output.stdout);
    // The tool's SNAPSHOT records went to the tool, not to the demo: zeros would be a claim.
    assert!(
        !stdout.contains("agent memory 0 region(s)"),
        "the demo never saw a snapshot's sources, so it must not report zero of each:\n{stdout}"
    );
    assert!(
        stdout.contains("snapshot sources: not seen by the demo"),
        "it says why it has none:\n{stdout}"
    );
    // '-' means "ran once" in the legend; replayed rows must not show it for tier and strategy.
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
        .collect();
    assert_eq!(rows.len(), 12, "one row per dispatch:\n{stdout}");
    for row in rows {
        let cells: Vec<&str> = row.split_whitespace().collect();
        // id kernel passes contexts snapshot(2 words) restored(2 words) tier strategy ...
        assert_eq!(
            (cells[8], cells[9]),
            ("?", "?"),
            "a replayed row's tier and strategy are unknown to the demo, not '-': {row}"
        );
    }
    assert!(
        stdout.contains("'?': chosen in a replay another tool drove"),
        "the legend explains '?':\n{stdout}"
    );
}

#[test]
fn demo_names_the_tool_library_in_kreplays_own_messages_about_a_tool() {
    let dir = scratch("origin");
    let tool = example_tool(&dir);
    let output = kreplay(
        &[
            "demo".as_ref(),
            "--elements".as_ref(),
            "1k".as_ref(),
            "--tool".as_ref(),
            tool.as_os_str(),
        ],
        &[("EXAMPLE_TOOL_PASSES", "0".as_ref())],
    );
    assert_refused(&output, &tool, "its initialize returned non-zero");
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains(&format!(
            "tool \"pass_counter\" (client 1, from {}) failed to initialize",
            tool.display()
        )),
        "kreplay's warning names the library the author passed, not an internal call:\n{stderr}"
    );
    assert!(!stderr.contains("kreplay_force_configure"), "{stderr}");
}

/// A tool library whose `kreplay_configure` is a variable (a function pointer named like the
/// entry point), not a function: calling it would jump into data.
fn variable_tool(dir: &Path) -> PathBuf {
    let source = dir.join("variable.c");
    write_source(
        &source,
        "void *kreplay_configure = 0; /* a slip: the pointer, not the function */\n",
    );
    let library = dir.join("libvariable.so");
    common::build_c_library_from(&source, &library, "c99", &[]);
    library
}

#[test]
fn demo_refuses_a_tool_whose_kreplay_configure_is_a_variable_instead_of_crashing() {
    let dir = scratch("variable");
    let library = variable_tool(&dir);
    let output = kreplay(
        &[
            "demo".as_ref(),
            "--elements".as_ref(),
            "1k".as_ref(),
            "--tool".as_ref(),
            library.as_os_str(),
        ],
        &[],
    );
    assert_refused(&output, &library, "kreplay_configure is not a function");
}

/// The 52-byte ELF header of a 32-bit x86 shared object, padded: enough for the dynamic loader
/// to tell its class.
fn elf32_header() -> Vec<u8> {
    let mut h = vec![0x7f, b'E', b'L', b'F', 1, 1, 1, 0];
    h.extend_from_slice(&[0; 8]);
    for half in [3u16, 3] {
        h.extend_from_slice(&half.to_le_bytes()); // e_type ET_DYN, e_machine EM_386
    }
    h.extend_from_slice(&1u32.to_le_bytes()); // e_version
    h.extend_from_slice(&[0; 4]); // e_entry
    h.extend_from_slice(&52u32.to_le_bytes()); // e_phoff
    h.extend_from_slice(&[0; 8]); // e_shoff, e_flags
    for half in [52u16, 32, 0, 40, 0, 0] {
        h.extend_from_slice(&half.to_le_bytes());
    }
    h.resize(h.len() + 64, 0);
    h
}

#[test]
fn demo_explains_a_tool_file_that_is_32_bit_or_not_a_library() {
    let dir = scratch("not_a_library");
    let demo = |tool: &Path| {
        kreplay(
            &[
                "demo".as_ref(),
                "--elements".as_ref(),
                "1k".as_ref(),
                "--tool".as_ref(),
                tool.as_os_str(),
            ],
            &[],
        )
    };
    let elf32 = dir.join("lib32.so");
    common::build_atomically(&elf32, |partial| {
        std::fs::write(partial, elf32_header()).expect("write")
    });
    assert_refused(
        &demo(&elf32),
        &elf32,
        "a 32-bit library: kreplay loads 64-bit tools only",
    );
    let source = dir.join("tool.c");
    write_source(&source, "int x;\n");
    assert_refused(
        &demo(&source),
        &source,
        "not a shared library: build the tool with -shared -fPIC",
    );
}

#[test]
fn demo_refuses_passes_it_was_given_when_another_tool_chooses_the_passes() {
    // --passes 6 was dropped without a word: the tool's 3 passes ran and the demo passed, the
    // header saying only who chose.
    let dir = scratch("passes_given");
    let tool = example_tool(&dir);
    let summary = summary_file(&dir);
    let output = kreplay(
        &[
            "demo".as_ref(),
            "--elements".as_ref(),
            "4k".as_ref(),
            "--passes".as_ref(),
            "6".as_ref(),
            "--tool".as_ref(),
            tool.as_os_str(),
        ],
        &[("EXAMPLE_TOOL_OUTPUT", summary.as_os_str())],
    );
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert_eq!(output.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("--passes 6") && stderr.contains("pass_counter"),
        "the error names the option and the tool that chooses: {stderr}"
    );
    assert!(!stdout.contains("verification"), "nothing ran: {stdout}");
}

/// A dispatch whose replay kreplay declined although the tool asked for passes ran once against
/// the tool's plan (abi.md §4): with a tool driving replay the demo lists it as not as planned
/// and exits 1, as it does for its own tool (it counted every such dispatch "as planned" and
/// exited 0).
#[test]
fn demo_with_another_tool_driving_replay_reports_a_declined_replay_and_fails() {
    let dir = scratch("declined_by_kreplay");
    let tool = example_tool(&dir);
    let output = kreplay(
        &[
            "demo".as_ref(),
            "--elements".as_ref(),
            "64".as_ref(),
            "--tool".as_ref(),
            tool.as_os_str(),
        ],
        &[("KREPLAY_MAX_SNAPSHOT_BYTES", "1".as_ref())],
    );
    let stdout = text(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("declined: footprint_budget") && stdout.contains("<- not as planned"),
        "{stdout}"
    );
    assert!(stdout.contains("0 as planned"), "{stdout}");
}

/// A `KREPLAY_TOOL_LIBRARIES` tool whose `kreplay_configure` returns NULL chose to stay
/// inactive: `profile`, `stress` and `bench-dispatch` name it on stderr and run on, as `kreplay
/// run` does (they said nothing at all, so a user never learned why the tool did nothing).
#[test]
fn commands_hosting_a_tool_name_one_that_stayed_inactive() {
    let dir = scratch("stayed_inactive");
    let source = dir.join("inactive.c");
    write_source(
        &source,
        "#include <stddef.h>\n\
         void *kreplay_configure(unsigned v, const char *r, unsigned p, void *id) {\n\
         (void)v; (void)r; (void)p; (void)id; return NULL; }\n",
    );
    let library = dir.join("libinactive.so");
    common::build_c_library_from(&source, &library, "c99", &[]);
    let out = kreplay(
        &[
            "profile".as_ref(),
            "--pmc".as_ref(),
            "SQ_WAVES".as_ref(),
            "--elements".as_ref(),
            "64".as_ref(),
            "--".as_ref(),
            "saxpy".as_ref(),
        ],
        &[("KREPLAY_TOOL_LIBRARIES", library.as_os_str())],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("stayed inactive: its kreplay_configure returned NULL")
            && stderr.contains("libinactive.so"),
        "{stderr}"
    );
}
