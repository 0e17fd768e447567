//! kreplay's diagnostics go to the logger the process installed: a Rust host decides where
//! they go, and installing kreplay's stderr sink (as `OnLoad` does) leaves that logger in place.

use kreplay::logging::{self, LogLevel};

mod captured;

#[test]
fn a_host_logger_receives_kreplay_diagnostics_and_keeps_them_after_onload_installs_its_sink() {
    captured::install();

    // What OnLoad does: the host already has a logger, so kreplay's sink is not installed.
    assert!(!logging::install_stderr_logger());
    // KREPLAY_LOG drives kreplay's own sink only: the host's logger decides for itself.
    logging::set_level(LogLevel::Off);

    assert!(kreplay::kreplay_warn!(
        "snapshot of {} bytes declined",
        9220
    ));
    assert!(kreplay::kreplay_debug!("detail"));
    assert!(logging::warn_once("facade-test", format_args!("once")));
    assert!(!logging::warn_once("facade-test", format_args!("twice")));

    let seen = captured::records();
    assert_eq!(
        seen,
        [
            (
                log::Level::Warn,
                "kreplay".to_string(),
                "snapshot of 9220 bytes declined".to_string()
            ),
            (log::Level::Debug, "kreplay".into(), "detail".into()),
            (log::Level::Warn, "kreplay".into(), "once".into()),
        ]
    );
}
