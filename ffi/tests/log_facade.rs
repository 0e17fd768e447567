//! kreplay's diagnostics go to the logger the process installed: a Rust host decides where
//! they go, and installing kreplay's stderr sink (as `OnLoad` does) leaves that logger in place.

use std::sync::Mutex;

use kreplay::logging::{self, LogLevel};

/// A host's logger: keeps every record it is given.
struct Captured(Mutex<Vec<(log::Level, String, String)>>);

impl log::Log for Captured {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        self.0.lock().unwrap().push((
            record.level(),
            record.target().to_string(),
            record.args().to_string(),
        ));
    }

    fn flush(&self) {}
}

static HOST: Captured = Captured(Mutex::new(Vec::new()));

#[test]
fn a_host_logger_receives_kreplay_diagnostics_and_keeps_them_after_onload_installs_its_sink() {
    log::set_logger(&HOST).expect("the first logger of this test process");
    log::set_max_level(log::LevelFilter::Debug);

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

    let seen = HOST.0.lock().unwrap().clone();
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
