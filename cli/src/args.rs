//! Command-line parsing, with clap (derive).
//!
//! Every command is a variant of the private `Cli`'s subcommand enum, with its help text beside its
//! options; [`parse`] turns the arguments into a [`Command`] with the options filled in (defaults
//! included), or a [`UsageError`] that names the argument at fault. Values are checked while they
//! are parsed (counts with `k`/`M` suffixes, comma lists, sizes, percentages, file paths).
//!
//! ```
//! use kreplay_cli::args::{Command, parse};
//!
//! let Ok(Command::Demo(options)) = parse(["demo", "--passes", "6", "--no-restore"]) else {
//!     panic!("a valid demo command line");
//! };
//! assert_eq!((options.passes, options.restore), (6, false));
//!
//! let error = parse(["demo", "--passes", "zero"]).unwrap_err();
//! assert!(error.to_string().contains("--passes"));
//! // An option that needs a value never takes the next option as its value.
//! let error = parse(["demo", "--csv", "--no-restore"]).unwrap_err();
//! assert!(error.to_string().contains("--csv"));
//! ```

use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;

use clap::builder::TypedValueParser;
use clap::{ArgAction, Args, CommandFactory, Parser, Subcommand, ValueEnum};
use kreplay_snapshot::{RestoreStrategy, StoreTier};

/// Exit status of a successful run (demo: verification passed).
pub const EXIT_OK: i32 = 0;
/// Exit status when a run fails (demo: verification failed, or an error stopped it).
pub const EXIT_FAILURE: i32 = 1;
/// Exit status for a bad command line.
pub const EXIT_USAGE: i32 = 2;

/// Default number of passes per dispatch of `kreplay demo`.
pub const DEFAULT_PASSES: u32 = 4;
/// Most passes `kreplay demo` accepts (it creates one tracing context per pass).
pub const MAX_PASSES: u32 = 64;
/// Default number of `u32` elements per demo buffer (4 MiB each).
pub const DEFAULT_ELEMENTS: usize = 1 << 20;
/// Most elements per demo buffer (256 MiB each).
pub const MAX_ELEMENTS: usize = 1 << 26;

/// Default footprints of `kreplay bench` (64 MiB and 256 MiB: well under a minute on 2 cores).
pub const DEFAULT_FOOTPRINTS: [u64; 2] = [64 << 20, 256 << 20];
/// Smallest footprint `kreplay bench` accepts.
pub const MIN_FOOTPRINT: u64 = 4 << 10;
/// Largest footprint `kreplay bench` accepts.
pub const MAX_FOOTPRINT: u64 = 64 << 30;
/// Default dirty percentages of `kreplay bench`.
pub const DEFAULT_DIRTY_PERCENT: [f64; 4] = [0.0, 1.0, 10.0, 100.0];
/// Default timed repetitions of every `kreplay bench` measurement (the best is kept).
pub const DEFAULT_REPEATS: usize = 3;
/// Most repetitions `kreplay bench` accepts.
pub const MAX_REPEATS: usize = 1000;
/// Default passes of the whole replays `kreplay bench` measures (38: Nsight Compute's full set).
pub const DEFAULT_REPLAY_PASSES: [u64; 4] = [2, 4, 8, 38];
/// Most passes of a measured replay.
pub const MAX_REPLAY_PASSES: u64 = 1000;
/// Default dirty percentages of the measured replays.
pub const DEFAULT_REPLAY_DIRTY_PERCENT: [f64; 2] = [1.0, 10.0];

/// Default tracked allocations (besides the replayed dispatch's own buffer) of
/// `kreplay bench-dispatch`.
pub const DEFAULT_ALLOCATIONS: usize = 1000;
/// Most tracked allocations `kreplay bench-dispatch` accepts.
pub const MAX_ALLOCATIONS: usize = 100_000;
/// Default timed dispatches per configuration of `kreplay bench-dispatch`.
pub const DEFAULT_DISPATCHES: usize = 3000;
/// Fewest timed dispatches per configuration `kreplay bench-dispatch` accepts.
pub const MIN_DISPATCHES: usize = 10;
/// Most timed dispatches per configuration `kreplay bench-dispatch` accepts.
pub const MAX_DISPATCHES: usize = 1_000_000;
/// Default passes of the replayed dispatch of `kreplay bench-dispatch`.
pub const DEFAULT_DISPATCH_PASSES: u64 = 2;
/// Default inventories (coarse-grained allocations on the replayed agent) whose snapshot and
/// restore `kreplay bench-dispatch` measures.
pub const DEFAULT_INVENTORIES: [usize; 2] = [1000, 10_000];
/// Most coarse-grained allocations of one inventory `kreplay bench-dispatch` accepts.
pub const MAX_INVENTORY: usize = 100_000;

/// Default seconds of `kreplay stress`.
pub const DEFAULT_STRESS_SECONDS: u64 = 10;
/// Most seconds `kreplay stress` accepts (one day).
pub const MAX_STRESS_SECONDS: u64 = 86_400;
/// Default application threads of `kreplay stress`.
pub const DEFAULT_STRESS_THREADS: usize = 8;
/// Most application threads `kreplay stress` accepts.
pub const MAX_STRESS_THREADS: usize = 256;

/// What the command line asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// Print this text (a help text or the version) on standard output.
    Print(String),
    /// Run `kreplay demo`.
    Demo(DemoOptions),
    /// Run `kreplay demo --backend cuda`.
    DemoCuda(CudaDemoOptions),
    /// Run `kreplay bench --backend cuda`: the measurements, and where to write them as CSV
    /// besides standard output.
    BenchCuda(kreplay_cuda::bench::BenchConfig, Option<PathBuf>),
    /// Run `kreplay bench`.
    Bench(BenchOptions),
    /// Run `kreplay bench-dispatch`.
    BenchDispatch(DispatchBenchOptions),
    /// Run `kreplay stress`.
    Stress(StressOptions),
    /// Run `kreplay profile`.
    Profile(crate::profile::ProfileOptions),
    /// Run `kreplay run`.
    Run(crate::run::RunOptions),
}

impl Command {
    /// The files the command will write (checked before any work starts).
    pub fn output_paths(&self) -> Vec<&std::path::Path> {
        match self {
            Command::Print(_) => Vec::new(),
            Command::Demo(o) => o.json.iter().chain(&o.csv).map(PathBuf::as_path).collect(),
            Command::DemoCuda(_) => Vec::new(),
            Command::BenchCuda(_, csv) => csv.iter().map(PathBuf::as_path).collect(),
            Command::Bench(o) => o.csv.iter().chain(&o.svg).map(PathBuf::as_path).collect(),
            Command::BenchDispatch(o) => o.csv.iter().map(PathBuf::as_path).collect(),
            Command::Stress(_) => Vec::new(),
            Command::Profile(o) => o.output.iter().map(PathBuf::as_path).collect(),
            Command::Run(o) => o.output.iter().map(PathBuf::as_path).collect(),
        }
    }
}

/// Options of `kreplay demo`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DemoOptions {
    /// Passes per dispatch (`--passes`, 1 = no replay).
    pub passes: u32,
    /// Whether replay restores memory between passes (`--no-restore` turns it off).
    pub restore: bool,
    /// `u32` elements per buffer (`--elements`).
    pub elements: usize,
    /// Where to write the records as JSON (`--json`).
    pub json: Option<PathBuf>,
    /// Where to write the per-pass records as CSV (`--csv`).
    pub csv: Option<PathBuf>,
    /// Tool libraries to load beside the demo's own tool (`--tool`, repeatable).
    pub tools: Vec<PathBuf>,
    /// Whether `--passes` was given: a tool library that drives kernel replay chooses the
    /// passes itself, and then a `--passes` given is an error rather than ignored.
    pub passes_given: bool,
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions {
            passes: DEFAULT_PASSES,
            restore: true,
            elements: DEFAULT_ELEMENTS,
            json: None,
            csv: None,
            tools: Vec::new(),
            passes_given: false,
        }
    }
}

/// Options of `kreplay demo --backend cuda`.
#[derive(Clone, Debug, PartialEq)]
pub struct CudaDemoOptions {
    /// Device ordinal (`--device`).
    pub device: i32,
    /// Bytes of the footprint (`--footprint`, a multiple of 64 KiB).
    pub footprint: u64,
    /// Fraction of the footprint the kernel writes, in `(0, 1]` (`--written`).
    pub written: f64,
    /// Passes of the replayed launch (`--passes`, 1 = no replay).
    pub passes: u64,
}

/// Default footprint of `kreplay demo --backend cuda`.
pub const DEFAULT_CUDA_FOOTPRINT: u64 = 1 << 30;
/// Default written fraction of `kreplay demo --backend cuda`.
pub const DEFAULT_CUDA_WRITTEN: f64 = 0.01;

impl Default for CudaDemoOptions {
    fn default() -> Self {
        CudaDemoOptions {
            device: 0,
            footprint: DEFAULT_CUDA_FOOTPRINT,
            written: DEFAULT_CUDA_WRITTEN,
            passes: u64::from(DEFAULT_PASSES),
        }
    }
}

/// Options of `kreplay stress`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StressOptions {
    /// How long the application threads run under kreplay (`--seconds`).
    pub seconds: u64,
    /// Seed of every thread's operations and of the faults (`--seed`).
    pub seed: u64,
    /// Application threads (`--threads`).
    pub threads: usize,
    /// Fault spec for softhsa (`--faults`); `None` falls back to `KREPLAY_SOFTHSA_FAULTS`.
    pub faults: Option<String>,
    /// What the application mix draws from (`--no-opt-out`, `--no-shared-queues`, ...).
    pub mix: kreplay_workloads::stress::Mix,
    /// The tool toggles contexts in every replay (`--no-toggles` turns it off).
    pub toggles: bool,
    /// The tool dispatches from inside its callbacks (`--no-reentrant` turns it off).
    pub reentrant: bool,
    /// Replay restores memory between passes (`--no-restore` turns it off, to show the check
    /// catching lost data).
    pub restore: bool,
}

impl Default for StressOptions {
    fn default() -> Self {
        StressOptions {
            seconds: DEFAULT_STRESS_SECONDS,
            seed: 1,
            threads: DEFAULT_STRESS_THREADS,
            faults: None,
            mix: kreplay_workloads::stress::Mix::ALL,
            toggles: true,
            reentrant: true,
            restore: true,
        }
    }
}

/// Options of `kreplay bench` (the snapshot/restore matrix).
#[derive(Clone, Debug, PartialEq)]
pub struct BenchOptions {
    /// Footprints to measure, in bytes (`--footprints`).
    pub footprints: Vec<u64>,
    /// Fractions of chunks a simulated pass dirties, in `0.0..=1.0` (`--dirty`, given in percent).
    pub dirty_fractions: Vec<f64>,
    /// Restore strategies (`--strategies`).
    pub strategies: Vec<RestoreStrategy>,
    /// Snapshot store tiers (`--tiers`).
    pub tiers: Vec<StoreTier>,
    /// Timed repetitions per measurement; the best is kept (`--repeats`).
    pub repeats: usize,
    /// Where to write every row as CSV (`--csv`).
    pub csv: Option<PathBuf>,
    /// Where to write the plot of restore time against dirty fraction (`--svg`).
    pub svg: Option<PathBuf>,
    /// Measure a device without host windows, reached through reads and writes only, like a
    /// discrete GPU (`--discrete`).
    pub discrete: bool,
    /// Passes of the whole replays measured (`--passes`; empty: no per-replay section).
    pub replay_passes: Vec<u64>,
    /// Fractions of chunks each pass of those replays writes (`--replay-dirty`, in percent).
    pub replay_dirty: Vec<f64>,
    /// Store tiers of those replays (`--replay-tiers`).
    pub replay_tiers: Vec<StoreTier>,
    /// Footprints of those replays (`--replay-footprints`; `None`: the smallest of
    /// `footprints`).
    pub replay_footprints: Option<Vec<u64>>,
    /// Repetitions of each replay cell of up to 8 passes (`--replay-repeats`) and of longer
    /// ones (`--replay-long-repeats`); `None`: the bench's defaults.
    pub replay_repeats: (Option<usize>, Option<usize>),
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            footprints: DEFAULT_FOOTPRINTS.to_vec(),
            dirty_fractions: DEFAULT_DIRTY_PERCENT.iter().map(|p| p / 100.0).collect(),
            strategies: vec![
                RestoreStrategy::Full,
                RestoreStrategy::Hash,
                RestoreStrategy::Writeset,
                RestoreStrategy::Tracked,
            ],
            tiers: vec![StoreTier::Host, StoreTier::File, StoreTier::Device],
            repeats: DEFAULT_REPEATS,
            csv: None,
            svg: None,
            discrete: false,
            replay_passes: DEFAULT_REPLAY_PASSES.to_vec(),
            replay_dirty: DEFAULT_REPLAY_DIRTY_PERCENT
                .iter()
                .map(|p| p / 100.0)
                .collect(),
            replay_tiers: vec![StoreTier::Host],
            replay_footprints: None,
            replay_repeats: (None, None),
        }
    }
}

/// Which services `kreplay bench-dispatch` configures in its process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DispatchService {
    /// A tool with the KERNEL_REPLAY service: replayed and opted-out dispatches are measured here,
    /// dispatches with no replay service in a child process (`--service none`).
    Replay,
    /// No tool and no service: only ordinary dispatches with no replay service are measured.
    None,
    /// On a runtime that overlaps dispatches of one queue (as AQL allows): two long kernels on
    /// one queue, on softhsa's own queue and on kreplay's with the tool opting out (a child
    /// process the `replay` run starts).
    Overlap,
    /// Only the per-pass hand-off of replayed dispatches (the `replay` run measures it in its
    /// own process, and pinned to one CPU in a child process started with `--pin`).
    Handoff,
}

/// Options of `kreplay bench-dispatch` (the fixed cost per dispatch).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DispatchBenchOptions {
    /// Tracked allocations besides the replayed dispatch's own buffer (`--allocations`).
    pub allocations: usize,
    /// Timed dispatches per measured configuration (`--dispatches`).
    pub dispatches: usize,
    /// Passes of the replayed dispatch (`--passes`).
    pub passes: u64,
    /// Which services this process configures (`--service`).
    pub service: DispatchService,
    /// Inventories whose snapshot and restore are measured: coarse-grained allocations on the
    /// replayed agent (`--inventory`; empty: none).
    pub inventories: Vec<usize>,
    /// Whether this process runs on one CPU (`--pin`).
    pub pin: bool,
    /// Where to write every figure as CSV (`--csv`).
    pub csv: Option<PathBuf>,
}

impl Default for DispatchBenchOptions {
    fn default() -> Self {
        DispatchBenchOptions {
            allocations: DEFAULT_ALLOCATIONS,
            dispatches: DEFAULT_DISPATCHES,
            passes: DEFAULT_DISPATCH_PASSES,
            service: DispatchService::Replay,
            inventories: DEFAULT_INVENTORIES.to_vec(),
            pin: false,
            csv: None,
        }
    }
}

/// A bad command line: what is wrong, which argument, and which help to read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageError {
    /// The explanation, as clap words it, ending with the help command to run.
    pub message: String,
}

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for UsageError {}

/// Parses the arguments after the program name.
pub fn parse<I, S>(args: I) -> Result<Command, UsageError>
where
    I: IntoIterator<Item = S>,
    S: Into<OsString>,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let args_given: Vec<String> = args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let command_word = args
        .first()
        .and_then(|a| a.to_str())
        .filter(|a| Cli::command().find_subcommand(a).is_some())
        .map(str::to_string);
    let cli = match Cli::try_parse_from(std::iter::once(OsString::from("kreplay")).chain(args)) {
        Ok(cli) => cli,
        Err(error) => {
            use clap::error::ErrorKind;
            return match error.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
                    Ok(Command::Print(error.render().to_string()))
                }
                ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
                | ErrorKind::MissingSubcommand => {
                    let names: Vec<String> = Cli::command()
                        .get_subcommands()
                        .map(|c| c.get_name().to_string())
                        .collect();
                    Err(UsageError {
                        message: format!(
                            "no command given; commands: {}\n\nFor more information, try \
                             'kreplay --help'.",
                            names.join(", ")
                        ),
                    })
                }
                ErrorKind::MissingRequiredArgument
                    if command_word.as_deref() == Some("profile")
                        && let Some(message) =
                            profile_workload_without_separator(&args_given[1..]) =>
                {
                    Err(UsageError { message })
                }
                _ => Err(usage_error(&error, command_word.as_deref())),
            };
        }
    };
    Ok(match cli.command {
        Sub::Demo(args) => args.into_command().map_err(|message| UsageError {
            message: format!("{message}\n\nFor more information, try 'kreplay demo --help'."),
        })?,
        Sub::Bench(args) => args.into_command().map_err(|message| UsageError {
            message: format!("{message}\n\nFor more information, try 'kreplay bench --help'."),
        })?,
        Sub::BenchDispatch(args) => Command::BenchDispatch(args.into_options()),
        Sub::Stress(args) => Command::Stress(args.into_options()),
        Sub::Profile(args) => Command::Profile(
            args.into_options(&args_before_workload(&args_given))
                .map_err(|message| UsageError {
                    message: format!(
                        "{message}\n\nFor more information, try 'kreplay profile --help'."
                    ),
                })?,
        ),
        Sub::Run(args) => Command::Run(args.into_options()),
        Sub::Completions(args) => Command::Print(completion_script(args.shell)),
        Sub::Help(args) => Command::Print(help_of(args.command.as_deref())),
    })
}

/// The completion script of kreplay for `shell`.
fn completion_script(shell: clap_complete::Shell) -> String {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "kreplay", &mut script);
    String::from_utf8_lossy(&script).into_owned()
}

/// The help text of `command` (`None`: the command list), as `--help` prints it.
pub fn help_of(command: Option<&str>) -> String {
    let mut cli = Cli::command();
    cli.build();
    match command.and_then(|name| cli.find_subcommand_mut(name)) {
        Some(sub) => sub.render_long_help().to_string(),
        None => cli.render_long_help().to_string(),
    }
}

fn usage_error(error: &clap::Error, command: Option<&str>) -> UsageError {
    let text = error.render().to_string();
    let text = text
        .trim_end()
        .strip_prefix("error: ")
        .unwrap_or(text.trim_end());
    let help = match command {
        Some(command) => format!("'kreplay {command} --help'"),
        None => "'kreplay --help'".to_string(),
    };
    UsageError {
        message: text.replace("'--help'", &help),
    }
}

// ------------------------------------------------------------------------------------------------
// The command line as clap sees it
// ------------------------------------------------------------------------------------------------

#[derive(Parser, Debug)]
#[command(
    name = "kreplay",
    version,
    about = "kreplay — kernel replay for GPU profilers",
    disable_help_flag = true,
    disable_version_flag = true,
    disable_help_subcommand = true,
    max_term_width = 100,
    after_long_help = "Run 'kreplay <command> --help' for the options of one command."
)]
struct Cli {
    #[command(flatten)]
    help: HelpFlag,
    /// show the version
    #[arg(short = 'V', long, action = ArgAction::Version)]
    version: Option<bool>,
    #[command(subcommand)]
    command: Sub,
}

/// `-h` and `--help` both print the whole help text.
#[derive(Args, Debug)]
struct HelpFlag {
    /// show this help
    #[arg(short, long, action = ArgAction::HelpLong)]
    help: Option<bool>,
}

#[derive(Subcommand, Debug)]
enum Sub {
    /// replay every dispatch of a small HSA application in N passes on the software HSA runtime
    /// and verify its results against an unprofiled run
    #[command(
        disable_help_flag = true,
        long_about = DEMO_ABOUT,
        after_long_help = DEMO_AFTER
    )]
    Demo(DemoArgs),
    /// measure snapshot and restore (footprints x dirty fractions x strategies x tiers) beside
    /// memcpy and read ceilings measured in the same run
    #[command(
        disable_help_flag = true,
        long_about = BENCH_ABOUT,
        after_long_help = BENCH_AFTER
    )]
    Bench(BenchArgs),
    /// measure the fixed cost kreplay adds per dispatch (replayed, opted out, no replay service)
    /// on the software HSA runtime
    #[command(
        name = "bench-dispatch",
        disable_help_flag = true,
        long_about = DISPATCH_ABOUT,
        after_long_help = "Exit status: 0 when the measurements ran (targets not met are reported, \
                           not failures), 1 when they could not run, 2 for a bad command line."
    )]
    BenchDispatch(DispatchArgs),
    /// run many threads of seeded dispatches, copies, fills and allocations under kreplay
    /// (optionally with injected faults) and check every byte and completion against a run
    /// without kreplay
    #[command(
        disable_help_flag = true,
        long_about = STRESS_ABOUT,
        after_long_help = "Exit status: 0 when every buffer equals the reference and every \
                           completion fired exactly once, 1 otherwise (a reproducing command line \
                           is printed), 2 for a bad command line."
    )]
    Stress(StressArgs),
    /// collect hardware-like counters of every dispatch of a workload, more than one pass
    /// allows, by kernel replay (one run) or application replay (one run per group)
    #[command(
        disable_help_flag = true,
        long_about = PROFILE_ABOUT,
        override_usage = PROFILE_USAGE,
        after_long_help = "Exit status: 0 when the profile ran (and, with --check, both modes \
                           agreed), 1 when it could not run (a group over a pass limit, an \
                           unknown counter), a dispatch did not count every group (its replay \
                           declined or ended early: INCOMPLETE) or --check found a difference, \
                           2 for a bad command line."
    )]
    Profile(ProfileArgs),
    /// run any program with kreplay injected (CUDA or ROCm): every kernel replayed N times by
    /// the built-in tool, or by your tool; prints a table per kernel
    #[command(
        disable_help_flag = true,
        long_about = RUN_ABOUT,
        override_usage = RUN_USAGE,
        after_long_help = "Exit status: 0 when the program ran and succeeded (and, with --check, \
                           printed the same standard output without kreplay), 1 when it could not \
                           start, failed, recorded nothing, a tool could not be used, a replay \
                           failed (a pass that could not run, a restore that lost data) or \
                           --check found a difference, 2 for a bad command line."
    )]
    Run(RunArgs),
    /// print a shell completion script for kreplay (bash, zsh, fish, elvish, powershell)
    #[command(
        disable_help_flag = true,
        long_about = COMPLETIONS_ABOUT,
        after_long_help = "Exit status: 0 when the script was printed, 2 for a bad command line."
    )]
    Completions(CompletionsArgs),
    /// show this help, or the help of one command (`kreplay help demo`)
    #[command(
        disable_help_flag = true,
        long_about = "kreplay help — the help of kreplay or of one command\n\n\
                  'kreplay help' prints the command list, 'kreplay help <command>' the help of one \
                  command (the same as 'kreplay <command> --help')."
    )]
    Help(HelpArgs),
}

const DEMO_ABOUT: &str = "kreplay demo — kernel replay on the software HSA runtime, verified\n\n\
    Runs a small HSA application (in-place updates, atomics, a kernel reading one buffer and \
    writing another; every dispatch depends on the previous results) twice: once unprofiled, once \
    under a tool that replays every dispatch in N passes with a different tracing context active on \
    each pass. Prints one row per dispatch and checks that the profiled results equal the \
    unprofiled ones.\n\n\
    With --backend cuda: on a CUDA GPU (the driver is loaded at run time), fills --footprint bytes \
    of device memory with a known pattern, launches x += 1 over the --written fraction of its \
    32-bit words (evenly spaced 64 KiB runs) and replays that launch in --passes passes through \
    the same replay window the injected library uses, with the snapshot tier and restore \
    strategy of KREPLAY_SNAPSHOT_STORE and KREPLAY_RESTORE. Then reads every word back: each \
    written word must hold exactly one increment, every other word its pattern. Prints the \
    passes, tier, strategy, snapshot time and every restore's time and bytes, and PASS or \
    FAIL.";

const DEMO_AFTER: &str = "The table, one row per dispatch:\n\
    \x20 id                 the dispatch id (every pass of a dispatch shares it)\n\
    \x20 kernel             the kernel's name\n\
    \x20 passes             times the kernel ran (1: not replayed)\n\
    \x20 contexts per pass  per pass, the tracing contexts that got its record: c0|c1 = pass 0 \
    reached c0, pass 1 reached c1; c0+c1 = one pass reached both; - = none. A dispatch that ran \
    once lists the contexts that saw it\n\
    \x20 snapshot           bytes copied into the snapshot before pass 0\n\
    \x20 restored           bytes written back, all restores together\n\
    \x20 tier               where the snapshot was kept (device, host or file)\n\
    \x20 strategy           how memory was restored (full, hash, writeset, writeset-unverified); \
    a tracked restore (KREPLAY_RESTORE=tracked, or auto following writes) shows as writeset, \
    the name the C ABI gives it (kreplay run names it tracked)\n\
    \x20 lock wait          waiting for the agent's writer lock\n\
    \x20 drain              waiting for the agent's earlier work to finish\n\
    \x20 snap time          planning and taking the snapshot\n\
    \x20 passes total       all passes together\n\
    \x20 restores total     all restores together\n\
    A '-' means the dispatch ran once, so there was nothing to measure; a '?' (tier, strategy) \
    that a --tool drove the replay and only that tool saw it; '<- not as planned' marks a row whose problems are listed under the table. The last row, 'total', adds up every \
    dispatch. Sizes are binary (KiB = 1024 B).\n\n\
    Exit status: 0 when verification passes, 1 when it fails (or a dispatch was not replayed as \
    planned, or a requested tool cannot be used, or an output file cannot be written), 2 for a \
    bad command line. With --backend cuda, 1 also when there is no CUDA driver or device, or a \
    KREPLAY_* setting is invalid (checked before anything runs).";

const BENCH_ABOUT: &str = "kreplay bench — snapshot and restore cost beside ceilings measured in \
    the same run\n\n\
    For every footprint: measures the machine's ceilings (copy and read, each the best of several \
    methods independent of kreplay's code, printed with the winning method), then for every store \
    tier and restore strategy a snapshot (first and steady-state) and, for every dirty fraction, a \
    steady-state restore after a pass that changed that fraction of the 64 KiB chunks; then the \
    cost of whole replays (snapshot plus every restore of an N-pass replay, for a kernel's first \
    dispatch and for later dispatches reusing what it learned) per strategy and dirty pattern, \
    the strategies of a cell in interleaved repetitions in shuffled orders after an untimed \
    dispatch each, each figure the lower quartile of its repetitions (median and spread beside \
    it), beside N full restores, at the smallest footprint and in the host tier unless \
    --replay-footprints and --replay-tiers say otherwise. The device is host memory split into 4 \
    tracked allocations. Prints each row with the ceiling beside it as soon as it is measured; \
    full snapshots, full restores and hash detection are then timed 15 times in turn with the \
    ceiling's best method over as many bytes (ceiling pass, kreplay pass, ...), and hash restores \
    after a pass that changed 1% of the chunks 15 times in turn with the hash pass, and the \
    design's targets are judged from this run (full copies, hash detection and the hash restore \
    from the medians of those paired passes; auto in every replay cell against each verified \
    fixed strategy paired per repetition, the median of auto's time / the strategy's time in the \
    same repetition).";

const BENCH_AFTER: &str = "The matrix needs about 5x the largest footprint of free memory (and \
    the footprint again on disk for the file tier, in KREPLAY_SPILL_DIR or the temporary folder; \
    a bad KREPLAY_* value is an error, as for every command). The fixed cost per dispatch is measured by \
    'kreplay bench-dispatch'.\n\n\
    Exit status: 0 when the matrix ran (targets not met are reported, not failures), 1 when it \
    could not run or its output could not be written, 2 for a bad command line.";

const DISPATCH_ABOUT: &str = "kreplay bench-dispatch — the fixed cost kreplay adds per dispatch, \
    on softhsa\n\n\
    Installs kreplay in this process on the software HSA runtime (as the demo does) with a minimal \
    tool that owns the KERNEL_REPLAY service, and times dispatches of an empty kernel (one \
    work-item) submitted and waited for one at a time, round-robin over:\n\
    \x20 - a queue of softhsa's own table (no interception, no kreplay): the baseline;\n\
    \x20 - an intercept queue of softhsa's own table with a pass-through handler (softhsa's \
    interception machinery alone);\n\
    \x20 - an intercept queue of softhsa's own table whose handler runs the dispatch N times and \
    waits for each run, as a replay loop must, with nothing else;\n\
    \x20 - a queue of the table kreplay is installed in, the tool answering N passes (a: replayed), \
    and the same queue with the tool leaving the pass-count callback NULL (b: opted out).\n\n\
    The replayed dispatch's agent owns one 4 KiB coarse-grained buffer while the other tracked \
    allocations are fine-grained, kernarg or on the other agent, so the snapshot is tiny and the \
    inventory walk is what costs. (c), an ordinary dispatch with no replay service configured, \
    needs a process without one: it is measured in a child process started as 'kreplay \
    bench-dispatch --service none'. Medians are reported, with kreplay's own timing of its replay \
    loop beside them. (b) and (c) are judged by the handler's own work, paired dispatch by \
    dispatch: on two more queues (kreplay's, and an intercept queue with the pass-through \
    handler) a probe handler registered below the measured one times the writes to softhsa's \
    hardware queue, whose doorbell and wake-ups vary by microseconds; each submit minus that time, \
    one dispatch on each queue per round, and the median of the rounds' differences. The \
    difference of the lanes' submit medians is printed beside it.\n\n\
    Then the per-pass hand-off: replays of 10 passes alternating with replays of N, each pass \
    timed by kreplay's loop (submit until the completion wait returns) against the kernel's own \
    time, here and in a child process pinned to one CPU ('--service handoff --pin'). Last, the \
    snapshot and restore of real inventories (--inventory): coarse-grained 4 KiB allocations \
    added on the replayed agent, every one in the snapshot (checked in each SNAPSHOT EXIT \
    record), with the cost per region.\n\n\
    Round trips include thread wake-ups, which on a virtual machine can cost tens of µs when they \
    cross vCPUs; 'taskset -c 0 kreplay bench-dispatch' keeps every thread on one CPU and takes that \
    out.";

#[derive(Args, Debug)]
struct DemoArgs {
    #[command(flatten)]
    help: HelpFlag,
    /// passes per dispatch, 1 to 64 (default 4; 1 = no replay)
    #[arg(long, value_name = "N", value_parser = count(1, MAX_PASSES as u64), allow_negative_numbers = true)]
    passes: Option<u64>,
    /// replay without restoring memory between passes, to show the wrong answer that restore
    /// prevents (verification fails)
    #[arg(long)]
    no_restore: bool,
    /// u32 elements per buffer, 1 to 67108864 (default 1048576); k/M suffixes multiply by 1024 /
    /// 1048576
    #[arg(long, value_name = "N", value_parser = count(1, MAX_ELEMENTS as u64))]
    elements: Option<u64>,
    /// write every dispatch and pass record as JSON
    #[arg(long, value_name = "PATH", value_parser = file_path())]
    json: Option<PathBuf>,
    /// write one CSV row per pass (column replay_pass)
    #[arg(long, value_name = "PATH", value_parser = file_path())]
    csv: Option<PathBuf>,
    /// load a tool library (a C tool defining kreplay_configure, see docs/c-tools.md) against this
    /// process's kreplay; repeatable, and KREPLAY_TOOL_LIBRARIES adds more. If it configures
    /// kernel replay, it chooses the passes (--passes is then an error) and the demo's tool
    /// only observes
    #[arg(long, value_name = "PATH", value_parser = file_path(), action = ArgAction::Append)]
    tool: Vec<PathBuf>,
    /// softhsa (default: the HSA application on the software runtime) or cuda (x += 1 on a GPU)
    #[arg(long, value_name = "BACKEND")]
    backend: Option<DeviceBackend>,
    /// with --backend cuda: bytes of device memory x += 1 runs over, a multiple of 64K (default
    /// 1G); K/M/G/T suffixes are binary
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    footprint: Option<u64>,
    /// with --backend cuda: the fraction of the footprint written, above 0 and at most 1, or a
    /// percentage like 1% (default 0.01)
    #[arg(long, value_name = "FRACTION", value_parser = parse_fraction)]
    written: Option<f64>,
    /// with --backend cuda: the device ordinal (default 0)
    #[arg(long, value_name = "N", value_parser = count(0, i32::MAX as u64))]
    device: Option<u64>,
}

/// The runtime `kreplay demo` and `kreplay bench` run on.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum DeviceBackend {
    /// the HSA application on the software HSA runtime
    Softhsa,
    /// x += 1 on a CUDA GPU
    Cuda,
}

impl DemoArgs {
    fn into_command(self) -> Result<Command, String> {
        if self.backend != Some(DeviceBackend::Cuda) {
            let cuda_only = [
                ("--footprint", self.footprint.is_some()),
                ("--written", self.written.is_some()),
                ("--device", self.device.is_some()),
            ];
            if let Some((name, _)) = cuda_only.iter().find(|(_, given)| *given) {
                return Err(format!("{name} is an option of --backend cuda"));
            }
            return Ok(Command::Demo(self.into_options()));
        }
        let softhsa_only = [
            ("--no-restore", self.no_restore),
            ("--elements", self.elements.is_some()),
            ("--json", self.json.is_some()),
            ("--csv", self.csv.is_some()),
            ("--tool", !self.tool.is_empty()),
        ];
        if let Some((name, _)) = softhsa_only.iter().find(|(_, given)| *given) {
            return Err(format!(
                "{name} is an option of the softhsa demo, not of --backend cuda"
            ));
        }
        let defaults = CudaDemoOptions::default();
        let options = CudaDemoOptions {
            device: self.device.map_or(defaults.device, |d| d as i32),
            footprint: self.footprint.unwrap_or(defaults.footprint),
            written: self.written.unwrap_or(defaults.written),
            passes: self.passes.unwrap_or(defaults.passes),
        };
        kreplay_cuda::demo::Runs::select(options.footprint, options.written)
            .map_err(|e| format!("--footprint/--written: {e}"))?;
        Ok(Command::DemoCuda(options))
    }

    fn into_options(self) -> DemoOptions {
        let defaults = DemoOptions::default();
        DemoOptions {
            passes: self.passes.map_or(defaults.passes, |p| p as u32),
            restore: !self.no_restore,
            elements: self.elements.map_or(defaults.elements, |e| e as usize),
            json: self.json,
            csv: self.csv,
            tools: self.tool,
            passes_given: self.passes.is_some(),
        }
    }
}

/// A comma-separated list, parsed as one value.
#[derive(Clone, Debug)]
struct List<T>(Vec<T>);

#[derive(Args, Debug)]
struct BenchArgs {
    #[command(flatten)]
    help: HelpFlag,
    /// comma list of sizes (K/M/G/T = KiB/MiB/GiB/TiB), 4K to 64G (default 64M,256M)
    #[arg(long, value_name = "LIST", value_parser = list(parse_size))]
    footprints: Option<List<u64>>,
    /// comma list of dirty percentages, 0 to 100 (default 0,1,10,100)
    #[arg(long, value_name = "LIST", value_parser = list(parse_percent), allow_hyphen_values = true)]
    dirty: Option<List<f64>>,
    /// restore strategies: full, hash, writeset, writeset-unverified, tracked, auto (default
    /// full,hash,writeset,tracked)
    #[arg(long, value_name = "LIST", value_parser = list(parse_strategy))]
    strategies: Option<List<RestoreStrategy>>,
    /// snapshot store tiers: host, file, device, auto (default host,file,device); with
    /// --backend cuda: device, host, squeezed (default device)
    #[arg(long, value_name = "LIST", value_parser = list(parse_bench_tier))]
    tiers: Option<List<BenchTierName>>,
    /// timed repetitions per measurement, best kept, 1 to 1000 (default 3)
    #[arg(long, value_name = "N", value_parser = count(1, MAX_REPEATS as u64))]
    repeats: Option<u64>,
    /// write every row as CSV
    #[arg(long, value_name = "PATH", value_parser = file_path())]
    csv: Option<PathBuf>,
    /// write an SVG plot of restore time against dirty fraction (largest footprint, log scales)
    /// with the copy and read ceilings as reference lines
    #[arg(long, value_name = "PATH", value_parser = file_path())]
    svg: Option<PathBuf>,
    /// a device without host windows, reached through reads and writes only, like a GPU behind
    /// PCIe
    #[arg(long)]
    discrete: bool,
    /// passes of the whole replays measured, 2 to 1000, or none (default 2,4,8,38)
    #[arg(long, value_name = "LIST", value_parser = replay_passes)]
    passes: Option<List<u64>>,
    /// dirty percentages of those replays (default 1,10)
    #[arg(long = "replay-dirty", value_name = "LIST", value_parser = list(parse_percent))]
    replay_dirty: Option<List<f64>>,
    /// store tiers of those replays: host, file, device, auto (default host)
    #[arg(long = "replay-tiers", value_name = "LIST", value_parser = list(parse_tier))]
    replay_tiers: Option<List<StoreTier>>,
    /// footprints of those replays, each one of --footprints (default: the smallest)
    #[arg(long = "replay-footprints", value_name = "LIST", value_parser = list(parse_size))]
    replay_footprints: Option<List<u64>>,
    /// repetitions of each replay cell of up to 8 passes, 1 to 100 (default 9)
    #[arg(long = "replay-repeats", value_name = "N", value_parser = count(1, 100))]
    replay_repeats: Option<u64>,
    /// repetitions of each replay cell of more than 8 passes, 1 to 100 (default 7)
    #[arg(long = "replay-long-repeats", value_name = "N", value_parser = count(1, 100))]
    replay_long_repeats: Option<u64>,
    /// softhsa (default: host memory as the device) or cuda (device 0 of a CUDA GPU: tiers
    /// device, host and squeezed, strategies full, hash, writeset and writeset-unverified, then
    /// whole replays of --passes passes with auto too, at every footprint, tier and dirty
    /// fraction; default footprints 1G,8G, dirty 0.1,1,10,100)
    #[arg(long, value_name = "BACKEND")]
    backend: Option<DeviceBackend>,
}

impl BenchArgs {
    fn into_command(self) -> Result<Command, String> {
        if self.backend != Some(DeviceBackend::Cuda) {
            if self
                .tiers
                .iter()
                .flat_map(|l| &l.0)
                .any(|t| t.store().is_none())
            {
                return Err(
                    "--tiers: squeezed (a device too full for a shadow) is a tier of --backend \
                     cuda; the softhsa bench measures host, file, device and auto"
                        .into(),
                );
            }
            let options = self.into_options();
            if let Some(missing) = options
                .replay_footprints
                .iter()
                .flatten()
                .find(|f| !options.footprints.contains(f))
            {
                return Err(format!(
                    "--replay-footprints: {} is not one of --footprints",
                    kreplay_benches::format_bytes(*missing)
                ));
            }
            return Ok(Command::Bench(options));
        }
        let softhsa_only = [
            ("--svg", self.svg.is_some()),
            ("--discrete", self.discrete),
            ("--replay-dirty", self.replay_dirty.is_some()),
            ("--replay-tiers", self.replay_tiers.is_some()),
            ("--replay-footprints", self.replay_footprints.is_some()),
            ("--replay-repeats", self.replay_repeats.is_some()),
            ("--replay-long-repeats", self.replay_long_repeats.is_some()),
        ];
        if let Some((name, _)) = softhsa_only.iter().find(|(_, given)| *given) {
            return Err(format!(
                "{name} is an option of the softhsa bench, not of --backend cuda"
            ));
        }
        use kreplay_cuda::bench::{BenchConfig, BenchTier};
        let defaults = BenchConfig::default();
        let tiers = match self.tiers {
            None => defaults.tiers,
            Some(l) => {
                l.0.into_iter()
                    .map(|t| match t {
                        BenchTierName::Store(StoreTier::Device) => Ok(BenchTier::Device),
                        BenchTierName::Store(StoreTier::Host) => Ok(BenchTier::Host),
                        BenchTierName::Squeezed => Ok(BenchTier::Squeezed),
                        BenchTierName::Store(other) => Err(format!(
                            "--tiers: {other} is not measured by --backend cuda (device, host, \
                             squeezed)"
                        )),
                    })
                    .collect::<Result<_, _>>()?
            }
        };
        let config = BenchConfig {
            footprints: self.footprints.map_or(defaults.footprints, |l| l.0),
            fractions: self.dirty.map_or(defaults.fractions, |l| {
                l.0.into_iter().map(|p| p / 100.0).collect()
            }),
            strategies: self.strategies.map_or(defaults.strategies, |l| l.0),
            tiers,
            reps: self.repeats.map_or(defaults.reps, |r| r as usize),
            passes: self.passes.map_or(defaults.passes, |l| l.0),
        };
        config.validate()?;
        Ok(Command::BenchCuda(config, self.csv))
    }

    fn into_options(self) -> BenchOptions {
        let defaults = BenchOptions::default();
        BenchOptions {
            footprints: self.footprints.map_or(defaults.footprints, |l| l.0),
            dirty_fractions: self.dirty.map_or(defaults.dirty_fractions, |l| {
                l.0.into_iter().map(|p| p / 100.0).collect()
            }),
            strategies: self.strategies.map_or(defaults.strategies, |l| l.0),
            tiers: self.tiers.map_or(defaults.tiers, |l| {
                l.0.into_iter().filter_map(BenchTierName::store).collect()
            }),
            repeats: self.repeats.map_or(defaults.repeats, |r| r as usize),
            csv: self.csv,
            svg: self.svg,
            discrete: self.discrete,
            replay_passes: self.passes.map_or(defaults.replay_passes, |l| l.0),
            replay_dirty: self.replay_dirty.map_or(defaults.replay_dirty, |l| {
                l.0.into_iter().map(|p| p / 100.0).collect()
            }),
            replay_tiers: self.replay_tiers.map_or(defaults.replay_tiers, |l| l.0),
            replay_footprints: self.replay_footprints.map(|l| l.0),
            replay_repeats: (
                self.replay_repeats.map(|n| n as usize),
                self.replay_long_repeats.map(|n| n as usize),
            ),
        }
    }
}

#[derive(Args, Debug)]
struct DispatchArgs {
    #[command(flatten)]
    help: HelpFlag,
    /// tracked allocations besides the 4 KiB buffer, 0 to 100000 (default 1000)
    #[arg(long, value_name = "N", value_parser = count(0, MAX_ALLOCATIONS as u64))]
    allocations: Option<u64>,
    /// timed dispatches per configuration, 10 to 1000000 (default 3000)
    #[arg(long, value_name = "N", value_parser = count(MIN_DISPATCHES as u64, MAX_DISPATCHES as u64))]
    dispatches: Option<u64>,
    /// passes of the replayed dispatch, 2 to 64 (default 2)
    #[arg(long, value_name = "N", value_parser = count(2, MAX_PASSES as u64), allow_negative_numbers = true)]
    passes: Option<u64>,
    /// replay: measure (a) and (b), the per-pass hand-off and the inventories here, (c), the
    /// overlap of two long kernels on one queue and the pinned hand-off in child processes
    /// (default); none: configure no tool and measure only (c); overlap: measure only the
    /// overlap, on a runtime that overlaps dispatches of a queue; handoff: measure only the
    /// per-pass hand-off
    #[arg(long, value_name = "S", value_enum, hide_possible_values = true)]
    service: Option<DispatchService>,
    /// coarse-grained 4 KiB allocations on the replayed agent whose snapshot and restore are
    /// measured, one inventory after the other, e.g. 1000,10000 (default); none: skip
    #[arg(long, value_name = "LIST", value_parser = inventories)]
    inventory: Option<List<usize>>,
    /// run this process on one CPU (the first its affinity mask allows), as 'taskset -c' does
    #[arg(long)]
    pin: bool,
    /// write every figure as CSV (nanoseconds)
    #[arg(long, value_name = "PATH", value_parser = file_path())]
    csv: Option<PathBuf>,
}

impl DispatchArgs {
    fn into_options(self) -> DispatchBenchOptions {
        let defaults = DispatchBenchOptions::default();
        DispatchBenchOptions {
            allocations: self
                .allocations
                .map_or(defaults.allocations, |n| n as usize),
            dispatches: self.dispatches.map_or(defaults.dispatches, |n| n as usize),
            passes: self.passes.unwrap_or(defaults.passes),
            service: self.service.unwrap_or(defaults.service),
            inventories: self.inventory.map_or(defaults.inventories, |l| l.0),
            pin: self.pin,
            csv: self.csv,
        }
    }
}

const STRESS_ABOUT: &str = "kreplay stress — nothing lost under many threads, queues, agents and \
    faults\n\n\
    Installs kreplay in this process on the software HSA runtime with a tool that replays some \
    dispatches in 2 to 4 passes and opts the others out, toggles its contexts in every pass and \
    dispatches from inside its callbacks. N application threads, each owning buffers on 2 GPU \
    agents, run a seeded mix of dispatches (private and shared queues), temporary allocations, \
    async copies (with KREPLAY_SOFTHSA_TABLE=7 every other one a ROCm 7 batch copy), \
    hsa_memory_copy and fills for the given time. The same operations then run \
    without kreplay and without faults, and every buffer is compared. Prints operations, replays, \
    passes, bytes restored, declines per reason, restore failures and the faults that struck.";

#[derive(Args, Debug)]
struct StressArgs {
    #[command(flatten)]
    help: HelpFlag,
    /// how long the threads run under kreplay, 1 to 86400 (default 10)
    #[arg(long, value_name = "S", value_parser = count(1, MAX_STRESS_SECONDS))]
    seconds: Option<u64>,
    /// seed of the operations and of the faults (default 1)
    #[arg(long, value_name = "X", value_parser = seed, allow_hyphen_values = true)]
    seed: Option<u64>,
    /// application threads, 1 to 256 (default 8)
    #[arg(long, value_name = "N", value_parser = count(1, MAX_STRESS_THREADS as u64))]
    threads: Option<u64>,
    /// softhsa fault injection, e.g. copy:0.01,signal_create:0.001,pool_allocate:0.01,
    /// async_copy:0.01,slow_kernel:0.01@20,queue_stall:0.001@500,async_copy_delay:0.05@5[,seed:N]
    /// (default: KREPLAY_SOFTHSA_FAULTS; a spec without seed uses --seed)
    #[arg(long, value_name = "SPEC", value_parser = fault_spec)]
    faults: Option<String>,
    /// every dispatch asks to be replayed
    #[arg(long)]
    no_opt_out: bool,
    /// only private queues
    #[arg(long)]
    no_shared_queues: bool,
    /// no temporary allocations
    #[arg(long)]
    no_alloc_free: bool,
    /// no hsa_amd_memory_async_copy
    #[arg(long)]
    no_async_copy: bool,
    /// no hsa_memory_copy
    #[arg(long)]
    no_memory_copy: bool,
    /// no hsa_amd_memory_fill
    #[arg(long)]
    no_fill: bool,
    /// no peer access: buffers are not granted to the other agent, whose dispatches never
    /// touch them
    #[arg(long)]
    no_peers: bool,
    /// the tool leaves its contexts alone
    #[arg(long)]
    no_toggles: bool,
    /// the tool dispatches nothing from its callbacks
    #[arg(long)]
    no_reentrant: bool,
    /// skip restores between passes, to see the check fail
    #[arg(long)]
    no_restore: bool,
}

impl StressArgs {
    fn into_options(self) -> StressOptions {
        let defaults = StressOptions::default();
        let mut mix = defaults.mix;
        mix.opt_out &= !self.no_opt_out;
        mix.shared_queues &= !self.no_shared_queues;
        mix.alloc_free &= !self.no_alloc_free;
        mix.async_copy &= !self.no_async_copy;
        mix.memory_copy &= !self.no_memory_copy;
        mix.fill &= !self.no_fill;
        mix.peers &= !self.no_peers;
        StressOptions {
            seconds: self.seconds.unwrap_or(defaults.seconds),
            seed: self.seed.unwrap_or(defaults.seed),
            threads: self.threads.map_or(defaults.threads, |n| n as usize),
            faults: self.faults,
            mix,
            toggles: !self.no_toggles,
            reentrant: !self.no_reentrant,
            restore: !self.no_restore,
        }
    }
}

const RUN_ABOUT: &str = "kreplay run — replay every kernel of any program, on CUDA or ROCm\n\n\
    Runs PROGRAM with kreplay's library injected: CUDA_INJECTION64_PATH on CUDA, HSA_TOOLS_LIB on \
    ROCm. Without --tool, the built-in tool replays every kernel launch --passes times (the \
    application's own launch is pass 0; memory is restored between passes, so the program's \
    results are those of one run). With --tool, your tool library (kreplay.h) decides. \
    Afterwards a table per kernel: launches, passes run, snapshot bytes, snapshot tier, restore \
    strategy, restore time and declines (launches that ran once, by reason). --check runs PROGRAM \
    a second time without kreplay and compares the two standard outputs (for programs that print \
    their results' checksums).\n\n\
    kreplay's library is --library, else $KREPLAY_LIBRARY, else libkreplay.so beside the kreplay \
    executable or in ../lib from it.";

const RUN_USAGE: &str = "kreplay run [--passes N] [--tool PATH] [--backend auto|cuda|hsa] \
    [--scope agent|referenced] [--check] [-o FILE.csv|FILE.json] [--library PATH] -- PROGRAM \
    [ARGS...]";

/// Which runtime `kreplay run` injects into.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum BackendArg {
    /// CUDA if libcuda loads, else ROCm if libhsa-runtime64 loads
    Auto,
    /// CUDA (CUDA_INJECTION64_PATH)
    Cuda,
    /// ROCm (HSA_TOOLS_LIB)
    Hsa,
}

/// What a replay of `kreplay run` snapshots.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum ScopeArg {
    /// every tracked allocation of the launch's device, plus what the launch reaches
    Agent,
    /// only what the kernel's arguments and module variables reach
    Referenced,
}

#[derive(Args, Debug)]
struct RunArgs {
    #[command(flatten)]
    help: HelpFlag,
    /// passes per kernel launch of the built-in tool, 2 to 1024 (default 4)
    #[arg(
        long,
        value_name = "N",
        value_parser = count(2, 1024),
        conflicts_with = "tool",
        allow_negative_numbers = true
    )]
    passes: Option<u64>,
    /// your tool library (its kreplay_configure decides what is replayed)
    #[arg(long, value_name = "PATH", value_parser = file_path())]
    tool: Option<PathBuf>,
    /// auto (default), cuda or hsa
    #[arg(long, value_name = "BACKEND")]
    backend: Option<BackendArg>,
    /// run PROGRAM again without kreplay and compare standard output
    #[arg(long)]
    check: bool,
    /// also write the table to FILE, .csv or .json
    #[arg(short = 'o', long = "output", value_name = "FILE", value_parser = profile_output())]
    output: Option<PathBuf>,
    /// kreplay's library (libkreplay.so)
    #[arg(long, value_name = "PATH", value_parser = file_path())]
    library: Option<PathBuf>,
    /// what a replay snapshots: agent (every allocation of the device) or referenced (what
    /// the kernel's arguments and module variables reach); default: $KREPLAY_SNAPSHOT_SCOPE,
    /// else agent
    #[arg(long, value_name = "SCOPE")]
    scope: Option<ScopeArg>,
    /// the program and its arguments (after --)
    #[arg(
        last = true,
        value_name = "PROGRAM",
        required = true,
        num_args = 1..,
        allow_hyphen_values = true,
        value_parser = clap::value_parser!(OsString)
    )]
    program: Vec<OsString>,
}

impl RunArgs {
    fn into_options(self) -> crate::run::RunOptions {
        use crate::run::{Backend, RunOptions};
        RunOptions {
            passes: self.passes.unwrap_or(crate::run::DEFAULT_PASSES),
            tool: self.tool,
            backend: match self.backend {
                Some(BackendArg::Cuda) => Some(Backend::Cuda),
                Some(BackendArg::Hsa) => Some(Backend::Hsa),
                Some(BackendArg::Auto) | None => None,
            },
            check: self.check,
            output: self.output,
            library: self.library,
            scope: self.scope.map(|s| match s {
                ScopeArg::Agent => crate::run::Scope::Agent,
                ScopeArg::Referenced => crate::run::Scope::Referenced,
            }),
            program: self.program,
        }
    }
}

/// Default work-items of each classic kernel of `kreplay profile`.
pub const DEFAULT_PROFILE_ELEMENTS: u32 = 1 << 16;
/// Most work-items `kreplay profile` accepts per kernel.
pub const MAX_PROFILE_ELEMENTS: u32 = 1 << 26;

const PROFILE_ABOUT: &str = "kreplay profile — more counters than one pass allows, for every \
    dispatch\n\n\
    Runs WORKLOAD (saxpy, histogram, stencil, reduction, demo, all) on the software HSA runtime \
    under kreplay and counts hardware-like counters (SQ_WAVES, SQ_WORK_ITEMS, TCP_READ_BYTES, \
    TCC_ATOMIC, GRBM_DURATION_NS, ...). Each --pmc group is counted in one pass and must fit the \
    agent's per-pass limits (the error names the block and its limit); --counters lets the \
    planner split a flat list into the fewest passes. Kernel replay runs the workload once and \
    replays every dispatch once per group; application replay runs the workload once per group. \
    Prints a table per kernel (one row per dispatch, pass and counter: a counter in two groups \
    appears once per pass, never added up) and derived metrics computed from passes of the same \
    dispatch.";

const PROFILE_USAGE: &str = "kreplay profile --pmc A B [--pmc C D ...] [options] -- WORKLOAD";

/// How `kreplay profile` obtains its passes.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum ReplayModeArg {
    /// every dispatch replayed once per group, in one run
    Kernel,
    /// the workload run once per group
    Application,
}

#[derive(Args, Debug)]
struct ProfileArgs {
    #[command(flatten)]
    help: HelpFlag,
    /// one counter group, counted in one pass (repeat for more groups)
    #[arg(long = "pmc", value_name = "COUNTER", num_args = 1.., action = ArgAction::Append)]
    pmc: Vec<String>,
    /// a flat counter list, planned into the fewest passes (instead of --pmc)
    #[arg(long, value_name = "COUNTER", num_args = 1.., conflicts_with = "pmc")]
    counters: Option<Vec<String>>,
    /// kernel (default) or application
    #[arg(long, value_name = "MODE")]
    replay_mode: Option<ReplayModeArg>,
    /// also write every row (dispatch_id, replay_pass, run, group, kernel, agent, counter, value)
    /// to FILE, .csv or .json
    #[arg(short = 'o', long = "output", value_name = "FILE", value_parser = profile_output())]
    output: Option<PathBuf>,
    /// run both modes and say whether their values (GRBM_DURATION_NS excluded) and the
    /// workload's results are the same
    #[arg(long)]
    check: bool,
    /// work-items per classic kernel, 1 to 67108864 (default 65536)
    #[arg(long, value_name = "N", value_parser = count(1, u64::from(MAX_PROFILE_ELEMENTS)))]
    elements: Option<u64>,
    /// the workload: saxpy, histogram, stencil, reduction, demo or all (after --)
    #[arg(last = true, value_name = "WORKLOAD", required = true, num_args = 1)]
    workload: Vec<String>,
}

/// For `kreplay profile` arguments without a lone `--`: a workload named last without it, which
/// clap took as one more counter of `--pmc` or `--counters`, explained with the fix (`None` when
/// the last argument is no workload name or the counters were not the option before it).
fn profile_workload_without_separator(args: &[String]) -> Option<String> {
    use kreplay_workloads::profile::Workload;
    if args.iter().any(|a| a == "--") {
        return None;
    }
    let (last, before) = args.split_last()?;
    Workload::parse(last)?;
    // The option whose values run up to the last argument.
    let option = before.iter().rev().find(|a| a.starts_with('-'))?;
    let option = ["--pmc", "--counters"]
        .into_iter()
        .find(|o| option == o || option.starts_with(&format!("{o}=")))?;
    Some(format!(
        "no <WORKLOAD> after --: '{last}' was taken as a counter of {option}; put the workload \
         after --, as in: kreplay profile {option} ... -- {last}\n\nFor more information, try \
         'kreplay profile --help'."
    ))
}

/// The arguments before a lone `--` (what follows it is the workload).
fn args_before_workload(args: &[String]) -> Vec<String> {
    args.iter().take_while(|a| *a != "--").cloned().collect()
}

/// The `--pmc` groups as given: each occurrence's values, up to the next option (clap keeps
/// only their concatenation).
fn pmc_groups(args: &[String]) -> Vec<Vec<String>> {
    let mut groups = Vec::new();
    let mut current: Option<Vec<String>> = None;
    for arg in args {
        if arg == "--pmc" || arg.starts_with("--pmc=") {
            groups.extend(current.take());
            current = Some(
                arg.strip_prefix("--pmc=")
                    .map(str::to_owned)
                    .into_iter()
                    .collect(),
            );
        } else if arg.starts_with('-') {
            groups.extend(current.take());
        } else if let Some(group) = current.as_mut() {
            group.push(arg.clone());
        }
    }
    groups.extend(current);
    groups
}

impl ProfileArgs {
    fn into_options(self, given: &[String]) -> Result<crate::profile::ProfileOptions, String> {
        use crate::profile::{CounterRequest, ProfileOptions, ReplayMode};
        use kreplay_workloads::profile::Workload;
        if let [_, extra, ..] = self.workload.as_slice() {
            return Err(format!(
                "one workload after --, got {} ('{extra}' too): name one of {} (all runs every one)",
                self.workload.len(),
                Workload::NAMES
            ));
        }
        let name = self
            .workload
            .first()
            .map(String::as_str)
            .unwrap_or_default();
        let workload = Workload::parse(name)
            .ok_or_else(|| format!("unknown workload '{name}'; workloads: {}", Workload::NAMES))?;
        let counters = match self.counters {
            Some(flat) => CounterRequest::Flat(flat),
            None if self.pmc.is_empty() => {
                return Err(
                    "no counters given: use --pmc A B ... (one group per pass) or \
                            --counters A B ... (planned into passes)"
                        .into(),
                );
            }
            None => {
                let groups = pmc_groups(given);
                if groups.concat() != self.pmc {
                    return Err("cannot tell the --pmc groups apart".into());
                }
                CounterRequest::Groups(groups)
            }
        };
        Ok(ProfileOptions {
            counters,
            mode: match self.replay_mode {
                Some(ReplayModeArg::Application) => ReplayMode::Application,
                _ => ReplayMode::Kernel,
            },
            output: self.output,
            check: self.check,
            workload,
            elements: self.elements.map_or(DEFAULT_PROFILE_ELEMENTS, |n| n as u32),
        })
    }
}

/// A `kreplay profile` output file: a path ending in .csv or .json.
fn profile_output() -> impl TypedValueParser<Value = PathBuf> {
    file_path().try_map(
        |path: PathBuf| match path.extension().and_then(|e| e.to_str()) {
            Some(e) if e.eq_ignore_ascii_case("csv") || e.eq_ignore_ascii_case("json") => Ok(path),
            _ => Err("the output file must end in .csv or .json"),
        },
    )
}

/// A seed: any whole number from 0 to 2^64 - 1, digits only.
fn seed(value: &str) -> Result<u64, String> {
    value
        .parse::<u64>()
        .ok()
        .filter(|_| value.chars().all(|c| c.is_ascii_digit()))
        .ok_or_else(|| format!("expected a whole number from 0 to {}", u64::MAX))
}

/// A softhsa fault spec, checked now and kept as given.
fn fault_spec(value: &str) -> Result<String, String> {
    kreplay_softhsa::faults::FaultPlan::parse(value)
        .map(|_| value.to_string())
        .map_err(|e| e.to_string())
}

const COMPLETIONS_ABOUT: &str = "kreplay completions — a shell completion script for kreplay\n\n\
    Prints a script that completes kreplay's commands, options and option values in the given \
    shell. Load it for the current shell, or install it where the shell looks for completions:\n\n  \
    bash:  source <(kreplay completions bash)\n         \
    (or: kreplay completions bash > ~/.local/share/bash-completion/completions/kreplay)\n  \
    zsh:   kreplay completions zsh > \"${fpath[1]}/_kreplay\"\n  \
    fish:  kreplay completions fish > ~/.config/fish/completions/kreplay.fish";

#[derive(Args, Debug)]
struct CompletionsArgs {
    #[command(flatten)]
    help: HelpFlag,
    /// the shell to complete in
    #[arg(value_name = "SHELL", value_enum)]
    shell: clap_complete::Shell,
}

#[derive(Args, Debug)]
struct HelpArgs {
    #[command(flatten)]
    help: HelpFlag,
    /// the command whose help to show
    #[arg(
        value_name = "COMMAND",
        value_parser = [
            "demo",
            "bench",
            "bench-dispatch",
            "stress",
            "profile",
            "run",
            "completions",
            "help"
        ]
    )]
    command: Option<String>,
}

// ------------------------------------------------------------------------------------------------
// Values
// ------------------------------------------------------------------------------------------------

/// A parser of whole numbers within `min..=max` (see [`parse_count`]).
fn count(min: u64, max: u64) -> impl Fn(&str) -> Result<u64, String> + Clone + Send + Sync {
    move |value| parse_count(value, min, max)
}

/// A parser of comma-separated lists of what `item` parses.
fn list<T: PartialEq + Clone + Send + Sync + 'static>(
    item: fn(&str) -> Result<T, String>,
) -> impl Fn(&str) -> Result<List<T>, String> + Clone + Send + Sync {
    move |value| parse_list(value, item).map(List)
}

/// The inventories of `bench-dispatch --inventory`, or none.
fn inventories(value: &str) -> Result<List<usize>, String> {
    if value.trim() == "none" {
        return Ok(List(Vec::new()));
    }
    parse_list(value, |item| {
        parse_count(item, 1, MAX_INVENTORY as u64).map(|n| n as usize)
    })
    .map(List)
}

/// The pass counts of `--passes`, or none.
fn replay_passes(value: &str) -> Result<List<u64>, String> {
    if value.trim() == "none" {
        return Ok(List(Vec::new()));
    }
    parse_list(value, |item| {
        item.parse::<u64>()
            .ok()
            .filter(|n| (2..=MAX_REPLAY_PASSES).contains(n))
            .ok_or_else(|| format!("expected pass counts from 2 to {MAX_REPLAY_PASSES}, or none"))
    })
    .map(List)
}

fn parse_strategy(item: &str) -> Result<RestoreStrategy, String> {
    item.parse::<RestoreStrategy>().map_err(|_| {
        "expected full, hash, writeset, writeset-unverified, tracked or auto".to_string()
    })
}

fn parse_tier(item: &str) -> Result<StoreTier, String> {
    item.parse::<StoreTier>()
        .map_err(|_| "expected host, file, device or auto".to_string())
}

/// A tier of `kreplay bench --tiers`: a store tier, or `squeezed` (`--backend cuda` only: tier
/// auto while the bench holds the device's memory, so no shadow fits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BenchTierName {
    Store(StoreTier),
    Squeezed,
}

impl BenchTierName {
    fn store(self) -> Option<StoreTier> {
        match self {
            BenchTierName::Store(t) => Some(t),
            BenchTierName::Squeezed => None,
        }
    }
}

fn parse_bench_tier(item: &str) -> Result<BenchTierName, String> {
    if item.eq_ignore_ascii_case("squeezed") {
        return Ok(BenchTierName::Squeezed);
    }
    item.parse::<StoreTier>()
        .map(BenchTierName::Store)
        .map_err(|_| {
            "expected host, file, device or auto, or with --backend cuda device, host or squeezed"
                .to_string()
        })
}

/// A file path: anything but empty.
/// A path, whatever its bytes (a file name need not be UTF-8), but not empty.
fn file_path() -> impl TypedValueParser<Value = PathBuf> {
    clap::builder::OsStringValueParser::new().try_map(|value: std::ffi::OsString| {
        if value.is_empty() {
            Err("needs a file path")
        } else {
            Ok(PathBuf::from(value))
        }
    })
}

/// A comma-separated list whose items `item` parses; empty items and repeated items are errors.
fn parse_list<T: PartialEq>(
    value: &str,
    item: impl Fn(&str) -> Result<T, String>,
) -> Result<Vec<T>, String> {
    let mut items = Vec::new();
    for text in value.split(',').map(str::trim) {
        if text.is_empty() {
            return Err("empty item in the comma-separated list".into());
        }
        let parsed = item(text).map_err(|why| format!("'{text}': {why}"))?;
        if items.contains(&parsed) {
            return Err(format!("'{text}' is listed twice"));
        }
        items.push(parsed);
    }
    Ok(items)
}

/// A byte count with an optional binary unit: `4096`, `64K`, `16M`, `1G`, `1GiB`, `2T`, within
/// [`MIN_FOOTPRINT`]..=[`MAX_FOOTPRINT`].
fn parse_size(text: &str) -> Result<u64, String> {
    let expected = "expected a size like 16M, 256M or 1G";
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    if digits.is_empty() {
        return Err(expected.into());
    }
    let shift = kreplay_passloop::settings::binary_unit_shift(unit).ok_or(expected)?;
    let bytes = digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .ok_or_else(|| format!("too large (at most {}GiB)", MAX_FOOTPRINT >> 30))?;
    if bytes < MIN_FOOTPRINT {
        return Err(format!("too small (at least {}KiB)", MIN_FOOTPRINT >> 10));
    }
    if bytes > MAX_FOOTPRINT {
        return Err(format!("too large (at most {}GiB)", MAX_FOOTPRINT >> 30));
    }
    Ok(bytes)
}

/// A fraction above 0 and at most 1 (`0.01`), or a percentage with `%` (`1%`).
fn parse_fraction(text: &str) -> Result<f64, String> {
    let expected = "expected a fraction above 0 and at most 1 (0.01), or a percentage (1%)";
    let fraction = if text.ends_with('%') {
        parse_percent(text).map_err(|_| expected.to_string())? / 100.0
    } else {
        let plain = !text.is_empty()
            && text.chars().all(|c| c.is_ascii_digit() || c == '.')
            && text.chars().filter(|&c| c == '.').count() <= 1
            && text != ".";
        match text.parse::<f64>() {
            Ok(f) if plain => f,
            _ => return Err(expected.into()),
        }
    };
    if fraction > 0.0 && fraction <= 1.0 {
        Ok(fraction)
    } else {
        Err(expected.into())
    }
}

/// A percentage from 0 to 100, decimals allowed, with an optional `%`.
fn parse_percent(text: &str) -> Result<f64, String> {
    let number = text.strip_suffix('%').unwrap_or(text);
    let plain = !number.is_empty()
        && number.chars().all(|c| c.is_ascii_digit() || c == '.')
        && number.chars().filter(|&c| c == '.').count() <= 1
        && number != ".";
    match number.parse::<f64>() {
        Ok(p) if plain && (0.0..=100.0).contains(&p) => Ok(p),
        _ => Err("expected a percentage from 0 to 100".into()),
    }
}

/// A whole number within `min..=max`; `_` separators and a `k`/`K` (x1024) or `m`/`M`
/// (x1048576) suffix are accepted.
fn parse_count(value: &str, min: u64, max: u64) -> Result<u64, String> {
    let (digits, scale) = match value.chars().last() {
        Some('k' | 'K') => (&value[..value.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&value[..value.len() - 1], 1u64 << 20),
        _ => (value, 1),
    };
    let digits: String = digits.chars().filter(|&c| c != '_').collect();
    if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
        return Err(format!("expected a whole number from {min} to {max}"));
    }
    let number = digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .ok_or_else(|| format!("too large (at most {max})"))?;
    if number < min {
        return Err(format!("must be at least {min}"));
    }
    if number > max {
        return Err(format!("too large (at most {max})"));
    }
    Ok(number)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_takes_the_snapshot_scope_and_names_the_choices_on_a_bad_one() {
        let scope_of = |args: &[&str]| match parse(args.iter().copied()) {
            Ok(Command::Run(o)) => Ok(o.scope),
            Ok(_) => panic!("not a run"),
            Err(e) => Err(e.message),
        };
        assert_eq!(
            scope_of(&["run", "--scope", "referenced", "--", "app"]),
            Ok(Some(crate::run::Scope::Referenced))
        );
        assert_eq!(
            scope_of(&["run", "--scope", "agent", "--", "app"]),
            Ok(Some(crate::run::Scope::Agent))
        );
        assert_eq!(scope_of(&["run", "--", "app"]), Ok(None));
        let bad = scope_of(&["run", "--scope", "everything", "--", "app"]).unwrap_err();
        assert!(
            bad.contains("--scope") && bad.contains("referenced"),
            "{bad}"
        );
    }

    fn demo(args: &[&str]) -> Result<DemoOptions, UsageError> {
        let mut all = vec!["demo"];
        all.extend_from_slice(args);
        match parse(all)? {
            Command::Demo(options) => Ok(options),
            other => panic!("expected demo options, got {other:?}"),
        }
    }

    fn bench(args: &[&str]) -> Result<BenchOptions, UsageError> {
        let mut all = vec!["bench"];
        all.extend_from_slice(args);
        match parse(all)? {
            Command::Bench(options) => Ok(options),
            other => panic!("expected bench options, got {other:?}"),
        }
    }

    fn bench_dispatch(args: &[&str]) -> Result<DispatchBenchOptions, UsageError> {
        let mut all = vec!["bench-dispatch"];
        all.extend_from_slice(args);
        match parse(all)? {
            Command::BenchDispatch(options) => Ok(options),
            other => panic!("expected bench-dispatch options, got {other:?}"),
        }
    }

    fn printed(args: &[&str]) -> String {
        match parse(args.iter().copied()) {
            Ok(Command::Print(text)) => text,
            other => panic!("{args:?}: expected a text to print, got {other:?}"),
        }
    }

    #[test]
    fn demo_without_options_uses_the_defaults() {
        assert_eq!(demo(&[]).unwrap(), DemoOptions::default());
        assert_eq!(DemoOptions::default().passes, 4);
        assert!(DemoOptions::default().restore);
    }

    #[test]
    fn demo_options_are_read_in_both_spellings() {
        let options = demo(&[
            "--passes",
            "6",
            "--elements=64k",
            "--no-restore",
            "--json",
            "out.json",
            "--csv=out.csv",
            "--tool",
            "a.so",
            "--tool=b.so",
        ])
        .unwrap();
        assert_eq!(
            options,
            DemoOptions {
                passes: 6,
                restore: false,
                elements: 65536,
                json: Some(PathBuf::from("out.json")),
                csv: Some(PathBuf::from("out.csv")),
                tools: vec![PathBuf::from("a.so"), PathBuf::from("b.so")],
                passes_given: true,
            }
        );
    }

    #[test]
    fn an_option_needing_a_value_never_takes_the_next_option_and_is_blamed() {
        let error = demo(&["--csv", "--no-restore"]).unwrap_err().message;
        assert!(
            error.contains("a value is required for '--csv <PATH>'"),
            "{error}"
        );
        let error = demo(&["--passes", "--elements", "1k"]).unwrap_err().message;
        assert!(
            error.contains("a value is required for '--passes <N>'"),
            "{error}"
        );
        assert!(!error.contains("--elements"), "{error}");
        assert!(error.contains("'kreplay demo --help'"), "{error}");
    }

    #[test]
    fn only_the_tool_option_may_be_repeated() {
        let error = demo(&["--csv", "a.csv", "--csv", "b.csv"]).unwrap_err();
        assert!(
            error.message.contains("cannot be used multiple times"),
            "{error}"
        );
        assert!(demo(&["--tool"]).is_err());
        assert!(
            demo(&["--tool", ""])
                .unwrap_err()
                .message
                .contains("needs a file path")
        );
    }

    #[test]
    fn counts_accept_separators_and_binary_suffixes() {
        assert_eq!(demo(&["--elements", "1_000"]).unwrap().elements, 1000);
        assert_eq!(demo(&["--elements", "2M"]).unwrap().elements, 2 << 20);
        assert_eq!(demo(&["--passes", "1"]).unwrap().passes, 1);
    }

    #[test]
    fn bad_counts_name_the_option_and_the_value() {
        for (args, needle) in [
            (vec!["--passes", "0"], "at least 1"),
            (vec!["--passes", "65"], "at most 64"),
            (vec!["--passes", "four"], "whole number"),
            (vec!["--elements=", ""], "whole number"),
            (vec!["--elements", "99999999999999999999"], "too large"),
            (vec!["--elements", "1G"], "whole number"),
        ] {
            let error = demo(&args).unwrap_err();
            let text = error.to_string();
            assert!(text.contains(args[0].trim_end_matches('=')), "{text}");
            assert!(text.contains(needle), "{args:?}: {text}");
        }
        assert!(demo(&["--passes", "-3"]).is_err());
    }

    #[test]
    fn unknown_and_stray_arguments_are_errors() {
        for (args, needle) in [
            (
                vec!["demo", "--frobnicate"],
                "unexpected argument '--frobnicate'",
            ),
            (vec!["demo", "extra"], "unexpected argument 'extra'"),
            (vec!["demo", "--no-restore=yes"], "--no-restore"),
            (vec!["benchmark"], "unrecognized subcommand 'benchmark'"),
            (vec!["--passes", "3"], "unexpected argument '--passes'"),
            (vec!["help", "nope"], "invalid value 'nope'"),
            (
                vec![],
                "no command given; commands: demo, bench, bench-dispatch, stress, profile, run, \
                 completions, help",
            ),
        ] {
            let error = parse(args.iter().copied()).unwrap_err().message;
            assert!(error.contains(needle), "{args:?}: {error}");
            assert!(
                error.contains("--help'"),
                "{args:?} points at a help: {error}"
            );
        }
    }

    #[test]
    fn help_and_version_print_and_help_of_help_works() {
        let main = printed(&["--help"]);
        assert_eq!(printed(&["-h"]), main);
        assert_eq!(printed(&["help"]), main);
        for command in ["demo", "bench", "bench-dispatch", "stress", "profile"] {
            let text = printed(&[command, "--help"]);
            assert!(text.starts_with(&format!("kreplay {command} — ")), "{text}");
            assert_eq!(printed(&["help", command]), text);
            assert_eq!(printed(&[command, "-h"]), text);
            assert!(main.contains(&format!("  {command} ")), "{main}");
        }
        let help_help = printed(&["help", "--help"]);
        assert!(help_help.starts_with("kreplay help — "), "{help_help}");
        assert_eq!(printed(&["help", "help"]), help_help);
        assert_eq!(
            printed(&["-V"]),
            format!("kreplay {}\n", env!("CARGO_PKG_VERSION"))
        );
        assert_eq!(printed(&["--version"]), printed(&["-V"]));
    }

    #[test]
    fn the_replay_repetitions_help_states_the_defaults_the_bench_uses() {
        let help = help_of(Some("bench"))
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        let defaults = kreplay_benches::ReplayConfig::default();
        for (option, default) in [
            ("up to 8 passes", defaults.repeats),
            ("more than 8 passes", defaults.long_repeats),
        ] {
            let said = format!("{option}, 1 to 100 (default {default})");
            assert!(help.contains(&said), "the help should say {said:?}");
        }
    }

    #[test]
    fn every_option_is_in_its_commands_help() {
        for (command, options) in [
            (
                "demo",
                &[
                    "--passes",
                    "--no-restore",
                    "--elements",
                    "--json",
                    "--csv",
                    "--tool",
                ][..],
            ),
            (
                "bench",
                &[
                    "--footprints",
                    "--dirty",
                    "--strategies",
                    "--tiers",
                    "--repeats",
                    "--csv",
                    "--svg",
                    "--discrete",
                    "bench-dispatch",
                ][..],
            ),
            (
                "bench-dispatch",
                &[
                    "--allocations",
                    "--dispatches",
                    "--passes",
                    "--service",
                    "--csv",
                ][..],
            ),
            (
                "stress",
                &[
                    "--seconds",
                    "--seed",
                    "--threads",
                    "--faults",
                    "--no-opt-out",
                    "--no-shared-queues",
                    "--no-alloc-free",
                    "--no-async-copy",
                    "--no-memory-copy",
                    "--no-fill",
                    "--no-toggles",
                    "--no-reentrant",
                    "--no-restore",
                ][..],
            ),
        ] {
            let text = help_of(Some(command));
            for option in options {
                assert!(
                    text.contains(option),
                    "{option} missing from {command} help: {text}"
                );
            }
            assert!(text.contains("Exit status: 0"), "{text}");
        }
    }

    #[test]
    fn bench_lists_are_read_with_units_percentages_and_names() {
        let options = bench(&[
            "--footprints",
            "16M,256MiB,1G,4096",
            "--dirty=0,0.5,1%,100",
            "--strategies",
            "writeset,FULL",
            "--tiers",
            "device, host",
            "--repeats",
            "5",
            "--csv",
            "m.csv",
            "--svg=m.svg",
            "--discrete",
        ])
        .unwrap();
        assert_eq!(
            options,
            BenchOptions {
                footprints: vec![16 << 20, 256 << 20, 1 << 30, 4096],
                dirty_fractions: vec![0.0, 0.005, 0.01, 1.0],
                strategies: vec![RestoreStrategy::Writeset, RestoreStrategy::Full],
                tiers: vec![StoreTier::Device, StoreTier::Host],
                repeats: 5,
                csv: Some(PathBuf::from("m.csv")),
                svg: Some(PathBuf::from("m.svg")),
                discrete: true,
                ..BenchOptions::default()
            }
        );
        let replay = bench(&["--passes", "2,38", "--replay-dirty", "5"]).unwrap();
        assert_eq!(replay.replay_passes, vec![2, 38]);
        assert_eq!(replay.replay_dirty, vec![0.05]);
        assert!(
            bench(&["--passes", "none"])
                .unwrap()
                .replay_passes
                .is_empty()
        );
        assert!(bench(&["--passes", "1"]).is_err());
        let more = bench(&[
            "--footprints",
            "256M,1G",
            "--replay-footprints",
            "1G",
            "--replay-tiers",
            "host,file",
        ])
        .unwrap();
        assert_eq!(more.replay_footprints, Some(vec![1 << 30]));
        assert_eq!(more.replay_tiers, vec![StoreTier::Host, StoreTier::File]);
        let repeats = bench(&["--replay-repeats", "9", "--replay-long-repeats", "3"]).unwrap();
        assert_eq!(repeats.replay_repeats, (Some(9), Some(3)));
        assert!(bench(&["--replay-repeats", "0"]).is_err());
        let error = bench(&["--footprints", "256M", "--replay-footprints", "1G"]).unwrap_err();
        assert!(
            error
                .message
                .contains("--replay-footprints: 1GiB is not one of --footprints"),
            "{}",
            error.message
        );
        let defaults = bench(&[]).unwrap();
        assert_eq!(defaults.replay_footprints, None);
        assert_eq!(defaults.replay_tiers, vec![StoreTier::Host]);
        assert_eq!(defaults, BenchOptions::default());
        assert_eq!(defaults.footprints, vec![64 << 20, 256 << 20]);
        assert_eq!(defaults.dirty_fractions, vec![0.0, 0.01, 0.1, 1.0]);
    }

    #[test]
    fn bad_bench_values_name_the_option_and_the_item() {
        for (args, needle) in [
            (vec!["--footprints", "16X"], "'16X': expected a size"),
            (vec!["--footprints", "1K"], "'1K': too small"),
            (vec!["--footprints", "65G"], "'65G': too large"),
            (vec!["--footprints", "16M,,1G"], "empty item"),
            (vec!["--footprints", "1G,1024M"], "'1024M' is listed twice"),
            (
                vec!["--dirty", "101"],
                "'101': expected a percentage from 0 to 100",
            ),
            (vec!["--dirty", "-1"], "'-1': expected a percentage"),
            (vec!["--dirty", "1e1"], "'1e1': expected a percentage"),
            (
                vec!["--strategies", "fast"],
                "'fast': expected full, hash, writeset",
            ),
            (vec!["--tiers", "gpu"], "'gpu': expected host, file, device"),
            (vec!["--repeats", "0"], "at least 1"),
            (vec!["--svg", ""], "needs a file path"),
        ] {
            let error = bench(&args).unwrap_err();
            let text = error.to_string();
            assert!(text.contains(args[0]), "{text}");
            assert!(text.contains(needle), "{args:?}: {text}");
            assert!(text.contains("'kreplay bench --help'"), "{text}");
        }
        assert!(bench(&["--discrete=yes"]).is_err());
        assert!(
            bench(&["--fast"])
                .unwrap_err()
                .message
                .contains("unexpected argument '--fast'")
        );
        assert!(
            bench(&["--passes", "1"])
                .unwrap_err()
                .to_string()
                .contains("expected pass counts from 2")
        );
    }

    #[test]
    fn bench_dispatch_options_are_read_and_checked() {
        assert_eq!(
            bench_dispatch(&[]).unwrap(),
            DispatchBenchOptions::default()
        );
        let options = bench_dispatch(&[
            "--allocations",
            "0",
            "--dispatches=2k",
            "--passes",
            "3",
            "--service",
            "none",
            "--csv",
            "d.csv",
        ])
        .unwrap();
        assert_eq!(
            options,
            DispatchBenchOptions {
                allocations: 0,
                dispatches: 2048,
                passes: 3,
                service: DispatchService::None,
                inventories: DEFAULT_INVENTORIES.to_vec(),
                pin: false,
                csv: Some(PathBuf::from("d.csv")),
            }
        );
        let options = bench_dispatch(&["--inventory", "5,2k", "--pin"]).unwrap();
        assert_eq!((options.inventories, options.pin), (vec![5, 2048], true));
        let options = bench_dispatch(&["--inventory", "none"]).unwrap();
        assert!(options.inventories.is_empty());
        for (args, needle) in [
            (vec!["--passes", "1"], "at least 2"),
            (vec!["--dispatches", "5"], "at least 10"),
            (vec!["--allocations", "200000"], "too large"),
            (
                vec!["--service", "all"],
                "possible values: replay, none, overlap, handoff",
            ),
            (vec!["--inventory", "0"], "at least 1"),
            (vec!["--inventory", "10,10"], "listed twice"),
        ] {
            let error = bench_dispatch(&args).unwrap_err();
            assert!(error.message.contains(needle), "{args:?}: {error}");
            assert!(
                error.message.contains("'kreplay bench-dispatch --help'"),
                "{error}"
            );
        }
    }

    #[test]
    fn profile_pmc_groups_stay_apart_and_the_workload_follows_the_separator() {
        use crate::profile::{CounterRequest, ReplayMode};
        let Ok(Command::Profile(o)) = parse([
            "profile",
            "--pmc",
            "A",
            "B",
            "--pmc=C",
            "--pmc",
            "D",
            "--replay-mode",
            "application",
            "-o",
            "x.csv",
            "--check",
            "--elements",
            "5000",
            "--",
            "saxpy",
        ]) else {
            panic!("a valid profile command line");
        };
        let group = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            o.counters,
            CounterRequest::Groups(vec![group(&["A", "B"]), group(&["C"]), group(&["D"])])
        );
        assert_eq!(o.mode, ReplayMode::Application);
        assert!(o.check);
        assert_eq!(o.elements, 5000);
        assert_eq!(o.output, Some(PathBuf::from("x.csv")));
        let Ok(Command::Profile(o)) = parse(["profile", "--counters", "A", "B", "--", "all"])
        else {
            panic!("a valid flat profile command line");
        };
        assert_eq!(o.counters, CounterRequest::Flat(group(&["A", "B"])));
        assert_eq!(o.mode, ReplayMode::Kernel);
        assert!(parse(["profile", "--pmc", "A", "--counters", "B", "--", "all"]).is_err());
    }

    #[test]
    fn profile_refuses_more_than_one_workload_instead_of_running_the_first() {
        // `-- saxpy histogram` ran saxpy alone and said nothing of histogram.
        let error = parse(["profile", "--pmc", "A", "--", "saxpy", "histogram"]).unwrap_err();
        let message = error.to_string();
        assert!(
            message.contains("one workload") && message.contains("histogram"),
            "{message}"
        );
    }
}
