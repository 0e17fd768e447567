//! The C ABI's configuration and the CUDA backend's read the settings they share the same way:
//! one parser each for the snapshot budget and for the built-in tool's pass count (with its
//! older CUDA-only name), so a value one of them accepts the other never refuses.

use std::collections::HashMap;

fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |name| map.get(name).cloned()
}

#[test]
fn both_backends_read_the_snapshot_budget_alike() {
    for value in [
        "0",
        "1",
        "1048576",
        "512M",
        "512m",
        "4GiB",
        "4gb",
        "64K",
        "2T",
        "1X",
        "G",
        "",
        "-1",
        "+5",
        "1.5G",
        "99999999999999999999",
        "16777216T",
    ] {
        let pairs = [("KREPLAY_MAX_SNAPSHOT_BYTES", value)];
        let abi = kreplay::config::Config::from_lookup(lookup(&pairs));
        let cuda = kreplay_cuda::config::Config::from_lookup(lookup(&pairs));
        assert_eq!(abi.is_ok(), cuda.is_ok(), "{value:?}: {abi:?} / {cuda:?}");
        if let (Ok(abi), Ok(cuda)) = (abi, cuda) {
            let (a, c) = (abi.snapshot_config().max_bytes, cuda.snapshot.max_bytes);
            if value == "0" {
                // Derived from the memory available now, read once by each: other processes
                // move it between the two reads, so the two agree on the rule, not the byte.
                let (a, c) = (a.expect("derived") as f64, c.expect("derived") as f64);
                assert!((a - c).abs() <= 0.01 * a.max(c), "{value:?}: {a} / {c}");
            } else {
                assert_eq!(a, c, "{value:?}");
            }
        }
    }
}

#[test]
fn both_backends_read_the_built_in_passes_and_their_older_cuda_name_alike() {
    let cases: &[&[(&str, &str)]] = &[
        &[],
        &[("KREPLAY_PASSES", "4")],
        &[("KREPLAY_CUDA_PASSES", "38")],
        &[("KREPLAY_PASSES", "6"), ("KREPLAY_CUDA_PASSES", "3")],
        &[("KREPLAY_PASSES", "0")],
        &[("KREPLAY_CUDA_PASSES", "0")],
        &[("KREPLAY_PASSES", "4x")],
        &[("KREPLAY_PASSES", " 4")],
        &[("KREPLAY_PASSES", "bad"), ("KREPLAY_CUDA_PASSES", "3")],
        &[("KREPLAY_PASSES", "99999999999999999999")],
    ];
    for pairs in cases {
        let abi = kreplay::config::Config::from_lookup(lookup(pairs));
        let cuda = kreplay_cuda::config::Config::from_lookup(lookup(pairs));
        match (abi, cuda) {
            (Ok(abi), Ok(cuda)) => assert_eq!(abi.passes, cuda.passes, "{pairs:?}"),
            (Err(abi), Err(cuda)) => {
                assert!(cuda.contains(abi.variable), "{pairs:?}: {abi} / {cuda}");
                assert!(cuda.contains(&abi.expected), "{pairs:?}: {abi} / {cuda}");
            }
            (abi, cuda) => panic!("{pairs:?}: they disagree: {abi:?} / {cuda:?}"),
        }
    }
}

#[test]
fn both_backends_read_the_drain_timeout_alike() {
    for value in ["250", " 250 ", "1", "0", "-1", "1.5", "soon", "", "+7"] {
        let pairs = [("KREPLAY_DRAIN_TIMEOUT_MS", value)];
        let abi = kreplay::config::Config::from_lookup(lookup(&pairs));
        let cuda = kreplay_cuda::config::Config::from_lookup(lookup(&pairs));
        assert_eq!(abi.is_ok(), cuda.is_ok(), "{value:?}: {abi:?} / {cuda:?}");
        if let (Ok(abi), Ok(cuda)) = (abi, cuda) {
            assert_eq!(abi.drain_timeout, cuda.drain_timeout, "{value:?}");
        }
    }
}

#[test]
fn both_backends_read_the_log_level_alike() {
    // libkreplay on CUDA reads KREPLAY_LOG twice (its own configuration and the CUDA
    // backend's): a spelling one takes and the other refuses left the backend uninstalled.
    for value in [
        "info", " info ", "INFO", "Info", "Debug", "OFF", "Warn", "loud", "",
    ] {
        let pairs = [("KREPLAY_LOG", value)];
        let abi = kreplay::config::Config::from_lookup(lookup(&pairs));
        let cuda = kreplay_cuda::config::Config::from_lookup(lookup(&pairs));
        assert_eq!(abi.is_ok(), cuda.is_ok(), "{value:?}: {abi:?} / {cuda:?}");
    }
    let cuda = kreplay_cuda::config::Config::from_lookup(lookup(&[("KREPLAY_LOG", "DEBUG")]));
    assert_eq!(cuda.unwrap().log, kreplay_cuda::config::LogLevel::Debug);
}

#[test]
fn millisecond_settings_take_the_same_spellings() {
    // Both are documented as "milliseconds, at least 1": digits only, as every numeric setting.
    for value in ["250", "+250", " 250", "250 ", "0", "-1", "2.5"] {
        let budget =
            kreplay::config::Config::from_lookup(lookup(&[("KREPLAY_REPLAY_BUDGET_MS", value)]));
        let drain =
            kreplay::config::Config::from_lookup(lookup(&[("KREPLAY_DRAIN_TIMEOUT_MS", value)]));
        assert_eq!(
            budget.is_ok(),
            drain.is_ok(),
            "{value:?}: budget {budget:?} / drain timeout {drain:?}"
        );
    }
}
