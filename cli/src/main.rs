//! The `kreplay` binary: see the `kreplay_cli` library.

fn main() {
    let status = kreplay_cli::run(std::env::args_os().skip(1), &mut std::io::stdout().lock());
    std::process::exit(status);
}
