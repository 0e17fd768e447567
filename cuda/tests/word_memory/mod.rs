//! Host memory of 32-bit words standing in for a device in the GPU-free tests of the CUDA
//! backend and of the C ABI on CUDA: addresses are byte offsets into the words.

use std::sync::Mutex;

use kreplay_snapshot::{CopyError, DeviceMemory};

/// The "device": words `0..n`, read and written byte by byte at any offset.
pub struct HostMemory(pub Mutex<Vec<u32>>);

impl HostMemory {
    /// `words` words holding `0, 1, 2, ...`.
    pub fn counting(words: usize) -> HostMemory {
        HostMemory(Mutex::new((0..words as u32).collect()))
    }
}

impl DeviceMemory for HostMemory {
    fn read(&self, addr: u64, dst: &mut [u8]) -> Result<(), CopyError> {
        let mem = self.0.lock().unwrap();
        let at = addr as usize;
        let bytes = mem.iter().flat_map(|w| w.to_le_bytes());
        for (b, from) in dst.iter_mut().zip(bytes.skip(at)) {
            *b = from;
        }
        Ok(())
    }

    fn write(&self, addr: u64, src: &[u8]) -> Result<(), CopyError> {
        let mut mem = self.0.lock().unwrap();
        for (i, b) in src.iter().enumerate() {
            let at = addr as usize + i;
            let mut w = mem[at / 4].to_le_bytes();
            w[at % 4] = *b;
            mem[at / 4] = u32::from_le_bytes(w);
        }
        Ok(())
    }
}
