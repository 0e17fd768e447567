//! What the CLI's test files share: running the built `kreplay` binary with none of the caller's
//! `KREPLAY_*` settings or injection variables leaking in.

use std::process::{Command, Output};

/// Runs the built `kreplay` with `args`, every inherited `KREPLAY_*` variable and injection
/// variable (`CUDA_INJECTION64_PATH`, `HSA_TOOLS_LIB`) removed and `env` set instead.
pub fn kreplay_with(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_kreplay"));
    command.args(args);
    for (name, _) in std::env::vars_os() {
        let n = name.to_string_lossy();
        if n.starts_with("KREPLAY_") || n == "CUDA_INJECTION64_PATH" || n == "HSA_TOOLS_LIB" {
            command.env_remove(name);
        }
    }
    command.envs(env.iter().copied());
    command.output().expect("the kreplay binary runs")
}
