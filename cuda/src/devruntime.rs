//! Kernels that call into the device runtime, and the device heap, on one context.
//!
//! Device code can reach memory that no allocation call returns and no kernel argument points
//! into: the driver's printf buffer (device-side `printf`, printed by the host at the next
//! synchronisation) and the device heap (device-side `malloc` and `free`). kreplay cannot
//! snapshot either (no driver call says where they are), so:
//!
//! * **A kernel that calls them** (`vprintf`, `malloc`, `free`, `__nv_aligned_device_malloc`,
//!   directly or through the functions it calls; read from its cubin by
//!   [`crate::globals::parse_cubin`]) is declined (`untracked_memory`) and runs once: replayed,
//!   it would print its lines once per pass, and allocate once per pass while a restore puts
//!   back only the pointers, so the heap would fill up with blocks the program never sees.
//! * **Once a kernel that calls the heap's functions has run on a context**, the heap may hold
//!   the program's data, reached by any later kernel through a pointer stored in memory (a
//!   `__device__` pointer, a pointer table) or passed as an argument. Every later launch on that
//!   context is then declined too, naming the kernel that used the heap, unless
//!   `KREPLAY_CUDA_DEVICE_HEAP=trust` says the program's other kernels never write heap memory
//!   (an explicit opt-in: a kernel that does is then replayed with the heap unrestored).
//!   Kernels that call the heap's functions themselves are declined under `trust` too.
//!
//! The state is per context: each context has a heap of its own.

use parking_lot::Mutex;

use crate::globals::is_heap_call;

/// What later launches do once a kernel has used the device heap (`KREPLAY_CUDA_DEVICE_HEAP`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HeapPolicy {
    /// Decline every later launch on the context (the default).
    #[default]
    Decline,
    /// Replay later launches that do not call the heap's functions themselves.
    Trust,
}

impl std::str::FromStr for HeapPolicy {
    type Err = String;
    /// `decline` or `trust`, in any ASCII case, spaces around ignored (as every other choice
    /// among kreplay's settings is read).
    fn from_str(s: &str) -> Result<HeapPolicy, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "decline" => Ok(HeapPolicy::Decline),
            "trust" => Ok(HeapPolicy::Trust),
            _ => Err(format!("{s:?}: expected decline or trust")),
        }
    }
}

/// One context's record of device-heap use.
#[derive(Debug, Default)]
pub struct DeviceRuntime {
    /// The first kernel seen to call the heap's functions on this context.
    heap_user: Mutex<Option<String>>,
}

impl DeviceRuntime {
    /// A context on which no kernel has used the heap yet.
    pub fn new() -> DeviceRuntime {
        DeviceRuntime::default()
    }

    /// Whether a launch of `kernel`, which can call the device-runtime functions `calls`, may be
    /// replayed; else why not (the launch is declined with `untracked_memory`). A kernel that
    /// calls the heap's functions is remembered as the context's heap user, declined or not.
    pub fn check(&self, kernel: &str, calls: &[String], policy: HeapPolicy) -> Result<(), String> {
        let heap: Vec<&str> = calls
            .iter()
            .map(String::as_str)
            .filter(|c| is_heap_call(c))
            .collect();
        let printf = calls.iter().any(|c| c == "vprintf");
        self.note(kernel, calls);
        let user = self.heap_user.lock();
        if printf || !heap.is_empty() {
            let mut effects = Vec::new();
            if printf {
                effects.push(
                    "it calls vprintf (device-side printf), so every pass would print its lines \
                     again"
                        .to_string(),
                );
            }
            if !heap.is_empty() {
                effects.push(format!(
                    "it calls {} (the device heap), so every pass would allocate or free again \
                     in memory kreplay cannot snapshot",
                    heap.join(", ")
                ));
            }
            return Err(format!(
                "kernel {kernel} uses the device runtime: {}",
                effects.join("; ")
            ));
        }
        match (&*user, policy) {
            (Some(first), HeapPolicy::Decline) => Err(format!(
                "kernel {first} allocated from the device heap on this context, and any later \
                 kernel may write that memory through a pointer kreplay cannot see or snapshot \
                 (KREPLAY_CUDA_DEVICE_HEAP=trust replays kernels that do not call malloc or free \
                 themselves, with the heap unrestored)"
            )),
            _ => Ok(()),
        }
    }

    /// A launch of `kernel`, which can call `calls`, ran on this context (replayed or not):
    /// remember it as the heap user if it calls the heap's functions and none was before.
    pub fn note(&self, kernel: &str, calls: &[String]) {
        if calls.iter().any(|c| is_heap_call(c)) {
            self.heap_user
                .lock()
                .get_or_insert_with(|| kernel.to_owned());
        }
    }

    /// The first kernel seen to call the heap's functions on this context, if any.
    pub fn heap_user(&self) -> Option<String> {
        self.heap_user.lock().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn calls(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_kernel_that_prints_is_declined_and_says_why_without_marking_the_heap() {
        let rt = DeviceRuntime::new();
        let e = rt
            .check("say", &calls(&["vprintf"]), HeapPolicy::Decline)
            .unwrap_err();
        assert!(e.contains("say") && e.contains("printf"), "{e}");
        assert_eq!(rt.heap_user(), None);
        assert_eq!(rt.check("plain", &[], HeapPolicy::Decline), Ok(()));
    }

    #[test]
    fn after_a_heap_user_every_later_launch_declines_unless_trusted() {
        let rt = DeviceRuntime::new();
        assert_eq!(rt.check("before", &[], HeapPolicy::Decline), Ok(()));
        let e = rt
            .check("grab", &calls(&["malloc"]), HeapPolicy::Trust)
            .unwrap_err();
        assert!(e.contains("grab") && e.contains("malloc"), "{e}");
        assert_eq!(rt.heap_user().as_deref(), Some("grab"));
        let e = rt.check("bump", &[], HeapPolicy::Decline).unwrap_err();
        assert!(
            e.contains("grab") && e.contains("KREPLAY_CUDA_DEVICE_HEAP=trust"),
            "{e}"
        );
        assert_eq!(rt.check("bump", &[], HeapPolicy::Trust), Ok(()));
        // A heap function is declined under trust too; the first user stays the one named.
        assert!(
            rt.check("release", &calls(&["free"]), HeapPolicy::Trust)
                .is_err()
        );
        assert_eq!(rt.heap_user().as_deref(), Some("grab"));
    }

    #[test]
    fn a_heap_user_that_ran_once_unreplayed_is_noted_too() {
        let rt = DeviceRuntime::new();
        rt.note("printer", &calls(&["vprintf"]));
        assert_eq!(rt.heap_user(), None);
        rt.note("grab", &calls(&["__nv_aligned_device_malloc"]));
        rt.note("other", &calls(&["malloc"]));
        assert_eq!(rt.heap_user().as_deref(), Some("grab"));
        assert!(rt.check("bump", &[], HeapPolicy::Decline).is_err());
    }

    #[test]
    fn the_policy_is_read_from_its_two_words() {
        assert_eq!(" trust ".parse::<HeapPolicy>(), Ok(HeapPolicy::Trust));
        assert_eq!("decline".parse::<HeapPolicy>(), Ok(HeapPolicy::Decline));
        let e = "ignore".parse::<HeapPolicy>().unwrap_err();
        assert!(e.contains("ignore") && e.contains("trust"), "{e}");
    }
}
