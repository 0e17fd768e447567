//! Helpers shared by the integration tests (also those of kreplay-cli, which include this file:
//! paths are derived from `kreplay::HEADER_PATH`, not from the including crate).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};

/// kreplay's registries are process-wide: tests that reset or lock them run one at a time.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The folder of kreplay.h.
pub fn include_dir() -> PathBuf {
    Path::new(kreplay::HEADER_PATH)
        .parent()
        .expect("the header lies in a folder")
        .to_path_buf()
}

/// The kreplay package's folder (ffi/).
fn ffi_dir() -> PathBuf {
    include_dir()
        .parent()
        .expect("include/ lies in the package folder")
        .to_path_buf()
}

/// A C source of tests/c.
pub fn c_source(name: &str) -> PathBuf {
    ffi_dir().join("tests").join("c").join(name)
}

/// A file under the repository's examples/ folder.
pub fn example_source(relative: &str) -> PathBuf {
    ffi_dir()
        .parent()
        .expect("ffi/ lies in the repository")
        .join("examples")
        .join(relative)
}

/// A scratch folder for this test binary's build products.
pub fn scratch_dir(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("kreplay-ffi-tests")
        .join(test);
    std::fs::create_dir_all(&dir).expect("create scratch folder");
    dir
}

/// Is there a working compiler called `program`? Prints why not when there is none.
pub fn have_compiler(program: &str) -> bool {
    match Command::new(program).arg("--version").output() {
        Ok(output) if output.status.success() => true,
        _ => {
            eprintln!("skipped: no working `{program}` on this machine");
            false
        }
    }
}

/// Runs `program args...`, panicking with its output if it fails.
pub fn run_ok(program: &str, args: &[&std::ffi::OsStr]) -> String {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|err| panic!("cannot run {program}: {err}"));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{program} {:?} failed ({}):\n{stdout}\n{}",
        args,
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// Runs `build`, which writes a build product to the path it is given, so that `output` appears
/// complete or not at all: the product is written under a name of this process's own and then
/// renamed over `output`. A process that loads `output` while another test process (a copy of
/// the same test binary, or a scenario's parent and child) builds it again then never reads a
/// half-written file ("file too short").
pub fn build_atomically(output: &Path, build: impl FnOnce(&Path)) {
    let mut name = output
        .file_name()
        .expect("a build product has a file name")
        .to_os_string();
    name.push(format!(".{}.partial", std::process::id()));
    let partial = output.with_file_name(name);
    build(&partial);
    std::fs::rename(&partial, output)
        .unwrap_or_else(|err| panic!("cannot rename {partial:?} to {output:?}: {err}"));
}

/// Compiles tests/c/tool.c into a shared library at `output`.
pub fn build_tool_library(output: &Path) {
    build_c_library("tool.c", output);
}

/// Compiles tests/c/`source` against kreplay.h (C99, warnings as errors) into a shared library
/// at `output`.
pub fn build_c_library(source: &str, output: &Path) {
    build_c_library_from(&c_source(source), output, "c99", &[]);
}

/// Compiles `source` against kreplay.h as C `standard` (e.g. "c11"), warnings as errors, into a
/// shared library at `output`; `link` is appended to the command line (e.g. `-L dir -lkreplay`).
pub fn build_c_library_from(
    source: &Path,
    output: &Path,
    standard: &str,
    link: &[&std::ffi::OsStr],
) {
    let include = include_dir();
    let standard = format!("-std={standard}");
    build_atomically(output, |output| {
        let mut args: Vec<&std::ffi::OsStr> = vec![
            standard.as_ref(),
            "-Wall".as_ref(),
            "-Wextra".as_ref(),
            "-Werror".as_ref(),
            "-pedantic".as_ref(),
            "-fPIC".as_ref(),
            "-shared".as_ref(),
            "-I".as_ref(),
            include.as_os_str(),
            source.as_os_str(),
            "-o".as_ref(),
            output.as_os_str(),
        ];
        args.extend_from_slice(link);
        run_ok("cc", &args);
    });
}

/// What tests/c/tool.c recorded: (configure, initialize, finalize) calls, (version, priority,
/// client handle) seen, and whether initialize got its data and a finalize function.
pub struct ToolProbe {
    pub calls: [i32; 3],
    pub seen: [u32; 3],
    pub tool_data_ok: bool,
}

/// Reads the probe of a loaded tests/c/tool.c library (the library is already loaded, so this
/// shares its state).
pub fn probe_tool_library(path: &Path) -> ToolProbe {
    type ProbeFn = unsafe extern "C" fn(*mut i32, *mut u32, *mut i32);
    // SAFETY: the library is tests/c/tool.c, whose initializers do nothing.
    let library = unsafe { libloading::Library::new(path) }.expect("open tool library");
    // SAFETY: `tool_probe` has exactly this signature in tests/c/tool.c.
    let probe = unsafe { library.get::<ProbeFn>(b"tool_probe\0") }.expect("tool_probe symbol");
    let mut calls = [0i32; 3];
    let mut seen = [0u32; 3];
    let mut ok = 0i32;
    // SAFETY: the arrays have the lengths tool_probe writes.
    unsafe { probe(calls.as_mut_ptr(), seen.as_mut_ptr(), &mut ok) };
    ToolProbe {
        calls,
        seen,
        tool_data_ok: ok != 0,
    }
}

/// libkreplay.so (the cdylib) as cargo built it beside the running test binary.
pub fn libkreplay() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("deps folder");
    [
        deps.join("libkreplay.so"),
        deps.parent().expect("target folder").join("libkreplay.so"),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .expect("cargo builds libkreplay.so (the cdylib) beside this test binary")
}

/// `OnLoad` as libkreplay.so exports it (kreplay.h): the runtime's table, its version, the
/// count and the names of the tools libraries it failed to load.
pub type OnLoad = unsafe extern "C" fn(
    *mut hsa_sys::HsaApiTable,
    u64,
    u64,
    *const *const std::ffi::c_char,
) -> bool;
/// `OnUnload` as libkreplay.so exports it.
pub type OnUnload = unsafe extern "C" fn();

/// libkreplay.so loaded as a runtime loads a tools library, with its two entry points. They are
/// valid while `library` stays loaded: keep this until after the last call.
pub struct Libkreplay {
    pub library: libloading::os::unix::Library,
    pub on_load: OnLoad,
    pub on_unload: OnUnload,
}

/// Loads this build's libkreplay.so ([`libkreplay`]) with the `dlopen` flags `flags`: as ROCm
/// loads `HSA_TOOLS_LIB`, or `RTLD_NOW | RTLD_GLOBAL` so that the `kreplay_*` references of a
/// C tool it loads resolve to it.
pub fn load_libkreplay(flags: std::ffi::c_int) -> Libkreplay {
    // SAFETY: libkreplay.so's initializers do nothing.
    let library = unsafe { libloading::os::unix::Library::open(Some(libkreplay()), flags) }
        .expect("load libkreplay.so");
    // SAFETY: the entry points kreplay.h declares, with these signatures.
    let (on_load, on_unload) = unsafe {
        (
            *library.get::<OnLoad>(b"OnLoad\0").expect("OnLoad exported"),
            *library
                .get::<OnUnload>(b"OnUnload\0")
                .expect("OnUnload exported"),
        )
    };
    Libkreplay {
        library,
        on_load,
        on_unload,
    }
}

pub mod outcomes_tool;

/// A Rust tool, configured through `kreplay_force_configure(Some(finalizing_tool::configure))`,
/// that keeps its client id and the client finalize function kreplay hands its initialize, so
/// that a test can have it ask to be finalized.
pub mod finalizing_tool {
    use std::ffi::{c_char, c_int, c_void};
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU32, Ordering};

    use kreplay::abi::{ClientFinalizeFn, ClientId, ToolConfigureResult};

    /// The tool's client handle.
    static HANDLE: AtomicU32 = AtomicU32::new(0);
    /// The client finalize function kreplay handed the tool.
    static FINALIZE: OnceLock<unsafe extern "C" fn(ClientId)> = OnceLock::new();

    /// The tool's configure function.
    pub unsafe extern "C" fn configure(
        _: u32,
        _: *const c_char,
        _: u32,
        client: *mut ClientId,
    ) -> *mut ToolConfigureResult {
        static mut RESULT: ToolConfigureResult = ToolConfigureResult {
            size: size_of::<ToolConfigureResult>(),
            initialize: Some(initialize),
            finalize: None,
            tool_data: std::ptr::null_mut(),
        };
        // SAFETY: kreplay passes a valid client id.
        HANDLE.store(unsafe { (*client).handle }, Ordering::SeqCst);
        &raw mut RESULT
    }

    unsafe extern "C" fn initialize(finalize: ClientFinalizeFn, _: *mut c_void) -> c_int {
        if let Some(finalize) = finalize {
            let _ = FINALIZE.set(finalize);
        }
        0
    }

    /// The tool's client handle (once configured).
    pub fn handle() -> u32 {
        HANDLE.load(Ordering::SeqCst)
    }

    /// The client finalize function kreplay handed the tool (once initialized).
    pub fn finalize_fn() -> unsafe extern "C" fn(ClientId) {
        *FINALIZE
            .get()
            .expect("the tool's initialize received a client finalize function")
    }

    /// The tool asks to be finalized, with its own client id.
    pub fn ask_for_finalize() {
        let client = ClientId {
            name: std::ptr::null(),
            handle: handle(),
        };
        // SAFETY: kreplay's client finalize function, with the tool's own client id.
        unsafe { finalize_fn()(client) };
    }
}

/// Forking inside a test process: `fork` and `_exit` for the child's side, and the child's end
/// waited for with a limit.
pub mod forked {
    use std::ffi::c_int;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    unsafe extern "C" {
        pub fn fork() -> c_int;
        pub fn _exit(code: c_int) -> !;
        fn waitpid(pid: c_int, status: *mut c_int, options: c_int) -> c_int;
        fn kill(pid: c_int, signal: c_int) -> c_int;
    }

    const WNOHANG: c_int = 1;
    const SIGKILL: c_int = 9;

    /// Waits for child `pid` at most `limit` (killing it then); its exit code, or `None`.
    pub fn wait_child(pid: c_int, limit: Duration) -> Option<c_int> {
        let deadline = Instant::now() + limit;
        let mut status: c_int = 0;
        loop {
            // SAFETY: `pid` is our child; `status` is writable.
            if unsafe { waitpid(pid, &mut status, WNOHANG) } == pid {
                return ((status & 0x7f) == 0).then_some((status >> 8) & 0xff);
            }
            if Instant::now() >= deadline {
                // SAFETY: our child, reaped right after.
                unsafe {
                    kill(pid, SIGKILL);
                    waitpid(pid, &mut status, 0);
                }
                return None;
            }
            std::thread::yield_now();
        }
    }

    /// Forks `rounds` times while another thread of the process runs `churn` over and over
    /// (each fork waits until that thread is at it: two more runs since the last fork). Each
    /// child runs `child` and leaves with `_exit`: 0 when it returned true, 1 when false, 2 when
    /// it panicked; it is waited for at most 10 s. Describes the child that did not end with 0
    /// (the forks stop at the first), or the other thread stalling: none when all went well.
    pub fn fork_while(
        rounds: usize,
        churn: impl Fn() + Sync,
        child: impl Fn() -> bool,
    ) -> Vec<String> {
        let stop = AtomicBool::new(false);
        let churned = AtomicU64::new(0);
        let mut failures = Vec::new();
        std::thread::scope(|scope| {
            scope.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    churn();
                    churned.fetch_add(1, Ordering::Relaxed);
                }
            });
            for round in 0..rounds {
                let before = churned.load(Ordering::Relaxed);
                let deadline = Instant::now() + Duration::from_secs(10);
                while churned.load(Ordering::Relaxed) < before + 2 {
                    if Instant::now() >= deadline {
                        failures.push(format!("fork {round}: the other thread stalled"));
                        break;
                    }
                    std::thread::yield_now();
                }
                if !failures.is_empty() {
                    break;
                }
                // SAFETY: the child runs `child`, which only calls kreplay, and leaves with _exit.
                let pid = unsafe { fork() };
                if pid == 0 {
                    let code = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(&child))
                    {
                        Ok(true) => 0,
                        Ok(false) => 1,
                        Err(_) => 2,
                    };
                    // SAFETY: leaves the child at once.
                    unsafe { _exit(code) };
                }
                assert!(pid > 0, "fork failed");
                match wait_child(pid, Duration::from_secs(10)) {
                    Some(0) => {}
                    other => {
                        failures.push(format!(
                            "fork {round}: the child ended with {other:?} (None: hung)"
                        ));
                        break;
                    }
                }
            }
            stop.store(true, Ordering::Relaxed);
        });
        failures
    }
}

/// Room kept beyond a test's own spill files, for the other writers on the same file system
/// (other tests, builds) between the check and the spill.
const SPILL_SLACK: u64 = 64 << 20;

/// Whether spill files of `bytes` bytes in all fit in `dir` (the spill folder the test uses),
/// printing why the file tier's part of the test is skipped when they do not: kreplay refuses a
/// spill file that would leave its file system short (`kreplay_snapshot::spill_room`), so on
/// a machine with little disk free a test of the file tier would fail for the machine, not the
/// code.
pub fn spill_room(dir: &Path, bytes: u64) -> bool {
    let short = kreplay_snapshot::spill_room(dir).filter(|&room| room < bytes + SPILL_SLACK);
    if let Some(room) = short {
        eprintln!(
            "skipped: {} leaves {room} bytes for spill files: too little for {bytes}",
            dir.display()
        );
    }
    short.is_none()
}
