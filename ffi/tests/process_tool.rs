//! Discovery of `kreplay_configure` in the process's global scope (a tool preloaded or linked
//! into the application). Its own test binary: once a tool is global, every later search of the
//! process would find it.

mod common;

use kreplay::abi::VERSION;
use kreplay::lifecycle::{self, ToolOrigin, ToolSearch, ToolState};
use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};

#[test]
fn a_tool_in_the_global_scope_is_found_once_even_when_also_listed() {
    if !common::have_compiler("cc") {
        return;
    }
    let _serial = common::serial();
    kreplay::reset_for_tests();
    let tool = common::scratch_dir("process_tool").join("libglobal_tool.so");
    common::build_tool_library(&tool);

    // Nothing global yet: searching the process finds no tool.
    let report = lifecycle::initialize_tools_with(&ToolSearch {
        search_process: true,
        libraries: Vec::new(),
    })
    .unwrap();
    assert!(report.tools.is_empty());
    kreplay::reset_for_tests();

    // What LD_PRELOAD or linking the tool into the application does.
    // SAFETY: tests/c/tool.c has no initializers with side effects.
    let _global = unsafe { Library::open(Some(&tool), RTLD_NOW | RTLD_GLOBAL) }.unwrap();
    let report = lifecycle::initialize_tools_with(&ToolSearch {
        search_process: true,
        libraries: vec![tool.clone()],
    })
    .unwrap();
    assert!(report.load_errors.is_empty());
    assert_eq!(report.tools.len(), 1, "{:?}", report.tools);
    assert_eq!(report.tools[0].origin, ToolOrigin::Process);
    assert_eq!(report.tools[0].state, ToolState::Active);
    assert_eq!(report.tools[0].name.as_deref(), Some("c-tool"));

    let probe = common::probe_tool_library(&tool);
    assert_eq!(probe.calls, [1, 1, 0]);
    assert_eq!(probe.seen, [VERSION, 0, 1]);
    assert_eq!(lifecycle::finalize_tools(), 1);
    assert_eq!(common::probe_tool_library(&tool).calls, [1, 1, 1]);
}
