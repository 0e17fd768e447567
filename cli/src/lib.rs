//! The `kreplay` command line: the user's front door to kernel replay.
//!
//! `kreplay demo` runs a small HSA application on the embedded software HSA runtime under a
//! tool that replays every dispatch in N passes (a different tracing context active on each
//! pass), prints one row per dispatch and verifies that the results equal an unprofiled run.
//! `kreplay bench` measures snapshot and restore beside ceilings measured in the same run, and
//! `kreplay bench-dispatch` the fixed cost kreplay adds per dispatch ([`bench`](mod@bench)).
//! `kreplay run` runs any program with kreplay injected (CUDA or ROCm) and prints a table per
//! kernel ([`run`](mod@run)). `kreplay stress` runs the stress mix under kreplay, with optional fault injection, and checks
//! every byte and completion against a run without it ([`stress`]).
//! The binary is a thin wrapper around [`run()`]; commands are parsed by [`args`] (clap), and the
//! files a command will write are checked before it starts.
//!
//! ```
//! let mut out = Vec::new();
//! let status = kreplay_cli::run(["--help"], &mut out);
//! assert_eq!(status, kreplay_cli::args::EXIT_OK);
//! assert!(String::from_utf8(out).unwrap().contains("demo"));
//!
//! let status = kreplay_cli::run(["demo", "--passes", "0"], &mut Vec::new());
//! assert_eq!(status, kreplay_cli::args::EXIT_USAGE);
//! ```

pub mod args;
pub mod bench;
pub mod demo;
pub mod format;
mod hosted;
pub mod output;
pub mod profile;
pub mod run;
pub mod stress;

use std::ffi::OsString;
use std::io::Write;

use args::{Command, EXIT_FAILURE, EXIT_OK, EXIT_USAGE};

/// Parses `args` (without the program name), runs the command and returns the exit status.
/// Normal output goes to `out`; errors go to stderr, prefixed `kreplay: error:`.
pub fn run<I, S>(args: I, out: &mut dyn Write) -> i32
where
    I: IntoIterator<Item = S>,
    S: Into<OsString>,
{
    let command = match args::parse(args) {
        Ok(command) => command,
        Err(error) => {
            eprintln!("kreplay: error: {error}");
            return EXIT_USAGE;
        }
    };
    let outputs = command.output_paths();
    for (i, path) in outputs.iter().enumerate() {
        if outputs[..i].iter().any(|o| same_file(o, path)) {
            eprintln!(
                "kreplay: error: two outputs name the same file, {}: the second would overwrite \
                 the first; name a file for each",
                path.display()
            );
            return EXIT_USAGE;
        }
    }
    for path in outputs {
        if let Err(error) = check_writable(path) {
            eprintln!("kreplay: error: {error}");
            return EXIT_FAILURE;
        }
    }
    // The commands on the embedded software runtime: its table layout, poll time and faults
    // are settings like the others, refused at once when malformed (the runtime itself would
    // fall back to the default layout with a line on stderr, and read the others only when it
    // starts).
    if matches!(
        command,
        Command::Demo(_)
            | Command::Bench(_)
            | Command::BenchDispatch(_)
            | Command::Stress(_)
            | Command::Profile(_)
    ) && let Err(error) = kreplay_softhsa::check_env()
    {
        eprintln!("kreplay: error: {error}");
        return EXIT_FAILURE;
    }
    match command {
        Command::Print(text) => match out.write_all(text.as_bytes()) {
            Ok(()) => EXIT_OK,
            Err(error) => {
                eprintln!("kreplay: error: cannot write the output: {error}");
                EXIT_FAILURE
            }
        },
        Command::Demo(options) => match demo::run(&options, out) {
            Ok(outcome) if outcome.passed => EXIT_OK,
            Ok(_) => EXIT_FAILURE,
            Err(error) => {
                eprintln!("kreplay: error: {error}");
                EXIT_FAILURE
            }
        },
        Command::DemoCuda(options) => match demo::cuda::run(&options, out) {
            Ok(report) if report.passed() => EXIT_OK,
            Ok(_) => EXIT_FAILURE,
            Err(error) => {
                eprintln!("kreplay: error: {error}");
                EXIT_FAILURE
            }
        },
        Command::BenchCuda(config, csv) => finished(bench::cuda::run(&config, csv.as_deref(), out)),
        Command::Bench(options) => finished(bench::run(&options, out).map(drop)),
        Command::BenchDispatch(options) => finished(bench::dispatch::run(&options, out).map(drop)),
        Command::Profile(options) => match profile::run(&options, out) {
            Ok(outcome) if outcome.passed() => EXIT_OK,
            Ok(_) => EXIT_FAILURE,
            Err(error) => {
                eprintln!("kreplay: error: {error}");
                EXIT_FAILURE
            }
        },
        Command::Run(options) => match run::run(&options, out) {
            Ok(outcome) if outcome.passed() => EXIT_OK,
            Ok(_) => EXIT_FAILURE,
            Err(error) => {
                eprintln!("kreplay: error: {error}");
                EXIT_FAILURE
            }
        },
        Command::Stress(options) => match stress::run(&options, out) {
            Ok(outcome) if outcome.passed => EXIT_OK,
            Ok(_) => EXIT_FAILURE,
            Err(error) => {
                eprintln!("kreplay: error: {error}");
                EXIT_FAILURE
            }
        },
    }
}

/// Whether `a` and `b` name the same file: compared with their folders resolved (`..`,
/// symbolic links), and as files when both exist.
fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    let resolved = |p: &std::path::Path| -> std::path::PathBuf {
        if let Ok(p) = p.canonicalize() {
            return p;
        }
        let folder = match p.parent() {
            Some(f) if !f.as_os_str().is_empty() => f,
            _ => std::path::Path::new("."),
        };
        match (folder.canonicalize(), p.file_name()) {
            (Ok(folder), Some(name)) => folder.join(name),
            _ => std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf()),
        }
    };
    a == b || resolved(a) == resolved(b)
}

/// Checks, before any work starts, that `path` can be written: its folder exists and a file
/// can be created there (an existing file is left as it is; a file created by the check is
/// removed again).
fn check_writable(path: &std::path::Path) -> Result<(), String> {
    let cannot = |why: String| format!("cannot write {}: {why}", path.display());
    if path.is_dir() {
        return Err(cannot("it is a folder".into()));
    }
    let existed = path.exists();
    // A named pipe (or a device) is written in place once the output is ready: opened and
    // closed now, a pipe's reader would see the end of its input before anything was written
    // (and with no reader yet, the open would wait for one). Only the permission is asked.
    if std::fs::metadata(path).is_ok_and(|m| !m.is_file()) {
        use std::os::unix::ffi::OsStrExt;
        let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
            .map_err(|_| cannot("the path holds a NUL byte".into()))?;
        // SAFETY: `c_path` is a NUL-terminated path that lives across the call.
        if unsafe { libc::access(c_path.as_ptr(), libc::W_OK) } != 0 {
            return Err(cannot(std::io::Error::last_os_error().to_string()));
        }
        return Ok(());
    }
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .map_err(|e| cannot(e.to_string()))?;
    if !existed {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// The exit status of a command that either ran or failed with an error (printed to stderr).
fn finished(result: Result<(), String>) -> i32 {
    match result {
        Ok(()) => EXIT_OK,
        Err(error) => {
            eprintln!("kreplay: error: {error}");
            EXIT_FAILURE
        }
    }
}
