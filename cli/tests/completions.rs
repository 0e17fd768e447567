//! `kreplay completions <shell>`: the scripts, and bash completing with one of them.

use std::process::{Command, Output};

fn kreplay(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kreplay"))
        .args(args)
        .output()
        .expect("the kreplay binary runs")
}

const COMMANDS: [&str; 8] = [
    "demo",
    "bench",
    "bench-dispatch",
    "stress",
    "profile",
    "run",
    "completions",
    "help",
];

#[test]
fn every_shell_gets_a_script_naming_every_command() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let output = kreplay(&["completions", shell]);
        assert_eq!(output.status.code(), Some(0), "{shell}: {output:?}");
        let script = String::from_utf8(output.stdout).unwrap();
        for command in COMMANDS {
            assert!(script.contains(command), "{shell}: {command} missing");
        }
        assert!(script.contains("footprints"), "{shell}: bench's options");
    }
}

/// The words bash's completion offers for the command line `words` (the last word being
/// completed), with the script `kreplay completions bash` printed loaded.
fn bash_completes(words: &[&str]) -> Vec<String> {
    let output = kreplay(&["completions", "bash"]);
    assert!(output.status.success());
    let script = String::from_utf8(output.stdout).unwrap();
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let program = format!(
        "{script}\nCOMP_WORDS=({words})\nCOMP_CWORD={cword}\nCOMP_LINE=\"${{COMP_WORDS[*]}}\"\n\
         COMP_POINT=${{#COMP_LINE}}\n\
         _kreplay kreplay \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"\n\
         printf '%s\\n' \"${{COMPREPLY[@]}}\"\n",
        words = quoted.join(" "),
        cword = words.len() - 1,
    );
    let output = Command::new("bash")
        .arg("-c")
        .arg(program)
        .output()
        .expect("bash runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn bash_completes_commands_options_and_option_values() {
    let commands = bash_completes(&["kreplay", "bench"]);
    assert!(commands.contains(&"bench".to_owned()), "{commands:?}");
    assert!(
        commands.contains(&"bench-dispatch".to_owned()),
        "{commands:?}"
    );
    assert!(!commands.contains(&"demo".to_owned()), "{commands:?}");

    let options = bash_completes(&["kreplay", "bench", "--f"]);
    assert_eq!(options, ["--footprints"]);

    let services = bash_completes(&["kreplay", "bench-dispatch", "--service", ""]);
    for value in ["replay", "none", "overlap"] {
        assert!(services.contains(&value.to_owned()), "{services:?}");
    }
    let shells = bash_completes(&["kreplay", "completions", "z"]);
    assert_eq!(shells, ["zsh"]);
}

#[test]
fn an_unknown_shell_is_a_usage_error_listing_the_shells() {
    let output = kreplay(&["completions", "tcsh"]);
    assert_eq!(output.status.code(), Some(2));
    let text = String::from_utf8_lossy(&output.stderr);
    assert!(
        text.contains("bash, elvish, fish, powershell, zsh"),
        "{text}"
    );
    assert!(text.contains("kreplay completions --help"), "{text}");
}
