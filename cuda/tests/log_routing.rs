//! The CUDA backend's messages go through the `log` facade (target `kreplay`) when the process
//! has a logger (libkreplay installs its stderr sink before the backend starts), filtered by
//! `KREPLAY_LOG`'s level, as every other kreplay diagnostic.

use kreplay_cuda::LogLevel;

#[path = "../../ffi/tests/captured/mod.rs"]
mod captured;

#[test]
fn backend_messages_reach_the_process_logger_within_the_configured_level() {
    captured::install();

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

    let seen = captured::records();
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
