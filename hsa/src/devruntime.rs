//! Kernels that may print, call the host or use the device heap, as their code objects say.
//!
//! A ROCm kernel reaches host services through buffers no allocation call returns and no
//! snapshot holds: the printf buffer (OpenCL `printf`, printed by the host after the kernel),
//! the hostcall buffer (services the host runs while the kernel runs, HIP's device-side
//! `printf` among them) and the device heap (device-side `malloc` and `free`). Replayed, such
//! a kernel prints its lines (makes its host calls, allocates) once per pass, and the
//! application sees it. The compiler says which kernels may do so: their code object's metadata
//! gives them a hidden argument of kind `hidden_printf_buffer`, `hidden_hostcall_buffer` or
//! `hidden_heap_v1` ([`kreplay_codeobj`]).
//!
//! So kreplay reads the metadata of every code object the application hands the runtime
//! (`hsa_code_object_reader_create_from_memory`, `_from_file`), keeps what it says of the
//! kernels that use those services per reader, follows the readers into the executables they
//! are loaded into (`hsa_executable_load_agent_code_object`, `_load_program_code_object`), and
//! when an executable is frozen ties those kernels to their kernel objects, by symbol name
//! (`.symbol`, `name.kd` on ROCm, or `.name`) among the executable's kernel symbols, for the
//! agent the code object was loaded for. A dispatch of such a kernel object is declined
//! (`untracked_memory`) before any snapshot and runs once, as the application ran it; the
//! decline names the kernel and the argument. A destroyed executable's kernel objects are
//! forgotten (another kernel may be given the same object later).
//!
//! Code objects in another format (softhsa's own), without MessagePack metadata (code object
//! V2) or loaded before kreplay was installed teach nothing: their kernels replay as before.
//! Metadata that cannot be read is warned about, and teaches nothing either.
//!
//! After finalization (and in the child of a `fork`, which is finalized at its start) nothing is
//! replayed, so nothing is learned or forgotten any more: the wrappers pass straight through and
//! never take this module's locks, which a thread of the parent may have held at the fork.

use std::collections::HashMap;
use std::ffi::{c_char, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use hsa_sys::*;
use kreplay_codeobj::Kernel;
use kreplay_passloop::{Decline, DeclineReason};
use parking_lot::{Mutex, RwLock};

use crate::backend::{backend, guarded};
use crate::original::forward;

/// The most bytes of a code object file read for its metadata.
const MAX_FILE_BYTES: u64 = 1 << 30;

/// The kernels of one code object that use the device runtime (never empty).
type Users = Arc<[Kernel]>;

/// Readers whose code object has such kernels, by reader handle.
static READERS: Mutex<Vec<(u64, Users)>> = Mutex::new(Vec::new());
/// Executables not frozen yet, loaded with such a reader: (executable, the agent it was loaded
/// for or none for a program code object, its kernels).
static LOADED: Mutex<Vec<(u64, Option<u64>, Users)>> = Mutex::new(Vec::new());
/// Per kernel object of a frozen executable: (executable, why it is not replayed), one for each
/// live executable holding the object.
type Objects = HashMap<u64, Vec<(u64, Arc<str>)>>;
/// The kernel objects of frozen executables whose code objects said they use the device
/// runtime (made on first use).
static OBJECTS: RwLock<Option<Objects>> = RwLock::new(None);
/// Whether any kernel object was ever tied to a reason (the dispatch path's fast check).
static ANY: AtomicBool = AtomicBool::new(false);

/// The decline of a dispatch of `kernel_object`, if its code object said it may print, call
/// the host or use the device heap.
pub(crate) fn decline(kernel_object: u64) -> Option<Decline> {
    if !ANY.load(Ordering::Acquire) {
        return None;
    }
    let objects = OBJECTS.read();
    let (_, why) = objects.as_ref()?.get(&kernel_object)?.first()?;
    Some(Decline::new(
        DeclineReason::UntrackedMemory,
        why.to_string(),
    ))
}

/// What the metadata of `bytes` says of the kernels that use the device runtime.
fn learn(bytes: &[u8]) -> Option<Users> {
    match kreplay_codeobj::kernels(bytes) {
        Ok(Some(kernels)) => {
            let users: Vec<Kernel> = kernels
                .into_iter()
                .filter(Kernel::uses_device_runtime)
                .collect();
            (!users.is_empty()).then(|| users.into())
        }
        Ok(None) => None,
        Err(e) => {
            backend().hooks.warn(&format!(
                "cannot read the metadata of a code object the application loads ({e}): its \
                 kernels are replayed whether or not they print or call the host"
            ));
            None
        }
    }
}

fn remember_reader(status: hsa_status_t, reader: *mut hsa_code_object_reader_t, users: Users) {
    if status == HSA_STATUS_SUCCESS && !reader.is_null() {
        // SAFETY: the runtime wrote the new reader through the caller's valid out pointer.
        let handle = unsafe { reader.read_unaligned() }.handle;
        remember(handle, users);
    }
}

/// The reader `handle` was just created: what its code object said.
fn remember(handle: u64, users: Users) {
    let mut readers = READERS.lock();
    readers.retain(|(h, _)| *h != handle);
    readers.push((handle, users));
}

/// Wrapper of `hsa_code_object_reader_create_from_memory`: reads the code object's metadata.
pub(crate) unsafe extern "C" fn reader_create_from_memory(
    code_object: *const c_void,
    size: usize,
    reader: *mut hsa_code_object_reader_t,
) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let status = forward!(
            b,
            core.hsa_code_object_reader_create_from_memory_fn(code_object, size, reader)
        );
        if status == HSA_STATUS_SUCCESS && !code_object.is_null() && size > 0 && !b.is_finalized() {
            // SAFETY: HSA contract: `code_object` points to `size` readable bytes, which the
            // runtime has just read too; the call has not returned, so they are still the
            // caller's.
            let bytes = unsafe { std::slice::from_raw_parts(code_object.cast::<u8>(), size) };
            if let Some(users) = learn(bytes) {
                remember_reader(status, reader, users);
            }
        }
        status
    })
}

/// The whole file `file` from its start (where the runtime reads a code object file from),
/// leaving its offset as it is; `None` where it cannot be read or is larger than a code
/// object can be.
fn read_file(file: hsa_file_t) -> Option<Vec<u8>> {
    // SAFETY: an all-zero `stat` is a valid value for fstat to overwrite.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid out pointer; a bad descriptor is an error return.
    if unsafe { libc::fstat(file, &mut st) } != 0 {
        return None;
    }
    let size = u64::try_from(st.st_size)
        .ok()
        .filter(|&s| s <= MAX_FILE_BYTES)?;
    let mut bytes = vec![0u8; usize::try_from(size).ok()?];
    let mut done = 0usize;
    while done < bytes.len() {
        // SAFETY: the destination is the unfilled tail of `bytes`, of the length passed.
        let n = unsafe {
            libc::pread(
                file,
                bytes[done..].as_mut_ptr().cast(),
                bytes.len() - done,
                libc::off_t::try_from(done).ok()?,
            )
        };
        match n {
            0 => break,
            n if n < 0 => {
                if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                    return None;
                }
            }
            n => done += n as usize,
        }
    }
    bytes.truncate(done);
    Some(bytes)
}

/// Wrapper of `hsa_code_object_reader_create_from_file`: reads the code object's metadata from
/// the same file.
pub(crate) unsafe extern "C" fn reader_create_from_file(
    file: hsa_file_t,
    reader: *mut hsa_code_object_reader_t,
) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let status = forward!(
            b,
            core.hsa_code_object_reader_create_from_file_fn(file, reader)
        );
        if status == HSA_STATUS_SUCCESS && !b.is_finalized() {
            match read_file(file) {
                Some(bytes) => {
                    if let Some(users) = learn(&bytes) {
                        remember_reader(status, reader, users);
                    }
                }
                None => b.hooks.warn(
                    "cannot read a code object file the application loads again: its kernels \
                     are replayed whether or not they print or call the host",
                ),
            }
        }
        status
    })
}

/// Wrapper of `hsa_code_object_reader_destroy`: forgets the reader (executables it was loaded
/// into keep what it said).
pub(crate) unsafe extern "C" fn reader_destroy(reader: hsa_code_object_reader_t) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        if b.is_finalized() {
            return forward!(b, core.hsa_code_object_reader_destroy_fn(reader));
        }
        destroy_reader(reader.handle, || {
            forward!(b, core.hsa_code_object_reader_destroy_fn(reader))
        })
    })
}

/// Forgets reader `handle` around `destroy`, the runtime's destroy of it: before it, since once
/// the runtime has freed the reader another thread may be given its handle for a new one (whose
/// record must stay); remembered again if the runtime refuses (the reader lives on, so its
/// handle cannot have been given to another meanwhile).
fn destroy_reader(handle: u64, destroy: impl FnOnce() -> hsa_status_t) -> hsa_status_t {
    let kept: Vec<(u64, Users)> = {
        let mut readers = READERS.lock();
        let (mine, others) = std::mem::take(&mut *readers)
            .into_iter()
            .partition(|(h, _)| *h == handle);
        *readers = others;
        mine
    };
    let status = destroy();
    if status != HSA_STATUS_SUCCESS {
        READERS.lock().extend(kept);
    }
    status
}

fn loaded(status: hsa_status_t, exe: hsa_executable_t, agent: Option<u64>, reader: u64) {
    if status != HSA_STATUS_SUCCESS || backend().is_finalized() {
        return;
    }
    let users = READERS
        .lock()
        .iter()
        .find(|(h, _)| *h == reader)
        .map(|(_, u)| u.clone());
    if let Some(users) = users {
        LOADED.lock().push((exe.handle, agent, users));
    }
}

/// Wrapper of `hsa_executable_load_agent_code_object`: the executable will hold the reader's
/// kernels for `agent`.
pub(crate) unsafe extern "C" fn load_agent_code_object(
    exe: hsa_executable_t,
    agent: hsa_agent_t,
    reader: hsa_code_object_reader_t,
    options: *const c_char,
    loaded_code_object: *mut hsa_loaded_code_object_t,
) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let status = forward!(
            b,
            core.hsa_executable_load_agent_code_object_fn(
                exe,
                agent,
                reader,
                options,
                loaded_code_object
            )
        );
        loaded(status, exe, Some(agent.handle), reader.handle);
        status
    })
}

/// Wrapper of `hsa_executable_load_program_code_object`.
pub(crate) unsafe extern "C" fn load_program_code_object(
    exe: hsa_executable_t,
    reader: hsa_code_object_reader_t,
    options: *const c_char,
    loaded_code_object: *mut hsa_loaded_code_object_t,
) -> hsa_status_t {
    guarded(|| {
        let b = backend();
        let status = forward!(
            b,
            core.hsa_executable_load_program_code_object_fn(
                exe,
                reader,
                options,
                loaded_code_object
            )
        );
        loaded(status, exe, None, reader.handle);
        status
    })
}

/// One kernel symbol of an executable: (name, agent, kernel object).
type KernelSymbol = (String, Option<u64>, u64);

/// The kernel symbols of `exe`, from the runtime.
fn kernel_symbols(exe: hsa_executable_t) -> Vec<KernelSymbol> {
    let b = backend();
    let mut out: Vec<KernelSymbol> = Vec::new();
    unsafe extern "C" fn visit(
        _: hsa_executable_t,
        sym: hsa_executable_symbol_t,
        data: *mut c_void,
    ) -> hsa_status_t {
        // SAFETY: `data` is the `Vec` below, alive for the walk.
        let out = unsafe { &mut *data.cast::<Vec<KernelSymbol>>() };
        if let Some(s) = describe(sym) {
            out.push(s);
        }
        HSA_STATUS_SUCCESS
    }
    // SAFETY: the runtime's own entry with a callback of the right type and live data; a walk
    // that fails leaves what was found so far.
    let _ = forward!(
        b,
        core.hsa_executable_iterate_symbols_fn(exe, Some(visit), (&raw mut out).cast())
    );
    out
}

fn info<T: Copy + Default>(
    sym: hsa_executable_symbol_t,
    attr: hsa_executable_symbol_info_t,
) -> Option<T> {
    let b = backend();
    let mut v = T::default();
    // `v` has the attribute's type (u32, u64 or hsa_agent_t per the HSA specification of each
    // attribute asked for below).
    let st = forward!(
        b,
        core.hsa_executable_symbol_get_info_fn(sym, attr, (&raw mut v).cast())
    );
    (st == HSA_STATUS_SUCCESS).then_some(v)
}

fn describe(sym: hsa_executable_symbol_t) -> Option<KernelSymbol> {
    if info::<u32>(sym, HSA_EXECUTABLE_SYMBOL_INFO_TYPE)? != HSA_SYMBOL_KIND_KERNEL {
        return None;
    }
    let len = info::<u32>(sym, HSA_EXECUTABLE_SYMBOL_INFO_NAME_LENGTH)?;
    // The name is written without a NUL; one more byte of room all the same.
    let mut name = vec![0u8; len as usize + 1];
    let b = backend();
    let st = forward!(
        b,
        core.hsa_executable_symbol_get_info_fn(
            sym,
            HSA_EXECUTABLE_SYMBOL_INFO_NAME,
            name.as_mut_ptr().cast()
        )
    );
    if st != HSA_STATUS_SUCCESS {
        return None;
    }
    name.truncate(len as usize);
    let name = String::from_utf8(name).ok()?;
    let agent = info::<hsa_agent_t>(sym, HSA_EXECUTABLE_SYMBOL_INFO_AGENT).map(|a| a.handle);
    let object = info::<u64>(sym, HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_OBJECT)?;
    Some((name, agent, object))
}

/// The kernel a symbol named `name` of `agent` is, among the code objects `loads` loaded (each
/// for an agent, or for none: a program code object): by its kernel descriptor's symbol
/// (`name.kd`, what ROCm names kernel symbols) or by its name. A symbol or load whose agent is
/// unknown matches any.
fn matching<'a>(
    loads: &'a [(Option<u64>, Users)],
    name: &str,
    agent: Option<u64>,
) -> Option<&'a Kernel> {
    loads
        .iter()
        .filter(|(a, _)| a.is_none() || agent.is_none() || *a == agent)
        .flat_map(|(_, users)| users.iter())
        .find(|k| k.symbol == name || k.name == name)
}

/// `exe` was frozen: ties the kernels its code objects said use the device runtime to their
/// kernel objects. Called by the freeze wrapper (`crate::reach::executable_freeze`).
pub(crate) fn frozen(exe: hsa_executable_t) {
    if backend().is_finalized() {
        return;
    }
    let loads: Vec<(Option<u64>, Users)> = {
        let mut loaded = LOADED.lock();
        let mine = loaded
            .iter()
            .filter(|(e, _, _)| *e == exe.handle)
            .map(|(_, a, u)| (*a, u.clone()))
            .collect();
        loaded.retain(|(e, _, _)| *e != exe.handle);
        mine
    };
    if loads.is_empty() {
        return;
    }
    let mut found: Vec<(u64, Arc<str>)> = Vec::new();
    for (name, agent, object) in kernel_symbols(exe) {
        if let Some(why) = matching(&loads, &name, agent).and_then(Kernel::why_not_replayable) {
            found.push((object, why.into()));
        }
    }
    if found.is_empty() {
        return;
    }
    let mut objects = OBJECTS.write();
    let map = objects.get_or_insert_with(HashMap::new);
    for (object, why) in found {
        map.entry(object).or_default().push((exe.handle, why));
    }
    ANY.store(true, Ordering::Release);
}

/// `exe` is being destroyed: its kernel objects may name other kernels later. Called by the
/// destroy wrapper (`crate::reach::executable_destroy`).
pub(crate) fn destroyed(exe: hsa_executable_t) {
    if backend().is_finalized() {
        return;
    }
    LOADED.lock().retain(|(e, _, _)| *e != exe.handle);
    if !ANY.load(Ordering::Acquire) {
        return;
    }
    if let Some(map) = OBJECTS.write().as_mut() {
        map.retain(|_, owners| {
            owners.retain(|(e, _)| *e != exe.handle);
            !owners.is_empty()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel(name: &str) -> Kernel {
        Kernel {
            name: name.into(),
            symbol: format!("{name}.kd"),
            printf: true,
            ..Kernel::default()
        }
    }

    fn remembered(handle: u64) -> Option<Users> {
        READERS
            .lock()
            .iter()
            .find(|(h, _)| *h == handle)
            .map(|(_, u)| u.clone())
    }

    /// Once the runtime destroyed a reader, another thread may be given its handle for a new
    /// reader before the destroy's wrapper forgot the old one: the wrapper then forgot the new
    /// reader's kernels, which were replayed, printing once per pass. The old reader is now
    /// forgotten before the runtime destroys it (and remembered again if it refuses).
    #[test]
    fn a_reader_made_while_another_with_its_handle_is_destroyed_is_remembered() {
        const H: u64 = 0xdead_0001;
        let old: Users = vec![kernel("old")].into();
        let new: Users = vec![kernel("new")].into();
        remember(H, old.clone());
        let status = destroy_reader(H, || {
            // The runtime freed the reader; another thread's create gets the same handle.
            remember(H, new.clone());
            HSA_STATUS_SUCCESS
        });
        assert_eq!(status, HSA_STATUS_SUCCESS);
        assert_eq!(
            remembered(H).map(|u| u[0].name.clone()).as_deref(),
            Some("new")
        );

        // A destroy the runtime refuses leaves the reader as it was.
        const R: u64 = 0xdead_0002;
        remember(R, old.clone());
        let status = destroy_reader(R, || HSA_STATUS_ERROR_INVALID_CODE_OBJECT_READER);
        assert_eq!(status, HSA_STATUS_ERROR_INVALID_CODE_OBJECT_READER);
        assert_eq!(
            remembered(R).map(|u| u[0].name.clone()).as_deref(),
            Some("old")
        );
        // One it does forgets it.
        assert_eq!(destroy_reader(R, || HSA_STATUS_SUCCESS), HSA_STATUS_SUCCESS);
        assert!(remembered(R).is_none());
    }

    #[test]
    fn symbols_match_by_descriptor_or_name_for_their_agent() {
        let loads: Vec<(Option<u64>, Users)> = vec![
            (Some(1), vec![kernel("a")].into()),
            (None, vec![kernel("p")].into()),
        ];
        assert_eq!(matching(&loads, "a.kd", Some(1)).unwrap().name, "a");
        assert_eq!(matching(&loads, "a", Some(1)).unwrap().name, "a");
        assert!(
            matching(&loads, "a.kd", Some(2)).is_none(),
            "loaded for agent 1"
        );
        assert_eq!(matching(&loads, "a.kd", None).unwrap().name, "a");
        assert_eq!(matching(&loads, "p.kd", Some(7)).unwrap().name, "p");
        assert!(matching(&loads, "b.kd", Some(1)).is_none());
        assert!(matching(&loads, "a.k", Some(1)).is_none());
    }
}
