//! `kreplay run`: any program, with kreplay injected.
//!
//! The program runs with kreplay's library (`libkreplay.so`) named by `CUDA_INJECTION64_PATH`
//! (CUDA) or `HSA_TOOLS_LIB` (ROCm), and either the built-in tool (`KREPLAY_PASSES=N`: every
//! kernel launch replayed N times) or the user's tool (`KREPLAY_TOOL_LIBRARIES`). Every process
//! of the program that loads the library writes what it saw, per kernel, into a fresh folder
//! `KREPLAY_RECORD_DIR` names ([`kreplay::run_record`]) when it exits; `kreplay run` adds the
//! records up, prints a table and writes CSV or JSON. `--check` runs the program a second time without kreplay and
//! compares the two standard outputs.
//!
//! ```
//! use kreplay_cli::run::{Backend, detect_backend};
//! // With libcuda loadable, auto picks CUDA; with neither runtime, it says what it tried.
//! assert_eq!(detect_backend(|lib| lib.starts_with("libcuda")), Ok(Backend::Cuda));
//! let err = detect_backend(|_| false).unwrap_err();
//! assert!(err.contains("libcuda.so.1") && err.contains("libhsa-runtime64.so.1"));
//! ```

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

use kreplay::run_record::{ENV_RECORD_DIR, KernelRecord, RunRecord};
use serde::Serialize;

use crate::format::{Align, Table, format_bytes};

mod process;

/// Passes of the built-in tool when `--passes` is not given.
pub const DEFAULT_PASSES: u64 = 4;

/// The runtime the program is run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// CUDA: `CUDA_INJECTION64_PATH`.
    Cuda,
    /// ROCm: `HSA_TOOLS_LIB`.
    Hsa,
}

impl Backend {
    /// The variable that makes the runtime load kreplay's library.
    pub fn injection_variable(self) -> &'static str {
        match self {
            Backend::Cuda => "CUDA_INJECTION64_PATH",
            Backend::Hsa => "HSA_TOOLS_LIB",
        }
    }

    /// `cuda` or `hsa`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Cuda => "cuda",
            Backend::Hsa => "hsa",
        }
    }
}

/// What a replay snapshots (`KREPLAY_SNAPSHOT_SCOPE`, README "Configuration").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The launch's device's every tracked allocation, plus what the launch reaches.
    Agent,
    /// Only what the launch reaches: its arguments' allocations, its module's variables.
    Referenced,
}

impl Scope {
    /// The value of `KREPLAY_SNAPSHOT_SCOPE`.
    pub fn name(self) -> &'static str {
        match self {
            Scope::Agent => "agent",
            Scope::Referenced => "referenced",
        }
    }
}

/// Options of `kreplay run`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunOptions {
    /// Passes of the built-in tool (ignored with `tool`).
    pub passes: u64,
    /// The user's tool library.
    pub tool: Option<PathBuf>,
    /// `None`: detect.
    pub backend: Option<Backend>,
    /// Run again without kreplay and compare standard output.
    pub check: bool,
    /// Where to write the table (.csv or .json).
    pub output: Option<PathBuf>,
    /// kreplay's library; `None`: `KREPLAY_LIBRARY`, else beside the executable.
    pub library: Option<PathBuf>,
    /// What a replay snapshots (`KREPLAY_SNAPSHOT_SCOPE`); `None`: the environment decides.
    pub scope: Option<Scope>,
    /// The program and its arguments.
    pub program: Vec<OsString>,
}

/// What `kreplay run` found.
#[derive(Clone, Debug, PartialEq)]
pub struct RunOutcome {
    /// The program's exit status under kreplay.
    pub status: ExitStatus,
    /// What the injected library recorded.
    pub record: RunRecord,
    /// `--check`: `Ok` when both runs printed the same and ended alike, else the difference.
    pub check: Option<Result<(), String>>,
    /// Processes the program started were still running when it exited (under kreplay): the
    /// table misses what they run.
    pub left_running: bool,
}

impl RunOutcome {
    /// Whether the command succeeded: the program did and left no process running, every
    /// process that loaded kreplay wrote its record (`record.incomplete`) and had it loaded
    /// for every start of its runtime (`record.sessions_unprofiled`), the tools (`--tool`'s and
    /// those of the environment's `KREPLAY_TOOL_LIBRARIES`) loaded and initialized
    /// (`record.tool_problems`), no replay failed (a pass that could not run, a restore that
    /// lost application data: `failed`), and `--check` found no difference.
    pub fn passed(&self) -> bool {
        self.status.success()
            && self.record.tool_problems.is_empty()
            && self.record.kernels.iter().all(|k| k.failed == 0)
            && self.record.incomplete == 0
            && self.record.sessions_unprofiled == 0
            && !self.left_running
            && self.check.as_ref().is_none_or(Result::is_ok)
    }
}

/// The runtime libraries auto-detection tries, in order.
pub const PROBES: [(&str, Backend); 2] = [
    ("libcuda.so.1", Backend::Cuda),
    ("libhsa-runtime64.so.1", Backend::Hsa),
];

/// Picks the backend whose runtime library `loads` (CUDA first).
pub fn detect_backend(loads: impl Fn(&str) -> bool) -> Result<Backend, String> {
    PROBES
        .iter()
        .find(|(lib, _)| loads(lib))
        .map(|&(_, b)| b)
        .ok_or_else(|| {
            format!(
                "no GPU runtime found: neither {} (CUDA) nor {} (ROCm) could be loaded; install \
                 one, or name the backend with --backend cuda|hsa",
                PROBES[0].0, PROBES[1].0
            )
        })
}

/// Whether `name` can be loaded with the dynamic loader.
fn library_loads(name: &str) -> bool {
    // SAFETY: loading a GPU runtime library runs its initializers, which have no preconditions
    // on this process; it is unloaded again at once.
    unsafe { libloading::Library::new(name) }.is_ok()
}

/// kreplay's library: `explicit`, else `KREPLAY_LIBRARY`, else beside the executable (or in
/// `../lib` from it).
pub fn find_library(explicit: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(path) = explicit {
        return existing_file(path, "--library");
    }
    if let Some(path) = std::env::var_os("KREPLAY_LIBRARY") {
        return existing_file(Path::new(&path), "KREPLAY_LIBRARY");
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find kreplay's folder: {e}"))?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    let candidates = [
        dir.join("libkreplay.so"),
        dir.join("../lib/libkreplay.so"),
        dir.join("../libkreplay.so"),
    ];
    candidates
        .iter()
        .find(|p| p.is_file())
        .map(|p| p.canonicalize().unwrap_or_else(|_| p.clone()))
        .ok_or_else(|| {
            format!(
                "cannot find libkreplay.so (looked beside {} and in ../lib); build it with \
                 `cargo build --release -p kreplay` and name it with --library or KREPLAY_LIBRARY",
                exe.display()
            )
        })
}

/// `path`, an existing file, as an absolute path; else what it is instead (nothing, a folder).
fn existing_file(path: &Path, from: &str) -> Result<PathBuf, String> {
    match crate::format::not_a_library_file(path) {
        None => Ok(path
            .canonicalize()
            .or_else(|_| std::path::absolute(path))
            .unwrap_or_else(|_| path.to_path_buf())),
        Some(why) if why == "no such file" => {
            Err(format!("{from}: no such file: {}", path.display()))
        }
        Some(why) => Err(format!("{from}: {} {why}", path.display())),
    }
}

/// The tool's path as it can be given in `KREPLAY_TOOL_LIBRARIES`, a colon-separated list.
fn tool_path(path: PathBuf) -> Result<PathBuf, String> {
    use std::os::unix::ffi::OsStrExt;
    if path.as_os_str().as_bytes().contains(&b':') {
        return Err(format!(
            "--tool: {} has a ':' in its path, which KREPLAY_TOOL_LIBRARIES (a colon-separated \
             list) cannot hold; link or copy the tool to a path without one",
            path.display()
        ));
    }
    Ok(path)
}

/// A fresh, empty record folder in the temporary folder, as an absolute path (`TMPDIR` may be
/// relative, and the program may change folder before it loads kreplay).
fn record_dir() -> Result<PathBuf, String> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let temp = std::env::temp_dir();
    let temp = std::path::absolute(&temp).unwrap_or(temp);
    let dir = temp.join(format!("kreplay-run-{}-{nanos}", std::process::id()));
    std::fs::create_dir(&dir)
        .map_err(|e| format!("cannot create the record folder {}: {e}", dir.display()))?;
    Ok(dir)
}

/// The variables kreplay sets for the profiled run (and removes for the plain one; what the
/// user had in the environment is composed into them, see [`Inherited`]), and
/// `KREPLAY_CUDA_PASSES`, the older name of `KREPLAY_PASSES`, which the library reads when that
/// is unset: left in the environment it would turn the built-in tool on under `--tool`.
const OUR_VARIABLES: [&str; 6] = [
    "CUDA_INJECTION64_PATH",
    "HSA_TOOLS_LIB",
    kreplay::config::ENV_PASSES,
    kreplay::config::ENV_CUDA_PASSES,
    "KREPLAY_TOOL_LIBRARIES",
    ENV_RECORD_DIR,
];

/// Why the program named by a path could not be executed (`EACCES`): a folder, or a file with no
/// execute permission, said so; anything else (a folder on the way that may not be searched, a
/// file system mounted noexec) as the system said it.
fn why_not_executable(options: &RunOptions, error: &std::io::Error) -> String {
    use std::os::unix::fs::PermissionsExt;
    let path = options.program.first().map(Path::new);
    // A bare name is looked up in PATH: which file was refused is not known here.
    let named = path.filter(|p| p.as_os_str().as_encoded_bytes().contains(&b'/'));
    match named.and_then(|p| std::fs::metadata(p).ok()) {
        Some(meta) if meta.is_dir() => "it is a folder, not a program".to_owned(),
        Some(meta) if meta.permissions().mode() & 0o111 == 0 => {
            "it is not executable (no execute permission)".to_owned()
        }
        _ => error.to_string(),
    }
}

fn program_name(options: &RunOptions) -> String {
    options
        .program
        .first()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The variables the profiled run gets on top of the environment (kreplay's own are removed
/// from it first, see [`OUR_VARIABLES`]).
fn injected_variables(
    options: &RunOptions,
    backend: Backend,
    library: &Path,
    record: &Path,
    inherited: &Inherited,
) -> Vec<(&'static str, OsString)> {
    let mut injection = injection_value(backend, library);
    if let (Backend::Hsa, Some(theirs)) = (backend, &inherited.hsa_tools_lib) {
        injection.push(" ");
        injection.push(theirs);
    }
    let mut vars = vec![
        (backend.injection_variable(), injection),
        (ENV_RECORD_DIR, record.as_os_str().to_owned()),
    ];
    // The other runtime's variable, as the user set it.
    match backend {
        Backend::Cuda => vars.extend(
            inherited
                .hsa_tools_lib
                .clone()
                .map(|theirs| ("HSA_TOOLS_LIB", theirs)),
        ),
        Backend::Hsa => vars.extend(
            inherited
                .cuda_injection
                .clone()
                .map(|theirs| ("CUDA_INJECTION64_PATH", theirs)),
        ),
    }
    let mut tools = inherited.tool_libraries.clone();
    if let Some(tool) = &options.tool {
        let listed = tools
            .as_ref()
            .is_some_and(|t| std::env::split_paths(t).any(|p| p == *tool));
        if !listed {
            let mut joined = tools.map_or_else(OsString::new, |mut t| {
                t.push(":");
                t
            });
            joined.push(tool);
            tools = Some(joined);
        }
    } else {
        vars.push(("KREPLAY_PASSES", options.passes.to_string().into()));
    }
    if let Some(tools) = tools {
        vars.push(("KREPLAY_TOOL_LIBRARIES", tools));
    }
    if let Some(scope) = options.scope {
        vars.push(("KREPLAY_SNAPSHOT_SCOPE", scope.name().into()));
    }
    vars
}

/// What the user's environment already asks the runtime and kreplay to load, kept for the
/// profiled run: a profiler user running another tool alongside expects it to still be there.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Inherited {
    /// The environment's `HSA_TOOLS_LIB` (ROCm loads every library of the list), less any entry
    /// that is kreplay's library: loaded after kreplay's, and by the run without kreplay.
    pub hsa_tools_lib: Option<OsString>,
    /// The environment's `KREPLAY_TOOL_LIBRARIES`: kept beside the built-in tool, and before
    /// `--tool`'s library.
    pub tool_libraries: Option<OsString>,
    /// The environment's `CUDA_INJECTION64_PATH` on ROCm, unless it is kreplay's library: the
    /// other runtime's, passed on unchanged.
    pub cuda_injection: Option<OsString>,
}

impl Inherited {
    /// Reads the user's settings with `lookup` (the environment) for a run on `backend` with
    /// kreplay's `library`. A `CUDA_INJECTION64_PATH` naming another library is an error on
    /// CUDA: the driver loads exactly one injection library, and kreplay's would replace it.
    pub fn read(
        backend: Backend,
        library: &Path,
        lookup: impl Fn(&str) -> Option<OsString>,
    ) -> Result<Inherited, String> {
        let set = |name: &str| lookup(name).filter(|v| !v.is_empty());
        let is_kreplay = |entry: &Path| {
            entry == library
                || entry
                    .canonicalize()
                    .is_ok_and(|e| library.canonicalize().is_ok_and(|l| l == e))
        };
        if backend == Backend::Cuda
            && let Some(theirs) = set("CUDA_INJECTION64_PATH")
            && !is_kreplay(Path::new(&theirs))
        {
            return Err(format!(
                "CUDA_INJECTION64_PATH={} is set, and CUDA loads exactly one injection library: \
                 kreplay run needs it for {}. Unset it to profile with kreplay; a tool written \
                 for kreplay's C API is loaded with --tool or KREPLAY_TOOL_LIBRARIES instead",
                theirs.to_string_lossy(),
                library.display()
            ));
        }
        let hsa_tools_lib = set("HSA_TOOLS_LIB").and_then(|theirs| {
            use std::os::unix::ffi::{OsStrExt, OsStringExt};
            let entries = hsa_tools_entries(theirs.as_bytes());
            if !entries
                .iter()
                .any(|e| is_kreplay(Path::new(std::ffi::OsStr::from_bytes(e))))
            {
                return Some(theirs);
            }
            let rest: Vec<OsString> = entries
                .into_iter()
                .map(OsString::from_vec)
                .filter(|e| !is_kreplay(Path::new(e)))
                .map(|e| injection_value(Backend::Hsa, Path::new(&e)))
                .collect();
            (!rest.is_empty()).then(|| rest.join(std::ffi::OsStr::new(" ")))
        });
        let cuda_injection = set("CUDA_INJECTION64_PATH")
            .filter(|theirs| backend == Backend::Hsa && !is_kreplay(Path::new(theirs)));
        Ok(Inherited {
            hsa_tools_lib,
            tool_libraries: set("KREPLAY_TOOL_LIBRARIES"),
            cuda_injection,
        })
    }

    /// What the user is told about the settings kept.
    fn notes(&self, options: &RunOptions, backend: Backend) -> Vec<String> {
        let mut notes = Vec::new();
        if let (Backend::Hsa, Some(theirs)) = (backend, &self.hsa_tools_lib) {
            notes.push(format!(
                "HSA_TOOLS_LIB from the environment is kept: {} is loaded after kreplay's \
                 library",
                theirs.to_string_lossy()
            ));
        }
        if let Some(theirs) = &self.tool_libraries {
            notes.push(format!(
                "KREPLAY_TOOL_LIBRARIES from the environment is kept: {} {}",
                theirs.to_string_lossy(),
                if options.tool.is_some() {
                    "is loaded, then --tool's library"
                } else {
                    "is loaded beside the built-in tool (a tool there that takes the replay \
                     service decides the passes instead)"
                }
            ));
        }
        notes
    }
}

/// The libraries of an `HSA_TOOLS_LIB` value as ROCm's runtime splits it: at spaces, with `"`
/// quoting and `\` escaping the next byte.
fn hsa_tools_entries(value: &[u8]) -> Vec<Vec<u8>> {
    let mut entries = Vec::new();
    let mut entry = Vec::new();
    let (mut quoted, mut escaped, mut started) = (false, false, false);
    for &b in value {
        if escaped {
            entry.push(b);
            escaped = false;
        } else if b == b'\\' {
            escaped = true;
            started = true;
        } else if b == b'"' {
            quoted = !quoted;
            started = true;
        } else if b == b' ' && !quoted {
            if started {
                entries.push(std::mem::take(&mut entry));
            }
            started = false;
        } else {
            entry.push(b);
            started = true;
        }
    }
    if started {
        entries.push(entry);
    }
    entries
}

/// The value of the injection variable that names `library`. ROCm's runtime reads
/// `HSA_TOOLS_LIB` as a list of libraries separated by spaces, with `"` quoting and `\`
/// escaping, so there a space, `"` or `\` of the path is escaped; CUDA takes one path as it
/// is.
fn injection_value(backend: Backend, library: &Path) -> OsString {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    match backend {
        Backend::Cuda => library.as_os_str().to_owned(),
        Backend::Hsa => {
            let mut escaped = Vec::new();
            for &b in library.as_os_str().as_bytes() {
                if matches!(b, b' ' | b'"' | b'\\') {
                    escaped.push(b'\\');
                }
                escaped.push(b);
            }
            OsString::from_vec(escaped)
        }
    }
}

/// Checks the `KREPLAY_*` settings the profiled run will see (the environment's, with kreplay
/// run's own in place of it) as the injected library will read them, so that a bad one stops
/// the command before the program runs: the library would refuse to load, and the whole
/// program would run without kreplay for a record that never comes.
fn check_settings(
    options: &RunOptions,
    backend: Backend,
    library: &Path,
    inherited: &Inherited,
) -> Result<(), String> {
    // The record folder is not a setting the configuration reads.
    let injected = injected_variables(options, backend, library, Path::new(""), inherited);
    let lookup = |name: &str| -> Option<String> {
        if let Some((_, value)) = injected.iter().find(|(n, _)| *n == name) {
            return Some(value.to_string_lossy().into_owned());
        }
        if OUR_VARIABLES.contains(&name) {
            return None;
        }
        std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
    };
    let not_loaded = |why: String| format!("{why} (kreplay would not load into the program)");
    let config =
        kreplay::config::Config::from_lookup(lookup).map_err(|e| not_loaded(e.to_string()))?;
    config.check_snapshot_config().map_err(not_loaded)?;
    if backend == Backend::Cuda {
        kreplay_cuda::config::Config::from_lookup(lookup).map_err(not_loaded)?;
    }
    // The built-in tool's pass count above the cap: every launch would be declined
    // (invalid_pass_count) and run once, with a warning each.
    if options.tool.is_none() && options.passes > config.max_passes {
        return Err(format!(
            "--passes {} is above the cap on passes per launch, KREPLAY_MAX_PASSES={}: every \
             launch would run once; lower --passes or raise the cap",
            options.passes, config.max_passes
        ));
    }
    Ok(())
}

/// Runs `options.program` once; `inject` adds kreplay's variables. `input` is its standard
/// input; its standard output is captured when `capture`, else inherited.
fn run_program(
    options: &RunOptions,
    inherited: &Inherited,
    inject: Option<(Backend, &Path, &Path)>,
    input: process::Input<'_>,
    capture: bool,
) -> Result<process::Ran, String> {
    let (program, args) = options
        .program
        .split_first()
        .ok_or("no program given (after --)")?;
    let mut command = Command::new(program);
    command.args(args).stderr(Stdio::inherit());
    for var in OUR_VARIABLES {
        command.env_remove(var);
    }
    match inject {
        Some((backend, library, record)) => {
            command.envs(injected_variables(
                options, backend, library, record, inherited,
            ));
        }
        // The user's other tools load without kreplay too.
        None => {
            if let Some(theirs) = &inherited.hsa_tools_lib {
                command.env("HSA_TOOLS_LIB", theirs);
            }
            if let Some(theirs) = &inherited.cuda_injection {
                command.env("CUDA_INJECTION64_PATH", theirs);
            }
        }
    }
    let name = program_name(options);
    let ran = process::run(&mut command, input, capture).map_err(|e| match e.kind() {
        std::io::ErrorKind::PermissionDenied => {
            format!("cannot start {name}: {}", why_not_executable(options, &e))
        }
        std::io::ErrorKind::NotFound => format!("cannot start {name}: {e}"),
        _ => format!("cannot start {name}, or lost it while it ran: {e}"),
    })?;
    if ran.output_held {
        eprintln!(
            "kreplay: a process {name} started still holds its standard output; what it wrote \
             until {name} exited is what counts"
        );
    }
    if ran.left_running {
        eprintln!(
            "kreplay: processes {name} started are still running after it exited: their \
             kernels are not in the table (and their records are lost)"
        );
    }
    Ok(ran)
}

/// How `--check` gives both runs the same standard input.
enum CheckInput {
    /// No `--check`, or a terminal: inherited by both runs.
    Inherit,
    /// A pipe or the like: the first run's input is passed on and kept, so that the second run
    /// gets the same bytes (it would otherwise find them taken). It is read only as the program
    /// reads it: an input that never ends does not stop a program that reads none of it from
    /// running.
    Tee,
    /// A file: inherited by the first run, and read again by the second from where the first
    /// started, through a description of its own (the file opened again), so that an input
    /// of any size costs no memory.
    File(std::fs::File, u64),
}

/// How `--check` (when `check`) gives both runs kreplay's standard input.
fn check_input(check: bool) -> CheckInput {
    use std::io::IsTerminal;
    use std::os::fd::AsFd;
    let stdin = std::io::stdin();
    if !check || stdin.is_terminal() {
        return CheckInput::Inherit;
    }
    let is_file = stdin
        .as_fd()
        .try_clone_to_owned()
        .map(std::fs::File::from)
        .and_then(|f| f.metadata())
        .is_ok_and(|meta| meta.is_file());
    if !is_file {
        // Opened again, a named pipe would wait for a writer, perhaps one long gone.
        return CheckInput::Tee;
    }
    // SAFETY: lseek on standard input with no memory arguments; SEEK_CUR with 0 moves nothing.
    let offset = unsafe { libc::lseek(0, 0, libc::SEEK_CUR) };
    match std::fs::File::open("/proc/self/fd/0") {
        Ok(again) if offset >= 0 => CheckInput::File(again, offset as u64),
        _ => CheckInput::Tee,
    }
}

/// Reads and adds up the records the processes of the program wrote into `dir`.
pub fn read_record(dir: &Path, program: &str, backend: Backend) -> Result<RunRecord, String> {
    kreplay::run_record::merge(kreplay::run_record::read_dir(dir)?).ok_or_else(|| {
        format!(
            "kreplay recorded nothing: its library was not loaded into {program} (with {}: the \
             program must initialize the runtime; see the program's standard error for a 'not \
             installed' reason), or it could not write its record (a warning there says why)",
            backend.injection_variable()
        )
    })
}

/// The per-kernel table.
pub fn table(record: &RunRecord) -> String {
    let mut table = Table::new(&[
        ("kernel", Align::Left),
        ("launches", Align::Right),
        ("passes", Align::Right),
        ("snapshot", Align::Right),
        ("tier", Align::Left),
        ("strategy", Align::Left),
        ("restore", Align::Right),
        ("declines", Align::Left),
    ]);
    for k in &record.kernels {
        table.row(vec![
            k.kernel.clone(),
            k.launches.to_string(),
            k.passes.to_string(),
            format_bytes(k.snapshot_bytes),
            dash(&k.tier),
            dash(&k.strategy),
            format!("{:.3} ms", k.restore_ms),
            declines(k),
        ]);
    }
    let mut text = table.render();
    let launches: u64 = record.kernels.iter().map(|k| k.launches).sum();
    let replayed: u64 = record.kernels.iter().map(|k| k.replayed).sum();
    let failed: u64 = record.kernels.iter().map(|k| k.failed).sum();
    let declined: u64 = record
        .kernels
        .iter()
        .map(|k| k.declines.values().sum::<u64>())
        .sum();
    let tool = match record.tool.as_str() {
        "built-in" if record.passes_requested > 1 => {
            format!("built-in tool, {} passes", record.passes_requested)
        }
        // No tool took the replay: every dispatch ran once (a tool given with --tool that did
        // not load, failed, or stayed inactive).
        "built-in" => "no tool replays: every kernel ran once".to_string(),
        _ => "your tool".to_string(),
    };
    let processes = if record.processes > 1 {
        format!(" in {} processes", record.processes)
    } else {
        String::new()
    };
    text.push_str(&format!(
        "{} kernel(s), {launches} launch(es) on {}{processes} ({tool}): {replayed} replayed, \
         {declined} declined, {failed} failed",
        record.kernels.len(),
        record.backend
    ));
    if record.graph_launches > 0 {
        text.push_str(&format!(
            "; run once, not replayed: {} graph launch(es)",
            record.graph_launches
        ));
    }
    if record.managed_allocations > 0 {
        text.push_str(&format!(
            "; {} managed allocation(s) (launches decline while one is live)",
            record.managed_allocations
        ));
    }
    let kept = record.tool_work.saturating_sub(record.tool_work_lost);
    if kept > 0 {
        text.push_str(&format!(
            "; {kept} tool call(s) from replay callbacks kept ({} bytes)",
            record.tool_work_kept_bytes
        ));
    }
    if record.tool_work_lost > 0 {
        text.push_str(&format!(
            "; WARNING: {} tool call(s) from replay callbacks may have been undone by a restore \
             (see the warnings above)",
            record.tool_work_lost
        ));
    }
    text.push('\n');
    text
}

fn dash(s: &str) -> String {
    if s.is_empty() { "-".into() } else { s.into() }
}

fn declines(k: &KernelRecord) -> String {
    if k.declines.is_empty() {
        return "-".into();
    }
    k.declines
        .iter()
        .map(|(r, n)| format!("{r}:{n}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The CSV's columns: [`CsvRow`]'s fields, in order (written first, also when there is no
/// row).
const CSV_COLUMNS: [&str; 11] = [
    "kernel",
    "launches",
    "replayed",
    "passes",
    "snapshot_bytes",
    "tier",
    "strategy",
    "restores",
    "restore_ms",
    "failed",
    "declines",
];

/// One CSV row.
#[derive(Serialize)]
struct CsvRow<'a> {
    kernel: &'a str,
    launches: u64,
    replayed: u64,
    passes: u64,
    snapshot_bytes: u64,
    tier: &'a str,
    strategy: &'a str,
    restores: u64,
    restore_ms: f64,
    failed: u64,
    declines: String,
}

/// Writes the record as CSV (one row per kernel) or JSON (the whole record), by extension,
/// whole or not at all ([`crate::output::write_whole`]).
pub fn write_output(path: &Path, record: &RunRecord) -> Result<(), String> {
    let text =
        output_text(path, record).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    crate::output::write_whole(path, &text)
}

/// The text of [`write_output`]'s file.
fn output_text(path: &Path, record: &RunRecord) -> Result<Vec<u8>, String> {
    let json = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"));
    if json {
        let text = serde_json::to_string_pretty(record).map_err(|e| e.to_string())?;
        return Ok((text + "\n").into_bytes());
    }
    // The header is written by hand: the serializer writes it with the first row only, so a
    // record without kernels would give an empty file.
    let mut writer = csv::WriterBuilder::new()
        .has_headers(false)
        .from_writer(Vec::new());
    writer
        .write_record(CSV_COLUMNS)
        .map_err(|e| e.to_string())?;
    for k in &record.kernels {
        writer
            .serialize(CsvRow {
                kernel: &k.kernel,
                launches: k.launches,
                replayed: k.replayed,
                passes: k.passes,
                snapshot_bytes: k.snapshot_bytes,
                tier: &k.tier,
                strategy: &k.strategy,
                restores: k.restores,
                restore_ms: k.restore_ms,
                failed: k.failed,
                declines: declines(k),
            })
            .map_err(|e| e.to_string())?;
    }
    writer.into_inner().map_err(|e| e.to_string())
}

/// Compares two standard outputs: `Err` with a summary (line counts, the first differing
/// lines) when they differ. Line by line, without copying the outputs: what it holds beyond
/// them is the few lines it shows.
pub fn compare_outputs(with: &[u8], without: &[u8]) -> Result<(), String> {
    if with == without {
        return Ok(());
    }
    // Line by line, whatever the bytes (a line that is not UTF-8 is shown with replacement
    // characters); a last line without its newline is a line too, and a `\r` before a newline
    // is not part of the line.
    fn lines(bytes: &[u8]) -> impl Iterator<Item = &[u8]> {
        let body = bytes.strip_suffix(b"\n").unwrap_or(bytes);
        body.split(|&b| b == b'\n')
            .take(if bytes.is_empty() { 0 } else { usize::MAX })
            .map(|line| line.strip_suffix(b"\r").unwrap_or(line))
    }
    const SHOWN: usize = 5;
    let (mut a, mut b) = (lines(with), lines(without));
    let (mut counted_a, mut counted_b, mut differ) = (0usize, 0usize, 0usize);
    let mut shown = String::new();
    loop {
        let (x, y) = (a.next(), b.next());
        if x.is_none() && y.is_none() {
            break;
        }
        counted_a += usize::from(x.is_some());
        counted_b += usize::from(y.is_some());
        if x == y {
            continue;
        }
        differ += 1;
        if differ <= SHOWN {
            let show = |line: Option<&[u8]>| {
                line.map_or_else(
                    || "(none)".to_string(),
                    |l| String::from_utf8_lossy(l).into_owned(),
                )
            };
            shown.push_str(&format!(
                "\n  line {}:\n    with kreplay:    {}\n    without kreplay: {}",
                counted_a.max(counted_b),
                show(x),
                show(y)
            ));
        }
    }
    let mut text = format!(
        "standard output differs: {counted_a} line(s) with kreplay, {counted_b} without, \
         {differ} line(s) differ"
    );
    if differ == 0 {
        text.push_str(
            " (the bytes differ: line endings, a missing last newline or bytes that are not \
             UTF-8)",
        );
    }
    text.push_str(&shown);
    if differ > SHOWN {
        text.push_str(&format!("\n  ... and {} more", differ - SHOWN));
    }
    Err(text)
}

/// What the record says beyond the table (on stderr), the table (to `out`) and `-o`'s file.
fn report(
    record: &RunRecord,
    options: &RunOptions,
    program: &str,
    out: &mut dyn Write,
) -> Result<(), String> {
    let write_err = |e: std::io::Error| format!("cannot write the output: {e}");
    // --tool reaches the program through KREPLAY_TOOL_LIBRARIES, which the library's lines
    // name: name the option the user gave instead.
    let from_variable = options.tool.as_ref().map(|tool| {
        format!(
            "{}: cannot use {}:",
            kreplay::lifecycle::ENV_TOOL_LIBRARIES,
            tool.display()
        )
    });
    for problem in &record.tool_problems {
        match &from_variable {
            Some(prefix) if problem.starts_with(prefix.as_str()) => {
                eprintln!(
                    "kreplay: --tool:{}",
                    &problem[kreplay::lifecycle::ENV_TOOL_LIBRARIES.len() + 1..]
                );
            }
            _ => eprintln!("kreplay: {problem}"),
        }
    }
    for note in &record.tool_notes {
        eprintln!("kreplay: {note}");
    }
    let failed: u64 = record.kernels.iter().map(|k| k.failed).sum();
    if failed > 0 {
        eprintln!(
            "kreplay: {failed} replay(s) failed (a pass that could not run, or a restore that \
             could not put memory back: the program's standard error says which): {program}'s \
             results may not be those of a run without kreplay"
        );
    }
    if record.sessions_unprofiled > 0 {
        eprintln!(
            "kreplay: {program} started its runtime again after shutting it down ({} time(s)); \
             kreplay loads once per process, so the kernels of the sessions after the first are \
             missing from the table",
            record.sessions_unprofiled
        );
    }
    match record.incomplete {
        0 => {}
        1 => eprintln!(
            "kreplay: a process of {program} loaded kreplay and ended without writing its record \
             (a crash, a signal, an exit that skipped the exit handlers), or is still running: \
             its kernels are missing from the table"
        ),
        n => eprintln!(
            "kreplay: {n} processes of {program} loaded kreplay and ended without writing their \
             records (a crash, a signal, an exit that skipped the exit handlers), or are still \
             running: their kernels are missing from the table"
        ),
    }
    // The file is written whether or not the table could be shown (standard output may be a
    // terminal that hung up, or a pipe whose reader ended).
    let shown = out.write_all(table(record).as_bytes()).map_err(write_err);
    if let Some(path) = &options.output {
        write_output(path, record)?;
        if shown.is_ok() {
            writeln!(out, "wrote {}", path.display()).map_err(write_err)?;
        }
    }
    shown
}

/// Runs `kreplay run`: the table goes to `out`; errors that stop it are returned.
pub fn run(options: &RunOptions, out: &mut dyn Write) -> Result<RunOutcome, String> {
    let backend = match options.backend {
        Some(b) => b,
        None => detect_backend(library_loads)?,
    };
    run_with(options, backend, out)
}

/// [`run`] with the backend decided.
pub fn run_with(
    options: &RunOptions,
    backend: Backend,
    out: &mut dyn Write,
) -> Result<RunOutcome, String> {
    let library = find_library(options.library.as_deref())?;
    // The tool goes to the program as an absolute path: the program may change folder before
    // it loads it, and the dynamic loader reads a bare name as one to look up on its search
    // path, not in the current folder.
    let mut options = options.clone();
    if let Some(tool) = &options.tool {
        options.tool = Some(tool_path(existing_file(tool, "--tool")?)?);
    }
    let options = &options;
    let inherited = Inherited::read(backend, &library, |name| std::env::var_os(name))?;
    check_settings(options, backend, &library, &inherited)?;
    for note in inherited.notes(options, backend) {
        eprintln!("kreplay: {note}");
    }
    let program = program_name(options);
    // Undone when this function returns.
    let _prepared = process::prepare();
    let input = check_input(options.check);
    if let Some(signal) = process::interrupted() {
        return Err(format!(
            "interrupted (signal {signal}) before {program} started"
        ));
    }
    let record_dir = record_dir()?;
    let profiled = run_program(
        options,
        &inherited,
        Some((backend, &library, &record_dir)),
        match input {
            CheckInput::Tee => process::Input::Tee,
            CheckInput::Inherit | CheckInput::File(..) => process::Input::Inherit,
        },
        options.check,
    );
    let record = profiled
        .as_ref()
        .map_err(Clone::clone)
        .and_then(|_| read_record(&record_dir, &program, backend));
    let _ = std::fs::remove_dir_all(&record_dir);
    let profiled = profiled?;
    let status = profiled.status;
    let write_err = |e: std::io::Error| format!("cannot write the output: {e}");
    // Reported after the record was (and written with -o, which does not need it).
    let echoed = if options.check {
        out.write_all(&profiled.stdout).map_err(write_err)
    } else {
        Ok(())
    };
    if let Some(signal) = process::interrupted() {
        // What the program recorded until it ended is still shown and written.
        if let Ok(record) = &record {
            report(record, options, &program, out)?;
        }
        return Err(format!(
            "interrupted (signal {signal}; {program} got it too and exited with {status})"
        ));
    }
    if !status.success() {
        eprintln!("kreplay: {program} exited with {status} under kreplay");
    }
    let record = record?;
    report(&record, options, &program, out)?;
    echoed?;
    let check = if options.check {
        if let Some(signal) = process::interrupted() {
            // While what was recorded was shown and written: the run without kreplay would
            // run to its end in spite of it.
            return Err(format!(
                "interrupted (signal {signal}) before the run without kreplay"
            ));
        }
        let input = match &input {
            CheckInput::Tee => process::Input::Bytes(&profiled.input),
            CheckInput::Inherit => process::Input::Inherit,
            CheckInput::File(file, offset) => {
                use std::io::Seek;
                let mut file = file;
                file.seek(std::io::SeekFrom::Start(*offset)).map_err(|e| {
                    format!("cannot read the standard input again for the run without kreplay: {e}")
                })?;
                process::Input::File(file)
            }
        };
        let plain = run_program(options, &inherited, None, input, true)?;
        if let Some(signal) = process::interrupted() {
            return Err(format!(
                "interrupted (signal {signal}) during the run without kreplay"
            ));
        }
        let compared = compare_outputs(&profiled.stdout, &plain.stdout).and_then(|()| {
            if plain.status == status {
                Ok(())
            } else {
                Err(format!(
                    "the standard output is the same, but {program} exited with {status} under \
                     kreplay and with {} without",
                    plain.status
                ))
            }
        });
        match &compared {
            Ok(()) => writeln!(
                out,
                "check: the standard output is the same with and without kreplay ({} bytes)",
                profiled.stdout.len()
            )
            .map_err(write_err)?,
            Err(diff) => eprintln!("kreplay: check failed: {diff}"),
        }
        Some(compared)
    } else {
        None
    };
    Ok(RunOutcome {
        status,
        left_running: profiled.left_running,
        record,
        check,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_outputs_pass_and_different_ones_name_the_lines() {
        assert_eq!(compare_outputs(b"a\nb\n", b"a\nb\n"), Ok(()));
        let diff =
            compare_outputs(b"checksum 1\nsum 2\n", b"checksum 1\nsum 3\nextra\n").unwrap_err();
        assert!(
            diff.contains("2 line(s) with kreplay, 3 without, 2 line(s) differ"),
            "{diff}"
        );
        assert!(diff.contains("line 2:") && diff.contains("sum 2") && diff.contains("sum 3"));
        assert!(
            diff.contains("line 3:") && diff.contains("(none)"),
            "{diff}"
        );
        let crlf = compare_outputs(b"a\r\n", b"a\n").unwrap_err();
        assert!(crlf.contains("the bytes differ"), "{crlf}");
    }

    #[test]
    fn scope_sets_the_snapshot_scope_of_the_profiled_run_only_when_given() {
        let mut options = RunOptions {
            passes: 38,
            tool: None,
            backend: Some(Backend::Cuda),
            check: false,
            output: None,
            library: None,
            scope: Some(Scope::Referenced),
            program: vec!["app".into()],
        };
        let vars = |o: &RunOptions| {
            injected_variables(
                o,
                Backend::Cuda,
                Path::new("/l.so"),
                Path::new("/rec"),
                &Inherited::default(),
            )
        };
        let given = vars(&options);
        assert!(given.contains(&("KREPLAY_SNAPSHOT_SCOPE", "referenced".into())));
        assert!(given.contains(&("KREPLAY_PASSES", "38".into())));
        assert!(given.contains(&("CUDA_INJECTION64_PATH", "/l.so".into())));
        options.scope = Some(Scope::Agent);
        assert!(vars(&options).contains(&("KREPLAY_SNAPSHOT_SCOPE", "agent".into())));
        // Not given: the environment's setting (if any) reaches the program unchanged.
        options.scope = None;
        assert!(
            vars(&options)
                .iter()
                .all(|(k, _)| *k != "KREPLAY_SNAPSHOT_SCOPE")
        );
    }

    #[test]
    fn the_library_is_one_entry_of_rocms_space_separated_tools_list() {
        let lib = Path::new("/opt/My Tools/\"v2\"\\libkreplay.so");
        assert_eq!(
            injection_value(Backend::Hsa, lib),
            OsString::from("/opt/My\\ Tools/\\\"v2\\\"\\\\libkreplay.so")
        );
        assert_eq!(injection_value(Backend::Cuda, lib), lib.as_os_str());
        let plain = Path::new("/usr/lib/libkreplay.so");
        assert_eq!(injection_value(Backend::Hsa, plain), plain.as_os_str());
    }

    #[test]
    fn the_csv_columns_are_the_rows_fields() {
        let mut writer = csv::Writer::from_writer(Vec::new());
        writer
            .serialize(CsvRow {
                kernel: "k",
                launches: 1,
                replayed: 1,
                passes: 2,
                snapshot_bytes: 64,
                tier: "host",
                strategy: "full",
                restores: 1,
                restore_ms: 0.5,
                failed: 0,
                declines: "-".into(),
            })
            .unwrap();
        let text = String::from_utf8(writer.into_inner().unwrap()).unwrap();
        assert_eq!(text.lines().next(), Some(CSV_COLUMNS.join(",").as_str()));
    }

    #[test]
    fn rocms_tools_list_is_split_at_unquoted_unescaped_spaces() {
        let entries = hsa_tools_entries(br#" /a/one.so  "/b/t w o.so" /c/th\ ree.so "" "#);
        let entries: Vec<String> = entries
            .into_iter()
            .map(|e| String::from_utf8(e).unwrap())
            .collect();
        assert_eq!(entries, ["/a/one.so", "/b/t w o.so", "/c/th ree.so", ""]);
        // An entry naming kreplay's library is dropped; the rest is written back escaped.
        let lookup = |name: &str| {
            (name == "HSA_TOOLS_LIB").then(|| OsString::from(r#""/opt/k r/libk.so" "/x/l y.so""#))
        };
        let kept = Inherited::read(Backend::Hsa, Path::new("/opt/k r/libk.so"), lookup).unwrap();
        assert_eq!(kept.hsa_tools_lib, Some(OsString::from(r"/x/l\ y.so")));
    }

    #[test]
    fn auto_detection_prefers_cuda_then_rocm() {
        assert_eq!(detect_backend(|_| true), Ok(Backend::Cuda));
        assert_eq!(
            detect_backend(|l| l.starts_with("libhsa")),
            Ok(Backend::Hsa)
        );
        assert!(detect_backend(|_| false).unwrap_err().contains("--backend"));
    }

    #[test]
    fn a_missing_record_says_kreplay_was_not_loaded() {
        let dir = std::env::temp_dir().join(format!("kreplay-run-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let err = read_record(&dir, "app", Backend::Cuda).unwrap_err();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            err.contains("recorded nothing") && err.contains("CUDA_INJECTION64_PATH"),
            "{err}"
        );
    }
}
