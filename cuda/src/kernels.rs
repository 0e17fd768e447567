//! kreplay's device kernels (`cuda/kernels/kreplay_kernels.cu`), JIT-loaded from the committed
//! PTX with `cuModuleLoadData`, and the host side of launching them.
//!
//! * `kreplay_hash_list`: xxh3_64 of every chunk of a list of device ranges in one launch, eight
//!   lanes per chunk, equal bit for bit to the host's `xxh3_64`, so a snapshot hashed on the
//!   host (pinned-host tier) and live memory hashed on the device compare. Chunks of 240 bytes
//!   or less (only a range's last chunk can be that short) take xxh3's short-input paths and are
//!   hashed on the host.
//! * `kreplay_restore_verified` and `kreplay_gather_found`: the detection and the copy of a
//!   verified restore, queued on one stream with one wait: each chunk hashed (as
//!   `kreplay_hash_list` does) and compared with the snapshot's hash on the device; the changed
//!   ones listed on the device and copied back from the store by the second launch; the changed
//!   chunks come back as a bitmap ([`restore_entries`]).
//! * `kreplay_hash_list_wide` and `kreplay_restore_verified_wide`: the same with a whole warp
//!   per chunk, for launches over fewer than [`WIDE_BELOW_CHUNKS`] chunks ([`lanes_for`]).
//! * `kreplay_gather`: many device-to-device copies in one launch; [`gather_tiles`] splits the
//!   copies into tiles of at most [`GATHER_TILE`] bytes, one block each.
//! * `kreplay_read_once` and `kreplay_add_one_runs`: the read bandwidth ceiling and the
//!   `x += 1` workload of the tests and the bench.

use std::ffi::{CStr, CString, c_void};
use std::sync::OnceLock;

use kreplay_snapshot::DeviceCopy;

use crate::driver::{CuDevicePtr, CuError, CuFunction, CuModule, CuStream, Driver};

/// The PTX that `nvcc` made of `cuda/kernels/kreplay_kernels.cu` (`cargo xtask ptx`).
pub const PTX: &str = include_str!("../kernels/kreplay_kernels.ptx");

/// Largest piece of one copy a gather block moves.
pub const GATHER_TILE: u64 = 1 << 20;
/// Threads per gather block.
pub const GATHER_THREADS: u32 = 256;
/// Copies (after merging) up to which `cuMemcpyDtoDAsync` per copy is used; more go through one
/// gather launch. Large copies run at the copy ceiling either way; many small ones are
/// launch-bound as separate copies.
pub const MEMCPY_MAX_COPIES: usize = 8;
/// Threads per hash block (32 groups of 8 lanes, one chunk each at a time).
pub const HASH_THREADS: u32 = 256;
/// Lanes that hash one chunk together.
pub const HASH_LANES: u32 = 8;
/// Lanes that hash one chunk together in the wide kernels (`*_wide`: a whole warp).
pub const WIDE_LANES: u32 = 32;
/// Launches over fewer chunks than this take the wide kernels. A group of [`HASH_LANES`] lanes
/// has one 1 KiB block of its chunk in flight at a time, and the narrow kernels (96 registers,
/// two blocks of 256 threads per SM) hold 64 chunks per SM at once: on a 132-SM H200 they fill
/// the GPU from about 8.4 Ki chunks. Below that a launch is bound by each chunk's chain of
/// 1 KiB reads (64 of them for 64 KiB), and a warp per chunk keeps four blocks in flight.
pub const WIDE_BELOW_CHUNKS: u64 = 8 << 10;
/// Chunks at or below this length are hashed on the host (xxh3's short-input paths).
pub const HASH_DEVICE_MIN_LEN: u64 = 241;

static PTX_OVERRIDE: OnceLock<String> = OnceLock::new();

/// The environment variable naming a PTX file to load instead of the built-in PTX (for trying
/// kernels rebuilt with `nvcc` in an injected application before their PTX is committed).
pub const PTX_ENV: &str = "KREPLAY_CUDA_PTX";

/// Use `ptx` instead of the built-in PTX for every module loaded from now on (for trying a
/// kernel built elsewhere; the first call wins). Returns whether it was taken.
pub fn override_ptx(ptx: String) -> bool {
    PTX_OVERRIDE.set(ptx).is_ok()
}

/// One entry of a gather list, as the kernel reads it (`struct KrCopy`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GatherEntry {
    /// Destination device address.
    pub dst: u64,
    /// Source device address.
    pub src: u64,
    /// Bytes, at most [`GATHER_TILE`].
    pub len: u64,
}

/// One range of a hash launch, as the kernel reads it (`struct KrHashRange`): the chunks of
/// `len` bytes at `addr` are work items `work_first..` and their hashes go to
/// `out[out_first..]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HashEntry {
    /// Device address of the range's first chunk.
    pub addr: u64,
    /// Bytes of the range.
    pub len: u64,
    /// Index in the output of the range's first hash.
    pub out_first: u64,
    /// Work index of the range's first chunk (chunks of all earlier entries before it).
    pub work_first: u64,
}

/// The hash entries of `ranges` (address, length, first output index), numbering their chunks
/// of `chunk_size` in order; returns the entries and the chunks in all.
pub fn hash_entries(ranges: &[(u64, u64, u64)], chunk_size: u64) -> (Vec<HashEntry>, u64) {
    let mut work = 0;
    let entries = ranges
        .iter()
        .filter(|r| r.1 > 0)
        .map(|&(addr, len, out_first)| {
            let e = HashEntry {
                addr,
                len,
                out_first,
                work_first: work,
            };
            work += len.div_ceil(chunk_size);
            e
        })
        .collect();
    (entries, work)
}

/// One range of a verified-restore launch, as the kernel reads it (`struct KrRestoreRange`):
/// the chunks of `len` bytes of live memory at `addr`, snapshotted at `src`, are work items
/// `work_first..` with global chunk indices `first..`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RestoreEntry {
    /// Device address of the range's first live chunk.
    pub addr: u64,
    /// Device address of its snapshotted bytes.
    pub src: u64,
    /// Bytes of the range.
    pub len: u64,
    /// Global index of its first chunk.
    pub first: u64,
    /// Work index of its first chunk (chunks of all earlier entries before it).
    pub work_first: u64,
}

/// The entries of a verified-restore launch over `ranges` (live address, store address,
/// length, first global chunk), numbering their chunks of `chunk_size` in order; returns the
/// entries and the chunks in all.
pub fn restore_entries(
    ranges: impl IntoIterator<Item = (u64, u64, u64, u64)>,
    chunk_size: u64,
) -> (Vec<RestoreEntry>, u64) {
    let mut entries = Vec::new();
    let work = restore_entries_into(&mut entries, ranges, chunk_size);
    (entries, work)
}

/// [`restore_entries`] into `out` (cleared first), so a restore can reuse the list's memory: a
/// verified restore of 32 GiB with a learned write set of 10% has 52 Ki entries (2 MB), and a
/// list that size allocated afresh for every restore is paid for again in page faults.
pub fn restore_entries_into(
    out: &mut Vec<RestoreEntry>,
    ranges: impl IntoIterator<Item = (u64, u64, u64, u64)>,
    chunk_size: u64,
) -> u64 {
    out.clear();
    let mut work = 0;
    for (addr, src, len, first) in ranges.into_iter().filter(|r| r.2 > 0) {
        out.push(RestoreEntry {
            addr,
            src,
            len,
            first,
            work_first: work,
        });
        work += len.div_ceil(chunk_size);
    }
    work
}

/// Split `copies` into gather entries of at most `tile` bytes each (empty copies dropped).
/// Pieces start at multiples of `tile` from their copy's start, so a copy whose addresses and
/// length are 16-byte aligned gives entries that are too, whenever `tile` is.
pub fn gather_tiles(copies: &[DeviceCopy], tile: u64) -> Vec<GatherEntry> {
    let mut out = Vec::new();
    gather_tiles_into(&mut out, copies, tile);
    out
}

/// [`gather_tiles`] into `out` (cleared first), reusing its memory.
pub fn gather_tiles_into(out: &mut Vec<GatherEntry>, copies: &[DeviceCopy], tile: u64) {
    assert!(tile > 0, "gather tile must be positive");
    out.clear();
    let n: u64 = copies.iter().map(|c| c.len.div_ceil(tile)).sum();
    out.reserve(n as usize);
    for c in copies {
        let mut off = 0;
        while off < c.len {
            let len = tile.min(c.len - off);
            out.push(GatherEntry {
                dst: c.dst + off,
                src: c.src + off,
                len,
            });
            off += len;
        }
    }
}

/// Grid size of a hash launch over `chunks` chunks: one group of [`HASH_LANES`] lanes per
/// chunk, up to the grid limit (the kernel strides over the rest).
pub fn hash_grid(chunks: u64) -> u32 {
    lanes_grid(chunks, HASH_LANES)
}

/// The lanes per chunk a hash or detection launch over `chunks` chunks uses, given whether the
/// loaded module has the wide kernels: [`WIDE_LANES`] below [`WIDE_BELOW_CHUNKS`], else
/// [`HASH_LANES`].
pub fn lanes_for(chunks: u64, has_wide: bool) -> u32 {
    if has_wide && chunks < WIDE_BELOW_CHUNKS {
        WIDE_LANES
    } else {
        HASH_LANES
    }
}

/// Grid size (blocks of [`HASH_THREADS`]) of a hash or detection launch over `chunks` chunks
/// with `lanes` lanes per chunk, up to the grid limit (the kernels stride over the rest).
pub fn lanes_grid(chunks: u64, lanes: u32) -> u32 {
    let per_block = u64::from(HASH_THREADS / lanes);
    chunks.div_ceil(per_block).clamp(1, i32::MAX as u64) as u32
}

/// Grid size of a gather launch over `entries` entries (one block each, the kernel strides over
/// any beyond the grid limit).
pub fn gather_grid(entries: u64) -> u32 {
    entries.clamp(1, i32::MAX as u64) as u32
}

/// Blocks of 256 threads for `kreplay_add_one_runs` over `runs` runs of `run_words` words (the
/// kernel strides over any beyond the cap).
pub fn add_one_runs_grid(runs: u64, run_words: u64) -> u32 {
    runs.saturating_mul(run_words)
        .div_ceil(256)
        .clamp(1, 1 << 20) as u32
}

/// Grid size of `kreplay_gather_found` after a detection over `chunks` chunks: one block per
/// chunk found changed, at most [`FOUND_MAX_BLOCKS`] (the blocks stride over the rest; how many
/// changed is known only on the device).
pub fn found_grid(chunks: u64) -> u32 {
    chunks.clamp(1, FOUND_MAX_BLOCKS) as u32
}

/// Most blocks of a `kreplay_gather_found` launch: 16 per SM of a 132-SM H200, enough to keep
/// the copies at the gather's rate; blocks that find nothing to copy return at once.
pub const FOUND_MAX_BLOCKS: u64 = 2048;

/// Whether a restore of `copies` copies (after merging) goes through the gather kernel.
pub fn use_gather(copies: usize) -> bool {
    copies > MEMCPY_MAX_COPIES
}

/// The kernels of one context.
#[derive(Debug)]
pub struct Kernels {
    module: usize,
    hash: usize,
    gather: usize,
    read_once: usize,
    add_one_runs: usize,
    /// `kreplay_restore_verified` and `kreplay_gather_found`, absent from a PTX built before
    /// them (then verified restores hash and gather in two steps).
    restore_verified: Option<(usize, usize)>,
    /// `kreplay_hash_list_wide` and `kreplay_restore_verified_wide`, absent from a PTX built
    /// before them (then every launch takes the narrow kernels).
    wide: Option<(usize, usize)>,
}

impl Kernels {
    /// JIT-load the kernels into the current context.
    pub fn load(driver: &Driver) -> Result<Kernels, CuError> {
        let from_file;
        let text = match (PTX_OVERRIDE.get(), std::env::var_os(PTX_ENV)) {
            (Some(text), _) => text.as_str(),
            (None, Some(path)) => {
                from_file = std::fs::read_to_string(&path).map_err(|e| CuError {
                    call: "cuModuleLoadData",
                    code: -1,
                    name: format!("{PTX_ENV}={}: {e}", path.to_string_lossy()),
                })?;
                from_file.as_str()
            }
            (None, None) => PTX,
        };
        let image = CString::new(text).map_err(|_| CuError {
            call: "cuModuleLoadData",
            code: -1,
            name: "PTX text holds a NUL byte".into(),
        })?;
        let mut module: CuModule = std::ptr::null_mut();
        // SAFETY: a NUL-terminated PTX image; the driver writes the module handle.
        driver.check("cuModuleLoadData", unsafe {
            (driver.module_load_data)(&mut module, image.as_ptr().cast())
        })?;
        let get = |name: &CStr| -> Result<usize, CuError> {
            let mut f: CuFunction = std::ptr::null_mut();
            // SAFETY: module was just loaded; name is NUL-terminated.
            driver.check("cuModuleGetFunction", unsafe {
                (driver.module_get_function)(&mut f, module, name.as_ptr())
            })?;
            Ok(f as usize)
        };
        let found = (|| {
            Ok(Kernels {
                module: module as usize,
                hash: get(c"kreplay_hash_list")?,
                gather: get(c"kreplay_gather")?,
                read_once: get(c"kreplay_read_once")?,
                add_one_runs: get(c"kreplay_add_one_runs")?,
                restore_verified: get(c"kreplay_restore_verified")
                    .and_then(|r| Ok((r, get(c"kreplay_gather_found")?)))
                    .ok(),
                wide: get(c"kreplay_hash_list_wide")
                    .and_then(|h| Ok((h, get(c"kreplay_restore_verified_wide")?)))
                    .ok(),
            })
        })();
        if found.is_err() {
            // SAFETY: our module, used by nobody.
            unsafe { (driver.module_unload)(module) };
        }
        found
    }

    /// The module handle.
    pub fn module(&self) -> CuModule {
        self.module as CuModule
    }

    /// Queue `kreplay_hash_list` over `count` [`HashEntry`]s at device address `list`, `work`
    /// chunks in all, into `out` (device, indexed by each entry's `out_first`; chunks of at most
    /// 240 bytes are left unwritten).
    ///
    /// # Safety
    /// `list` holds `count` entries whose ranges are readable device memory, sorted by
    /// `work_first` and numbering `work` chunks as [`hash_entries`] does; `out` holds every
    /// index they name; all in the current context and alive until the stream has run it.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn hash(
        &self,
        driver: &Driver,
        stream: CuStream,
        list: CuDevicePtr,
        count: u64,
        work: u64,
        chunk_size: u64,
        out: CuDevicePtr,
    ) -> Result<(), CuError> {
        let (mut l, mut n, mut w, mut cs, mut o) = (list, count, work, chunk_size, out);
        let mut args: [*mut c_void; 5] = [
            (&raw mut l).cast(),
            (&raw mut n).cast(),
            (&raw mut w).cast(),
            (&raw mut cs).cast(),
            (&raw mut o).cast(),
        ];
        let lanes = self.lanes(work);
        let function = match self.wide {
            Some((wide, _)) if lanes == WIDE_LANES => wide,
            _ => self.hash,
        };
        // SAFETY: the arguments match the kernel's signature (the wide one's is the same);
        // memory by the caller's promise.
        unsafe {
            launch(
                driver,
                function,
                lanes_grid(work, lanes),
                HASH_THREADS,
                stream,
                &mut args,
            )
        }
    }

    /// Lanes per chunk of a hash or detection launch over `work` chunks (see [`lanes_for`]).
    pub fn lanes(&self, work: u64) -> u32 {
        lanes_for(work, self.wide.is_some())
    }

    /// Whether the module has `kreplay_restore_verified`.
    pub fn has_restore_verified(&self) -> bool {
        self.restore_verified.is_some()
    }

    /// Queue a verified restore's detection and copy: `kreplay_restore_verified` over `count`
    /// [`RestoreEntry`]s at device address `list`, `work` chunks in all, comparing with the
    /// snapshot hashes at `snap` (indexed by global chunk), setting the bits of changed chunks in
    /// `changed` and listing their copies in `found` (room for `work` [`GatherEntry`]s) with
    /// their number in the word at `found_count`; then `kreplay_gather_found`, which copies them.
    /// Fails with `CUDA_ERROR_NOT_FOUND` (500) when the module lacks the kernels.
    ///
    /// # Safety
    /// `list` holds `count` entries sorted by `work_first`, numbering `work` chunks as
    /// [`restore_entries`] does, whose live ranges are device memory and whose sources are
    /// device memory or mapped pinned host memory; `snap` holds every global index they name,
    /// `changed` a bit for each (zeroed), `found_count` is a zeroed word; all alive until the
    /// stream has run both launches.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn restore_verified(
        &self,
        driver: &Driver,
        stream: CuStream,
        list: CuDevicePtr,
        count: u64,
        work: u64,
        chunk_size: u64,
        snap: CuDevicePtr,
        changed: CuDevicePtr,
        found: CuDevicePtr,
        found_count: CuDevicePtr,
    ) -> Result<(), CuError> {
        let Some((detect, copy)) = self.restore_verified else {
            return Err(CuError {
                call: "cuModuleGetFunction",
                code: 500,
                name: "kreplay_restore_verified not in the loaded PTX".into(),
            });
        };
        let (mut l, mut n, mut w, mut cs, mut h, mut c, mut f, mut fc) = (
            list,
            count,
            work,
            chunk_size,
            snap,
            changed,
            found,
            found_count,
        );
        let mut args: [*mut c_void; 8] = [
            (&raw mut l).cast(),
            (&raw mut n).cast(),
            (&raw mut w).cast(),
            (&raw mut cs).cast(),
            (&raw mut h).cast(),
            (&raw mut c).cast(),
            (&raw mut f).cast(),
            (&raw mut fc).cast(),
        ];
        let lanes = self.lanes(work);
        let detect = match self.wide {
            Some((_, wide)) if lanes == WIDE_LANES => wide,
            _ => detect,
        };
        // SAFETY: the arguments match the kernel's signature (the wide one's is the same);
        // memory by the caller's promise.
        unsafe {
            launch(
                driver,
                detect,
                lanes_grid(work, lanes),
                HASH_THREADS,
                stream,
                &mut args,
            )
        }?;
        let (mut f, mut fc) = (found, found_count);
        let mut args: [*mut c_void; 2] = [(&raw mut f).cast(), (&raw mut fc).cast()];
        // SAFETY: as above; the list and its count are written by the launch before it on the
        // same stream.
        unsafe {
            launch(
                driver,
                copy,
                found_grid(work),
                GATHER_THREADS,
                stream,
                &mut args,
            )
        }
    }

    /// Queue `kreplay_gather` over `count` entries at device address `list`.
    ///
    /// # Safety
    /// `list` holds `count` [`GatherEntry`]s whose ranges are device memory of the current
    /// context, alive until the stream has run the launch.
    pub unsafe fn gather(
        &self,
        driver: &Driver,
        stream: CuStream,
        list: CuDevicePtr,
        count: u64,
    ) -> Result<(), CuError> {
        let (mut p, mut n) = (list, count);
        let mut args: [*mut c_void; 2] = [(&raw mut p).cast(), (&raw mut n).cast()];
        // SAFETY: as documented.
        unsafe {
            launch(
                driver,
                self.gather,
                gather_grid(count),
                GATHER_THREADS,
                stream,
                &mut args,
            )
        }
    }

    /// Queue `kreplay_read_once` over `len` bytes (a multiple of 16) at `addr`; `sink` is one
    /// word of device memory it may write.
    ///
    /// # Safety
    /// Both ranges are device memory of the current context, alive until the stream has run it.
    pub unsafe fn read_once(
        &self,
        driver: &Driver,
        stream: CuStream,
        addr: CuDevicePtr,
        len: u64,
        sink: CuDevicePtr,
        blocks: u32,
    ) -> Result<(), CuError> {
        let (mut p, mut n, mut s) = (addr, len / 16, sink);
        let mut args: [*mut c_void; 3] = [
            (&raw mut p).cast(),
            (&raw mut n).cast(),
            (&raw mut s).cast(),
        ];
        // SAFETY: as documented.
        unsafe { launch(driver, self.read_once, blocks, 256, stream, &mut args) }
    }

    /// Queue `kreplay_add_one_runs`: `+= 1` on the 32-bit words of `runs` runs of `run_words`
    /// words, run r starting at word `r * stride_words` of `addr`.
    ///
    /// # Safety
    /// Every word touched lies in device memory of the current context, alive until the stream
    /// has run the launch.
    pub unsafe fn add_one_runs(
        &self,
        driver: &Driver,
        stream: CuStream,
        addr: CuDevicePtr,
        runs: u64,
        run_words: u64,
        stride_words: u64,
    ) -> Result<(), CuError> {
        let (mut p, mut r, mut w, mut s) = (addr, runs, run_words, stride_words);
        let mut args: [*mut c_void; 4] = [
            (&raw mut p).cast(),
            (&raw mut r).cast(),
            (&raw mut w).cast(),
            (&raw mut s).cast(),
        ];
        let blocks = add_one_runs_grid(runs, run_words);
        // SAFETY: as documented.
        unsafe { launch(driver, self.add_one_runs, blocks, 256, stream, &mut args) }
    }

    /// `kreplay_add_one_runs` itself, for a launch made outside [`Kernels::add_one_runs`] (the
    /// demo launches it as an application would, so that kreplay replays it). Its parameters:
    /// `u32 *p, u64 runs, u64 run_words, u64 stride_words`, blocks of 256 threads.
    pub fn add_one_runs_function(&self) -> CuFunction {
        self.add_one_runs as CuFunction
    }
}

/// `cuLaunchKernel` of a one-dimensional grid.
///
/// # Safety
/// `function` is a kernel of a loaded module whose parameters `args` point to, in order.
unsafe fn launch(
    driver: &Driver,
    function: usize,
    grid: u32,
    block: u32,
    stream: CuStream,
    args: &mut [*mut c_void],
) -> Result<(), CuError> {
    // SAFETY: by the caller's promise.
    let rc = unsafe {
        (driver.launch_kernel)(
            function as CuFunction,
            grid,
            1,
            1,
            block,
            1,
            1,
            0,
            stream,
            args.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    driver.check("cuLaunchKernel", rc)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(dst: u64, src: u64, len: u64) -> DeviceCopy {
        DeviceCopy { dst, src, len }
    }

    #[test]
    fn gather_tiles_cover_every_byte_once_and_none_exceeds_the_tile() {
        let copies = [
            c(0x10_0000, 0x90_0000, 3 * GATHER_TILE + 48),
            c(0x50_0000, 0xa0_0000, 0),
            c(0x60_0000, 0xb0_0000, 16),
            c(0x70_0001, 0xc0_0003, GATHER_TILE),
        ];
        let tiles = gather_tiles(&copies, GATHER_TILE);
        assert_eq!(tiles.len(), 4 + 1 + 1);
        assert!(tiles.iter().all(|t| t.len > 0 && t.len <= GATHER_TILE));
        // Each copy is covered exactly, in order, with dst and src advancing together.
        for copy in copies.iter().filter(|c| c.len > 0) {
            let mine: Vec<_> = tiles
                .iter()
                .filter(|t| t.dst >= copy.dst && t.dst < copy.dst + copy.len)
                .collect();
            let mut at = 0;
            for t in &mine {
                assert_eq!(t.dst, copy.dst + at);
                assert_eq!(t.src, copy.src + at);
                at += t.len;
            }
            assert_eq!(at, copy.len);
        }
        assert_eq!(tiles[3].len, 48);
    }

    #[test]
    fn tiles_of_aligned_copies_stay_aligned() {
        let tiles = gather_tiles(&[c(0x1000, 0x8000, 10 * 4096 + 32)], 4096);
        assert_eq!(tiles.len(), 11);
        assert!(tiles.iter().all(|t| (t.dst | t.src | t.len) % 16 == 0));
        assert_eq!(tiles[10].len, 32);
    }

    #[test]
    fn launch_geometry_covers_every_chunk_and_stays_in_the_grid_limit() {
        assert_eq!(hash_grid(0), 1);
        assert_eq!(hash_grid(1), 1);
        assert_eq!(hash_grid(32), 1);
        assert_eq!(hash_grid(33), 2);
        // 32 GiB of 64 KiB chunks: 512 Ki groups of 8 lanes, 32 per block.
        assert_eq!(hash_grid(512 << 10), 16 << 10);
        assert_eq!(hash_grid(u64::MAX), i32::MAX as u32);
        assert_eq!(gather_grid(0), 1);
        assert_eq!(gather_grid(5000), 5000);
        assert_eq!(gather_grid(u64::MAX), i32::MAX as u32);
    }

    #[test]
    fn hash_entries_number_the_chunks_of_every_range_in_order() {
        let (entries, work) = hash_entries(
            &[(0x1000, 3 * 512, 0), (0x9000, 0, 3), (0x20000, 512 + 1, 7)],
            512,
        );
        assert_eq!(work, 5);
        assert_eq!(
            entries,
            [
                HashEntry {
                    addr: 0x1000,
                    len: 1536,
                    out_first: 0,
                    work_first: 0
                },
                HashEntry {
                    addr: 0x20000,
                    len: 513,
                    out_first: 7,
                    work_first: 3
                },
            ]
        );
        assert_eq!(std::mem::size_of::<HashEntry>(), 32);
    }

    #[test]
    fn restore_entries_number_the_chunks_of_every_range_in_order() {
        let (entries, work) = restore_entries(
            [
                (0x1000, 0x9_0000, 3 * 512, 0),
                (0x5000, 0xa_0000, 0, 3),
                (0x20000, 0xb_0000, 512 + 1, 7),
            ],
            512,
        );
        assert_eq!(work, 5);
        assert_eq!(
            entries,
            [
                RestoreEntry {
                    addr: 0x1000,
                    src: 0x9_0000,
                    len: 1536,
                    first: 0,
                    work_first: 0,
                },
                RestoreEntry {
                    addr: 0x20000,
                    src: 0xb_0000,
                    len: 513,
                    first: 7,
                    work_first: 3,
                },
            ]
        );
        assert_eq!(std::mem::size_of::<RestoreEntry>(), 40);
        assert_eq!(found_grid(0), 1);
        assert_eq!(found_grid(100), 100);
        assert_eq!(found_grid(1 << 20), FOUND_MAX_BLOCKS as u32);
    }

    #[test]
    fn launches_over_few_chunks_take_a_warp_per_chunk_where_the_module_has_it() {
        // 80 MB of 64 KiB chunks: 1250 chunks, a warp each, 8 per block of 256 threads.
        assert_eq!(lanes_for(1250, true), WIDE_LANES);
        assert_eq!(lanes_grid(1250, WIDE_LANES), 157);
        // Groups of 8 would put them in 40 blocks: a third of a 132-SM GPU.
        assert_eq!(lanes_grid(1250, HASH_LANES), 40);
        // An older PTX without the wide kernels keeps groups of 8.
        assert_eq!(lanes_for(1250, false), HASH_LANES);
        // Large launches fill the GPU with groups of 8 (32 GiB: 512 Ki chunks).
        assert_eq!(lanes_for(WIDE_BELOW_CHUNKS - 1, true), WIDE_LANES);
        assert_eq!(lanes_for(WIDE_BELOW_CHUNKS, true), HASH_LANES);
        assert_eq!(lanes_for(512 << 10, true), HASH_LANES);
        assert_eq!(lanes_grid(512 << 10, HASH_LANES), hash_grid(512 << 10));
        assert_eq!(lanes_grid(0, WIDE_LANES), 1);
        assert_eq!(lanes_grid(u64::MAX, WIDE_LANES), i32::MAX as u32);
    }

    #[test]
    fn few_copies_use_the_copy_engine_and_many_one_gather_launch() {
        assert!(!use_gather(0));
        assert!(!use_gather(MEMCPY_MAX_COPIES));
        assert!(use_gather(MEMCPY_MAX_COPIES + 1));
    }

    #[test]
    fn the_committed_ptx_defines_every_kernel_the_crate_launches() {
        for name in [
            "kreplay_hash_list",
            "kreplay_gather",
            "kreplay_read_once",
            "kreplay_add_one_runs",
            "kreplay_restore_verified",
            "kreplay_gather_found",
            "kreplay_hash_list_wide",
            "kreplay_restore_verified_wide",
        ] {
            assert!(
                PTX.contains(&format!(".entry {name}(")),
                "{name} missing from kreplay_kernels.ptx"
            );
        }
    }
}
