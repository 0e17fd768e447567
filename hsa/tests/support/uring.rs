//! A minimal io_uring (raw system calls): one ring, one registered buffer, READ_FIXED.
//! Shared by adversarial tests (included with `#[path]`).

#![allow(dead_code)]

use std::io;

const SYS_IO_URING_SETUP: libc::c_long = 425;
const SYS_IO_URING_ENTER: libc::c_long = 426;
const SYS_IO_URING_REGISTER: libc::c_long = 427;
const IORING_OFF_SQ_RING: i64 = 0;
const IORING_OFF_CQ_RING: i64 = 0x8000000;
const IORING_OFF_SQES: i64 = 0x10000000;
const IORING_REGISTER_BUFFERS: u32 = 0;
const IORING_UNREGISTER_BUFFERS: u32 = 1;
const IORING_OP_READ_FIXED: u8 = 4;
const IORING_ENTER_GETEVENTS: u32 = 1;

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct SqOffsets {
    head: u32,
    tail: u32,
    ring_mask: u32,
    ring_entries: u32,
    flags: u32,
    dropped: u32,
    array: u32,
    resv1: u32,
    user_addr: u64,
}
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct CqOffsets {
    head: u32,
    tail: u32,
    ring_mask: u32,
    ring_entries: u32,
    overflow: u32,
    cqes: u32,
    flags: u32,
    resv1: u32,
    user_addr: u64,
}
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct Params {
    sq_entries: u32,
    cq_entries: u32,
    flags: u32,
    sq_thread_cpu: u32,
    sq_thread_idle: u32,
    features: u32,
    wq_fd: u32,
    resv: [u32; 3],
    sq_off: SqOffsets,
    cq_off: CqOffsets,
}
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct Sqe {
    opcode: u8,
    flags: u8,
    ioprio: u16,
    fd: i32,
    off: u64,
    addr: u64,
    len: u32,
    rw_flags: u32,
    user_data: u64,
    buf_index: u16,
    personality: u16,
    splice_fd_in: i32,
    addr3: u64,
    pad: u64,
}
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct Cqe {
    user_data: u64,
    res: i32,
    flags: u32,
}

const _: () = assert!(std::mem::size_of::<Params>() == 120);
const _: () = assert!(std::mem::size_of::<Sqe>() == 64);

pub struct Ring {
    fd: i32,
    sq: *mut u8,
    cq: *mut u8,
    sqes: *mut Sqe,
    p: Params,
}

// SAFETY: the ring's mappings and descriptor belong to the ring alone; whichever one thread
// holds it may submit to it and read its completions.
unsafe impl Send for Ring {}

fn map(fd: i32, len: usize, off: i64) -> Option<*mut u8> {
    // SAFETY: mapping the ring's own regions.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_POPULATE,
            fd,
            off,
        )
    };
    (p != libc::MAP_FAILED).then_some(p.cast())
}

impl Ring {
    pub fn new() -> Option<Ring> {
        let mut p = Params::default();
        // SAFETY: io_uring_setup writes `p`.
        let fd = unsafe { libc::syscall(SYS_IO_URING_SETUP, 4u32, &mut p as *mut Params) } as i32;
        if fd < 0 {
            return None;
        }
        let sq_len = p.sq_off.array as usize + p.sq_entries as usize * 4;
        let cq_len = p.cq_off.cqes as usize + p.cq_entries as usize * std::mem::size_of::<Cqe>();
        let sq = map(fd, sq_len, IORING_OFF_SQ_RING)?;
        let cq = map(fd, cq_len, IORING_OFF_CQ_RING)?;
        let sqes = map(fd, p.sq_entries as usize * 64, IORING_OFF_SQES)?.cast();
        Some(Ring {
            fd,
            sq,
            cq,
            sqes,
            p,
        })
    }

    pub fn register_buffer(&self, addr: usize, len: usize) -> io::Result<()> {
        let iov = libc::iovec {
            iov_base: addr as *mut _,
            iov_len: len,
        };
        // SAFETY: one iovec.
        let rc = unsafe {
            libc::syscall(
                SYS_IO_URING_REGISTER,
                self.fd,
                IORING_REGISTER_BUFFERS,
                &iov as *const libc::iovec,
                1u32,
            )
        };
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// Unregisters every registered buffer (the kernel unpins their pages before returning).
    pub fn unregister_buffers(&self) -> io::Result<()> {
        // SAFETY: IORING_UNREGISTER_BUFFERS takes no argument.
        let rc = unsafe {
            libc::syscall(
                SYS_IO_URING_REGISTER,
                self.fd,
                IORING_UNREGISTER_BUFFERS,
                std::ptr::null::<u8>(),
                0u32,
            )
        };
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// READ_FIXED of `len` bytes at file offset `off` of `fd` into `addr` (inside registered
    /// buffer 0); waits for the completion and returns its result.
    pub fn read_fixed(&self, fd: i32, addr: usize, len: usize, off: u64) -> io::Result<usize> {
        // SAFETY: the offsets come from the kernel; one submission, one completion at a time.
        unsafe {
            let at = |base: *mut u8, o: u32| base.add(o as usize).cast::<u32>();
            let tail = std::ptr::read_volatile(at(self.sq, self.p.sq_off.tail));
            let mask = std::ptr::read_volatile(at(self.sq, self.p.sq_off.ring_mask));
            let idx = tail & mask;
            *self.sqes.add(idx as usize) = Sqe {
                opcode: IORING_OP_READ_FIXED,
                fd,
                off,
                addr: addr as u64,
                len: len as u32,
                user_data: 7,
                buf_index: 0,
                ..Sqe::default()
            };
            *at(self.sq, self.p.sq_off.array).add(idx as usize) = idx;
            std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
            std::ptr::write_volatile(at(self.sq, self.p.sq_off.tail), tail.wrapping_add(1));
            let rc = libc::syscall(
                SYS_IO_URING_ENTER,
                self.fd,
                1u32,
                1u32,
                IORING_ENTER_GETEVENTS,
                std::ptr::null::<u8>(),
                0usize,
            );
            if rc < 0 {
                return Err(io::Error::last_os_error());
            }
            let head = std::ptr::read_volatile(at(self.cq, self.p.cq_off.head));
            let cmask = std::ptr::read_volatile(at(self.cq, self.p.cq_off.ring_mask));
            let cqe = *self
                .cq
                .add(self.p.cq_off.cqes as usize)
                .cast::<Cqe>()
                .add((head & cmask) as usize);
            std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
            std::ptr::write_volatile(at(self.cq, self.p.cq_off.head), head.wrapping_add(1));
            if cqe.res < 0 {
                Err(io::Error::from_raw_os_error(-cqe.res))
            } else {
                Ok(cqe.res as usize)
            }
        }
    }
}

/// A memfd holding `data`.
pub fn memfd_with(data: &[u8]) -> i32 {
    // SAFETY: a new memfd, written once.
    unsafe {
        let fd = libc::memfd_create(c"adv-uring".as_ptr(), 0);
        assert!(fd >= 0);
        assert_eq!(
            libc::pwrite(fd, data.as_ptr().cast(), data.len(), 0) as usize,
            data.len()
        );
        fd
    }
}
