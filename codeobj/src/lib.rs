//! What a ROCm code object says of its kernels' use of the device runtime.
//!
//! A code object for ROCm is an ELF64 file (`e_machine` `EM_AMDGPU`) carrying a note (owner
//! `AMDGPU`, type `NT_AMDGPU_METADATA`) whose descriptor is a MessagePack map (code object V3
//! and later): one per object it was linked from, in its note segments (else its note
//! sections), each listing its own kernels. Its `amdhsa.kernels` array describes every kernel: its `.name`, its kernel
//! descriptor's `.symbol` (`name.kd`) and its `.args`, each with a `.value_kind`. The compiler
//! gives a kernel hidden arguments for the device-runtime services it may use:
//!
//! * `hidden_printf_buffer`: the printf buffer (OpenCL's device-side `printf`), printed by the
//!   host after the kernel;
//! * `hidden_hostcall_buffer`: the hostcall buffer, through which a kernel calls host services
//!   while it runs (HIP's device-side `printf` among them);
//! * `hidden_heap_v1`: the device heap behind device-side `malloc` and `free`.
//!
//! A kernel with one of them may print, call the host or allocate on every run: replayed, it
//! would do so once per pass, which the application sees. [`kernels`] reads these facts from
//! code object bytes; [`write`](mod@write) builds such code objects (for tests and the software
//! runtime).
//!
//! Only what is needed is read, with every offset and length checked: truncated or hostile
//! bytes give an [`Error`], never a panic or a read out of bounds. The crate has no
//! dependencies and knows nothing of any runtime.

mod elf;
pub mod msgpack;
pub mod write;

pub use elf::{Elf, Note};

use std::fmt;

/// `e_machine` of AMDGPU code objects.
pub const EM_AMDGPU: u16 = 224;
/// The type of the note holding MessagePack metadata (code object V3 and later).
pub const NT_AMDGPU_METADATA: u32 = 32;
/// The owner of that note.
pub const NOTE_OWNER: &[u8] = b"AMDGPU";

/// The hidden argument of a kernel that may print (OpenCL printf).
pub const HIDDEN_PRINTF_BUFFER: &str = "hidden_printf_buffer";
/// The hidden argument of a kernel that may call host services while it runs.
pub const HIDDEN_HOSTCALL_BUFFER: &str = "hidden_hostcall_buffer";
/// The hidden argument of a kernel that may use the device heap (malloc and free).
pub const HIDDEN_HEAP_V1: &str = "hidden_heap_v1";

/// Why code object bytes could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// The ELF structure is truncated or inconsistent.
    Elf(String),
    /// The metadata note is not the MessagePack map code objects carry.
    Metadata(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Elf(why) => write!(f, "malformed ELF: {why}"),
            Error::Metadata(why) => write!(f, "malformed code object metadata: {why}"),
        }
    }
}

impl std::error::Error for Error {}

/// One kernel of a code object, as its metadata describes it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Kernel {
    /// The kernel's name (`.name`).
    pub name: String,
    /// Its kernel descriptor's symbol (`.symbol`, `name.kd`; the name with `.kd` when absent).
    pub symbol: String,
    /// It has a `hidden_printf_buffer` argument.
    pub printf: bool,
    /// It has a `hidden_hostcall_buffer` argument.
    pub hostcall: bool,
    /// It has a `hidden_heap_v1` argument.
    pub heap: bool,
}

impl Kernel {
    /// Whether a run of the kernel may reach the host or the device heap (see the crate's
    /// documentation): replaying it would repeat what the application sees.
    pub fn uses_device_runtime(&self) -> bool {
        self.printf || self.hostcall || self.heap
    }

    /// Why replaying the kernel would show: `None` where it uses none of those services.
    pub fn why_not_replayable(&self) -> Option<String> {
        let mut why = Vec::new();
        if self.printf {
            why.push(format!(
                "kernel {} may print ({HIDDEN_PRINTF_BUFFER}): every pass would print again",
                self.name
            ));
        }
        if self.hostcall {
            why.push(format!(
                "kernel {} may call the host while it runs, device-side printf among others \
                 ({HIDDEN_HOSTCALL_BUFFER}): every pass would call it again",
                self.name
            ));
        }
        if self.heap {
            why.push(format!(
                "kernel {} may allocate from the device heap ({HIDDEN_HEAP_V1}): every pass \
                 would allocate or free again, in memory kreplay cannot snapshot",
                self.name
            ));
        }
        (!why.is_empty()).then(|| why.join("; "))
    }
}

/// The kernels of a code object: `Ok(None)` where the bytes are no AMDGPU ELF file (another
/// format, such as the software runtime's own) or carry no MessagePack metadata note (code
/// object V2 and older); an error where they are an AMDGPU ELF file whose structure or metadata
/// is malformed.
pub fn kernels(bytes: &[u8]) -> Result<Option<Vec<Kernel>>, Error> {
    if !Elf::is_elf(bytes) {
        return Ok(None);
    }
    let elf = Elf::parse(bytes)?;
    if elf.machine != EM_AMDGPU {
        return Ok(None);
    }
    // Every metadata note counts (a code object linked from several objects has one per
    // object, each listing its own kernels); where the segments hold none, the sections may (as
    // the runtime's own metadata reader looks for them).
    let is_metadata = |n: &Note<'_>| n.name == NOTE_OWNER && n.kind == NT_AMDGPU_METADATA;
    let mut notes: Vec<Note<'_>> = elf
        .segment_notes()?
        .into_iter()
        .filter(is_metadata)
        .collect();
    if notes.is_empty() {
        notes = elf
            .section_notes()?
            .into_iter()
            .filter(is_metadata)
            .collect();
    }
    if notes.is_empty() {
        return Ok(None);
    }
    // Headers naming the same bytes give the same note more than once: it is read once. Notes
    // of one file do not overlap, so what is decoded is no more than the file.
    notes.sort_by_key(|n| (n.desc.as_ptr() as usize, n.desc.len()));
    notes.dedup_by_key(|n| (n.desc.as_ptr() as usize, n.desc.len()));
    let total = notes
        .iter()
        .try_fold(0usize, |sum, n| sum.checked_add(n.desc.len()));
    if total.is_none_or(|t| t > bytes.len()) {
        return Err(Error::Elf("metadata notes overlap".into()));
    }
    let mut out = Vec::new();
    for note in notes {
        out.extend(from_metadata(note.desc)?);
    }
    Ok(Some(out))
}

fn meta(what: &str) -> Error {
    Error::Metadata(what.to_string())
}

/// The kernels of a MessagePack metadata map.
pub fn from_metadata(desc: &[u8]) -> Result<Vec<Kernel>, Error> {
    let root = msgpack::decode(desc)?;
    if !matches!(root, msgpack::Value::Map(_)) {
        return Err(meta("the metadata is not a map"));
    }
    let Some(list) = root.get("amdhsa.kernels") else {
        return Ok(Vec::new());
    };
    let list = list
        .as_array()
        .ok_or_else(|| meta("amdhsa.kernels is not an array"))?;
    let mut out = Vec::with_capacity(list.len());
    for k in list {
        if !matches!(k, msgpack::Value::Map(_)) {
            return Err(meta("a kernel's metadata is not a map"));
        }
        let name = k
            .get(".name")
            .and_then(msgpack::Value::as_str)
            .ok_or_else(|| meta("a kernel without a .name string"))?;
        let symbol = match k.get(".symbol") {
            None => format!("{name}.kd"),
            Some(s) => s
                .as_str()
                .ok_or_else(|| meta(&format!("kernel {name}: .symbol is not a string")))?
                .to_string(),
        };
        let mut kernel = Kernel {
            name: name.to_string(),
            symbol,
            ..Kernel::default()
        };
        let args = match k.get(".args") {
            None => &[][..],
            Some(a) => a
                .as_array()
                .ok_or_else(|| meta(&format!("kernel {name}: .args is not an array")))?,
        };
        for arg in args {
            let kind = arg
                .get(".value_kind")
                .and_then(msgpack::Value::as_str)
                .ok_or_else(|| {
                    meta(&format!(
                        "kernel {name}: an argument without a .value_kind string"
                    ))
                })?;
            match kind {
                HIDDEN_PRINTF_BUFFER => kernel.printf = true,
                HIDDEN_HOSTCALL_BUFFER => kernel.hostcall = true,
                HIDDEN_HEAP_V1 => kernel.heap = true,
                _ => {}
            }
        }
        out.push(kernel);
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
