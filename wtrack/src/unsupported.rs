//! The stand-in for `linux.rs` on platforms without asynchronous write protection: the same
//! calls, each refusing.

use std::ops::Range;

use crate::TrackError;

fn unsupported() -> TrackError {
    TrackError::Unsupported("needs Linux on x86_64 or aarch64".into())
}

/// Never built: [`Tracker::new`] refuses.
pub(crate) struct Tracker;

impl Tracker {
    pub(crate) fn new(_ranges: &[Range<usize>]) -> Result<Tracker, TrackError> {
        Err(unsupported())
    }

    pub(crate) fn register(_ranges: &[Range<usize>]) -> Result<Tracker, TrackError> {
        Err(unsupported())
    }

    pub(crate) fn owner(&self) -> u32 {
        std::process::id()
    }

    pub(crate) fn protect(&self, _r: Range<usize>) -> Result<(), TrackError> {
        Err(unsupported())
    }

    pub(crate) fn scan(
        &self,
        _r: Range<usize>,
        _out: &mut Vec<Range<usize>>,
    ) -> Result<(), TrackError> {
        Err(unsupported())
    }
}

pub(crate) fn probe() -> Result<(), TrackError> {
    Err(unsupported())
}

pub(crate) fn measure_page_costs(_pages: usize, _rounds: usize) -> Option<crate::PageCosts> {
    None
}
