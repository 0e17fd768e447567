//! The CUDA backend's messages go through the `log` facade (target `kreplay`) when the process
//! has a logger (libkreplay installs its stderr sink before the backend starts), filtered by
//! `KREPLAY_LOG`'s level, as every other kreplay diagnostic.

use std::sync::Mutex;

use kreplay_cuda::LogLevel;

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
fn backend_messages_reach_the_process_logger_within_the_configured_level() {
    log::set_logger(&HOST).expect("the first logger of this test process");
    log::set_max_level(log::LevelFilter::Debug);

    let warn = LogLevel::Warn;
    kreplay_cuda::inject::emit(
        warn,
        LogLevel::Warn,
        format_args!("graph launches run once"),
    );
    kreplay_cuda::inject::emit(warn, LogLevel::Info, format_args!("replayed k x4"));
    kreplay_cuda::inject::emit(LogLevel::Off, LogLevel::Warn, format_args!("silenced"));
    kreplay_cuda::inject::emit(
        LogLevel::Debug,
        LogLevel::Debug,
        format_args!("free at 0x10"),
    );

    let seen = HOST.0.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            (
                log::Level::Warn,
                "kreplay".to_string(),
                "cuda: graph launches run once".to_string()
            ),
            (
                log::Level::Debug,
                "kreplay".into(),
                "cuda: free at 0x10".into()
            ),
        ]
    );
}
