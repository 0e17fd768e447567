//! `kreplay demo --backend cuda` and `kreplay bench --backend cuda` without a GPU: their command
//! lines, and the errors they give where they cannot run. (The replay itself is checked on a GPU
//! by kreplay-cuda's `gpu_replay` tests.)

mod support;

use std::process::Output;

use kreplay_cli::args::{
    Command as Parsed, CudaDemoOptions, DEFAULT_CUDA_FOOTPRINT, DemoOptions, parse,
};

/// Runs `kreplay args...` with only the given `KREPLAY_*` settings.
fn kreplay(args: &[&str], env: &[(&str, &str)]) -> Output {
    support::kreplay_with(args, env)
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
        ("KREPLAY_MAX_SNAPSHOT_BYTES", "1X"),
    ] {
        let output = kreplay(&["demo", "--backend", "cuda"], &[(var, value)]);
        let err = stderr(&output);
        assert_eq!(output.status.code(), Some(1), "{err}");
        assert!(err.contains(var), "{err}");
        assert!(!err.contains("driver"), "settings come first: {err}");
    }
}

fn bench(
    args: &[&str],
) -> Result<(kreplay_cuda::bench::BenchConfig, Option<std::path::PathBuf>), String> {
    let mut all = vec!["bench", "--backend", "cuda"];
    all.extend_from_slice(args);
    match parse(all) {
        Ok(Parsed::BenchCuda(config, csv)) => Ok((config, csv)),
        Ok(other) => panic!("expected the CUDA bench, got {other:?}"),
        Err(e) => Err(e.to_string()),
    }
}

#[test]
fn the_cuda_bench_reads_its_matrix_and_defaults() {
    use kreplay_cuda::bench::{BenchConfig, BenchTier};
    use kreplay_snapshot::RestoreStrategy;
    assert_eq!(bench(&[]).unwrap(), (BenchConfig::default(), None));
    let (config, csv) = bench(&[
        "--footprints",
        "1G,32G",
        "--dirty",
        "0.1,1",
        "--strategies",
        "hash,writeset-unverified",
        "--tiers",
        "host,device",
        "--repeats",
        "2",
        "--csv",
        "out.csv",
    ])
    .unwrap();
    assert_eq!(
        config,
        BenchConfig {
            footprints: vec![1 << 30, 32 << 30],
            fractions: vec![0.001, 0.01],
            strategies: vec![RestoreStrategy::Hash, RestoreStrategy::WritesetUnverified],
            tiers: vec![BenchTier::Host, BenchTier::Device],
            reps: 2,
            passes: vec![2, 4, 8, 38],
        }
    );
    assert_eq!(csv, Some("out.csv".into()));
    // Without --backend, the softhsa matrix as before.
    assert!(matches!(parse(["bench"]).unwrap(), Parsed::Bench(_)));
}

#[test]
fn the_cuda_bench_measures_whole_replays_of_the_passes_asked_or_none() {
    let (config, _) = bench(&["--passes", "3,38"]).unwrap();
    assert_eq!(config.passes, vec![3, 38]);
    let (config, _) = bench(&["--passes", "none"]).unwrap();
    assert!(config.passes.is_empty());
}

#[test]
fn the_cuda_bench_measures_the_squeezed_tier_when_asked() {
    use kreplay_cuda::bench::BenchTier;
    let (config, _) = bench(&["--footprints", "32G", "--tiers", "device,squeezed,host"]).unwrap();
    assert_eq!(
        config.tiers,
        vec![BenchTier::Device, BenchTier::Squeezed, BenchTier::Host]
    );
    let (config, _) = bench(&["--tiers", "squeezed"]).unwrap();
    assert_eq!(config.tiers, vec![BenchTier::Squeezed]);
}

#[test]
fn a_tier_name_neither_backend_knows_is_refused_with_the_names_it_takes() {
    for (tiers, bad) in [
        ("gpu", "'gpu'"),
        ("squeeze", "'squeeze'"),
        ("squeezed,gpu", "'gpu'"),
    ] {
        let e = bench(&["--tiers", tiers]).unwrap_err();
        assert!(e.contains("--tiers") && e.contains(bad), "{e}");
        assert!(e.contains("squeezed"), "the names taken are listed: {e}");
    }
    // squeezed needs a GPU memory to fill: the softhsa bench says whose tier it is.
    let e = parse(["bench", "--tiers", "host,squeezed"])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("squeezed") && e.contains("--backend cuda"),
        "{e}"
    );
    let e = bench(&["--tiers", "file"]).unwrap_err();
    assert!(
        e.contains("file") && e.contains("device, host, squeezed"),
        "{e}"
    );
}

#[test]
fn bad_cuda_bench_command_lines_name_what_is_wrong() {
    for (args, expect) in [
        (&["--dirty", "0"][..], "above 0"),
        (&["--footprints", "100K"], "multiple of 64 KiB"),
        (&["--strategies", "auto"], "measures full, hash, writeset"),
        (&["--tiers", "file"], "--tiers"),
        (&["--svg", "x.svg"], "--svg"),
        (&["--discrete"], "--discrete"),
        (&["--passes", "1"], "--passes"),
        (&["--passes", "4,1001"], "--passes"),
        (&["--replay-dirty", "1"], "--replay-dirty"),
    ] {
        let e = bench(args).unwrap_err();
        assert!(e.contains(expect), "{args:?}: {e}");
    }
}

#[test]
fn the_cuda_bench_without_a_driver_exits_1_says_why_and_creates_no_file() {
    if kreplay_cuda::Driver::get().is_ok() {
        eprintln!("skipped: a CUDA driver is present here");
        return;
    }
    let csv = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("kreplay-cuda-bench-{}.csv", std::process::id()));
    let _ = std::fs::remove_file(&csv);
    let output = kreplay(
        &["bench", "--backend", "cuda", "--csv", csv.to_str().unwrap()],
        &[],
    );
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with("kreplay: error: no CUDA driver could be loaded"),
        "{err}"
    );
    assert!(output.stdout.is_empty());
    assert!(!csv.exists(), "no file where nothing was measured");
}
