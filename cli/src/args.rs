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
        name: "help",
        summary: "show this help, or the help of one command (`kreplay help demo`)",
    },
];

/// What the command line asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Print a help text.
    Help(HelpTopic),
    /// Print the version.
    Version,
    /// Run `kreplay demo`.
    Demo(DemoOptions),
}

/// Which help text to print.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HelpTopic {
    /// The command list.
    Main,
    /// `kreplay demo`.
    Demo,
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
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions {
            passes: DEFAULT_PASSES,
            restore: true,
            elements: DEFAULT_ELEMENTS,
            json: None,
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

    fn demo(message: impl Into<String>) -> Self {
        UsageError {
            message: message.into(),
            help: "kreplay demo --help",
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
        [topic] if topic == "demo" => Ok(Command::Help(HelpTopic::Demo)),
        [topic] if topic == "help" => Ok(Command::Help(HelpTopic::Main)),
        [topic] => Err(UsageError::main(format!(
            "no help for '{topic}'; commands: {}",
            command_names()
        ))),
        [_, extra, ..] => Err(UsageError::main(format!(
            "unexpected argument '{extra}' after the help topic"
        ))),
    }
}

fn parse_demo(rest: &[String]) -> Result<Command, UsageError> {
    if rest.iter().any(|arg| arg == "-h" || arg == "--help") {
        return Ok(Command::Help(HelpTopic::Demo));
    }
    let mut options = DemoOptions::default();
    let mut seen: Vec<&str> = Vec::new();
    let mut args = rest.iter();
    while let Some(arg) = args.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((name, value)) if name.starts_with("--") => (name, Some(value)),
            _ => (arg.as_str(), None),
        };
        let known = ["--passes", "--no-restore", "--elements", "--json", "--csv"];
        let Some(&name) = known.iter().find(|&&k| k == name) else {
            return Err(if name.starts_with('-') {
                UsageError::demo(format!("unknown option '{name}' for 'kreplay demo'"))
            } else {
                UsageError::demo(format!("unexpected argument '{arg}' for 'kreplay demo'"))
            });
        };
        if seen.contains(&name) {
            return Err(UsageError::demo(format!("option '{name}' given twice")));
        }
        seen.push(name);
        if name == "--no-restore" {
            if inline.is_some() {
                return Err(UsageError::demo("option '--no-restore' takes no value"));
            }
            options.restore = false;
            continue;
        }
        let value = match inline {
            Some(value) => value,
            None => args
                .next()
                .map(String::as_str)
                .ok_or_else(|| UsageError::demo(format!("option '{name}' needs a value")))?,
        };
        match name {
            "--passes" => {
                let passes = parse_count(name, value, 1, u64::from(MAX_PASSES))?;
                options.passes = u32::try_from(passes).unwrap_or(MAX_PASSES);
            }
            "--elements" => {
                let elements = parse_count(name, value, 1, MAX_ELEMENTS as u64)?;
                options.elements = usize::try_from(elements).unwrap_or(MAX_ELEMENTS);
            }
            "--json" => options.json = Some(parse_path(name, value)?),
            "--csv" => options.csv = Some(parse_path(name, value)?),
            _ => unreachable!("every known option is handled above"),
        }
    }
    Ok(Command::Demo(options))
}

/// A whole number within `min..=max`; `_` separators and a `k`/`K` (×1024) or `m`/`M`
/// (×1048576) suffix are accepted.
fn parse_count(option: &str, value: &str, min: u64, max: u64) -> Result<u64, UsageError> {
    let bad =
        |why: String| UsageError::demo(format!("invalid value '{value}' for '{option}': {why}"));
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

fn parse_path(option: &str, value: &str) -> Result<PathBuf, UsageError> {
    if value.is_empty() {
        return Err(UsageError::demo(format!(
            "option '{option}' needs a file path"
        )));
    }
    Ok(PathBuf::from(value))
}

/// The help text of `topic`.
pub fn help_text(topic: HelpTopic) -> String {
    match topic {
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
             \x20 -h, --help     show this help\n\n\
             Exit status: 0 when verification passes, 1 when it fails (or a dispatch was not\n\
             replayed as planned), 2 for a bad command line.\n"
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
            }
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
    }
}
