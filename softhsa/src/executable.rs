//! Executables: host "code objects" that declare kernels (registered host kernels) and
//! module-scope variables, loaded per agent through the HSA executable API.
//!
//! A [`CodeObject`] is built on the host and serialized to bytes; an application hands the bytes
//! to `hsa_code_object_reader_create_from_memory`, loads them into an executable with
//! `hsa_executable_load_agent_code_object`, freezes it and looks its symbols up as the HSA
//! specification describes. Loading places every variable of the code object in one segment of
//! the agent's coarse-grained memory (as a GPU loader does), initialized from the declared bytes;
//! read-only variables live in the same segment. Destroying the executable frees the segments.
//!
//! A code object is written in softhsa's own format ([`CodeObject::to_bytes`], starting with
//! `SHSACO01`) or as an AMDGPU ELF file ([`CodeObject::to_elf`]) carrying the metadata note a
//! ROCm code object carries (its kernels' names and arguments, hidden ones included, as declared
//! with [`CodeObject::hidden_args`]), with the same declarations in a `.softhsa` section: its
//! kernels resolve to the same registered host kernels, under the symbol names ROCm gives them
//! (`name.kd`). Both load the same way (from memory or
//! from a file); the ELF form lets tests see what a tool reads from a real code object's
//! metadata.

use crate::api::{HsaResult, put, put_bytes, with_runtime};
use crate::handles::next_handle;
use crate::kernel::kernel_name;
use crate::runtime::Runtime;
use crate::topology::PoolKind;
use hsa_sys::*;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_void};

const MAGIC: &[u8; 8] = b"SHSACO01";
const TAG_KERNEL: u8 = 1;
const TAG_VARIABLE: u8 = 2;
const TAG_READONLY: u8 = 3;
/// Alignment of a kernel's argument segment, as reported for every kernel symbol.
const KERNARG_ALIGNMENT: u32 = 16;

/// One symbol a code object declares.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Declared {
    Kernel {
        name: String,
        kernel_object: u64,
        kernarg_size: u32,
    },
    Variable {
        name: String,
        align: u32,
        readonly: bool,
        init: Vec<u8>,
    },
}

/// A host code object: kernels (already registered with
/// [`register_kernel`](crate::register_kernel)) and module-scope variables.
///
/// ```
/// use kreplay_softhsa::{CodeObject, WorkGroup, register_kernel};
/// fn count(_: &WorkGroup) {}
/// let kernel = register_kernel("doc_count", count);
/// let bytes = CodeObject::new()
///     .kernel("doc_count", kernel, 8)
///     .variable("hits", &0u32.to_ne_bytes())
///     .readonly_variable("limit", &64u32.to_ne_bytes())
///     .to_bytes();
/// assert!(bytes.len() > 8);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CodeObject {
    symbols: Vec<Declared>,
    /// Hidden arguments per kernel name, written into the ELF form's metadata only.
    hidden: Vec<(String, Vec<String>)>,
}

/// The section of the ELF form holding the declarations in softhsa's own format.
const ELF_PAYLOAD: &str = ".softhsa";

impl CodeObject {
    /// An empty code object.
    pub fn new() -> Self {
        Self::default()
    }

    /// Declares a kernel: `kernel_object` is what [`register_kernel`](crate::register_kernel)
    /// returned, `kernarg_size` the size of its argument block.
    pub fn kernel(mut self, name: &str, kernel_object: u64, kernarg_size: u32) -> Self {
        self.symbols.push(Declared::Kernel {
            name: name.to_owned(),
            kernel_object,
            kernarg_size,
        });
        self
    }

    /// Declares a writable module-scope variable (a `__device__` global) initialized to `init`.
    pub fn variable(self, name: &str, init: &[u8]) -> Self {
        self.var(name, init, false)
    }

    /// Declares a read-only module-scope variable (a `__constant__` global).
    pub fn readonly_variable(self, name: &str, init: &[u8]) -> Self {
        self.var(name, init, true)
    }

    fn var(mut self, name: &str, init: &[u8], readonly: bool) -> Self {
        self.symbols.push(Declared::Variable {
            name: name.to_owned(),
            align: 16,
            readonly,
            init: init.to_vec(),
        });
        self
    }

    /// Declares hidden arguments of kernel `kernel` (declared before), such as
    /// `hidden_printf_buffer`, `hidden_hostcall_buffer` or `hidden_heap_v1`: what the compiler
    /// gives a kernel that may print, call the host or use the device heap. Only the ELF form
    /// ([`to_elf`](Self::to_elf)) carries them, in its metadata, after the kernel's explicit
    /// argument block; they change nothing in how the kernel runs.
    ///
    /// Panics if no kernel of that name was declared.
    pub fn hidden_args(mut self, kernel: &str, kinds: &[&str]) -> Self {
        assert!(
            self.symbols
                .iter()
                .any(|s| matches!(s, Declared::Kernel { name, .. } if name == kernel)),
            "hidden arguments of undeclared kernel {kernel}"
        );
        let kinds = kinds.iter().map(|k| (*k).to_owned());
        match self.hidden.iter_mut().find(|(k, _)| k == kernel) {
            Some((_, list)) => list.extend(kinds),
            None => self.hidden.push((kernel.to_owned(), kinds.collect())),
        }
        self
    }

    /// The code object as an AMDGPU ELF file (`e_machine` 224): a metadata note
    /// (`NT_AMDGPU_METADATA`, MessagePack) describing every kernel (`.name`, `.symbol` =
    /// `name.kd`, its argument block passed by value, then its hidden arguments), and the
    /// declarations of [`to_bytes`](Self::to_bytes) in a `.softhsa` section. Loads like those
    /// bytes, except that each kernel's executable symbol is named after its kernel descriptor,
    /// `name.kd`, as ROCm names the kernels of an ELF code object.
    ///
    /// ```
    /// use kreplay_softhsa::{CodeObject, WorkGroup, register_kernel};
    /// fn say(_: &WorkGroup) {}
    /// let kernel = register_kernel("doc_say", say);
    /// let elf = CodeObject::new()
    ///     .kernel("doc_say", kernel, 8)
    ///     .hidden_args("doc_say", &["hidden_printf_buffer"])
    ///     .to_elf();
    /// assert!(elf.starts_with(b"\x7fELF"));
    /// ```
    pub fn to_elf(&self) -> Vec<u8> {
        let kernels: Vec<kreplay_codeobj::write::KernelMeta> = self
            .symbols
            .iter()
            .filter_map(|s| match s {
                Declared::Kernel {
                    name, kernarg_size, ..
                } => {
                    let hidden: Vec<&str> = self
                        .hidden
                        .iter()
                        .filter(|(k, _)| k == name)
                        .flat_map(|(_, kinds)| kinds.iter().map(String::as_str))
                        .collect();
                    Some(kreplay_codeobj::write::KernelMeta::new(
                        name,
                        *kernarg_size,
                        &hidden,
                    ))
                }
                Declared::Variable { .. } => None,
            })
            .collect();
        kreplay_codeobj::write::amdgpu_elf(&kernels, &[(ELF_PAYLOAD, &self.to_bytes())])
    }

    /// Parses either form: an ELF file made by [`to_elf`](Self::to_elf) (its metadata must be
    /// well formed and name the kernels its payload declares), or softhsa's own bytes.
    fn load(bytes: &[u8]) -> Option<CodeObject> {
        if !kreplay_codeobj::Elf::is_elf(bytes) {
            return CodeObject::parse(bytes);
        }
        let elf = kreplay_codeobj::Elf::parse(bytes).ok()?;
        if elf.machine != kreplay_codeobj::EM_AMDGPU {
            return None;
        }
        let payload = elf.section(ELF_PAYLOAD).ok()??;
        let code = CodeObject::parse(payload)?;
        let mut described: Vec<String> = kreplay_codeobj::kernels(bytes)
            .ok()??
            .into_iter()
            .map(|k| k.name)
            .collect();
        let mut declared: Vec<String> = code
            .symbols
            .iter()
            .filter(|s| matches!(s, Declared::Kernel { .. }))
            .map(|s| s.name().to_owned())
            .collect();
        described.sort_unstable();
        declared.sort_unstable();
        if described != declared {
            return None;
        }
        // As ROCm's loader does, a kernel's symbol is its kernel descriptor's, `name.kd`.
        let mut code = code;
        for s in &mut code.symbols {
            if let Declared::Kernel { name, .. } = s {
                name.push_str(".kd");
            }
        }
        Some(code)
    }

    /// The bytes an application loads.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&(self.symbols.len() as u32).to_le_bytes());
        for s in &self.symbols {
            let name = match s {
                Declared::Kernel { name, .. } => {
                    out.push(TAG_KERNEL);
                    name
                }
                Declared::Variable { name, readonly, .. } => {
                    out.push(if *readonly {
                        TAG_READONLY
                    } else {
                        TAG_VARIABLE
                    });
                    name
                }
            };
            out.extend_from_slice(&(name.len() as u32).to_le_bytes());
            out.extend_from_slice(name.as_bytes());
            match s {
                Declared::Kernel {
                    kernel_object,
                    kernarg_size,
                    ..
                } => {
                    out.extend_from_slice(&kernel_object.to_le_bytes());
                    out.extend_from_slice(&kernarg_size.to_le_bytes());
                }
                Declared::Variable { align, init, .. } => {
                    out.extend_from_slice(&align.to_le_bytes());
                    out.extend_from_slice(&(init.len() as u32).to_le_bytes());
                    out.extend_from_slice(init);
                }
            }
        }
        out
    }

    /// Parses bytes made by [`to_bytes`](Self::to_bytes); `None` when they are not a valid code
    /// object (bad magic, truncated, an empty or duplicate name, an empty variable, a kernel
    /// object that names no registered kernel, an alignment that is not a power of two).
    fn parse(bytes: &[u8]) -> Option<CodeObject> {
        let mut r = Reader(bytes);
        if r.take(8)? != MAGIC {
            return None;
        }
        let count = r.u32()?;
        let mut symbols = Vec::new();
        for _ in 0..count {
            let tag = r.take(1)?[0];
            let len = r.u32()? as usize;
            let name = std::str::from_utf8(r.take(len)?).ok()?.to_owned();
            if name.is_empty() || name.contains('\0') {
                return None;
            }
            let symbol = match tag {
                TAG_KERNEL => {
                    let kernel_object = r.u64()?;
                    let kernarg_size = r.u32()?;
                    kernel_name(kernel_object)?;
                    Declared::Kernel {
                        name,
                        kernel_object,
                        kernarg_size,
                    }
                }
                TAG_VARIABLE | TAG_READONLY => {
                    let align = r.u32()?;
                    let len = r.u32()? as usize;
                    let init = r.take(len)?.to_vec();
                    if !align.is_power_of_two() || init.is_empty() {
                        return None;
                    }
                    Declared::Variable {
                        name,
                        align,
                        readonly: tag == TAG_READONLY,
                        init,
                    }
                }
                _ => return None,
            };
            symbols.push(symbol);
        }
        let mut names: Vec<&str> = symbols.iter().map(Declared::name).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        (r.0.is_empty() && names.len() == before).then_some(CodeObject {
            symbols,
            hidden: Vec::new(),
        })
    }
}

impl Declared {
    fn name(&self) -> &str {
        match self {
            Declared::Kernel { name, .. } | Declared::Variable { name, .. } => name,
        }
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

/// A symbol of a loaded code object.
#[derive(Clone, Debug)]
enum SymbolKind {
    Kernel {
        kernel_object: u64,
        kernarg_size: u32,
    },
    Variable {
        address: u64,
        size: u32,
        align: u32,
        readonly: bool,
    },
}

#[derive(Clone, Debug)]
struct Symbol {
    handle: u64,
    executable: u64,
    name: String,
    agent: u64,
    kind: SymbolKind,
}

#[derive(Debug)]
struct Executable {
    profile: hsa_profile_t,
    rounding: hsa_default_float_rounding_mode_t,
    frozen: bool,
    symbols: Vec<Symbol>,
    /// Segments holding the variables (runtime allocations), freed on destroy.
    segments: Vec<usize>,
    loaded: Vec<u64>,
}

/// The executables and code object readers of one runtime instance.
#[derive(Default)]
pub(crate) struct Executables {
    readers: Mutex<HashMap<u64, CodeObject>>,
    executables: Mutex<HashMap<u64, Executable>>,
}

impl Executables {
    /// The symbol behind a handle.
    fn symbol(&self, handle: u64) -> Result<Symbol, hsa_status_t> {
        self.executables
            .lock()
            .values()
            .flat_map(|e| e.symbols.iter())
            .find(|s| s.handle == handle)
            .cloned()
            .ok_or(HSA_STATUS_ERROR_INVALID_EXECUTABLE_SYMBOL)
    }

    /// The segments of every executable (freed when the runtime stops, with all its memory).
    fn with<R>(
        &self,
        exe: hsa_executable_t,
        f: impl FnOnce(&mut Executable) -> Result<R, hsa_status_t>,
    ) -> Result<R, hsa_status_t> {
        let mut map = self.executables.lock();
        let e = map
            .get_mut(&exe.handle)
            .ok_or(HSA_STATUS_ERROR_INVALID_EXECUTABLE)?;
        f(e)
    }
}

fn cstr(p: *const c_char) -> Result<String, hsa_status_t> {
    if p.is_null() {
        return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: HSA contract: a non-null name is a NUL-terminated string.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map(str::to_owned)
        .map_err(|_| HSA_STATUS_ERROR_INVALID_SYMBOL_NAME)
}

fn create(
    profile: hsa_profile_t,
    rounding: hsa_default_float_rounding_mode_t,
    out: *mut hsa_executable_t,
) -> HsaResult {
    with_runtime_result(|rt| {
        if profile != HSA_PROFILE_BASE && profile != HSA_PROFILE_FULL {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        if out.is_null() {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        let handle = next_handle();
        rt.executables.executables.lock().insert(
            handle,
            Executable {
                profile,
                rounding,
                frozen: false,
                symbols: Vec::new(),
                segments: Vec::new(),
                loaded: Vec::new(),
            },
        );
        // SAFETY: checked non-null; the caller's out pointer.
        unsafe { put(out, hsa_executable_t { handle }) }
    })
}

/// Runs `f` with the runtime, as an entry point body.
fn with_runtime_result(f: impl FnOnce(&Runtime) -> HsaResult) -> HsaResult {
    match with_runtime(|rt| f(rt)) {
        HSA_STATUS_SUCCESS => Ok(()),
        status => Err(status),
    }
}

fn status(r: HsaResult) -> hsa_status_t {
    match r {
        Ok(()) => HSA_STATUS_SUCCESS,
        Err(s) => s,
    }
}

pub(crate) unsafe extern "C" fn hsa_code_object_reader_create_from_memory(
    code_object: *const c_void,
    size: usize,
    reader: *mut hsa_code_object_reader_t,
) -> hsa_status_t {
    with_runtime(|rt| {
        if code_object.is_null() || size == 0 || reader.is_null() {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: HSA contract: `code_object` points to `size` readable bytes.
        let bytes = unsafe { std::slice::from_raw_parts(code_object.cast::<u8>(), size) };
        let parsed = CodeObject::load(bytes).ok_or(HSA_STATUS_ERROR_INVALID_CODE_OBJECT)?;
        let handle = next_handle();
        rt.executables.readers.lock().insert(handle, parsed);
        // SAFETY: checked non-null; the caller's out pointer.
        unsafe { put(reader, hsa_code_object_reader_t { handle }) }
    })
}

/// The most bytes a code object file may have.
const MAX_FILE_BYTES: u64 = 1 << 30;

/// Reads the whole file `file` from its start, whatever its offset (which is left as it is).
fn read_file(file: hsa_file_t) -> Result<Vec<u8>, hsa_status_t> {
    // SAFETY: an all-zero `stat` is a valid value for fstat to overwrite.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid out pointer; an invalid descriptor is an error return.
    if unsafe { libc::fstat(file, &mut st) } != 0 {
        return Err(HSA_STATUS_ERROR_INVALID_FILE);
    }
    let size = u64::try_from(st.st_size).map_err(|_| HSA_STATUS_ERROR_INVALID_FILE)?;
    if size == 0 || size > MAX_FILE_BYTES {
        return Err(HSA_STATUS_ERROR_INVALID_CODE_OBJECT);
    }
    let mut bytes = vec![0u8; size as usize];
    let mut done = 0usize;
    while done < bytes.len() {
        // SAFETY: the destination is the unfilled tail of `bytes`, of the length passed.
        let n = unsafe {
            libc::pread(
                file,
                bytes[done..].as_mut_ptr().cast(),
                bytes.len() - done,
                done as libc::off_t,
            )
        };
        match n {
            0 => break,
            n if n < 0 => {
                if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(HSA_STATUS_ERROR_INVALID_FILE);
            }
            n => done += n as usize,
        }
    }
    bytes.truncate(done);
    Ok(bytes)
}

pub(crate) unsafe extern "C" fn hsa_code_object_reader_create_from_file(
    file: hsa_file_t,
    reader: *mut hsa_code_object_reader_t,
) -> hsa_status_t {
    with_runtime(|rt| {
        if reader.is_null() {
            return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        }
        let bytes = read_file(file)?;
        let parsed = CodeObject::load(&bytes).ok_or(HSA_STATUS_ERROR_INVALID_CODE_OBJECT)?;
        let handle = next_handle();
        rt.executables.readers.lock().insert(handle, parsed);
        // SAFETY: checked non-null; the caller's out pointer.
        unsafe { put(reader, hsa_code_object_reader_t { handle }) }
    })
}

pub(crate) unsafe extern "C" fn hsa_code_object_reader_destroy(
    reader: hsa_code_object_reader_t,
) -> hsa_status_t {
    with_runtime(|rt| {
        rt.executables
            .readers
            .lock()
            .remove(&reader.handle)
            .map(|_| ())
            .ok_or(HSA_STATUS_ERROR_INVALID_CODE_OBJECT_READER)
    })
}

pub(crate) unsafe extern "C" fn hsa_executable_create(
    profile: hsa_profile_t,
    executable_state: hsa_executable_state_t,
    _options: *const c_char,
    executable: *mut hsa_executable_t,
) -> hsa_status_t {
    if executable_state != HSA_EXECUTABLE_STATE_UNFROZEN {
        // An executable is created empty; only an unfrozen one can be loaded into.
        return HSA_STATUS_ERROR_INVALID_ARGUMENT;
    }
    status(create(
        profile,
        HSA_DEFAULT_FLOAT_ROUNDING_MODE_NEAR,
        executable,
    ))
}

pub(crate) unsafe extern "C" fn hsa_executable_create_alt(
    profile: hsa_profile_t,
    default_float_rounding_mode: hsa_default_float_rounding_mode_t,
    _options: *const c_char,
    executable: *mut hsa_executable_t,
) -> hsa_status_t {
    if default_float_rounding_mode > HSA_DEFAULT_FLOAT_ROUNDING_MODE_NEAR {
        return HSA_STATUS_ERROR_INVALID_ARGUMENT;
    }
    status(create(profile, default_float_rounding_mode, executable))
}

pub(crate) unsafe extern "C" fn hsa_executable_destroy(
    executable: hsa_executable_t,
) -> hsa_status_t {
    with_runtime(|rt| {
        let e = rt
            .executables
            .executables
            .lock()
            .remove(&executable.handle)
            .ok_or(HSA_STATUS_ERROR_INVALID_EXECUTABLE)?;
        for segment in e.segments {
            // The runtime may have freed everything already (shut down); nothing else to do.
            let _ = rt.memory.free(&rt.topology, segment);
        }
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn hsa_executable_load_agent_code_object(
    executable: hsa_executable_t,
    agent: hsa_agent_t,
    code_object_reader: hsa_code_object_reader_t,
    _options: *const c_char,
    loaded_code_object: *mut hsa_loaded_code_object_t,
) -> hsa_status_t {
    with_runtime(|rt| {
        let agent_index = rt.gpu_agent(agent.handle)?;
        let code = rt
            .executables
            .readers
            .lock()
            .get(&code_object_reader.handle)
            .cloned()
            .ok_or(HSA_STATUS_ERROR_INVALID_CODE_OBJECT_READER)?;
        // Checked before anything is allocated: frozen, or a name already defined on the agent.
        rt.executables.with(executable, |e| {
            if e.frozen {
                return Err(HSA_STATUS_ERROR_FROZEN_EXECUTABLE);
            }
            let clash = code.symbols.iter().any(|d| {
                e.symbols
                    .iter()
                    .any(|s| s.agent == agent.handle && s.name == d.name())
            });
            if clash {
                return Err(HSA_STATUS_ERROR_VARIABLE_ALREADY_DEFINED);
            }
            Ok(())
        })?;
        // One segment for every variable of the code object, in the agent's coarse memory.
        let mut offsets = Vec::new();
        let mut end = 0usize;
        for d in &code.symbols {
            if let Declared::Variable { align, init, .. } = d {
                let at = end.next_multiple_of(*align as usize);
                offsets.push(at);
                end = at + init.len();
            }
        }
        let segment = if end > 0 {
            let pool = rt.topology.agents[agent_index]
                .pools
                .iter()
                .copied()
                .find(|&p| rt.topology.pools[p].kind == PoolKind::CoarseVram)
                .ok_or(HSA_STATUS_ERROR_OUT_OF_RESOURCES)?;
            Some(rt.memory.allocate(&rt.topology, pool, end)? as usize)
        } else {
            None
        };
        let mut symbols = Vec::new();
        let mut offsets = offsets.into_iter();
        for d in &code.symbols {
            let kind = match d {
                Declared::Kernel {
                    kernel_object,
                    kernarg_size,
                    ..
                } => SymbolKind::Kernel {
                    kernel_object: *kernel_object,
                    kernarg_size: *kernarg_size,
                },
                Declared::Variable {
                    align,
                    readonly,
                    init,
                    ..
                } => {
                    let base = segment.expect("a segment when there are variables");
                    let address = base + offsets.next().expect("one offset per variable");
                    // SAFETY: the segment is a fresh runtime allocation of `end` bytes and the
                    // variable lies inside it (offsets were laid out above).
                    unsafe {
                        std::ptr::copy_nonoverlapping(init.as_ptr(), address as *mut u8, init.len())
                    };
                    SymbolKind::Variable {
                        address: address as u64,
                        size: init.len() as u32,
                        align: *align,
                        readonly: *readonly,
                    }
                }
            };
            symbols.push(Symbol {
                handle: next_handle(),
                executable: executable.handle,
                name: d.name().to_owned(),
                agent: agent.handle,
                kind,
            });
        }
        let loaded = next_handle();
        let stored = rt.executables.with(executable, |e| {
            if e.frozen {
                return Err(HSA_STATUS_ERROR_FROZEN_EXECUTABLE);
            }
            e.symbols.extend(symbols);
            e.segments.extend(segment);
            e.loaded.push(loaded);
            Ok(())
        });
        if let Err(s) = stored {
            if let Some(segment) = segment {
                let _ = rt.memory.free(&rt.topology, segment);
            }
            return Err(s);
        }
        if !loaded_code_object.is_null() {
            // SAFETY: a non-null out pointer of the caller.
            unsafe {
                put(
                    loaded_code_object,
                    hsa_loaded_code_object_t { handle: loaded },
                )
            }?;
        }
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn hsa_executable_freeze(
    executable: hsa_executable_t,
    _options: *const c_char,
) -> hsa_status_t {
    with_runtime(|rt| {
        rt.executables.with(executable, |e| {
            if e.frozen {
                return Err(HSA_STATUS_ERROR_FROZEN_EXECUTABLE);
            }
            e.frozen = true;
            Ok(())
        })
    })
}

pub(crate) unsafe extern "C" fn hsa_executable_get_info(
    executable: hsa_executable_t,
    attribute: hsa_executable_info_t,
    value: *mut c_void,
) -> hsa_status_t {
    with_runtime(|rt| {
        let (profile, state, rounding) = rt.executables.with(executable, |e| {
            let state = if e.frozen {
                HSA_EXECUTABLE_STATE_FROZEN
            } else {
                HSA_EXECUTABLE_STATE_UNFROZEN
            };
            Ok((e.profile, state, e.rounding))
        })?;
        let v = match attribute {
            HSA_EXECUTABLE_INFO_PROFILE => profile,
            HSA_EXECUTABLE_INFO_STATE => state,
            HSA_EXECUTABLE_INFO_DEFAULT_FLOAT_ROUNDING_MODE => rounding,
            _ => return Err(HSA_STATUS_ERROR_INVALID_ARGUMENT),
        };
        // SAFETY: HSA contract: `value` has room for the attribute (a 32-bit enum).
        unsafe { put(value.cast::<u32>(), v) }
    })
}

pub(crate) unsafe extern "C" fn hsa_executable_validate(
    executable: hsa_executable_t,
    result: *mut u32,
) -> hsa_status_t {
    with_runtime(|rt| {
        rt.executables.with(executable, |_| Ok(()))?;
        // SAFETY: the caller's out pointer (null is rejected by `put`).
        unsafe { put(result, 0) }
    })
}

pub(crate) unsafe extern "C" fn hsa_executable_validate_alt(
    executable: hsa_executable_t,
    _options: *const c_char,
    result: *mut u32,
) -> hsa_status_t {
    // SAFETY: the same contract.
    unsafe { hsa_executable_validate(executable, result) }
}

fn lookup(
    rt: &Runtime,
    executable: hsa_executable_t,
    name: &str,
    agent: Option<u64>,
) -> Result<hsa_executable_symbol_t, hsa_status_t> {
    rt.executables.with(executable, |e| {
        e.symbols
            .iter()
            // Every symbol is an agent symbol: without an agent (program symbols) none matches.
            .find(|s| s.name == name && Some(s.agent) == agent)
            .map(|s| hsa_executable_symbol_t { handle: s.handle })
            .ok_or(HSA_STATUS_ERROR_INVALID_SYMBOL_NAME)
    })
}

pub(crate) unsafe extern "C" fn hsa_executable_get_symbol_by_name(
    executable: hsa_executable_t,
    symbol_name: *const c_char,
    agent: *const hsa_agent_t,
    symbol: *mut hsa_executable_symbol_t,
) -> hsa_status_t {
    with_runtime(|rt| {
        let name = cstr(symbol_name)?;
        let agent = if agent.is_null() {
            None
        } else {
            // SAFETY: HSA contract: a non-null agent pointer points to an agent.
            let a = unsafe { agent.read_unaligned() };
            rt.agent(a.handle)?;
            Some(a.handle)
        };
        let found = lookup(rt, executable, &name, agent)?;
        // SAFETY: the caller's out pointer (null is rejected by `put`).
        unsafe { put(symbol, found) }
    })
}

pub(crate) unsafe extern "C" fn hsa_executable_get_symbol(
    executable: hsa_executable_t,
    _module_name: *const c_char,
    symbol_name: *const c_char,
    agent: hsa_agent_t,
    _call_convention: i32,
    symbol: *mut hsa_executable_symbol_t,
) -> hsa_status_t {
    // SAFETY: the same contract, with the agent passed by address.
    unsafe { hsa_executable_get_symbol_by_name(executable, symbol_name, &agent, symbol) }
}

pub(crate) unsafe extern "C" fn hsa_executable_symbol_get_info(
    executable_symbol: hsa_executable_symbol_t,
    attribute: hsa_executable_symbol_info_t,
    value: *mut c_void,
) -> hsa_status_t {
    with_runtime(|rt| {
        let s = rt.executables.symbol(executable_symbol.handle)?;
        macro_rules! out {
            ($t:ty, $v:expr) => {
                // SAFETY: HSA contract: `value` has room for the attribute's type.
                unsafe { put(value.cast::<$t>(), $v) }
            };
        }
        let not_this_kind = Err(HSA_STATUS_ERROR_INVALID_ARGUMENT);
        match (attribute, &s.kind) {
            (HSA_EXECUTABLE_SYMBOL_INFO_TYPE, SymbolKind::Kernel { .. }) => {
                out!(u32, HSA_SYMBOL_KIND_KERNEL)
            }
            (HSA_EXECUTABLE_SYMBOL_INFO_TYPE, SymbolKind::Variable { .. }) => {
                out!(u32, HSA_SYMBOL_KIND_VARIABLE)
            }
            (HSA_EXECUTABLE_SYMBOL_INFO_NAME_LENGTH, _) => out!(u32, s.name.len() as u32),
            (HSA_EXECUTABLE_SYMBOL_INFO_NAME, _) => {
                // SAFETY: HSA contract: room for NAME_LENGTH bytes (not NUL-terminated).
                unsafe { put_bytes(value, s.name.as_bytes()) }
            }
            (HSA_EXECUTABLE_SYMBOL_INFO_MODULE_NAME_LENGTH, _) => out!(u32, 0),
            (HSA_EXECUTABLE_SYMBOL_INFO_MODULE_NAME, _) => Ok(()),
            (HSA_EXECUTABLE_SYMBOL_INFO_LINKAGE, _) => out!(u32, HSA_SYMBOL_LINKAGE_PROGRAM),
            (HSA_EXECUTABLE_SYMBOL_INFO_IS_DEFINITION, _) => out!(bool, true),
            (HSA_EXECUTABLE_SYMBOL_INFO_AGENT, _) => {
                out!(hsa_agent_t, hsa_agent_t { handle: s.agent })
            }
            (HSA_EXECUTABLE_SYMBOL_INFO_VARIABLE_ADDRESS, SymbolKind::Variable { address, .. }) => {
                out!(u64, *address)
            }
            (HSA_EXECUTABLE_SYMBOL_INFO_VARIABLE_ALLOCATION, SymbolKind::Variable { .. }) => {
                out!(u32, HSA_VARIABLE_ALLOCATION_AGENT)
            }
            (
                HSA_EXECUTABLE_SYMBOL_INFO_VARIABLE_SEGMENT,
                SymbolKind::Variable { readonly, .. },
            ) => {
                out!(
                    u32,
                    if *readonly {
                        HSA_VARIABLE_SEGMENT_READONLY
                    } else {
                        HSA_VARIABLE_SEGMENT_GLOBAL
                    }
                )
            }
            (HSA_EXECUTABLE_SYMBOL_INFO_VARIABLE_ALIGNMENT, SymbolKind::Variable { align, .. }) => {
                out!(u32, *align)
            }
            (HSA_EXECUTABLE_SYMBOL_INFO_VARIABLE_SIZE, SymbolKind::Variable { size, .. }) => {
                out!(u32, *size)
            }
            (
                HSA_EXECUTABLE_SYMBOL_INFO_VARIABLE_IS_CONST,
                SymbolKind::Variable { readonly, .. },
            ) => {
                out!(bool, *readonly)
            }
            (
                HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_OBJECT,
                SymbolKind::Kernel { kernel_object, .. },
            ) => {
                out!(u64, *kernel_object)
            }
            (
                HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_KERNARG_SEGMENT_SIZE,
                SymbolKind::Kernel { kernarg_size, .. },
            ) => out!(u32, *kernarg_size),
            (
                HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_KERNARG_SEGMENT_ALIGNMENT,
                SymbolKind::Kernel { .. },
            ) => {
                out!(u32, KERNARG_ALIGNMENT)
            }
            (
                HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_GROUP_SEGMENT_SIZE
                | HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_PRIVATE_SEGMENT_SIZE,
                SymbolKind::Kernel { .. },
            ) => out!(u32, 0),
            (HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_DYNAMIC_CALLSTACK, SymbolKind::Kernel { .. }) => {
                out!(bool, false)
            }
            _ => not_this_kind,
        }
    })
}

type SymbolCallback = Option<
    unsafe extern "C" fn(hsa_executable_t, hsa_executable_symbol_t, *mut c_void) -> hsa_status_t,
>;
type AgentSymbolCallback = Option<
    unsafe extern "C" fn(
        hsa_executable_t,
        hsa_agent_t,
        hsa_executable_symbol_t,
        *mut c_void,
    ) -> hsa_status_t,
>;

/// The symbols of an executable (optionally of one agent), copied so callbacks run unlocked.
fn symbols_of(
    rt: &Runtime,
    executable: hsa_executable_t,
    agent: Option<u64>,
) -> Result<Vec<Symbol>, hsa_status_t> {
    rt.executables.with(executable, |e| {
        Ok(e.symbols
            .iter()
            .filter(|s| agent.is_none_or(|a| a == s.agent))
            .cloned()
            .collect())
    })
}

pub(crate) unsafe extern "C" fn hsa_executable_iterate_symbols(
    executable: hsa_executable_t,
    callback: SymbolCallback,
    data: *mut c_void,
) -> hsa_status_t {
    with_runtime(|rt| {
        let callback = callback.ok_or(HSA_STATUS_ERROR_INVALID_ARGUMENT)?;
        for s in symbols_of(rt, executable, None)? {
            let sym = hsa_executable_symbol_t { handle: s.handle };
            // SAFETY: the caller's callback, called per the HSA contract with its data.
            let st = unsafe {
                callback(
                    hsa_executable_t {
                        handle: s.executable,
                    },
                    sym,
                    data,
                )
            };
            if st != HSA_STATUS_SUCCESS {
                return Err(st);
            }
        }
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn hsa_executable_iterate_agent_symbols(
    executable: hsa_executable_t,
    agent: hsa_agent_t,
    callback: AgentSymbolCallback,
    data: *mut c_void,
) -> hsa_status_t {
    with_runtime(|rt| {
        let callback = callback.ok_or(HSA_STATUS_ERROR_INVALID_ARGUMENT)?;
        rt.agent(agent.handle)?;
        for s in symbols_of(rt, executable, Some(agent.handle))? {
            let sym = hsa_executable_symbol_t { handle: s.handle };
            // SAFETY: the caller's callback, called per the HSA contract with its data.
            let st = unsafe { callback(executable, agent, sym, data) };
            if st != HSA_STATUS_SUCCESS {
                return Err(st);
            }
        }
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn hsa_executable_iterate_program_symbols(
    executable: hsa_executable_t,
    callback: SymbolCallback,
    _data: *mut c_void,
) -> hsa_status_t {
    with_runtime(|rt| {
        callback.ok_or(HSA_STATUS_ERROR_INVALID_ARGUMENT)?;
        // Every symbol softhsa loads is an agent symbol: there are no program symbols to visit.
        rt.executables.with(executable, |_| Ok(()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noop(_: &crate::WorkGroup) {}

    #[test]
    fn the_elf_form_loads_like_the_own_form_and_malformed_ones_are_refused() {
        let k = crate::register_kernel("executable_unit_elf", noop);
        let co = CodeObject::new()
            .kernel("executable_unit_elf", k, 16)
            .hidden_args("executable_unit_elf", &["hidden_printf_buffer"])
            .variable("v", &[1, 2, 3, 4]);
        let elf = co.to_elf();
        let loaded = CodeObject::load(&elf).expect("the ELF form loads");
        let names: Vec<&str> = loaded.symbols.iter().map(Declared::name).collect();
        assert_eq!(names, ["executable_unit_elf.kd", "v"]);
        assert!(matches!(
            loaded.symbols[0],
            Declared::Kernel { kernel_object, kernarg_size: 16, .. } if kernel_object == k
        ));
        assert_eq!(loaded.symbols[1], co.symbols[1]);
        assert!(kreplay_codeobj::kernels(&elf).unwrap().unwrap()[0].printf);
        for cut in 0..elf.len() {
            assert_eq!(CodeObject::load(&elf[..cut]), None, "truncated at {cut}");
        }
        // Metadata naming another kernel than the payload declares.
        let other = kreplay_codeobj::write::amdgpu_elf(
            &[kreplay_codeobj::write::KernelMeta::new("nothing", 0, &[])],
            &[(ELF_PAYLOAD, &co.to_bytes())],
        );
        assert_eq!(CodeObject::load(&other), None);
    }

    #[test]
    fn a_code_object_round_trips_and_malformed_bytes_are_refused() {
        let k = crate::register_kernel("executable_unit_noop", noop);
        let co = CodeObject::new()
            .kernel("executable_unit_noop", k, 24)
            .variable("v", &[1, 2, 3, 4])
            .readonly_variable("c", &[9]);
        let bytes = co.to_bytes();
        assert_eq!(CodeObject::parse(&bytes), Some(co.clone()));
        for cut in 0..bytes.len() {
            assert_eq!(CodeObject::parse(&bytes[..cut]), None, "truncated at {cut}");
        }
        let mut extra = bytes.clone();
        extra.push(0);
        assert_eq!(CodeObject::parse(&extra), None, "trailing bytes");
        let dup = CodeObject::new().variable("v", &[1]).variable("v", &[2]);
        assert_eq!(CodeObject::parse(&dup.to_bytes()), None, "duplicate names");
        let unknown = CodeObject::new().kernel("nothing", 0x1234, 8);
        assert_eq!(
            CodeObject::parse(&unknown.to_bytes()),
            None,
            "unregistered kernel"
        );
        assert_eq!(
            CodeObject::parse(&CodeObject::new().variable("e", &[]).to_bytes()),
            None
        );
    }
}
