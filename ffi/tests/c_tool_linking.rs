//! C tools: how a tool is linked. c-tools.md §1 offers libkreplay.a "for static
//! linking"; a tool linked with it carries its own copy of kreplay. Under ROCm (HSA_TOOLS_LIB
//! opened without RTLD_GLOBAL) its kreplay_* calls then go to that private copy: the kreplay
//! that runs the replay never sees its contexts. `kreplay demo` refuses such a tool ("its
//! kreplay_* calls reached another copy of kreplay"); the HSA path must not hide it either.

mod common;
#[path = "c_probe_tools/harness.rs"]
mod harness;

use std::path::PathBuf;
use std::time::Duration;

use harness::*;

/// replay_owner.c linked statically with this build's libkreplay.a.
fn static_tool(test: &str) -> PathBuf {
    let dir = common::scratch_dir(test);
    let out = dir.join("libstatic_owner.so");
    let archive = common::libkreplay().with_file_name("libkreplay.a");
    let archive = if archive.is_file() {
        archive
    } else {
        common::libkreplay()
            .parent()
            .unwrap()
            .join("deps")
            .join("libkreplay.a")
    };
    assert!(
        archive.is_file(),
        "cargo builds libkreplay.a beside libkreplay.so"
    );
    let src =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c_probe_tools/replay_owner.c");
    let include = common::include_dir();
    let args: Vec<&std::ffi::OsStr> = vec![
        "-std=c11".as_ref(),
        "-fPIC".as_ref(),
        "-shared".as_ref(),
        "-I".as_ref(),
        include.as_os_str(),
        src.as_os_str(),
        archive.as_os_str(),
        "-Wl,--gc-sections".as_ref(),
        "-lpthread".as_ref(),
        "-ldl".as_ref(),
        "-lm".as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
    ];
    common::run_ok("cc", &args);
    out
}

#[test]
fn a_tool_linked_with_its_own_copy_of_kreplay_is_reported_not_silently_ignored_under_rocm_loading()
{
    let name = "a_tool_linked_with_its_own_copy_of_kreplay_is_reported_not_silently_ignored_under_rocm_loading";
    if in_child(name) {
        return standard_child(1, 2);
    }
    let tool = static_tool(name);
    let (problems, run) = run_tools(
        name,
        &[tool],
        &[("PROBE_LOAD_LOCAL", "1")],
        Duration::from_secs(60),
    );
    // The tool reports that it replayed nothing; that is acceptable only if kreplay said why.
    let replayed_nothing = problems.iter().any(|p| p.contains("dispatch(es) replayed"));
    let said_so = run.stderr.contains("kreplay:");
    assert!(
        !replayed_nothing || said_so,
        "the tool's kreplay_* calls went to its own copy of kreplay: nothing was replayed and \
         kreplay printed nothing about it\nproblems: {problems:#?}\n{}",
        run.report()
    );
}
