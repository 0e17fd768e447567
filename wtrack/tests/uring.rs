//! Writes that reach followed pages without passing through this process's page tables.
//! io_uring's registered ("fixed") buffers are pinned once at registration; a later
//! IORING_OP_READ_FIXED fills them through the kernel's own mapping of the pages, which no
//! tracker sees. What a caller can see is that memory is pinned (`pinned_bytes`): the snapshot
//! crate does not rely on what a tracker saw between replays while any is.

#![allow(clippy::single_range_in_vec_init)]

#[path = "../../hsa/tests/support/uring.rs"]
mod uring;

use kreplay_wtrack::{available, page_size, pinned_bytes};

#[test]
fn memory_pinned_for_io_is_counted_by_pinned_bytes() {
    if let Err(why) = available() {
        eprintln!("skipped: {why}");
        return;
    }
    let page = page_size();
    let len = 16 * page;
    // SAFETY: a new private anonymous mapping.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    } as usize;
    assert_ne!(base, libc::MAP_FAILED as usize);
    // SAFETY: ours.
    unsafe { std::ptr::write_bytes(base as *mut u8, 0x11, len) };
    let Some(ring) = uring::Ring::new() else {
        eprintln!("skipped: io_uring unavailable");
        return;
    };
    let before = pinned_bytes();
    ring.register_buffer(base, len)
        .expect("IORING_REGISTER_BUFFERS");
    let pinned = pinned_bytes();
    assert!(
        pinned >= before + len as u64,
        "{len} bytes registered as an io_uring fixed buffer: VmPin went from {before} to {pinned}"
    );
}
