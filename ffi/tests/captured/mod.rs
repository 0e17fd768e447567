//! A host's logger for the logging tests (included by ffi's and the CUDA backend's): installed
//! once per test process, it keeps every record it is given.

use std::sync::Mutex;

/// One kept record: level, target, message.
pub type Record = (log::Level, String, String);

/// Keeps every record it is given.
pub struct Captured(Mutex<Vec<Record>>);

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

/// Install the capturing logger as the process's logger at debug level (the first logger of
/// the test process: a test binary calls this once).
pub fn install() {
    log::set_logger(&HOST).expect("the first logger of this test process");
    log::set_max_level(log::LevelFilter::Debug);
}

/// Every record kept so far.
pub fn records() -> Vec<Record> {
    HOST.0.lock().unwrap().clone()
}
