//! How a snapshot's regions are laid out in the store and cut into chunks and copy pieces.

use std::ops::Range;

use crate::inventory::Region;

/// Each region starts at a multiple of this in the store (keeps copies cache-line aligned).
const STORE_ALIGN: u64 = 64;
/// Target size of one parallel copy job; a whole number of chunks.
const PIECE_BYTES: u64 = 1 << 20;

/// A run of whole chunks inside one region: the unit of parallel copy and batched writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Piece {
    /// Index of the region in the layout.
    pub region: usize,
    /// First chunk, counted within the region.
    pub first: usize,
    /// Number of chunks.
    pub count: usize,
}

/// Regions, their store offsets and their chunking.
#[derive(Clone, Debug)]
pub(crate) struct Layout {
    pub regions: Vec<Region>,
    /// Byte offset of each region in the store.
    pub store_offset: Vec<u64>,
    /// Global index of each region's first chunk; one extra entry holds the total.
    pub first_chunk: Vec<usize>,
    pub chunk_size: u64,
    /// Sum of region sizes.
    pub bytes: u64,
    /// Bytes the store needs (regions plus alignment padding).
    pub store_len: u64,
}

impl Layout {
    pub(crate) fn new(regions: Vec<Region>, chunk_size: u64) -> Self {
        let mut store_offset = Vec::with_capacity(regions.len());
        let mut first_chunk = Vec::with_capacity(regions.len() + 1);
        let (mut offset, mut chunks, mut bytes) = (0u64, 0usize, 0u64);
        // Saturating: regions that add up past the address space (an allocation reported
        // with a corrupt size) make a plan of `u64::MAX` bytes, which no budget or store
        // accepts, instead of an overflow.
        for r in &regions {
            offset = offset
                .checked_next_multiple_of(STORE_ALIGN)
                .unwrap_or(u64::MAX);
            store_offset.push(offset);
            first_chunk.push(chunks);
            offset = offset.saturating_add(r.size);
            bytes = bytes.saturating_add(r.size);
            chunks += chunk_count(r.size, chunk_size);
        }
        first_chunk.push(chunks);
        Layout {
            regions,
            store_offset,
            first_chunk,
            chunk_size,
            bytes,
            store_len: offset,
        }
    }

    /// Total number of chunks.
    pub(crate) fn chunks(&self) -> usize {
        self.first_chunk.last().copied().unwrap_or(0)
    }

    /// Number of chunks of region `r`.
    pub(crate) fn region_chunks(&self, r: usize) -> usize {
        self.first_chunk[r + 1] - self.first_chunk[r]
    }

    /// Global chunk indices of a piece.
    pub(crate) fn global(&self, p: &Piece) -> Range<usize> {
        let start = self.first_chunk[p.region] + p.first;
        start..start + p.count
    }

    /// Byte offset within the region and length of chunks `first..first + count` of region `r`.
    pub(crate) fn span(&self, r: usize, first: usize, count: usize) -> (u64, u64) {
        let size = self.regions[r].size;
        let start = first as u64 * self.chunk_size;
        let end = ((first + count) as u64 * self.chunk_size).min(size);
        (start, end - start)
    }

    /// Byte offset within the region and length of a piece.
    pub(crate) fn piece_span(&self, p: &Piece) -> (u64, u64) {
        self.span(p.region, p.first, p.count)
    }

    /// Byte range of a piece in the store.
    pub(crate) fn store_range(&self, p: &Piece) -> Range<usize> {
        let (off, len) = self.piece_span(p);
        let start = (self.store_offset[p.region] + off) as usize;
        start..start + len as usize
    }

    fn chunks_per_piece(&self) -> usize {
        (PIECE_BYTES / self.chunk_size).max(1) as usize
    }

    /// Pieces covering every live region entirely.
    pub(crate) fn full_pieces(&self, live: &[bool]) -> Vec<Piece> {
        let per_piece = self.chunks_per_piece();
        let mut pieces = Vec::new();
        for r in (0..self.regions.len()).filter(|&r| live[r]) {
            let n = self.region_chunks(r);
            pieces.extend((0..n).step_by(per_piece).map(|first| Piece {
                region: r,
                first,
                count: per_piece.min(n - first),
            }));
        }
        pieces
    }

    /// One piece per live region, covering it entirely: a full restore from a device shadow,
    /// which becomes one device copy per region whatever the pieces, without cutting every
    /// region into 1 MiB pieces first (32 Ki of them for 32 GiB, a fifth of a millisecond of
    /// host time in series with the copy).
    pub(crate) fn whole_regions(&self, live: &[bool]) -> Vec<Piece> {
        (0..self.regions.len())
            .filter(|&r| live[r])
            .map(|r| Piece {
                region: r,
                first: 0,
                count: self.region_chunks(r),
            })
            .filter(|p| p.count > 0)
            .collect()
    }

    /// Pieces covering the chunks whose global indices `marked` yields (in increasing order),
    /// in live regions only, merging neighbours up to the piece size: what
    /// [`runs`](Layout::runs) gives for the same chunks, in time proportional to the marked
    /// chunks rather than to all of them.
    pub(crate) fn runs_of(
        &self,
        live: &[bool],
        marked: impl IntoIterator<Item = usize>,
    ) -> Vec<Piece> {
        let mut pieces: Vec<Piece> = Vec::new();
        self.for_runs_of(live, marked, |p| pieces.push(p));
        pieces
    }

    /// [`runs_of`](Layout::runs_of), handing each piece to `emit` in order instead of
    /// collecting them (a restore builds its own list from them without a second one).
    pub(crate) fn for_runs_of(
        &self,
        live: &[bool],
        marked: impl IntoIterator<Item = usize>,
        mut emit: impl FnMut(Piece),
    ) {
        let per_piece = self.chunks_per_piece();
        let mut open: Option<Piece> = None;
        let mut r = 0;
        for c in marked {
            while r < self.regions.len() && c >= self.first_chunk[r + 1] {
                r += 1;
            }
            if r == self.regions.len() {
                break;
            }
            if !live[r] {
                continue;
            }
            let k = c - self.first_chunk[r];
            match &mut open {
                Some(p) if p.region == r && p.first + p.count == k && p.count < per_piece => {
                    p.count += 1;
                }
                _ => {
                    if let Some(p) = open.replace(Piece {
                        region: r,
                        first: k,
                        count: 1,
                    }) {
                        emit(p);
                    }
                }
            }
        }
        if let Some(p) = open {
            emit(p);
        }
    }

    /// Maximal runs `(region, first chunk, count)` of the chunks of live regions that `flags`
    /// (one per global chunk) does not mark, found by skipping over the marked ones.
    pub(crate) fn unmarked_runs(
        &self,
        live: &[bool],
        flags: &[bool],
    ) -> Vec<(usize, usize, usize)> {
        let mut out = Vec::new();
        self.for_unmarked_runs(live, flags, |r, first, count| out.push((r, first, count)));
        out
    }

    /// [`unmarked_runs`](Layout::unmarked_runs), handing each run to `emit` in order.
    pub(crate) fn for_unmarked_runs(
        &self,
        live: &[bool],
        flags: &[bool],
        mut emit: impl FnMut(usize, usize, usize),
    ) {
        let mut marks = marked_indices(flags).peekable();
        for (r, &alive) in live.iter().enumerate().take(self.regions.len()) {
            let (lo, hi) = (self.first_chunk[r], self.first_chunk[r + 1]);
            let mut start = lo;
            while let Some(&m) = marks.peek() {
                if m >= hi {
                    break;
                }
                marks.next();
                if alive && m > start {
                    emit(r, start - lo, m - start);
                }
                start = m + 1;
            }
            if alive && hi > start {
                emit(r, start - lo, hi - start);
            }
        }
    }

    /// Pieces covering the chunks of live regions for which `marked(global chunk index)` holds,
    /// merging neighbours up to the piece size. In store order.
    pub(crate) fn runs(&self, live: &[bool], marked: impl Fn(usize) -> bool) -> Vec<Piece> {
        let per_piece = self.chunks_per_piece();
        let mut pieces = Vec::new();
        for (r, _) in self.regions.iter().enumerate().filter(|(r, _)| live[*r]) {
            let base = self.first_chunk[r];
            let mut open: Option<Piece> = None;
            for k in 0..self.region_chunks(r) {
                if marked(base + k) {
                    match &mut open {
                        Some(p) if p.count < per_piece => p.count += 1,
                        _ => {
                            pieces.extend(open.take());
                            open = Some(Piece {
                                region: r,
                                first: k,
                                count: 1,
                            });
                        }
                    }
                } else {
                    pieces.extend(open.take());
                }
            }
            pieces.extend(open);
        }
        pieces
    }
}

/// Indices of the `true` entries of `flags`, in order, skipping eight unmarked flags at a time
/// (a learned write set is a few marked chunks among hundreds of thousands).
pub(crate) fn marked_indices(flags: &[bool]) -> impl Iterator<Item = usize> + '_ {
    // SAFETY: bool has the size and alignment of u8 and only the values 0 and 1, so its bytes
    // may be read as u8.
    let bytes: &[u8] = unsafe { std::slice::from_raw_parts(flags.as_ptr().cast(), flags.len()) };
    let words = bytes.chunks_exact(8);
    let tail_start = flags.len() - words.remainder().len();
    words
        .enumerate()
        .flat_map(|(i, w)| {
            // Flag j of the eight is bit 8j of the little-endian word: visit the set ones only
            // (testing each of the eight flags of a word that has one cost twice as much).
            let mut m = u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
            std::iter::from_fn(move || {
                if m == 0 {
                    return None;
                }
                let j = m.trailing_zeros() as usize / 8;
                m &= m - 1;
                Some(i * 8 + j)
            })
        })
        .chain((tail_start..flags.len()).filter(move |&c| flags[c]))
}

/// Chunks needed for `size` bytes.
pub(crate) fn chunk_count(size: u64, chunk_size: u64) -> usize {
    size.div_ceil(chunk_size) as usize
}

/// Split `slice` into the given sorted, non-overlapping ranges.
pub(crate) fn split_ranges<T>(
    mut slice: &mut [T],
    ranges: impl IntoIterator<Item = Range<usize>>,
) -> Vec<&mut [T]> {
    let mut parts = Vec::new();
    let mut pos = 0;
    for range in ranges {
        let rest = std::mem::take(&mut slice);
        let (_, tail) = rest.split_at_mut(range.start - pos);
        let (part, tail) = tail.split_at_mut(range.len());
        parts.push(part);
        slice = tail;
        pos = range.end;
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(base: u64, size: u64) -> Region {
        Region {
            base,
            size,
            generation: 1,
        }
    }

    #[test]
    fn layout_aligns_regions_and_counts_partial_last_chunks() {
        let l = Layout::new(vec![region(0, 1000), region(1 << 20, 4096)], 512);
        assert_eq!(l.store_offset, vec![0, 1024]);
        assert_eq!(l.first_chunk, vec![0, 2, 10]);
        assert_eq!(l.bytes, 5096);
        assert_eq!(l.store_len, 1024 + 4096);
        assert_eq!(l.span(0, 1, 1), (512, 488));
    }

    #[test]
    fn whole_regions_cover_each_live_region_in_one_piece_partial_last_chunk_included() {
        let cs = PIECE_BYTES / 4;
        let l = Layout::new(
            vec![
                region(0, 9 * cs + 100),
                region(1 << 40, 3 * cs),
                region(1 << 41, 2 * cs),
            ],
            cs,
        );
        let pieces = l.whole_regions(&[true, false, true]);
        assert_eq!(pieces.len(), 2);
        assert_eq!((pieces[0].region, pieces[0].first), (0, 0));
        assert_eq!(l.piece_span(&pieces[0]), (0, 9 * cs + 100));
        assert_eq!(l.piece_span(&pieces[1]), (0, 2 * cs));
        // The same chunks as the piece-by-piece cover.
        let count = |ps: &[Piece]| ps.iter().map(|p| p.count).sum::<usize>();
        assert_eq!(count(&pieces), count(&l.full_pieces(&[true, false, true])));
    }

    #[test]
    fn runs_merge_neighbours_split_at_piece_size_and_skip_dead_regions() {
        let cs = PIECE_BYTES / 2;
        let l = Layout::new(vec![region(0, 5 * cs), region(1 << 40, 2 * cs)], cs);
        // chunks 0,1,2 marked (split after 2 per piece), 4 marked, region 1 all marked but dead.
        let marked = [true, true, true, false, true, true, true];
        let pieces = l.runs(&[true, false], |c| marked[c]);
        let spans: Vec<_> = pieces
            .iter()
            .map(|p| (p.region, p.first, p.count))
            .collect();
        assert_eq!(spans, vec![(0, 0, 2), (0, 2, 1), (0, 4, 1)]);
        assert_eq!(l.full_pieces(&[false, true]).len(), 1);
    }

    #[test]
    fn fast_runs_equal_the_chunk_by_chunk_ones() {
        let cs = PIECE_BYTES / 4;
        let l = Layout::new(
            vec![
                region(0, 37 * cs),
                region(1 << 40, 3 * cs + 5),
                region(2 << 40, 21 * cs),
            ],
            cs,
        );
        let n = l.chunks();
        let mut x = 0x9e37u64;
        for live in [
            [true, true, true],
            [true, false, true],
            [false, true, false],
        ] {
            for density in [0, 1, 7, 50, 100] {
                let flags: Vec<bool> = (0..n)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x % 100 < density
                    })
                    .collect();
                let marked: Vec<usize> = marked_indices(&flags).collect();
                let want: Vec<usize> = (0..n).filter(|&c| flags[c]).collect();
                assert_eq!(marked, want);
                assert_eq!(
                    l.runs_of(&live, marked.iter().copied()),
                    l.runs(&live, |c| flags[c])
                );
                let gaps: Vec<(usize, usize, usize)> = l.runs(&live, |c| !flags[c]).iter().fold(
                    Vec::new(),
                    |mut acc: Vec<(usize, usize, usize)>, p| {
                        match acc.last_mut() {
                            Some(last) if last.0 == p.region && last.1 + last.2 == p.first => {
                                last.2 += p.count
                            }
                            _ => acc.push((p.region, p.first, p.count)),
                        }
                        acc
                    },
                );
                assert_eq!(l.unmarked_runs(&live, &flags), gaps);
            }
            assert_eq!(l.full_pieces(&live), l.runs(&live, |_| true));
        }
    }

    #[test]
    fn split_ranges_yields_the_requested_parts() {
        let mut v: Vec<u32> = (0..10).collect();
        let parts = split_ranges(&mut v, [1..3, 3..4, 7..10]);
        assert_eq!(parts.len(), 3);
        assert_eq!(&*parts[0], &[1, 2]);
        assert_eq!(&*parts[1], &[3]);
        assert_eq!(&*parts[2], &[7, 8, 9]);
    }
}
