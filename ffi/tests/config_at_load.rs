//! Configuration that must refuse the load before any tool code runs, each test in a child
//! process of its own with its environment (docs/abi.md §5: "A malformed value is an error at
//! start-up that names the variable, never a silent default"; a spill folder "where no file can
//! be created is refused at start-up"; kreplay.h, OnLoad: refusals are "checked before any tool
//! is initialized").

use std::ffi::{OsStr, OsString, c_char};
use std::os::unix::ffi::OsStrExt;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use kreplay::abi::{ClientId, Status, ToolConfigureResult};
use kreplay::config::Config;
use kreplay_softhsa::OwnedApiTable;
use kreplay_softhsa::testing::Hsa;

const CHILD_ENV: &str = "KREPLAY_CONFIG_AT_LOAD_TEST";

fn isolated(name: &str, extra_env: &[(&str, OsString)], body: fn()) {
    if std::env::var(CHILD_ENV).as_deref() == Ok(name) {
        body();
        println!("child-done:{name}");
        return;
    }
    let mut child = Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, name)
        .envs(extra_env.iter().map(|(k, v)| (*k, v.as_os_str())))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the child starts");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{name} hung");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().expect("output");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let report = format!(
        "--- stdout ---\n{stdout}\n--- stderr ---\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{name} failed\n{report}");
    assert!(
        stdout.contains(&format!("child-done:{name}")),
        "{name} did not run its body\n{report}"
    );
}

fn not_utf8() -> OsString {
    OsStr::from_bytes(b"4\xff").to_owned()
}

/// KREPLAY_PASSES (the built-in tool's passes) set to bytes that are not UTF-8: a start-up
/// error naming the variable, on libkreplay's side and the CUDA backend's (it was read as
/// unset: the built-in tool silently off).
#[test]
fn kreplay_passes_not_utf8_is_an_error_on_both_backends_not_a_silent_default() {
    isolated(
        "kreplay_passes_not_utf8_is_an_error_on_both_backends_not_a_silent_default",
        &[("KREPLAY_PASSES", not_utf8())],
        || {
            let err = Config::from_env().expect_err("refused");
            assert_eq!(err.variable, "KREPLAY_PASSES");
            let err = kreplay_cuda::config::Config::from_env().expect_err("refused");
            assert!(err.contains("KREPLAY_PASSES"), "{err}");
        },
    );
}

static CONFIGURED: AtomicU32 = AtomicU32::new(0);

unsafe extern "C" fn configure(
    _: u32,
    _: *const c_char,
    _: u32,
    _: *mut ClientId,
) -> *mut ToolConfigureResult {
    CONFIGURED.fetch_add(1, Ordering::SeqCst);
    std::ptr::null_mut()
}

/// KREPLAY_SPILL_DIR naming a folder that does not exist: "one where no file can be created
/// is refused at start-up" (docs/abi.md §5), and OnLoad's refusals are "checked before any
/// tool is initialized" (kreplay.h).
#[test]
fn a_spill_dir_that_does_not_exist_is_refused_before_any_tool_is_configured() {
    isolated(
        "a_spill_dir_that_does_not_exist_is_refused_before_any_tool_is_configured",
        &[(
            "KREPLAY_SPILL_DIR",
            OsString::from("/nonexistent/kreplay-config-at-load-spill/deeper"),
        )],
        || {
            assert_eq!(
                kreplay::api::kreplay_force_configure(Some(configure)),
                Status::SUCCESS
            );
            let mut table = OwnedApiTable::softhsa();
            let source = Hsa::softhsa();
            let _hold = source.init().expect("hsa_init");
            // SAFETY: a complete, writable copy of softhsa's table that outlives the call.
            let loaded = unsafe { kreplay::hsa_tool::on_load(table.as_mut_ptr()) };
            let configured = CONFIGURED.load(Ordering::SeqCst);
            if loaded.is_ok() {
                kreplay::hsa_tool::on_unload();
            }
            assert!(
                loaded.is_err() && configured == 0,
                "KREPLAY_SPILL_DIR=/nonexistent/...: on_load returned {loaded:?} and the tool's \
                 configure ran {configured} time(s); expected a refusal before any tool"
            );
            let why = loaded.unwrap_err();
            assert!(
                why.contains("KREPLAY_SPILL_DIR"),
                "the refusal names the variable: {why}"
            );
        },
    );
}

/// A spill folder where no file can be created (a regular file as the folder).
#[test]
fn a_spill_dir_that_is_a_file_is_refused_at_load() {
    let file = std::env::temp_dir().join("kreplay-config-at-load-spill-is-a-file");
    std::fs::write(&file, b"x").unwrap();
    isolated(
        "a_spill_dir_that_is_a_file_is_refused_at_load",
        &[("KREPLAY_SPILL_DIR", file.into_os_string())],
        || {
            let mut table = OwnedApiTable::softhsa();
            let source = Hsa::softhsa();
            let _hold = source.init().expect("hsa_init");
            // SAFETY: a complete, writable copy of softhsa's table that outlives the call.
            let loaded = unsafe { kreplay::hsa_tool::on_load(table.as_mut_ptr()) };
            if loaded.is_ok() {
                kreplay::hsa_tool::on_unload();
            }
            assert!(loaded.is_err(), "on_load returned {loaded:?}");
        },
    );
}
