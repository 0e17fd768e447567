//! Deterministic dirty patterns: which chunks a simulated kernel writes.

use kreplay_snapshot::{CopyError, Region};

use crate::device::HostDevice;

/// A small deterministic pseudo-random generator (SplitMix64).
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

/// The page the passes write a byte of, each page of each chunk they change.
const PAGE: u64 = 4096;

impl SplitMix64 {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A value in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}

/// Chunk positions across a set of regions: chunk `i` is the `i`-th chunk when the regions'
/// chunks are laid end to end.
#[derive(Clone, Debug)]
pub struct ChunkMap {
    regions: Vec<Region>,
    chunk_size: u64,
    first: Vec<u64>,
}

impl ChunkMap {
    /// The chunking of `regions` by `chunk_size`.
    pub fn new(regions: &[Region], chunk_size: u64) -> Self {
        let mut first = Vec::with_capacity(regions.len() + 1);
        let mut n = 0;
        for r in regions {
            first.push(n);
            n += r.size.div_ceil(chunk_size);
        }
        first.push(n);
        ChunkMap {
            regions: regions.to_vec(),
            chunk_size,
            first,
        }
    }

    /// Total chunks.
    pub fn chunks(&self) -> u64 {
        *self.first.last().unwrap_or(&0)
    }

    /// Device address and length of chunk `i`.
    pub fn chunk(&self, i: u64) -> (u64, u64) {
        let r = self.first.partition_point(|&f| f <= i) - 1;
        let region = &self.regions[r];
        let offset = (i - self.first[r]) * self.chunk_size;
        (
            region.base + offset,
            self.chunk_size.min(region.size - offset),
        )
    }

    /// How many of `chunks` chunks [`ChunkMap::pick`] picks for `fraction`:
    /// `round(fraction * chunks)`, `fraction` clamped to `0.0..=1.0`.
    pub fn picked(chunks: u64, fraction: f64) -> u64 {
        ((fraction.clamp(0.0, 1.0) * chunks as f64).round() as u64).min(chunks)
    }

    /// `round(fraction * chunks)` distinct chunks, in a seeded random order (a prefix of one
    /// permutation, so smaller fractions pick subsets of larger ones).
    pub fn pick(&self, fraction: f64, seed: u64) -> Vec<u64> {
        let n = self.chunks();
        let k = Self::picked(n, fraction);
        let mut all: Vec<u64> = (0..n).collect();
        let mut rng = SplitMix64::new(seed);
        for i in 0..k {
            let j = i + rng.below(n - i);
            all.swap(i as usize, j as usize);
        }
        all.truncate(k as usize);
        all
    }

    /// Changes every chunk of `chunks` (one byte per 4 KiB page, at a place `salt` picks).
    pub fn dirty(&self, device: &HostDevice, chunks: &[u64], salt: u64) -> Result<(), CopyError> {
        for &c in chunks {
            let (addr, len) = self.chunk(c);
            // One byte in every 4 KiB page of the chunk, as a kernel writing the chunk would
            // touch every page of it (what a pass pays where writes are followed page by page).
            let at = (salt.wrapping_mul(0x9E37_79B9) ^ c.wrapping_mul(31)) % len.min(PAGE);
            for off in (at..len).step_by(PAGE as usize) {
                device.flip(addr + off, 0x5A)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_are_distinct_nested_and_sized_by_fraction() {
        let regions = [
            Region {
                base: 0,
                size: 10 * 4096,
                generation: 1,
            },
            Region {
                base: 1 << 30,
                size: 5 * 4096 + 1,
                generation: 2,
            },
        ];
        let map = ChunkMap::new(&regions, 4096);
        assert_eq!(map.chunks(), 16);
        assert_eq!(map.chunk(15), ((1 << 30) + 5 * 4096, 1));
        let small = map.pick(0.25, 9);
        let large = map.pick(0.5, 9);
        assert_eq!((small.len(), large.len()), (4, 8));
        assert_eq!(&large[..4], &small[..]);
        let mut all = map.pick(1.0, 3);
        all.sort_unstable();
        assert_eq!(all, (0..16).collect::<Vec<_>>());
        assert!(map.pick(0.0, 1).is_empty());
        assert_eq!(ChunkMap::picked(16, 0.25), 4);
        assert_eq!(ChunkMap::picked(16, 2.0), 16);
        assert_eq!(ChunkMap::picked(1000, 0.01), 10);
    }
}
