//! What the application's own memory operations do on a range a tracker follows: the same as
//! without it, but for the two the crate documents (its own userfaultfd, MADV_COLLAPSE).

#![allow(clippy::single_range_in_vec_init)]

use kreplay_wtrack::{WriteTracker, available};

const MIB2: usize = 2 << 20;
const MADV_COLLAPSE: libc::c_int = 25;

fn skip() -> bool {
    if let Err(why) = available() {
        eprintln!("skipped: {why}");
        return true;
    }
    false
}

/// 2 MiB-aligned private anonymous memory of `len` bytes, filled.
fn aligned(len: usize) -> usize {
    // SAFETY: a new anonymous mapping.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len + MIB2,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    let base = (p as usize).div_ceil(MIB2) * MIB2;
    // SAFETY: ours.
    unsafe { std::ptr::write_bytes(base as *mut u8, 0x5A, len) };
    base
}

fn collapse(base: usize) -> Result<(), std::io::Error> {
    // SAFETY: advice on our own mapping.
    let rc = unsafe { libc::madvise(base as *mut libc::c_void, MIB2, MADV_COLLAPSE) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// madvise(MADV_COLLAPSE) (Linux 6.1+) asks for a transparent huge page now; on memory a
/// tracker follows it must do what it does without one.
#[test]
#[ignore = "kernel limit, documented in the crate: memory registered with a userfaultfd is not collapsed (EINVAL)"]
fn madv_collapse_behaves_the_same_on_followed_memory() {
    if skip() {
        return;
    }
    let without = aligned(MIB2);
    let expected = collapse(without);
    if let Err(e) = &expected {
        eprintln!("skipped: MADV_COLLAPSE unavailable here: {e}");
        return;
    }
    let base = aligned(MIB2);
    let tracker = WriteTracker::new(&[base..base + MIB2]).unwrap();
    let got = collapse(base);
    drop(tracker);
    assert!(
        got.is_ok(),
        "MADV_COLLAPSE succeeds without a tracker, fails on followed memory: {got:?}"
    );
}

/// The application registers memory with a userfaultfd of its own (a checkpointing library,
/// a garbage collector): on memory a tracker follows it must succeed as it does without.
#[test]
#[ignore = "kernel limit, documented in the crate: one userfaultfd per range (EBUSY)"]
fn the_applications_own_userfaultfd_registration_succeeds_on_followed_memory() {
    if skip() {
        return;
    }
    let len = 64 * 4096;
    let base = aligned(len);
    let tracker = WriteTracker::new(&[base..base + len]).unwrap();
    let register = || -> std::io::Result<()> {
        // SAFETY: the userfaultfd system calls with structures laid out as the uapi header.
        unsafe {
            let fd = libc::syscall(
                libc::SYS_userfaultfd,
                libc::O_CLOEXEC | 1, /* UFFD_USER_MODE_ONLY */
            ) as i32;
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let mut api = [0xAAu64, 0, 0];
            if libc::ioctl(fd, 0xc018aa3fu64 as _, api.as_mut_ptr()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // UFFDIO_REGISTER, MODE_MISSING.
            let mut reg = [base as u64, len as u64, 1u64, 0u64];
            let rc = libc::ioctl(fd, 0xc020aa00u64 as _, reg.as_mut_ptr());
            let err = std::io::Error::last_os_error();
            libc::close(fd);
            if rc != 0 { Err(err) } else { Ok(()) }
        }
    };
    let got = register();
    drop(tracker);
    let after = register();
    assert!(after.is_ok(), "control: {after:?}");
    assert!(
        got.is_ok(),
        "the application's UFFDIO_REGISTER fails only because the range is followed: {got:?}"
    );
}

/// Writes that other system calls make for the process into a followed range:
/// process_vm_writev (a debugger or an MPI transport) and pwrite to /proc/self/mem.
#[test]
fn pages_written_by_process_vm_writev_and_proc_self_mem_are_reported() {
    if skip() {
        return;
    }
    let page = kreplay_wtrack::page_size();
    let len = 16 * page;
    let base = aligned(len);
    let tracker = WriteTracker::new(&[base..base + len]).unwrap();
    let src = [0xC3u8; 64];
    // SAFETY: writing 64 bytes into our own mapping through the kernel.
    unsafe {
        let local = libc::iovec {
            iov_base: src.as_ptr() as *mut _,
            iov_len: 64,
        };
        let remote = libc::iovec {
            iov_base: (base + 3 * page) as *mut _,
            iov_len: 64,
        };
        assert_eq!(
            libc::process_vm_writev(libc::getpid(), &local, 1, &remote, 1, 0),
            64
        );
        let fd = libc::open(c"/proc/self/mem".as_ptr(), libc::O_RDWR);
        assert!(fd >= 0);
        assert_eq!(
            libc::pwrite(fd, src.as_ptr().cast(), 64, (base + 9 * page) as i64),
            64
        );
        libc::close(fd);
    }
    let mut out = Vec::new();
    tracker.written(&mut out).unwrap();
    for p in [3, 9] {
        assert!(
            out.iter().any(|r| r.contains(&(base + p * page))),
            "page {p} not reported: {out:x?}"
        );
    }
    assert!(
        !out.iter().any(|r| r.contains(&(base + 5 * page))),
        "page 5 reported: {out:x?}"
    );
}
