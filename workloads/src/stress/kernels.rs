//! The stress mix's kernels: one softhsa host kernel registered under three names, so a tool can
//! tell from the kernel object alone how the application wants a dispatch treated (replayed or
//! opted out), and one kernel a tool dispatches from inside its callbacks.

use kreplay_softhsa::WorkGroup;

/// Work-items per work-group of every stress dispatch.
pub const WORKGROUP: u16 = 64;

/// What [`StressArgs::op`] asks the kernel to do to `dst[i]` (all arithmetic wrapping `u32`).
pub mod op {
    /// `dst[i] = dst[i] * 3 + (constant ^ i)`: in place, not idempotent.
    pub const MUTATE: u32 = 0;
    /// `dst[i] = seed(constant, i)`: initialization.
    pub const INIT: u32 = 1;
    /// `dst[i] = rotl(dst[i] + src[i], 1)`: reads a second buffer, not idempotent.
    pub const ACCUMULATE: u32 = 2;
}

/// Arguments of the stress kernel.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct StressArgs {
    /// The buffer written (`words` u32s).
    pub dst: u64,
    /// The buffer read by [`op::ACCUMULATE`] (`words` u32s), else 0.
    pub src: u64,
    /// Elements.
    pub words: u32,
    /// One of [`op`].
    pub op: u32,
    /// Mixed into the result.
    pub constant: u32,
    /// Unused.
    pub pad: u32,
}

/// Arguments of the tool's kernel: `data[i] += 1` for `i < words`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct AddOneArgs {
    /// The buffer (`words` u32s).
    pub data: u64,
    /// Elements.
    pub words: u32,
    /// Unused.
    pub pad: u32,
}

/// The kernel objects of the stress mix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StressKernels {
    /// The stress kernel, for dispatches the application wants replayed.
    pub replayed: u64,
    /// The same kernel, for dispatches the tool is to opt out.
    pub opted_out: u64,
    /// `data[i] += 1`, dispatched by the tool from inside its callbacks.
    pub tool_add: u64,
}

impl StressKernels {
    /// Registers the kernels (registering again returns the same objects).
    pub fn register() -> Self {
        StressKernels {
            replayed: kreplay_softhsa::register_kernel("stress_replayed", stress),
            opted_out: kreplay_softhsa::register_kernel("stress_opted_out", stress),
            tool_add: kreplay_softhsa::register_kernel("stress_tool_add", tool_add),
        }
    }
}

/// The value [`op::INIT`] stores at `i`.
pub fn seed_word(constant: u32, i: u32) -> u32 {
    let mut x = (u64::from(constant) << 32) | u64::from(i);
    x = (x ^ (x >> 33)).wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 29;
    x as u32
}

fn stress(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries a `StressArgs` block.
    let args: StressArgs = unsafe { group.kernargs() };
    let dst = args.dst as *mut u32;
    let src = args.src as *const u32;
    for [i, _, _] in group.work_items() {
        if i >= args.words {
            continue;
        }
        let at = i as usize;
        // SAFETY: `dst` (and `src` for ACCUMULATE) hold `words` u32s; each work-item owns
        // element `i`.
        unsafe {
            let old = *dst.add(at);
            *dst.add(at) = match args.op {
                op::MUTATE => old.wrapping_mul(3).wrapping_add(args.constant ^ i),
                op::INIT => seed_word(args.constant, i),
                _ => old.wrapping_add(*src.add(at)).rotate_left(1),
            };
        }
    }
}

fn tool_add(group: &WorkGroup) {
    // SAFETY: every dispatch of this kernel carries an `AddOneArgs` block.
    let args: AddOneArgs = unsafe { group.kernargs() };
    for [i, _, _] in group.work_items() {
        if i < args.words {
            // SAFETY: `data` holds `words` u32s; each work-item owns element `i`.
            unsafe { *(args.data as *mut u32).add(i as usize) += 1 };
        }
    }
}
