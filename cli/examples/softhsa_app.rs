//! An HSA application on the software HSA runtime whose "runtime" honours `HSA_TOOLS_LIB` the
//! way ROCm's does: the variable is a list of libraries separated by spaces (a space, `"` or
//! `\` is taken literally after a `\`, and spaces inside `"..."` do not separate), each is
//! loaded (symbols global, as a tool library's `kreplay_*` calls need) and its `OnLoad` is
//! called with the runtime's API table before the application runs, `OnUnload` at shutdown; a
//! library that does not load is reported and skipped. It stands in for a real ROCm program
//! under `kreplay run --backend hsa` (the tests run it so; see cli/tests/run.rs).
//!
//! With `SOFTHSA_APP_SESSIONS=N` it runs N times in one process, the runtime (and the tools
//! libraries) shut down and started again in between, as a program that initializes ROCm's
//! runtime again does. With `SOFTHSA_APP_EXEC_AGAIN` set it replaces itself with a fresh run of
//! itself after printing (exec: the same process id). With `SOFTHSA_APP_CRASH` set it aborts
//! after printing (a worker that crashes: no runtime
//! shutdown, no exit handlers).
//!
//! The application: three buffers, each updated in place (`x += 1`) by two dispatches, then one
//! `checksum` line per buffer (the sum of its words). A replay that forgot a restore would add
//! one per extra pass and change the checksums.
//!
//! ```sh
//! HSA_TOOLS_LIB=target/debug/libkreplay.so KREPLAY_PASSES=3 target/debug/examples/softhsa_app
//! ```

use std::ffi::{OsStr, OsString, c_char};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;
use std::time::Duration;

use hsa_sys::HsaApiTable;
use kreplay_softhsa::testing::{Dispatch, Hsa};
use kreplay_softhsa::{OwnedApiTable, WorkGroup, register_kernel};

const ELEMENTS: usize = 4096;
const BUFFERS: usize = 3;
const DISPATCHES_PER_BUFFER: usize = 2;

#[derive(Clone, Copy)]
#[repr(C)]
struct AddOneArgs {
    data: *mut u32,
    len: u32,
}

fn add_one(group: &WorkGroup) {
    // SAFETY: the application passes an `AddOneArgs` kernarg block.
    let args: AddOneArgs = unsafe { group.kernargs() };
    for [x, _, _] in group.work_items() {
        if x < args.len {
            // SAFETY: `data` holds `len` u32 in live device memory; each work-item owns one.
            unsafe { *args.data.add(x as usize) += 1 };
        }
    }
}

type OnLoad = unsafe extern "C" fn(*mut HsaApiTable, u64, u64, *const *const c_char) -> bool;
type OnUnload = unsafe extern "C" fn();

fn main() {
    // A program may shut the runtime down and initialize it again (ROCm then loads and
    // unloads its tool libraries each time): SOFTHSA_APP_SESSIONS=N runs the application N
    // times so, in one process.
    let sessions: u32 = std::env::var("SOFTHSA_APP_SESSIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    for _ in 0..sessions {
        if let Err(e) = run() {
            eprintln!("softhsa_app: {e}");
            std::process::exit(1);
        }
    }
}

fn run() -> Result<(), String> {
    // A layout it does not know is an error, as for kreplay's commands: a run meant for one
    // table that went on with another would say nothing of the one asked for.
    let layout = kreplay_softhsa::TableLayout::from_env()?;
    let mut table = OwnedApiTable::softhsa_with(layout);
    let mut tools = Vec::new();
    let names = std::env::var_os("HSA_TOOLS_LIB")
        .map(|v| tool_names(&v))
        .unwrap_or_default();
    for name in names {
        // SAFETY: loading a tools library runs its initializers, as ROCm's runtime does.
        let lib = match unsafe {
            libloading::os::unix::Library::open(
                Some(&name),
                libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL,
            )
        } {
            Ok(lib) => lib,
            Err(e) => {
                // ROCm's runtime goes on without a tool library it cannot load.
                eprintln!(
                    "softhsa_app: tool lib {:?} failed to load: {e}",
                    Path::new(&name)
                );
                continue;
            }
        };
        // SAFETY: the tools-library entry points have these signatures.
        let (on_load, on_unload) = unsafe {
            (
                *lib.get::<OnLoad>(b"OnLoad\0").map_err(|e| e.to_string())?,
                *lib.get::<OnUnload>(b"OnUnload\0")
                    .map_err(|e| e.to_string())?,
            )
        };
        // SAFETY: `table` is a valid table owned for the rest of the program.
        if !unsafe { on_load(table.as_mut_ptr(), 1, 0, std::ptr::null()) } {
            eprintln!("softhsa_app: the tools library declined to load");
        }
        tools.push((lib, on_unload));
    }

    // SAFETY: the table stays alive and valid while `hsa` is used.
    let hsa = unsafe { Hsa::from_table(table.table()) };
    let session = hsa.init().map_err(|e| format!("hsa_init: {e:?}"))?;
    let gpu = hsa.gpu_agents().map_err(|e| format!("{e:?}"))?[0];
    let pool = hsa.coarse_pool(gpu).map_err(|e| format!("{e:?}"))?;
    let kernarg_pool = hsa
        .pool(gpu, kreplay_softhsa::testing::PoolKind::Kernarg)
        .map_err(|e| format!("{e:?}"))?;
    let kernel = register_kernel("softhsa_app_add_one", add_one);
    let queue = hsa.queue_create(gpu, 64).map_err(|e| format!("{e:?}"))?;
    let mut buffers = Vec::new();
    for b in 0..BUFFERS {
        let ptr = hsa
            .allocate(pool, ELEMENTS * 4)
            .map_err(|e| format!("{e:?}"))?
            .cast::<u32>();
        let init: Vec<u32> = (0..ELEMENTS as u32).map(|i| i * 7 + b as u32).collect();
        // SAFETY: softhsa device memory is host memory; the buffer holds ELEMENTS u32.
        unsafe { std::ptr::copy_nonoverlapping(init.as_ptr(), ptr, ELEMENTS) };
        buffers.push(ptr);
    }
    for _ in 0..DISPATCHES_PER_BUFFER {
        for ptr in &buffers {
            let args = hsa
                .allocate(kernarg_pool, std::mem::size_of::<AddOneArgs>())
                .map_err(|e| format!("{e:?}"))?
                .cast::<AddOneArgs>();
            // SAFETY: the kernarg allocation holds one AddOneArgs.
            unsafe {
                args.write(AddOneArgs {
                    data: *ptr,
                    len: ELEMENTS as u32,
                })
            };
            let done = hsa.signal_create(1).map_err(|e| format!("{e:?}"))?;
            // SAFETY: `queue` is live; the packet names a registered kernel with valid
            // kernargs.
            unsafe {
                hsa.dispatch(
                    queue,
                    &Dispatch::linear(kernel, ELEMENTS as u32, 64, args.cast(), done),
                )
            };
            if !hsa.wait_zero(done, Duration::from_secs(30)) {
                return Err("a dispatch did not complete".into());
            }
            hsa.signal_destroy(done).map_err(|e| format!("{e:?}"))?;
        }
    }
    for (b, ptr) in buffers.iter().enumerate() {
        // SAFETY: as above; every dispatch completed.
        let words = unsafe { std::slice::from_raw_parts(*ptr, ELEMENTS) };
        let sum: u64 = words.iter().map(|&w| u64::from(w)).sum();
        println!("checksum buffer {b} sum {sum}");
    }
    if std::env::var_os("SOFTHSA_APP_EXEC_AGAIN").is_some() {
        // A program that replaces itself (exec, same process id) after its work: no runtime
        // shutdown, no exit handlers; the new image runs the application once more.
        use std::io::Write;
        use std::os::unix::process::CommandExt;
        let _ = std::io::stdout().flush();
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let err = std::process::Command::new(exe)
            .env_remove("SOFTHSA_APP_EXEC_AGAIN")
            .exec();
        return Err(format!("exec: {err}"));
    }
    if std::env::var_os("SOFTHSA_APP_CRASH").is_some() {
        // A worker that crashes after its work: no runtime shutdown, no exit handlers.
        use std::io::Write;
        let _ = std::io::stdout().flush();
        std::process::abort();
    }
    drop(session);
    for (_lib, on_unload) in tools.iter().rev() {
        // SAFETY: the runtime's shutdown call of the tools library.
        unsafe { on_unload() };
    }
    Ok(())
}

/// The libraries an `HSA_TOOLS_LIB` value names, split as ROCm's runtime splits it: at spaces
/// outside double quotes; a backslash takes the next byte literally. Paths are bytes.
fn tool_names(value: &OsStr) -> Vec<OsString> {
    let mut names = Vec::new();
    let mut name = Vec::new();
    let mut quoted = false;
    let mut bytes = value.as_bytes().iter().copied();
    while let Some(b) = bytes.next() {
        match b {
            b'\\' => name.extend(bytes.next()),
            b'"' if quoted => {
                quoted = false;
                names.push(std::mem::take(&mut name));
            }
            b'"' => quoted = true,
            b' ' if !quoted => names.push(std::mem::take(&mut name)),
            b => name.push(b),
        }
    }
    names.push(name);
    names
        .into_iter()
        .filter(|n| !n.is_empty())
        .map(OsString::from_vec)
        .collect()
}
