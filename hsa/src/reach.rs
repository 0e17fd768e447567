//! What a dispatch can reach, turned into the snapshot's filter (docs/abi.md §3 rules 2 and 3).
//!
//! * **Kernel arguments.** The dispatch's kernarg segment starts at the packet's
//!   `kernarg_address`; its size is the kernel's `KERNEL_KERNARG_SEGMENT_SIZE`, found by kernel
//!   object among the kernel symbols of the executables loaded on the agent (the same query on
//!   ROCm and on softhsa: both describe kernels through `hsa_executable_symbol_get_info`). A
//!   kernel object no executable describes (softhsa's registered host kernels, code loaded
//!   before kreplay) is scanned up to the end of the allocation that holds its arguments: its
//!   first [`MAX_KERNARG_SCAN`] bytes in full, the rest up to [`MAX_KERNARG_READ`] for values
//!   naming memory kreplay knows (a kernel with a large struct passed by value had a pointer
//!   past 4 KiB missed, its memory replayed unrestored); more values than the kernel has,
//!   which can only add regions. Every 8-byte value at a 4-byte aligned position is resolved (one
//!   past a tracked allocation's end reaches that allocation, even where the next allocation
//!   begins there), and a value at any other byte
//!   position (a pointer in a packed struct) where it names memory kreplay knows without asking
//!   the runtime (tracked, an image, a signal, a reservation, a module variable): a writable module
//!   variable is vouched for; read-only variables, the rest of a loaded code segment and
//!   executable memory are skipped; a tracked allocation is referenced whatever its owner or
//!   kind; memory the runtime knows and kreplay does not is adopted or declined (see
//!   [`adoption`]); a value in no memory the runtime knows is a plain number, except where the
//!   agents reach the process's host memory directly (`HSA_AMD_SYSTEM_INFO_SVM_ACCESSIBLE_BY_DEFAULT`,
//!   XNACK on): there a value that is an address mapped in the process declines the replay
//!   (`untracked_memory`), since the kernel may write that memory and no snapshot holds it.
//!   A value equal to the handle of an image kreplay saw created (`crate::images`) resolves to
//!   the image's data instead: a kernel reaches an image through its handle, which points to
//!   none of the data's bytes.
//!   A value inside a reserved virtual address range (`hsa_amd_vmem_address_reserve`), or one
//!   past its end, reaches every mapping inside that range (`crate::vmem`): a range backed by
//!   several handles side by side is one buffer to the kernel.
//! * **Images.** The data of every image created for the agent (`crate::images`), whose handle
//!   a kernel may find in memory (a HIP texture or surface object), as if an argument pointed
//!   into it.
//! * **Module-scope variables.** The writable variables of every frozen executable loaded on the agent
//!   (`hsa_executable_iterate_agent_symbols`, `VARIABLE_SEGMENT` global and not
//!   `VARIABLE_IS_CONST`) are vouched for by address and size: they live inside a loader
//!   segment that also holds code and read-only data, so the segment as a whole is never taken.
//! * **Scope.** `KREPLAY_SNAPSHOT_SCOPE=agent` starts from the agent's coarse-grained memory,
//!   `referenced` from nothing; both add the above.
//!
//! The limit: memory reached only through pointers stored in memory (a pointer table in a
//! buffer, a linked structure) is invisible to the argument scan. Under `agent` scope it is
//! still covered when it is the agent's own coarse-grained memory.

use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

use hsa_sys::*;
use kreplay_passloop::{Decline, DeclineReason};
use kreplay_snapshot::{
    DeviceMemory, Filter, MemoryKind, NewAllocation, RegionSource, SnapshotScope,
};
use parking_lot::Mutex;

use crate::backend::{Backend, backend, guarded};
use crate::memory::HsaMemory;

/// The kernarg bytes whose values are all resolved when the kernel's segment size is unknown.
pub(crate) const MAX_KERNARG_SCAN: u64 = 4096;

/// The most kernarg bytes read when the kernel's segment size is unknown: past
/// [`MAX_KERNARG_SCAN`], values are resolved only where they name memory kreplay knows (as at
/// unaligned positions), so that a kernel with more arguments than usual (a large struct passed
/// by value) has its pointers found without a runtime call per value of what may be unrelated
/// bytes after its arguments.
pub(crate) const MAX_KERNARG_READ: u64 = 64 << 10;

/// One past the highest address of a process on x86-64 and AArch64 (57 bits with five-level
/// paging): no candidate pointer at or above it is looked up.
const MAX_USER_ADDRESS: u64 = 1 << 57;

type SymbolCallback = unsafe extern "C" fn(
    hsa_executable_t,
    hsa_agent_t,
    hsa_executable_symbol_t,
    *mut c_void,
) -> hsa_status_t;

/// The runtime's own executable entries, saved at installation (absent entries: no module
/// variables or kernarg sizes can be learned, and the wrappers are not installed).
struct ExecutableApi {
    create: unsafe extern "C" fn(
        hsa_profile_t,
        hsa_executable_state_t,
        *const std::ffi::c_char,
        *mut hsa_executable_t,
    ) -> hsa_status_t,
    create_alt: unsafe extern "C" fn(
        hsa_profile_t,
        hsa_default_float_rounding_mode_t,
        *const std::ffi::c_char,
        *mut hsa_executable_t,
    ) -> hsa_status_t,
    destroy: unsafe extern "C" fn(hsa_executable_t) -> hsa_status_t,
    freeze: unsafe extern "C" fn(hsa_executable_t, *const std::ffi::c_char) -> hsa_status_t,
    iterate_agent_symbols: unsafe extern "C" fn(
        hsa_executable_t,
        hsa_agent_t,
        Option<SymbolCallback>,
        *mut c_void,
    ) -> hsa_status_t,
    symbol_get_info: unsafe extern "C" fn(
        hsa_executable_symbol_t,
        hsa_executable_symbol_info_t,
        *mut c_void,
    ) -> hsa_status_t,
}

static API: OnceLock<ExecutableApi> = OnceLock::new();
/// Executables the application created (and has not destroyed) since installation.
static EXECUTABLES: Mutex<Vec<Tracked>> = Mutex::new(Vec::new());

/// [`EXECUTABLES`], for the fork set (`crate::fork`).
pub(crate) fn fork_lock() -> crate::fork::Lock<'static> {
    &EXECUTABLES
}

/// One executable and, once it is frozen (its symbols no longer change), its symbols per agent,
/// enumerated on first use and kept: a replay's fixed cost must not grow with the number of
/// kernels an application loaded.
struct Tracked {
    handle: u64,
    frozen: bool,
    per_agent: Vec<(u64, Arc<[LoadedSymbol]>)>,
}

/// Saves the runtime's executable entries (from the table as captured, so entries past the size
/// the runtime declares are absent). Returns whether every entry reach needs is there; only then
/// are creation and destruction wrapped, so the executables loaded on an agent can be enumerated
/// at snapshot time.
pub(crate) fn capture(core: &CoreApiTable) -> bool {
    let (
        Some(create),
        Some(create_alt),
        Some(destroy),
        Some(freeze),
        Some(iterate_agent_symbols),
        Some(symbol_get_info),
    ) = (
        core.hsa_executable_create_fn,
        core.hsa_executable_create_alt_fn,
        core.hsa_executable_destroy_fn,
        core.hsa_executable_freeze_fn,
        core.hsa_executable_iterate_agent_symbols_fn,
        core.hsa_executable_symbol_get_info_fn,
    )
    else {
        return false;
    };
    API.set(ExecutableApi {
        create,
        create_alt,
        destroy,
        freeze,
        iterate_agent_symbols,
        symbol_get_info,
    })
    .is_ok()
}

fn remember(status: hsa_status_t, exe: *mut hsa_executable_t) -> hsa_status_t {
    if status == HSA_STATUS_SUCCESS && !exe.is_null() && !backend().is_finalized() {
        // SAFETY: the runtime wrote the new executable through the caller's valid out pointer.
        let handle = unsafe { exe.read_unaligned() }.handle;
        EXECUTABLES.lock().push(Tracked {
            handle,
            frozen: false,
            per_agent: Vec::new(),
        });
    }
    status
}

pub(crate) unsafe extern "C" fn executable_create(
    profile: hsa_profile_t,
    state: hsa_executable_state_t,
    options: *const std::ffi::c_char,
    exe: *mut hsa_executable_t,
) -> hsa_status_t {
    guarded(|| {
        let api = API.get().expect("installed with the entries");
        // SAFETY: the runtime's own entry, called with the caller's arguments.
        remember(unsafe { (api.create)(profile, state, options, exe) }, exe)
    })
}

pub(crate) unsafe extern "C" fn executable_create_alt(
    profile: hsa_profile_t,
    rounding: hsa_default_float_rounding_mode_t,
    options: *const std::ffi::c_char,
    exe: *mut hsa_executable_t,
) -> hsa_status_t {
    guarded(|| {
        let api = API.get().expect("installed with the entries");
        // SAFETY: the runtime's own entry, called with the caller's arguments.
        remember(
            unsafe { (api.create_alt)(profile, rounding, options, exe) },
            exe,
        )
    })
}

/// Wrapper of `hsa_executable_destroy`: a fenced call. Every replay snapshots the writable
/// module-scope variables of the executables loaded on its agent, and restores them after each
/// pass: the executable (its variables' memory) is destroyed only once no replay of a GPU holds
/// them, so no restore writes into memory the runtime has freed (and may have handed to another
/// allocation, of another GPU).
pub(crate) unsafe extern "C" fn executable_destroy(exe: hsa_executable_t) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let gpus = b.gpus().to_vec();
        let _fence = crate::copies::readers(b, &gpus);
        EXECUTABLES.lock().retain(|t| t.handle != exe.handle);
        crate::devruntime::destroyed(exe);
        let api = API.get().expect("installed with the entries");
        // SAFETY: the runtime's own entry, called with the caller's argument.
        unsafe { (api.destroy)(exe) }
    })
}

pub(crate) unsafe extern "C" fn executable_freeze(
    exe: hsa_executable_t,
    options: *const std::ffi::c_char,
) -> hsa_status_t {
    guarded(|| {
        let api = API.get().expect("installed with the entries");
        // SAFETY: the runtime's own entry, called with the caller's arguments.
        let status = unsafe { (api.freeze)(exe, options) };
        if status == HSA_STATUS_SUCCESS {
            crate::devruntime::frozen(exe);
        }
        if status == HSA_STATUS_SUCCESS
            && let Some(t) = EXECUTABLES
                .lock()
                .iter_mut()
                .find(|t| t.handle == exe.handle)
        {
            t.frozen = true;
        }
        status
    })
}

/// One symbol of a loaded executable, as far as reach is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LoadedSymbol {
    Kernel {
        object: u64,
        kernarg_size: u64,
    },
    Variable {
        address: u64,
        size: u64,
        writable: bool,
    },
}

/// The kernels and variables of every frozen executable loaded on `agent` (only a frozen
/// executable's kernels can be dispatched, and its symbols no longer change).
fn loaded_symbols(agent: hsa_agent_t) -> Vec<LoadedSymbol> {
    if API.get().is_none() {
        return Vec::new();
    }
    let mut executables = EXECUTABLES.lock();
    let mut out = Vec::new();
    for t in executables.iter_mut().filter(|t| t.frozen) {
        let symbols = match t.per_agent.iter().find(|(a, _)| *a == agent.handle) {
            Some((_, symbols)) => symbols.clone(),
            None => {
                let symbols: Arc<[LoadedSymbol]> = enumerate(t.handle, agent).into();
                t.per_agent.push((agent.handle, symbols.clone()));
                symbols
            }
        };
        out.extend_from_slice(&symbols);
    }
    out
}

/// The symbols of one executable on `agent`, from the runtime.
fn enumerate(handle: u64, agent: hsa_agent_t) -> Vec<LoadedSymbol> {
    let api = API.get().expect("checked by the caller");
    let mut out: Vec<LoadedSymbol> = Vec::new();
    unsafe extern "C" fn visit(
        _: hsa_executable_t,
        _: hsa_agent_t,
        sym: hsa_executable_symbol_t,
        data: *mut c_void,
    ) -> hsa_status_t {
        // SAFETY: `data` is the `Vec` below, alive for the walk; the API is set.
        let out = unsafe { &mut *data.cast::<Vec<LoadedSymbol>>() };
        if let Some(s) = describe(API.get().expect("set"), sym) {
            out.push(s);
        }
        HSA_STATUS_SUCCESS
    }
    // SAFETY: the runtime's own entry with a callback of the right type and live data; an
    // executable destroyed meanwhile is an error status, ignored.
    let _ = unsafe {
        (api.iterate_agent_symbols)(
            hsa_executable_t { handle },
            agent,
            Some(visit),
            (&raw mut out).cast(),
        )
    };
    out
}

fn info<T: Copy + Default>(
    api: &ExecutableApi,
    sym: hsa_executable_symbol_t,
    attr: hsa_executable_symbol_info_t,
) -> Option<T> {
    let mut v = T::default();
    // SAFETY: the runtime's own entry; `v` has the attribute's type (u32, u64 or bool per the
    // HSA specification of each attribute asked for below).
    let st = unsafe { (api.symbol_get_info)(sym, attr, (&raw mut v).cast()) };
    (st == HSA_STATUS_SUCCESS).then_some(v)
}

fn describe(api: &ExecutableApi, sym: hsa_executable_symbol_t) -> Option<LoadedSymbol> {
    match info::<u32>(api, sym, HSA_EXECUTABLE_SYMBOL_INFO_TYPE)? {
        HSA_SYMBOL_KIND_KERNEL => Some(LoadedSymbol::Kernel {
            object: info::<u64>(api, sym, HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_OBJECT)?,
            kernarg_size: u64::from(info::<u32>(
                api,
                sym,
                HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_KERNARG_SEGMENT_SIZE,
            )?),
        }),
        HSA_SYMBOL_KIND_VARIABLE => {
            let segment = info::<u32>(api, sym, HSA_EXECUTABLE_SYMBOL_INFO_VARIABLE_SEGMENT)?;
            let is_const = info::<bool>(api, sym, HSA_EXECUTABLE_SYMBOL_INFO_VARIABLE_IS_CONST)?;
            Some(LoadedSymbol::Variable {
                address: info::<u64>(api, sym, HSA_EXECUTABLE_SYMBOL_INFO_VARIABLE_ADDRESS)?,
                size: u64::from(info::<u32>(
                    api,
                    sym,
                    HSA_EXECUTABLE_SYMBOL_INFO_VARIABLE_SIZE,
                )?),
                writable: segment == HSA_VARIABLE_SEGMENT_GLOBAL && !is_const,
            })
        }
        _ => None,
    }
}

/// Whether memory the runtime knows at a kernel argument, untracked by kreplay, is adopted
/// (its base and size, from the runtime) or the replay declined (why).
///
/// Adopted: memory the runtime allocated (`HSA`) or locked for agents (`LOCKED`): its base, size
/// and owner are exact, which is all a snapshot needs, and its free goes through the wrapped
/// free entries, so it stays tracked correctly afterwards. Declined (`untracked_memory`): memory
/// imported from another process (`IPC`) or from a graphics API (`GRAPHICS`), which others may
/// write while the passes run and which no replay can fence, and memory the runtime reports
/// without an extent.
pub(crate) fn adoption(info: &hsa_amd_pointer_info_t) -> Result<(u64, u64), String> {
    let base = info.agentBaseAddress as u64;
    let size = info.sizeInBytes as u64;
    match info.type_ {
        HSA_EXT_POINTER_TYPE_HSA | HSA_EXT_POINTER_TYPE_LOCKED if base != 0 && size != 0 => {
            Ok((base, size))
        }
        HSA_EXT_POINTER_TYPE_HSA | HSA_EXT_POINTER_TYPE_LOCKED => Err(format!(
            "the runtime reports no extent for it (base {base:#x}, size {size})"
        )),
        HSA_EXT_POINTER_TYPE_IPC => {
            Err("it is memory imported from another process, which a replay cannot fence".into())
        }
        HSA_EXT_POINTER_TYPE_GRAPHICS => {
            Err("it is graphics-interop memory, which a replay cannot fence".into())
        }
        other => Err(format!("the runtime reports pointer type {other}")),
    }
}

fn untracked(addr: u64, why: &str) -> Decline {
    Decline::new(
        DeclineReason::UntrackedMemory,
        format!(
            "a kernel argument points into memory kreplay does not track at {addr:#x} and cannot \
             adopt: {why}; the dispatch runs once"
        ),
    )
}

/// The filter of one dispatch's snapshot: the scope's starting point, the writable module
/// variables on the agent, and everything the kernel arguments reach.
pub(crate) fn filter(
    b: &Backend,
    agent: hsa_agent_t,
    dispatch: &hsa_kernel_dispatch_packet_t,
) -> Result<Filter, Decline> {
    let mut filter = match b.snapshotter.config().scope {
        SnapshotScope::Agent => Filter::for_replay(agent.handle),
        SnapshotScope::Referenced => Filter::referenced_only(agent.handle),
        // A scope this backend does not know yet: the widest one it does.
        _ => Filter::for_replay(agent.handle),
    };
    let symbols = loaded_symbols(agent);
    for s in &symbols {
        if let LoadedSymbol::Variable {
            address,
            size,
            writable: true,
        } = *s
        {
            filter = filter.vouch(address, size, RegionSource::ModuleVariable);
        }
    }
    let values = argument_values(b, dispatch, &symbols)?;
    for &value in &values.aligned {
        filter = resolve(b, filter, value, &symbols)?;
    }
    let variables = variable_ranges(&symbols);
    for &value in &values.unaligned {
        if names_known_memory(b, value, &variables) {
            filter = resolve(b, filter, value, &symbols)?;
        }
    }
    // The agent's images: their handles may be found in memory, where no scan looks.
    for data in b.images.data_of_agent(agent.handle) {
        filter = resolve(b, filter, data, &symbols).map_err(|d| {
            Decline::new(
                d.reason,
                format!(
                    "the data of an image created for the agent, at {data:#x}, which its kernels \
                     may reach: {}",
                    d.detail
                ),
            )
        })?;
    }
    Ok(filter)
}

/// The owners of the memory the dispatch's arguments point into, read without changing
/// anything (nothing is adopted, nothing declined): for a replay to work out which agents it
/// must hold before it takes their locks (`crate::peers::replay_agents`). An owner of 0 is
/// memory the runtime knows without an owner. Unreadable arguments give none.
pub(crate) fn argument_owners(
    b: &Backend,
    agent: hsa_agent_t,
    dispatch: &hsa_kernel_dispatch_packet_t,
) -> Vec<u64> {
    let symbols = loaded_symbols(agent);
    let values = argument_values(b, dispatch, &symbols).unwrap_or_default();
    let variables = variable_ranges(&symbols);
    let unaligned = values
        .unaligned
        .into_iter()
        .filter(|&value| names_known_memory(b, value, &variables));
    values
        .aligned
        .into_iter()
        .chain(unaligned)
        .chain(b.images.data_of_agent(agent.handle))
        // An image handle: the image's data is what the kernel reaches.
        .map(|value| b.images.data_of(value).map_or(value, |image| image.data))
        // A reserved virtual address range: every mapping inside it; an end pointer: the
        // allocation it ends.
        .flat_map(|value| {
            let ended = b.inventory.ending_at(value).map(|a| a.base);
            std::iter::once(value)
                .chain(ended)
                .chain(b.vmem.mappings_reached(value))
        })
        .filter_map(|value| match b.inventory.lookup(value) {
            Some(a) => a.kind.is_reachable().then_some(a.owner_agent),
            None => b
                .original
                .pointer_info(value as *const c_void)
                .map(|info| info.agentOwner.handle),
        })
        .collect()
}

/// The 8-byte values of a dispatch's kernel arguments that may be addresses (at least
/// [`kreplay_snapshot::MIN_ADDRESS`]).
#[derive(Default)]
struct ArgumentValues {
    /// At 4-byte aligned positions of the device address: every one is resolved.
    aligned: Vec<u64>,
    /// Candidates: at the other positions (a pointer inside a packed struct passed by value,
    /// after a `char`), and past the first [`MAX_KERNARG_SCAN`] bytes of the arguments of a
    /// kernel no executable describes: resolved only where [`names_known_memory`] says so. Such windows mostly mix the
    /// bytes of two neighbouring values, so asking the runtime about each, or taking a mapped
    /// host address for one the kernel may write, would cost a runtime call per byte and
    /// decline replays over chance values.
    unaligned: Vec<u64>,
}

/// Whether `value`, a candidate of the arguments ([`ArgumentValues::unaligned`]), names memory kreplay knows
/// without asking the runtime: a tracked allocation (inside it or one past its end), a reserved
/// virtual address range, an image's handle, an application signal or a module variable of code
/// loaded on the agent.
fn names_known_memory(b: &Backend, value: u64, variables: &[(u64, u64)]) -> bool {
    b.inventory.lookup(value).is_some()
        || b.inventory.ending_at(value).is_some()
        || b.images.data_of(value).is_some()
        || b.signals.holding(value).is_some()
        || b.svm.containing(value).is_some()
        || b.soft_queues.holding(value).is_some()
        || !b.vmem.mappings_reached(value).is_empty()
        || in_variable(variables, value)
}

/// The (address, size) of every variable among `symbols`, by address: for [`in_variable`],
/// which a scan asks once per byte position of the arguments.
fn variable_ranges(symbols: &[LoadedSymbol]) -> Vec<(u64, u64)> {
    let mut ranges: Vec<(u64, u64)> = symbols
        .iter()
        .filter_map(|s| match *s {
            LoadedSymbol::Variable { address, size, .. } => Some((address, size)),
            LoadedSymbol::Kernel { .. } => None,
        })
        .collect();
    ranges.sort_unstable();
    ranges
}

/// Whether `value` lies in one of `ranges` (sorted by address, as [`variable_ranges`] makes
/// them; variables do not overlap).
fn in_variable(ranges: &[(u64, u64)], value: u64) -> bool {
    let after = ranges.partition_point(|&(address, _)| address <= value);
    after > 0 && {
        let (address, size) = ranges[after - 1];
        value - address < size
    }
}

/// The values of the dispatch's kernel arguments that may be addresses; none when it has no
/// arguments.
fn argument_values(
    b: &Backend,
    dispatch: &hsa_kernel_dispatch_packet_t,
    symbols: &[LoadedSymbol],
) -> Result<ArgumentValues, Decline> {
    let kernarg = dispatch.kernarg_address as u64;
    if kernarg == 0 {
        return Ok(ArgumentValues::default());
    }
    let known_size = symbols.iter().find_map(|s| match *s {
        LoadedSymbol::Kernel {
            object,
            kernarg_size,
        } if object == dispatch.kernel_object => Some(kernarg_size),
        _ => None,
    });
    let len = match known_size {
        Some(size) => size,
        None => {
            // The allocation holding the arguments bounds the scan.
            let end = match b.inventory.lookup(kernarg) {
                Some(a) => a.end(),
                None => match b.original.pointer_info(kernarg as *const c_void) {
                    Some(i) => (i.agentBaseAddress as u64).saturating_add(i.sizeInBytes as u64),
                    None => {
                        return Err(untracked(
                            kernarg,
                            "it holds the dispatch's kernel arguments, and neither an executable \
                             nor the runtime says how large they are",
                        ));
                    }
                },
            };
            end.saturating_sub(kernarg).min(MAX_KERNARG_READ)
        }
    };
    // Values in full only within the known size, or the first bytes of an unknown one.
    let resolved = if known_size.is_some() {
        len
    } else {
        len.min(MAX_KERNARG_SCAN)
    } as usize;
    let mut bytes = vec![0u8; len as usize];
    if len > 0 {
        HsaMemory.read(kernarg, &mut bytes).map_err(|e| {
            Decline::new(
                DeclineReason::SnapshotFailed,
                format!("cannot read the kernel arguments at {kernarg:#x}: {e}"),
            )
        })?;
    }
    // Every 8-byte window at a 4-byte boundary of the device address within those bytes: the
    // ABI aligns pointers to 8, but a packed struct passed by value puts one at 4 (it was
    // never read, and the memory it names was replayed unrestored). A window resolving to
    // nothing is a number. The other windows are candidates: at other byte positions (a packed
    // struct may put a pointer after a `char` or a `short`; such pointers were never read
    // either) and past the bytes resolved in full.
    let mut values = ArgumentValues::default();
    kreplay_snapshot::aligned_values(&bytes[..resolved], kernarg as usize, &mut values.aligned);
    for at in 0..bytes.len().saturating_sub(7) {
        let aligned = (kernarg as usize).wrapping_add(at) % 4 == 0;
        if aligned && at + 8 <= resolved {
            continue;
        }
        let v = u64::from_ne_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        // Most such windows mix the bytes of two values; those above every user address
        // (57 bits, five-level paging) are no pointer and are dropped before any look-up.
        if (kreplay_snapshot::MIN_ADDRESS..MAX_USER_ADDRESS).contains(&v) {
            values.unaligned.push(v);
        }
    }
    Ok(values)
}

/// Whether `addr` lies in a page mapped in this process (`mincore(2)` on its page).
fn mapped_in_process(addr: u64) -> bool {
    const PAGE: u64 = 4096;
    let Ok(page) = usize::try_from(addr & !(PAGE - 1)) else {
        return false;
    };
    let mut resident = 0u8;
    // SAFETY: mincore only inspects the page tables: on an unmapped page it fails with ENOMEM,
    // on a mapped one it writes one byte per page (one page here) into `resident`.
    unsafe { libc::mincore(page as *mut libc::c_void, PAGE as usize, &mut resident) == 0 }
}

/// Adds what `value` (a kernel argument) points into to `filter`.
fn resolve(
    b: &Backend,
    filter: Filter,
    value: u64,
    agent_symbols: &[LoadedSymbol],
) -> Result<Filter, Decline> {
    let variable = |symbols: &[LoadedSymbol]| {
        symbols.iter().find_map(|s| match *s {
            LoadedSymbol::Variable {
                address,
                size,
                writable,
            } if value >= address && value < address.saturating_add(size) => {
                Some((address, size, writable))
            }
            _ => None,
        })
    };
    // An image handle (the address of the image's descriptor on ROCm, not of its data): the
    // kernel reaches the image's data, wherever it lies, and the handle itself is no address
    // of memory the kernel writes.
    if let Some(image) = b.images.data_of(value) {
        return resolve(b, filter, image.data, agent_symbols);
    }
    // A reserved virtual address range (`crate::vmem`): a kernel given a pointer into it, or
    // to its end, may write every mapping inside it, not only the one the pointer names.
    let filter = b
        .vmem
        .mappings_reached(value)
        .into_iter()
        .filter(|&m| b.inventory.lookup(m).is_some_and(|a| a.kind.is_reachable()))
        .fold(filter, |f, m| f.reach(m, RegionSource::Referenced));
    // One past an allocation's end (an end pointer): a kernel may walk back from it, so the
    // allocation it ends is reached too (it was taken for a plain number), also where another
    // allocation begins at that very address (allocations packed back to back): what begins at
    // the value itself is resolved below as ever.
    let filter = match b.inventory.ending_at(value) {
        Some(a) if a.kind.is_reachable() => filter.reach(a.base, RegionSource::Referenced),
        _ => filter,
    };
    // A soft queue (its `hsa_queue_t`): a kernel given one enqueues packets the host processes,
    // once per pass, through a write index and a doorbell no snapshot holds.
    if let Some(queue) = b.soft_queues.holding(value) {
        return Err(Decline::new(
            DeclineReason::UntrackedMemory,
            format!(
                "an argument ({value:#x}) is the application's soft queue {queue:#x}: a kernel \
                 that enqueues into it would enqueue once per pass"
            ),
        ));
    }
    if let Some(a) = b.inventory.lookup(value) {
        return Ok(if a.kind.is_reachable() {
            filter.reach(value, RegionSource::Referenced)
        } else {
            filter
        });
    }
    // An application signal (its handle, or a pointer into it): a kernel that counts it down
    // signals the host once per pass, which no restore can take back (`crate::signals`).
    if let Some(signal) = b.signals.holding(value) {
        return Err(Decline::new(
            DeclineReason::UntrackedMemory,
            format!(
                "an argument ({value:#x}) is the application's signal {signal:#x}: a kernel that \
                 writes a signal would signal the host once per pass"
            ),
        ));
    }
    // Shared virtual memory (`crate::svm`): host memory an agent was granted, which the runtime
    // keeps no allocation for and no snapshot holds.
    if let Some((base, size)) = b.svm.containing(value)
        && mapped_in_process(value)
    {
        return Err(Decline::new(
            DeclineReason::UntrackedMemory,
            format!(
                "a kernel argument ({value:#x}) points into {size} bytes of host memory at                  {base:#x} made accessible to agents with hsa_amd_svm_attributes_set (shared                  virtual memory, managed memory), which the kernel may write and no snapshot                  holds"
            ),
        ));
    }
    let Some(info) = b.original.pointer_info(value as *const c_void) else {
        // No memory the runtime knows: a plain number, unless agents reach the process's host
        // memory directly (XNACK) and it is an address mapped here, which the kernel may write
        // and no snapshot holds.
        if b.svm_by_default && mapped_in_process(value) {
            return Err(Decline::new(
                DeclineReason::UntrackedMemory,
                format!(
                    "a kernel argument ({value:#x}) is an address of this process's host memory, \
                     which the agents reach directly here (SVM accessible by default, XNACK on) \
                     and which is not snapshotted"
                ),
            ));
        }
        return Ok(filter);
    };
    // A loader segment (it holds module variables): only its writable variables count, the
    // rest is code and read-only data. Variables on the dispatch's agent are already vouched.
    let owner_symbols;
    let symbols = if info.agentOwner.handle == 0 {
        agent_symbols
    } else {
        owner_symbols = loaded_symbols(info.agentOwner);
        &owner_symbols
    };
    if let Some((address, size, writable)) = variable(symbols).or_else(|| variable(agent_symbols)) {
        return Ok(if writable {
            filter.vouch(address, size, RegionSource::ModuleVariable)
        } else {
            filter
        });
    }
    let base = info.agentBaseAddress as u64;
    let end = base.saturating_add(info.sizeInBytes as u64);
    let in_segment = symbols.iter().chain(agent_symbols).any(|s| {
        matches!(*s, LoadedSymbol::Variable { address, .. } if address >= base && address < end)
    });
    if in_segment {
        return Ok(filter);
    }
    let (base, size) = adoption(&info).map_err(|why| untracked(value, &why))?;
    let (_, _, owner, kind) = crate::memory::classify(b, value as *const c_void).unwrap_or((
        base,
        size,
        0,
        MemoryKind::Host,
    ));
    b.inventory.on_alloc(NewAllocation {
        base,
        size,
        owner_agent: owner,
        kind,
    });
    b.hooks.warn_once(
        "adopted_memory",
        &format!(
            "adopted {size} bytes at {base:#x} that kreplay never saw allocated (a kernel argument \
             points into it); it is tracked from now on"
        ),
    );
    Ok(filter.reach(value, RegionSource::Adopted))
}

/// The range of `ranges` (base to size) that `addr` lies in, as (base, size).
pub(crate) fn range_containing(
    ranges: &std::collections::BTreeMap<u64, u64>,
    addr: u64,
) -> Option<(u64, u64)> {
    ranges
        .range(..=addr)
        .next_back()
        .map(|(&base, &size)| (base, size))
        .filter(|&(base, size)| addr - base < size)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(type_: hsa_amd_pointer_type_t, base: u64, size: usize) -> hsa_amd_pointer_info_t {
        hsa_amd_pointer_info_t {
            type_,
            agentBaseAddress: base as *mut c_void,
            sizeInBytes: size,
            ..Default::default()
        }
    }

    #[test]
    fn a_value_is_in_a_variable_only_within_its_bytes() {
        let ranges = variable_ranges(&[
            LoadedSymbol::Variable {
                address: 0x2000,
                size: 16,
                writable: true,
            },
            LoadedSymbol::Kernel {
                object: 0x1800,
                kernarg_size: 64,
            },
            LoadedSymbol::Variable {
                address: 0x1000,
                size: 4,
                writable: false,
            },
        ]);
        assert_eq!(ranges, [(0x1000, 4), (0x2000, 16)]);
        for (value, inside) in [
            (0xfff, false),
            (0x1000, true),
            (0x1003, true),
            (0x1004, false),
            (0x1800, false),
            (0x200f, true),
            (0x2010, false),
        ] {
            assert_eq!(in_variable(&ranges, value), inside, "{value:#x}");
        }
        assert!(!in_variable(&[], 0x1000));
    }

    #[test]
    fn runtime_and_locked_memory_is_adopted_with_the_runtimes_extent() {
        assert_eq!(
            adoption(&info(HSA_EXT_POINTER_TYPE_HSA, 0x10000, 4096)),
            Ok((0x10000, 4096))
        );
        assert_eq!(
            adoption(&info(HSA_EXT_POINTER_TYPE_LOCKED, 0x20000, 64)),
            Ok((0x20000, 64))
        );
    }

    #[test]
    fn imported_memory_and_memory_without_an_extent_are_declined_with_a_reason() {
        for (t, base, size, needle) in [
            (HSA_EXT_POINTER_TYPE_IPC, 0x10000, 4096, "another process"),
            (HSA_EXT_POINTER_TYPE_GRAPHICS, 0x10000, 4096, "graphics"),
            (HSA_EXT_POINTER_TYPE_HSA, 0x10000, 0, "no extent"),
            (HSA_EXT_POINTER_TYPE_LOCKED, 0, 4096, "no extent"),
        ] {
            let why = adoption(&info(t, base, size)).unwrap_err();
            assert!(why.contains(needle), "{why}");
            let d = untracked(0x10008, &why);
            assert_eq!(d.reason, DeclineReason::UntrackedMemory);
        }
    }
}
