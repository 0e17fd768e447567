//! `kreplay demo --backend cuda` without a GPU: its command line, and the errors it gives where
//! it cannot run. (The replay itself is checked on a GPU by kreplay-cuda's `gpu_replay` tests.)

use std::process::{Command, Output};

use kreplay_cli::args::{
    Command as Parsed, CudaDemoOptions, DEFAULT_CUDA_FOOTPRINT, DemoOptions, parse,
};

/// Runs `kreplay args...` with only the given `KREPLAY_*` settings.
fn kreplay(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_kreplay"));
    command.args(args);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("KREPLAY_") {
            command.env_remove(name);
        }
    }
    command.envs(env.iter().copied());
    command.output().expect("the kreplay binary runs")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn cuda(args: &[&str]) -> Result<CudaDemoOptions, String> {
    let mut all = vec!["demo", "--backend", "cuda"];
    all.extend_from_slice(args);
    match parse(all) {
        Ok(Parsed::DemoCuda(options)) => Ok(options),
        Ok(other) => panic!("expected the CUDA demo, got {other:?}"),
        Err(e) => Err(e.to_string()),
    }
}

#[test]
fn the_cuda_demo_reads_its_options_and_defaults() {
    assert_eq!(cuda(&[]).unwrap(), CudaDemoOptions::default());
    assert_eq!(CudaDemoOptions::default().footprint, DEFAULT_CUDA_FOOTPRINT);
    assert_eq!(
        cuda(&[
            "--footprint",
            "4GiB",
            "--written",
            "0.25",
            "--passes",
            "6",
            "--device",
            "1"
        ])
        .unwrap(),
        CudaDemoOptions {
            device: 1,
            footprint: 4 << 30,
            written: 0.25,
            passes: 6,
        }
    );
    assert_eq!(cuda(&["--written", "1%"]).unwrap().written, 0.01);
    assert_eq!(cuda(&["--written", "1"]).unwrap().written, 1.0);
}

#[test]
fn without_a_backend_the_demo_is_the_softhsa_one_and_takes_no_cuda_options() {
    assert_eq!(
        parse(["demo"]).unwrap(),
        Parsed::Demo(DemoOptions::default())
    );
    assert_eq!(
        parse(["demo", "--backend", "softhsa"]).unwrap(),
        Parsed::Demo(DemoOptions::default())
    );
    for option in [
        ["--footprint", "1G"],
        ["--written", "0.5"],
        ["--device", "0"],
    ] {
        let e = parse(["demo", option[0], option[1]])
            .unwrap_err()
            .to_string();
        assert!(e.contains(option[0]) && e.contains("--backend cuda"), "{e}");
    }
}

#[test]
fn bad_cuda_demo_command_lines_name_what_is_wrong() {
    for (args, expect) in [
        (&["--written", "0"][..], "--written"),
        (&["--written", "1.5"], "--written"),
        (&["--written", "150%"], "--written"),
        (&["--written=-0.1"], "--written"),
        (&["--written", "half"], "--written"),
        (&["--footprint", "100K"], "multiple of 64 KiB"),
        (&["--footprint", "lots"], "--footprint"),
        (&["--passes", "0"], "--passes"),
        (&["--passes", "65"], "--passes"),
        (&["--device=-1"], "--device"),
        (&["--no-restore"], "--no-restore"),
        (&["--elements", "1k"], "--elements"),
        (&["--csv", "x.csv"], "--csv"),
    ] {
        let e = cuda(args).unwrap_err();
        assert!(e.contains(expect), "{args:?}: {e}");
    }
    let e = parse(["demo", "--backend", "rocm"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("rocm") && e.contains("cuda"), "{e}");
}

#[test]
fn the_cuda_demo_without_a_driver_exits_1_and_says_why() {
    if kreplay_cuda::Driver::get().is_ok() {
        eprintln!("skipped: a CUDA driver is present here");
        return;
    }
    let output = kreplay(
        &[
            "demo",
            "--backend",
            "cuda",
            "--footprint",
            "64K",
            "--written",
            "1",
        ],
        &[],
    );
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with("kreplay: error: no CUDA driver could be loaded"),
        "{err}"
    );
    assert!(err.contains("libcuda.so.1"), "{err}");
    assert!(output.stdout.is_empty(), "nothing ran, nothing is printed");
}

#[test]
fn the_cuda_demo_checks_the_snapshot_settings_before_looking_for_a_driver() {
    for (var, value) in [
        ("KREPLAY_RESTORE", "fast"),
        ("KREPLAY_SNAPSHOT_STORE", "gpu"),
        ("KREPLAY_MAX_SNAPSHOT_BYTES", "1G"),
    ] {
        let output = kreplay(&["demo", "--backend", "cuda"], &[(var, value)]);
        let err = stderr(&output);
        assert_eq!(output.status.code(), Some(1), "{err}");
        assert!(err.contains(var), "{err}");
        assert!(!err.contains("driver"), "settings come first: {err}");
    }
}
