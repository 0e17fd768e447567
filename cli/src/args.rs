//! Command-line parsing (by hand: a few commands and options, each with a clear error).
//!
//! Every command is listed in [`COMMANDS`] (what `kreplay --help` prints) and has a variant in
//! [`Command`] and a help text in [`help_text`]; adding a command means adding to those three and
//! to the `match` in [`crate::run`].
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
//! ```

use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;

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

/// One entry of the command list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommandInfo {
    /// The word typed after `kreplay`.
    pub name: &'static str,
    /// One line for `kreplay --help`.
    pub summary: &'static str,
}

/// Every command, in the order `kreplay --help` lists them.
pub const COMMANDS: &[CommandInfo] = &[
    CommandInfo {
        name: "demo",
        summary: "replay every dispatch of a small HSA application in N passes on the software \
                  HSA runtime and verify its results against an unprofiled run",
    },
    CommandInfo {
        name: "bench",
        summary: "measure snapshot and restore (footprints x dirty fractions x strategies x \
                  tiers) beside memcpy and read ceilings measured in the same run",
    },
    CommandInfo {
        name: "bench-dispatch",
        summary: "measure the fixed cost kreplay adds per dispatch (replayed, opted out, no \
                  replay service) on the software HSA runtime",
    },
    CommandInfo {
        name: "stress",
        summary: "run many threads of seeded dispatches, copies, fills and allocations under \
                  kreplay (optionally with injected faults) and check every byte and completion \
                  against a run without kreplay",
    },
    CommandInfo {
        name: "help",
        summary: "show this help, or the help of one command (`kreplay help demo`)",
    },
];

/// What the command line asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// Print a help text.
    Help(HelpTopic),
    /// Print the version.
    Version,
    /// Run `kreplay demo`.
    Demo(DemoOptions),
    /// Run `kreplay bench`.
    Bench(BenchOptions),
    /// Run `kreplay bench-dispatch`.
    BenchDispatch(DispatchBenchOptions),
    /// Run `kreplay stress`.
    Stress(StressOptions),
}

/// Which help text to print.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HelpTopic {
    /// The command list.
    Main,
    /// `kreplay demo`.
    Demo,
    /// `kreplay bench`.
    Bench,
    /// `kreplay bench-dispatch`.
    BenchDispatch,
    /// `kreplay stress`.
    Stress,
}

impl HelpTopic {
    /// The topic of a command name (`demo`, `bench`, ...), if it has one.
    pub fn of_command(name: &str) -> Option<HelpTopic> {
        match name {
            "demo" => Some(HelpTopic::Demo),
            "bench" => Some(HelpTopic::Bench),
            "bench-dispatch" => Some(HelpTopic::BenchDispatch),
            "stress" => Some(HelpTopic::Stress),
            "help" => Some(HelpTopic::Main),
            _ => None,
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
        }
    }
}

/// Default seconds of `kreplay stress`.
pub const DEFAULT_STRESS_SECONDS: u64 = 10;
/// Most seconds `kreplay stress` accepts (one day).
pub const MAX_STRESS_SECONDS: u64 = 86_400;
/// Default application threads of `kreplay stress`.
pub const DEFAULT_STRESS_THREADS: usize = 8;
/// Most application threads `kreplay stress` accepts.
pub const MAX_STRESS_THREADS: usize = 256;

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
    /// Tracked bytes per matrix (`--footprints`).
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
            ],
            tiers: vec![StoreTier::Host, StoreTier::File, StoreTier::Device],
            repeats: DEFAULT_REPEATS,
            csv: None,
            svg: None,
            discrete: false,
        }
    }
}

/// Which services `kreplay bench-dispatch` configures in its process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DispatchService {
    /// A tool with the KERNEL_REPLAY service: replayed and opted-out dispatches are measured here,
    /// dispatches with no replay service in a child process (`--service none`).
    Replay,
    /// No tool and no service: only ordinary dispatches with no replay service are measured.
    None,
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
            csv: None,
        }
    }
}

/// A bad command line: what is wrong and which help to read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageError {
    /// What is wrong, one sentence.
    pub message: String,
    /// The help command to suggest (`kreplay --help`, `kreplay demo --help`).
    pub help: &'static str,
}

impl UsageError {
    fn main(message: impl Into<String>) -> Self {
        UsageError {
            message: message.into(),
            help: "kreplay --help",
        }
    }

    /// An error of the command whose help is `topic`.
    fn of(topic: HelpTopic, message: impl Into<String>) -> Self {
        UsageError {
            message: message.into(),
            help: match topic {
                HelpTopic::Main => "kreplay --help",
                HelpTopic::Demo => "kreplay demo --help",
                HelpTopic::Bench => "kreplay bench --help",
                HelpTopic::BenchDispatch => "kreplay bench-dispatch --help",
                HelpTopic::Stress => "kreplay stress --help",
            },
        }
    }
}

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (see '{}')", self.message, self.help)
    }
}

impl std::error::Error for UsageError {}

/// Parses the arguments after the program name.
pub fn parse<I, S>(args: I) -> Result<Command, UsageError>
where
    I: IntoIterator<Item = S>,
    S: Into<OsString>,
{
    let args = args
        .into_iter()
        .map(|arg| {
            let arg: OsString = arg.into();
            arg.into_string()
                .map_err(|raw| UsageError::main(format!("argument {raw:?} is not valid UTF-8")))
        })
        .collect::<Result<Vec<String>, UsageError>>()?;
    let Some((first, rest)) = args.split_first() else {
        return Err(UsageError::main(format!(
            "no command given; commands: {}",
            command_names()
        )));
    };
    match first.as_str() {
        "-h" | "--help" => Ok(Command::Help(HelpTopic::Main)),
        "-V" | "--version" => Ok(Command::Version),
        "help" => parse_help(rest),
        "demo" => parse_demo(rest),
        "bench" => parse_bench(rest),
        "bench-dispatch" => parse_bench_dispatch(rest),
        "stress" => parse_stress(rest),
        other if other.starts_with('-') => Err(UsageError::main(format!(
            "unknown option '{other}' (options go after the command)"
        ))),
        other => Err(UsageError::main(format!(
            "unknown command '{other}'; commands: {}",
            command_names()
        ))),
    }
}

fn command_names() -> String {
    COMMANDS
        .iter()
        .map(|c| c.name)
        .collect::<Vec<_>>()
        .join(", ")
}

fn parse_help(rest: &[String]) -> Result<Command, UsageError> {
    match rest {
        [] => Ok(Command::Help(HelpTopic::Main)),
        [topic] => HelpTopic::of_command(topic)
            .map(Command::Help)
            .ok_or_else(|| {
                UsageError::main(format!(
                    "no help for '{topic}'; commands: {}",
                    command_names()
                ))
            }),
        [_, extra, ..] => Err(UsageError::main(format!(
            "unexpected argument '{extra}' after the help topic"
        ))),
    }
}

/// One option a command accepts.
struct OptionSpec {
    name: &'static str,
    takes_value: bool,
    /// May be given more than once (each value is kept).
    repeatable: bool,
}

const fn flag(name: &'static str) -> OptionSpec {
    OptionSpec {
        name,
        takes_value: false,
        repeatable: false,
    }
}

const fn valued(name: &'static str) -> OptionSpec {
    OptionSpec {
        name,
        takes_value: true,
        repeatable: false,
    }
}

const fn repeated(name: &'static str) -> OptionSpec {
    OptionSpec {
        name,
        takes_value: true,
        repeatable: true,
    }
}

/// An option as given: its name and its value (`None` for a flag).
type GivenOption<'a> = (&'static str, Option<&'a str>);

/// Splits the arguments of `kreplay <command>` into options and their values (`--name value` or
/// `--name=value`), refusing unknown, repeated and stray arguments, missing values and values
/// given to flags. Returns `None` when `-h`/`--help` is among them.
fn read_options<'a>(
    topic: HelpTopic,
    command: &str,
    specs: &[OptionSpec],
    rest: &'a [String],
) -> Result<Option<Vec<GivenOption<'a>>>, UsageError> {
    if rest.iter().any(|arg| arg == "-h" || arg == "--help") {
        return Ok(None);
    }
    let error = |message: String| UsageError::of(topic, message);
    let mut options: Vec<GivenOption<'a>> = Vec::new();
    let mut args = rest.iter();
    while let Some(arg) = args.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((name, value)) if name.starts_with("--") => (name, Some(value)),
            _ => (arg.as_str(), None),
        };
        let Some(spec) = specs.iter().find(|spec| spec.name == name) else {
            return Err(if name.starts_with('-') {
                error(format!("unknown option '{name}' for 'kreplay {command}'"))
            } else {
                error(format!(
                    "unexpected argument '{arg}' for 'kreplay {command}'"
                ))
            });
        };
        if !spec.repeatable && options.iter().any(|(seen, _)| *seen == spec.name) {
            return Err(error(format!("option '{name}' given twice")));
        }
        let value = if spec.takes_value {
            Some(match inline {
                Some(value) => value,
                None => args
                    .next()
                    .map(String::as_str)
                    .ok_or_else(|| error(format!("option '{name}' needs a value")))?,
            })
        } else if inline.is_some() {
            return Err(error(format!("option '{name}' takes no value")));
        } else {
            None
        };
        options.push((spec.name, value));
    }
    Ok(Some(options))
}

fn parse_demo(rest: &[String]) -> Result<Command, UsageError> {
    const SPECS: [OptionSpec; 6] = [
        valued("--passes"),
        flag("--no-restore"),
        valued("--elements"),
        valued("--json"),
        valued("--csv"),
        repeated("--tool"),
    ];
    let Some(given) = read_options(HelpTopic::Demo, "demo", &SPECS, rest)? else {
        return Ok(Command::Help(HelpTopic::Demo));
    };
    let mut options = DemoOptions::default();
    for (name, value) in given {
        let value = value.unwrap_or_default();
        let topic = HelpTopic::Demo;
        match name {
            "--no-restore" => options.restore = false,
            "--passes" => {
                let passes = parse_count(topic, name, value, 1, u64::from(MAX_PASSES))?;
                options.passes = u32::try_from(passes).unwrap_or(MAX_PASSES);
            }
            "--elements" => {
                let elements = parse_count(topic, name, value, 1, MAX_ELEMENTS as u64)?;
                options.elements = usize::try_from(elements).unwrap_or(MAX_ELEMENTS);
            }
            "--json" => options.json = Some(parse_path(topic, name, value)?),
            "--csv" => options.csv = Some(parse_path(topic, name, value)?),
            "--tool" => options.tools.push(parse_path(topic, name, value)?),
            _ => unreachable!("every demo option is handled above"),
        }
    }
    Ok(Command::Demo(options))
}

fn parse_bench(rest: &[String]) -> Result<Command, UsageError> {
    const SPECS: [OptionSpec; 8] = [
        valued("--footprints"),
        valued("--dirty"),
        valued("--strategies"),
        valued("--tiers"),
        valued("--repeats"),
        valued("--csv"),
        valued("--svg"),
        flag("--discrete"),
    ];
    let topic = HelpTopic::Bench;
    let Some(given) = read_options(topic, "bench", &SPECS, rest)? else {
        return Ok(Command::Help(topic));
    };
    let mut options = BenchOptions::default();
    for (name, value) in given {
        let value = value.unwrap_or_default();
        match name {
            "--footprints" => options.footprints = parse_list(topic, name, value, parse_size)?,
            "--dirty" => {
                options.dirty_fractions = parse_list(topic, name, value, parse_percent)?
                    .into_iter()
                    .map(|p| p / 100.0)
                    .collect();
            }
            "--strategies" => {
                options.strategies = parse_list(topic, name, value, |item| {
                    item.parse::<RestoreStrategy>()
                        .map_err(|_| "expected full, hash, writeset or auto".to_string())
                })?;
            }
            "--tiers" => {
                options.tiers = parse_list(topic, name, value, |item| {
                    item.parse::<StoreTier>()
                        .map_err(|_| "expected host, file, device or auto".to_string())
                })?;
            }
            "--repeats" => {
                let repeats = parse_count(topic, name, value, 1, MAX_REPEATS as u64)?;
                options.repeats = usize::try_from(repeats).unwrap_or(MAX_REPEATS);
            }
            "--csv" => options.csv = Some(parse_path(topic, name, value)?),
            "--svg" => options.svg = Some(parse_path(topic, name, value)?),
            "--discrete" => options.discrete = true,
            _ => unreachable!("every bench option is handled above"),
        }
    }
    Ok(Command::Bench(options))
}

fn parse_bench_dispatch(rest: &[String]) -> Result<Command, UsageError> {
    const SPECS: [OptionSpec; 5] = [
        valued("--allocations"),
        valued("--dispatches"),
        valued("--passes"),
        valued("--service"),
        valued("--csv"),
    ];
    let topic = HelpTopic::BenchDispatch;
    let Some(given) = read_options(topic, "bench-dispatch", &SPECS, rest)? else {
        return Ok(Command::Help(topic));
    };
    let mut options = DispatchBenchOptions::default();
    for (name, value) in given {
        let value = value.unwrap_or_default();
        match name {
            "--allocations" => {
                let n = parse_count(topic, name, value, 0, MAX_ALLOCATIONS as u64)?;
                options.allocations = usize::try_from(n).unwrap_or(MAX_ALLOCATIONS);
            }
            "--dispatches" => {
                let n = parse_count(
                    topic,
                    name,
                    value,
                    MIN_DISPATCHES as u64,
                    MAX_DISPATCHES as u64,
                )?;
                options.dispatches = usize::try_from(n).unwrap_or(MAX_DISPATCHES);
            }
            "--passes" => {
                options.passes = parse_count(topic, name, value, 2, u64::from(MAX_PASSES))?
            }
            "--service" => {
                options.service = match value {
                    "replay" => DispatchService::Replay,
                    "none" => DispatchService::None,
                    _ => {
                        return Err(UsageError::of(
                            topic,
                            format!(
                                "invalid value '{value}' for '--service': expected replay or none"
                            ),
                        ));
                    }
                };
            }
            "--csv" => options.csv = Some(parse_path(topic, name, value)?),
            _ => unreachable!("every bench-dispatch option is handled above"),
        }
    }
    Ok(Command::BenchDispatch(options))
}

fn parse_stress(rest: &[String]) -> Result<Command, UsageError> {
    const SPECS: [OptionSpec; 13] = [
        valued("--seconds"),
        valued("--seed"),
        valued("--threads"),
        valued("--faults"),
        flag("--no-opt-out"),
        flag("--no-shared-queues"),
        flag("--no-alloc-free"),
        flag("--no-async-copy"),
        flag("--no-memory-copy"),
        flag("--no-fill"),
        flag("--no-toggles"),
        flag("--no-reentrant"),
        flag("--no-restore"),
    ];
    let topic = HelpTopic::Stress;
    let Some(given) = read_options(topic, "stress", &SPECS, rest)? else {
        return Ok(Command::Help(topic));
    };
    let mut options = StressOptions::default();
    for (name, value) in given {
        let value = value.unwrap_or_default();
        match name {
            "--seconds" => {
                options.seconds = parse_count(topic, name, value, 1, MAX_STRESS_SECONDS)?;
            }
            "--seed" => {
                options.seed = value.parse().map_err(|_| {
                    UsageError::of(
                        topic,
                        format!("invalid value '{value}' for '--seed': expected a whole number from 0 to {}", u64::MAX),
                    )
                })?;
            }
            "--threads" => {
                let n = parse_count(topic, name, value, 1, MAX_STRESS_THREADS as u64)?;
                options.threads = usize::try_from(n).unwrap_or(MAX_STRESS_THREADS);
            }
            "--faults" => {
                kreplay_softhsa::faults::FaultPlan::parse(value).map_err(|e| {
                    UsageError::of(
                        topic,
                        format!("invalid value '{value}' for '--faults': {e}"),
                    )
                })?;
                options.faults = Some(value.to_string());
            }
            "--no-opt-out" => options.mix.opt_out = false,
            "--no-shared-queues" => options.mix.shared_queues = false,
            "--no-alloc-free" => options.mix.alloc_free = false,
            "--no-async-copy" => options.mix.async_copy = false,
            "--no-memory-copy" => options.mix.memory_copy = false,
            "--no-fill" => options.mix.fill = false,
            "--no-toggles" => options.toggles = false,
            "--no-reentrant" => options.reentrant = false,
            "--no-restore" => options.restore = false,
            _ => unreachable!("every stress option is handled above"),
        }
    }
    Ok(Command::Stress(options))
}

/// A comma-separated list whose items `item` parses; empty items and repeated items are errors.
fn parse_list<T: PartialEq>(
    topic: HelpTopic,
    option: &str,
    value: &str,
    item: impl Fn(&str) -> Result<T, String>,
) -> Result<Vec<T>, UsageError> {
    let bad = |why: String| {
        UsageError::of(
            topic,
            format!("invalid value '{value}' for '{option}': {why}"),
        )
    };
    let mut items = Vec::new();
    for text in value.split(',').map(str::trim) {
        if text.is_empty() {
            return Err(bad("empty item in the comma-separated list".into()));
        }
        let parsed = item(text).map_err(|why| bad(format!("'{text}': {why}")))?;
        if items.contains(&parsed) {
            return Err(bad(format!("'{text}' is listed twice")));
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
    let shift = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => return Err(expected.into()),
    };
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

/// A whole number within `min..=max`; `_` separators and a `k`/`K` (×1024) or `m`/`M`
/// (×1048576) suffix are accepted.
fn parse_count(
    topic: HelpTopic,
    option: &str,
    value: &str,
    min: u64,
    max: u64,
) -> Result<u64, UsageError> {
    let bad = |why: String| {
        UsageError::of(
            topic,
            format!("invalid value '{value}' for '{option}': {why}"),
        )
    };
    let (digits, scale) = match value.chars().last() {
        Some('k' | 'K') => (&value[..value.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&value[..value.len() - 1], 1u64 << 20),
        _ => (value, 1),
    };
    let digits: String = digits.chars().filter(|&c| c != '_').collect();
    if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
        return Err(bad(format!("expected a whole number from {min} to {max}")));
    }
    let number = digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .ok_or_else(|| bad(format!("too large (at most {max})")))?;
    if number < min {
        return Err(bad(format!("must be at least {min}")));
    }
    if number > max {
        return Err(bad(format!("too large (at most {max})")));
    }
    Ok(number)
}

fn parse_path(topic: HelpTopic, option: &str, value: &str) -> Result<PathBuf, UsageError> {
    if value.is_empty() {
        return Err(UsageError::of(
            topic,
            format!("option '{option}' needs a file path"),
        ));
    }
    Ok(PathBuf::from(value))
}

/// The help text of `topic`.
pub fn help_text(topic: HelpTopic) -> String {
    match topic {
        HelpTopic::Stress => format!(
            "kreplay stress — nothing lost under many threads, queues, agents and faults\n\n\
             Usage: kreplay stress [options]\n\n\
             Installs kreplay in this process on the software HSA runtime with a tool that replays\n\
             some dispatches in 2 to 4 passes and opts the others out, toggles its contexts in\n\
             every pass and dispatches from inside its callbacks. N application threads, each\n\
             owning buffers on 2 GPU agents, run a seeded mix of dispatches (private and shared\n\
             queues), temporary allocations, async copies, hsa_memory_copy and fills for the\n\
             given time. The same operations then run without kreplay and without faults, and\n\
             every buffer is compared. Prints operations, replays, passes, bytes restored,\n\
             declines per reason, restore failures and the faults that struck.\n\n\
             Options:\n\
             \x20 --seconds S         how long the threads run under kreplay, 1 to {MAX_STRESS_SECONDS}\n\
             \x20                     (default {DEFAULT_STRESS_SECONDS})\n\
             \x20 --seed X            seed of the operations and of the faults (default 1)\n\
             \x20 --threads N         application threads, 1 to {MAX_STRESS_THREADS} (default {DEFAULT_STRESS_THREADS})\n\
             \x20 --faults SPEC       softhsa fault injection, e.g. copy:0.01,signal_create:0.001,\n\
             \x20                     pool_allocate:0.01,async_copy:0.01,slow_kernel:0.01@20,\n\
             \x20                     queue_stall:0.001@500,async_copy_delay:0.05@5[,seed:N]\n\
             \x20                     (default: KREPLAY_SOFTHSA_FAULTS; a spec without seed uses --seed)\n\
             \x20 --no-opt-out        every dispatch asks to be replayed\n\
             \x20 --no-shared-queues  only private queues\n\
             \x20 --no-alloc-free     no temporary allocations\n\
             \x20 --no-async-copy     no hsa_amd_memory_async_copy\n\
             \x20 --no-memory-copy    no hsa_memory_copy\n\
             \x20 --no-fill           no hsa_amd_memory_fill\n\
             \x20 --no-toggles        the tool leaves its contexts alone\n\
             \x20 --no-reentrant      the tool dispatches nothing from its callbacks\n\
             \x20 --no-restore        skip restores between passes, to see the check fail\n\
             \x20 -h, --help          show this help\n\n\
             Exit status: 0 when every buffer equals the reference and every completion fired\n\
             exactly once, 1 otherwise (a reproducing command line is printed), 2 for a bad\n\
             command line.\n"
        ),
        HelpTopic::Main => {
            let width = COMMANDS.iter().map(|c| c.name.len()).max().unwrap_or(0);
            let mut text = String::from(
                "kreplay — kernel replay for GPU profilers\n\n\
                 Usage: kreplay <command> [options]\n\nCommands:\n",
            );
            for command in COMMANDS {
                text.push_str(&format!("  {:width$}  {}\n", command.name, command.summary));
            }
            text.push_str(
                "\nOptions:\n  -h, --help     show this help\n  -V, --version  show the version\n\n\
                 Run 'kreplay <command> --help' for the options of one command.\n",
            );
            text
        }
        HelpTopic::Demo => format!(
            "kreplay demo — kernel replay on the software HSA runtime, verified\n\n\
             Usage: kreplay demo [options]\n\n\
             Runs a small HSA application (in-place updates, atomics, a kernel reading one buffer\n\
             and writing another; every dispatch depends on the previous results) twice: once\n\
             unprofiled, once under a tool that replays every dispatch in N passes with a\n\
             different tracing context active on each pass. Prints one row per dispatch and\n\
             checks that the profiled results equal the unprofiled ones.\n\n\
             Options:\n\
             \x20 --passes N     passes per dispatch, 1 to {MAX_PASSES} (default {DEFAULT_PASSES}; 1 = no replay)\n\
             \x20 --no-restore   replay without restoring memory between passes, to show the\n\
             \x20                wrong answer that restore prevents (verification fails)\n\
             \x20 --elements N   u32 elements per buffer, 1 to {MAX_ELEMENTS} (default {DEFAULT_ELEMENTS});\n\
             \x20                k/M suffixes multiply by 1024 / 1048576\n\
             \x20 --json PATH    write every dispatch and pass record as JSON\n\
             \x20 --csv PATH     write one CSV row per pass (column replay_pass)\n\
             \x20 --tool PATH    load a tool library (a C tool defining kreplay_configure, see\n\
             \x20                docs/c-tools.md) against this process's kreplay; repeatable,\n\
             \x20                and KREPLAY_TOOL_LIBRARIES adds more. If it configures kernel\n\
             \x20                replay, it chooses the passes and the demo's tool only observes\n\
             \x20 -h, --help     show this help\n\n\
             Exit status: 0 when verification passes, 1 when it fails (or a dispatch was not\n\
             replayed as planned, or a requested tool cannot be used), 2 for a bad command line.\n"
        ),
        HelpTopic::Bench => format!(
            "kreplay bench — snapshot and restore cost beside ceilings measured in the same run\n\n\
             Usage: kreplay bench [options]\n\n\
             For every footprint: measures the ceilings (memcpy of the footprint, a parallel read\n\
             pass, one-thread xxh3), then for every store tier and restore strategy a snapshot\n\
             (first and steady-state) and, for every dirty fraction, a steady-state restore after a\n\
             pass that changed that fraction of the 64 KiB chunks. The device is host memory split\n\
             into 4 tracked allocations. Prints one row per measurement with the ceiling beside it,\n\
             then the design's targets judged from this run's rows.\n\n\
             Options:\n\
             \x20 --footprints LIST  comma list of sizes (K/M/G/T = KiB/MiB/GiB/TiB), {}K to {}G\n\
             \x20                    (default 64M,256M)\n\
             \x20 --dirty LIST       comma list of dirty percentages, 0 to 100 (default 0,1,10,100)\n\
             \x20 --strategies LIST  restore strategies: full, hash, writeset, auto\n\
             \x20                    (default full,hash,writeset)\n\
             \x20 --tiers LIST       snapshot store tiers: host, file, device, auto\n\
             \x20                    (default host,file,device)\n\
             \x20 --repeats N        timed repetitions per measurement, best kept, 1 to {MAX_REPEATS}\n\
             \x20                    (default {DEFAULT_REPEATS})\n\
             \x20 --csv PATH         write every row as CSV\n\
             \x20 --svg PATH         write a plot of restore time against dirty fraction (largest\n\
             \x20                    footprint) with the memcpy ceiling\n\
             \x20 --discrete         a device without host windows, reached through reads and\n\
             \x20                    writes only, like a GPU behind PCIe\n\
             \x20 -h, --help         show this help\n\n\
             The matrix needs about 3x the largest footprint of free memory (and the footprint\n\
             again on disk for the file tier). The fixed cost per dispatch is measured by\n\
             'kreplay bench-dispatch'.\n\n\
             Exit status: 0 when the matrix ran (targets not met are reported, not failures), 1\n\
             when it could not run or its output could not be written, 2 for a bad command line.\n",
            MIN_FOOTPRINT >> 10,
            MAX_FOOTPRINT >> 30,
        ),
        HelpTopic::BenchDispatch => format!(
            "kreplay bench-dispatch — the fixed cost kreplay adds per dispatch, on softhsa\n\n\
             Usage: kreplay bench-dispatch [options]\n\n\
             Installs kreplay in this process on the software HSA runtime (as the demo does) with a\n\
             minimal tool that owns the KERNEL_REPLAY service, and times dispatches of an empty\n\
             kernel (one work-item) submitted and waited for one at a time, round-robin over:\n\
             \x20 - a queue of softhsa's own table (no interception, no kreplay): the baseline;\n\
             \x20 - an intercept queue of softhsa's own table with a pass-through handler\n\
             \x20   (softhsa's interception machinery alone);\n\
             \x20 - an intercept queue of softhsa's own table whose handler runs the dispatch\n\
             \x20   N times and waits for each run, as a replay loop must, with nothing else;\n\
             \x20 - a queue of the table kreplay is installed in, the tool answering N passes\n\
             \x20   (a: replayed), and the same queue with the tool leaving the pass-count\n\
             \x20   callback NULL (b: opted out).\n\
             The replayed dispatch's agent owns one 4 KiB coarse-grained buffer while the other\n\
             tracked allocations are fine-grained, kernarg or on the other agent, so the snapshot\n\
             is tiny and the inventory walk is what costs. (c), an ordinary dispatch with no replay\n\
             service configured, needs a process without one: it is measured in a child process\n\
             started as 'kreplay bench-dispatch --service none'. Medians are reported, with\n\
             kreplay's own timing of its replay loop beside them.\n\n\
             Round trips include thread wake-ups, which on a virtual machine can cost tens of\n\
             µs when they cross vCPUs; 'taskset -c 0 kreplay bench-dispatch' keeps every thread\n\
             on one CPU and takes that out.\n\n\
             Options:\n\
             \x20 --allocations N  tracked allocations besides the 4 KiB buffer, 0 to {MAX_ALLOCATIONS}\n\
             \x20                  (default {DEFAULT_ALLOCATIONS})\n\
             \x20 --dispatches N   timed dispatches per configuration, {MIN_DISPATCHES} to {MAX_DISPATCHES}\n\
             \x20                  (default {DEFAULT_DISPATCHES})\n\
             \x20 --passes N       passes of the replayed dispatch, 2 to {MAX_PASSES} (default {DEFAULT_DISPATCH_PASSES})\n\
             \x20 --service S      replay: measure (a) and (b) here and (c) in a child process\n\
             \x20                  (default); none: configure no tool and measure only (c)\n\
             \x20 --csv PATH       write every figure as CSV (nanoseconds)\n\
             \x20 -h, --help       show this help\n\n\
             Exit status: 0 when the measurements ran (targets not met are reported, not\n\
             failures), 1 when they could not run, 2 for a bad command line.\n"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn demo(args: &[&str]) -> Result<DemoOptions, UsageError> {
        let mut all = vec!["demo"];
        all.extend_from_slice(args);
        match parse(all)? {
            Command::Demo(options) => Ok(options),
            other => panic!("expected a demo command, got {other:?}"),
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
            }
        );
    }

    #[test]
    fn only_the_tool_option_may_be_repeated() {
        let error = demo(&["--csv", "a.csv", "--csv", "b.csv"]).unwrap_err();
        assert!(error.to_string().contains("given twice"), "{error}");
        assert!(demo(&["--tool"]).is_err());
        assert!(demo(&["--tool", ""]).is_err());
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
            (vec!["--passes", "-3"], "whole number"),
            (vec!["--elements", ""], "whole number"),
            (vec!["--elements", "99999999999999999999"], "too large"),
            (vec!["--elements", "1G"], "whole number"),
        ] {
            let error = demo(&args).unwrap_err();
            let text = error.to_string();
            assert!(text.contains(args[0]), "{text}");
            assert!(text.contains(needle), "{text}");
            assert!(text.contains(&format!("'{}'", args[1])), "{text}");
            assert_eq!(error.help, "kreplay demo --help");
        }
    }

    #[test]
    fn unknown_missing_repeated_and_stray_arguments_are_errors() {
        let message = |args: &[&str]| demo(args).unwrap_err().message;
        assert_eq!(
            message(&["--fast"]),
            "unknown option '--fast' for 'kreplay demo'"
        );
        assert_eq!(message(&["--passes"]), "option '--passes' needs a value");
        assert_eq!(
            message(&["--passes", "2", "--passes=3"]),
            "option '--passes' given twice"
        );
        assert_eq!(
            message(&["extra"]),
            "unexpected argument 'extra' for 'kreplay demo'"
        );
        assert_eq!(
            message(&["--no-restore=yes"]),
            "option '--no-restore' takes no value"
        );
        assert_eq!(message(&["--json="]), "option '--json' needs a file path");
    }

    #[test]
    fn top_level_words_select_commands_help_and_version() {
        assert_eq!(parse(["--help"]).unwrap(), Command::Help(HelpTopic::Main));
        assert_eq!(parse(["help"]).unwrap(), Command::Help(HelpTopic::Main));
        assert_eq!(
            parse(["help", "demo"]).unwrap(),
            Command::Help(HelpTopic::Demo)
        );
        assert_eq!(
            parse(["demo", "--passes", "x", "--help"]).unwrap(),
            Command::Help(HelpTopic::Demo)
        );
        assert_eq!(parse(["-V"]).unwrap(), Command::Version);
        let none: [&str; 0] = [];
        assert!(parse(none).unwrap_err().message.contains("no command"));
        let unknown = parse(["benchmark"]).unwrap_err();
        assert!(unknown.message.contains("unknown command 'benchmark'"));
        assert!(unknown.message.contains("demo"));
        assert!(parse(["help", "nope"]).is_err());
        assert!(
            parse(["--passes", "3"])
                .unwrap_err()
                .message
                .contains("after the command")
        );
    }

    fn bench(args: &[&str]) -> Result<BenchOptions, UsageError> {
        let mut all = vec!["bench"];
        all.extend_from_slice(args);
        match parse(all)? {
            Command::Bench(options) => Ok(options),
            other => panic!("expected a bench command, got {other:?}"),
        }
    }

    fn bench_dispatch(args: &[&str]) -> Result<DispatchBenchOptions, UsageError> {
        let mut all = vec!["bench-dispatch"];
        all.extend_from_slice(args);
        match parse(all)? {
            Command::BenchDispatch(options) => Ok(options),
            other => panic!("expected a bench-dispatch command, got {other:?}"),
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
            }
        );
        let defaults = bench(&[]).unwrap();
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
            assert_eq!(error.help, "kreplay bench --help");
        }
        assert_eq!(
            bench(&["--discrete=yes"]).unwrap_err().message,
            "option '--discrete' takes no value"
        );
        assert_eq!(
            bench(&["--passes", "2"]).unwrap_err().message,
            "unknown option '--passes' for 'kreplay bench'"
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
                csv: Some(PathBuf::from("d.csv")),
            }
        );
        for (args, needle) in [
            (vec!["--passes", "1"], "at least 2"),
            (vec!["--dispatches", "5"], "at least 10"),
            (vec!["--allocations", "200000"], "too large"),
            (vec!["--service", "all"], "expected replay or none"),
        ] {
            let error = bench_dispatch(&args).unwrap_err();
            assert!(error.message.contains(needle), "{args:?}: {error}");
            assert_eq!(error.help, "kreplay bench-dispatch --help");
        }
        assert_eq!(
            parse(["bench-dispatch", "--dispatches", "x", "-h"]).unwrap(),
            Command::Help(HelpTopic::BenchDispatch)
        );
        assert_eq!(
            parse(["help", "bench"]).unwrap(),
            Command::Help(HelpTopic::Bench)
        );
    }

    #[test]
    fn main_help_lists_every_command() {
        let text = help_text(HelpTopic::Main);
        for command in COMMANDS {
            assert!(text.contains(command.name), "{} missing", command.name);
        }
        let demo = help_text(HelpTopic::Demo);
        for option in ["--passes", "--no-restore", "--elements", "--json", "--csv"] {
            assert!(demo.contains(option), "{option} missing from demo help");
        }
        let bench = help_text(HelpTopic::Bench);
        for option in [
            "--footprints",
            "--dirty",
            "--strategies",
            "--tiers",
            "--repeats",
            "--csv",
            "--svg",
            "--discrete",
            "bench-dispatch",
        ] {
            assert!(bench.contains(option), "{option} missing from bench help");
        }
        let dispatch = help_text(HelpTopic::BenchDispatch);
        for option in [
            "--allocations",
            "--dispatches",
            "--passes",
            "--service",
            "--csv",
        ] {
            assert!(
                dispatch.contains(option),
                "{option} missing from bench-dispatch help"
            );
        }
    }
}
