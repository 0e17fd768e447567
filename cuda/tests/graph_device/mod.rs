//! The fake device of the graph-memory tests: counting words, the graph allocations among
//! them having memory behind them only while mapped (a copy or kernel touching an unmapped one
//! is an illegal address, counted and failing the copy), and work submitted to a device's
//! stream running when that device is drained; and the tool the tests replay with.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use kreplay_passloop::{
    ContinueChange, DispatchInfo, MemoryOpReport, Phase, ReplayOutcome, ReplayTool, RestoreRequest,
    ToolAnswer,
};
use kreplay_snapshot::{CopyError, DeviceMemory};

/// Words of the device.
pub const WORDS: usize = 4096;

/// Work queued on a device's stream, run when the device is drained.
pub type StreamWork = Box<dyn FnOnce(&GraphDevice) + Send>;

/// The device(s): counting words; graph addresses have memory behind them only while mapped.
/// Work submitted to a device's stream (a graph launch) waits in `pending` until that device
/// is drained (`cuCtxSynchronize` of its contexts).
pub struct GraphDevice {
    words: Mutex<Vec<u32>>,
    graph: Vec<(u64, u64)>,
    mapped: Mutex<BTreeSet<u64>>,
    /// Copies and kernels that touched a graph allocation with no memory behind it.
    pub illegal: AtomicUsize,
    pending: Mutex<HashMap<u64, Vec<StreamWork>>>,
}

impl GraphDevice {
    pub fn new(graph: &[(u64, u64)]) -> GraphDevice {
        GraphDevice {
            words: Mutex::new((0..WORDS as u32).collect()),
            graph: graph.to_vec(),
            mapped: Mutex::new(BTreeSet::new()),
            illegal: AtomicUsize::new(0),
            pending: Mutex::new(HashMap::new()),
        }
    }

    pub fn check(&self, addr: u64, len: u64) -> Result<(), CopyError> {
        let mapped = self.mapped.lock().unwrap();
        let end = addr + len;
        for &(b, s) in &self.graph {
            if addr < b + s && end > b && !mapped.contains(&b) {
                self.illegal.fetch_add(1, Ordering::SeqCst);
                return Err(CopyError::Failed {
                    addr,
                    len,
                    detail: format!(
                        "CUDA_ERROR_ILLEGAL_ADDRESS: graph allocation at {b:#x} has no memory"
                    ),
                });
            }
        }
        Ok(())
    }

    /// The graph's allocation node ran: memory behind `base`, holding `fill` in every word.
    pub fn map(&self, base: u64, fill: u32) {
        self.mapped.lock().unwrap().insert(base);
        let size = self.graph.iter().find(|g| g.0 == base).unwrap().1;
        let mut w = self.words.lock().unwrap();
        for i in base / 4..(base + size) / 4 {
            w[i as usize] = fill;
        }
    }

    pub fn unmap(&self, base: u64) {
        self.mapped.lock().unwrap().remove(&base);
    }

    pub fn word(&self, addr: u64) -> u32 {
        self.words.lock().unwrap()[addr as usize / 4]
    }

    pub fn set_pointer(&self, at: u64, value: u64) {
        let mut w = self.words.lock().unwrap();
        w[at as usize / 4] = value as u32;
        w[at as usize / 4 + 1] = (value >> 32) as u32;
    }

    /// `x += 1` on `words` words at `addr`, as a kernel would (an unmapped graph allocation
    /// is an illegal address).
    pub fn add_one(&self, addr: u64, words: u64) {
        if self.check(addr, words * 4).is_err() {
            return;
        }
        let mut w = self.words.lock().unwrap();
        for i in addr / 4..addr / 4 + words {
            w[i as usize] += 1;
        }
    }

    /// `x += 1` on `words` words of the buffer whose address the first 8 bytes of the device
    /// hold (a pointer kept in device memory).
    pub fn bump_through_pointer(&self, words: u64) {
        let target = {
            let w = self.words.lock().unwrap();
            u64::from(w[0]) | (u64::from(w[1]) << 32)
        };
        self.add_one(target, words);
    }

    /// Work submitted to `device`'s stream, run when that device is drained.
    pub fn submit(&self, device: u64, work: impl FnOnce(&GraphDevice) + Send + 'static) {
        self.pending
            .lock()
            .unwrap()
            .entry(device)
            .or_default()
            .push(Box::new(work));
    }

    /// `cuCtxSynchronize` of `device`'s contexts: its submitted work runs.
    pub fn drain(&self, device: u64) {
        let work = self
            .pending
            .lock()
            .unwrap()
            .remove(&device)
            .unwrap_or_default();
        for w in work {
            w(self);
        }
    }
}

impl DeviceMemory for GraphDevice {
    fn read(&self, addr: u64, dst: &mut [u8]) -> Result<(), CopyError> {
        self.check(addr, dst.len() as u64)?;
        let w = self.words.lock().unwrap();
        let bytes = w.iter().flat_map(|x| x.to_le_bytes()).skip(addr as usize);
        for (b, from) in dst.iter_mut().zip(bytes) {
            *b = from;
        }
        Ok(())
    }

    fn write(&self, addr: u64, src: &[u8]) -> Result<(), CopyError> {
        self.check(addr, src.len() as u64)?;
        let mut w = self.words.lock().unwrap();
        for (i, b) in src.iter().enumerate() {
            let at = addr as usize + i;
            let mut word = w[at / 4].to_le_bytes();
            word[at % 4] = *b;
            w[at / 4] = u32::from_le_bytes(word);
        }
        Ok(())
    }
}

/// A tool that asks 4 passes of every launch and keeps how the latest ended.
#[derive(Default)]
pub struct Passes(pub RefCell<Option<ReplayOutcome>>);

impl ReplayTool for Passes {
    fn config_enter(&mut self, _: &DispatchInfo) -> ToolAnswer {
        ToolAnswer::passes(4)
    }
    fn pass_enter(&mut self, _: &DispatchInfo, _: u64, _: u64) {}
    fn pass_exit(&mut self, _: &DispatchInfo, _: u64, _: u64) -> ContinueChange {
        ContinueChange::Keep
    }
    fn should_continue(&mut self, _: &DispatchInfo, _: u64, _: u64) -> bool {
        true
    }
    fn snapshot(&mut self, _: &DispatchInfo, _: Phase, _: &MemoryOpReport) {}
    fn restore(&mut self, _: &DispatchInfo, _: Phase, _: &RestoreRequest, _: &MemoryOpReport) {}
    fn config_exit(&mut self, _: &DispatchInfo, outcome: &ReplayOutcome) {
        *self.0.borrow_mut() = Some(outcome.clone());
    }
}
