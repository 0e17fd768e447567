//! Writable module-scope variables (`__device__` globals) of loaded CUDA modules.
//!
//! A kernel that does `counter += 1` on a `__device__ int counter` writes memory that no
//! allocation call ever returned: the variable lives in its module's data segment. Every
//! replayed launch therefore snapshots the writable variables of the launched function's module
//! besides the tracked allocations (SPEC rule 2), or is declined (`untracked_memory`) when they
//! cannot be located: never replayed with them unrestored.
//!
//! * **Which variables.** CUPTI's resource callback for a module load
//!   (`CUPTI_CBID_RESOURCE_MODULE_LOADED`) hands over the cubin the driver loaded (an ELF
//!   image, the JIT result when the module came from PTX). [`parse_cubin`] reads its symbol
//!   table: the kernels (function symbols in `.text.<name>` sections) and the object symbols
//!   of the writable data sections (`.nv.global`, uninitialized, and `.nv.global.init`,
//!   initialized; never `.nv.constant*`, `.nv.shared*` or `.nv.local*`).
//! * **Where they are.** At a launch, the module comes from the launched function
//!   (`cuFuncGetModule`) and each variable's device address and size from
//!   `cuModuleGetGlobal`, by name. A section whose named variables all resolve to one base (the
//!   address minus the symbol's offset in its section) is covered whole, so unnamed or local
//!   data inside it (printf strings, `static __device__` variables) is covered too; otherwise
//!   each variable is covered by its own address and size, and a variable the driver cannot
//!   resolve declines the launch.
//! * **Which module.** The kernel's name (CUPTI's `symbolName`) picks the loaded cubins that
//!   define it; a cubin whose variables all resolve in the launched function's module is taken
//!   (several cubins defining the same kernel name are all tried; covering more of the module
//!   than needed is harmless). A kernel no reported cubin defines declines the launch.
//!
//! [`ModuleRegistry`] is bookkeeping over a [`ModuleLookup`] (the driver in production, a fake
//! in tests), so its rules run without a GPU.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use parking_lot::Mutex;

/// One object symbol of a writable data section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GlobalSymbol {
    /// Its name (what `cuModuleGetGlobal` looks up).
    pub name: String,
    /// Its offset inside its section.
    pub offset: u64,
    /// Its size in bytes.
    pub size: u64,
}

/// A writable data section of a cubin (`.nv.global`, `.nv.global.init`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WritableSection {
    /// The section's name.
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its object symbols.
    pub symbols: Vec<GlobalSymbol>,
}

/// What kreplay needs of a cubin: its kernels, its writable module-scope variables and the
/// device-runtime functions its kernels call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CubinSymbols {
    /// Names of the functions it defines (kernels among them).
    pub kernels: Vec<String>,
    /// Its writable data sections of non-zero size.
    pub writable: Vec<WritableSection>,
    /// Functions of [`DEVICE_RUNTIME_CALLS`] each function can reach, directly or through the
    /// functions it calls (only functions that reach one).
    pub runtime_calls: BTreeMap<String, Vec<String>>,
}

/// Functions the driver supplies to device code whose effects no restore of the snapshot undoes:
/// device-side `printf` (`vprintf` writes the driver's printf buffer, printed by the host at the
/// next synchronisation: every pass would print again) and the device heap's allocator
/// (`malloc`, `free`, and `__nv_aligned_device_malloc` behind `aligned_alloc`: every pass would
/// allocate again from, or free again into, memory kreplay cannot snapshot).
pub const DEVICE_RUNTIME_CALLS: [&str; 4] =
    ["vprintf", "malloc", "free", "__nv_aligned_device_malloc"];

/// Whether `name` is one of the device heap's functions (of [`DEVICE_RUNTIME_CALLS`]).
pub fn is_heap_call(name: &str) -> bool {
    matches!(name, "malloc" | "free" | "__nv_aligned_device_malloc")
}

/// `SHT_CUDA_INFO`: `.nv.info` and `.nv.info.<function>`, attributes of the image and of one
/// function (`sh_info` is the function's text section).
const SHT_CUDA_INFO: u32 = 0x7000_0000;
/// `SHT_CUDA_CALLGRAPH`: `.nv.callgraph`, pairs of 32-bit symbol indices (caller, callee);
/// entries with caller 0 are the driver's markers.
const SHT_CUDA_CALLGRAPH: u32 = 0x7000_0001;
/// The `.nv.info` attribute listing a function's external calls (32-bit symbol indices).
const EIATTR_EXTERNS: u8 = 0x0f;
/// `.nv.info` entry formats: a 16-bit value, and a 16-bit size followed by that many bytes.
const EIFMT_HVAL: u8 = 3;
const EIFMT_SVAL: u8 = 4;

const SHT_SYMTAB: u32 = 2;
const STT_OBJECT: u8 = 1;
const STT_FUNC: u8 = 2;
const SHN_LORESERVE: u16 = 0xff00;

fn read<const N: usize>(image: &[u8], at: u64, what: &str) -> Result<[u8; N], String> {
    let start = usize::try_from(at).map_err(|_| format!("{what} out of range"))?;
    image
        .get(
            start
                ..start
                    .checked_add(N)
                    .ok_or_else(|| format!("{what} out of range"))?,
        )
        .map(|s| s.try_into().expect("N bytes"))
        .ok_or_else(|| format!("{what} at {at:#x} lies past the end of the image"))
}

fn u16_at(image: &[u8], at: u64, what: &str) -> Result<u16, String> {
    read::<2>(image, at, what).map(u16::from_le_bytes)
}

fn u32_at(image: &[u8], at: u64, what: &str) -> Result<u32, String> {
    read::<4>(image, at, what).map(u32::from_le_bytes)
}

fn u64_at(image: &[u8], at: u64, what: &str) -> Result<u64, String> {
    read::<8>(image, at, what).map(u64::from_le_bytes)
}

/// A NUL-terminated name at `at` in a string table of `len` bytes starting at `table`.
fn name_at(image: &[u8], table: u64, len: u64, at: u32) -> Result<String, String> {
    let at = u64::from(at);
    if at >= len {
        return Err(format!("name offset {at} outside its string table"));
    }
    let start =
        usize::try_from(table.saturating_add(at)).map_err(|_| "string table out of range")?;
    let end = usize::try_from(table.saturating_add(len))
        .map_err(|_| "string table out of range")?
        .min(image.len());
    let bytes = image
        .get(start..end)
        .ok_or("string table lies past the end of the image")?;
    let n = bytes
        .iter()
        .position(|&b| b == 0)
        .ok_or("unterminated name")?;
    Ok(String::from_utf8_lossy(&bytes[..n]).into_owned())
}

#[derive(Clone, Copy)]
struct Section {
    name: u32,
    kind: u32,
    addr: u64,
    offset: u64,
    size: u64,
    link: u32,
    info: u32,
    entsize: u64,
}

/// Whether a section of this name holds writable module-scope variables.
pub fn is_writable_data(section: &str) -> bool {
    section == ".nv.global" || section.starts_with(".nv.global.")
}

/// Read the kernels and writable variables of a cubin (a 64-bit little-endian ELF image).
/// Anything else (a fatbin, PTX text, a truncated image) is an error saying why.
pub fn parse_cubin(image: &[u8]) -> Result<CubinSymbols, String> {
    if image.len() < 64 || image[..4] != *b"\x7fELF" {
        return Err("not an ELF image".into());
    }
    if image[4] != 2 || image[5] != 1 {
        return Err("not a 64-bit little-endian ELF image".into());
    }
    let shoff = u64_at(image, 0x28, "e_shoff")?;
    let shentsize = u64::from(u16_at(image, 0x3a, "e_shentsize")?);
    let shnum = u16_at(image, 0x3c, "e_shnum")?;
    let shstrndx = u16_at(image, 0x3e, "e_shstrndx")?;
    if shentsize < 64 {
        return Err(format!("section header entries of {shentsize} bytes"));
    }
    let mut sections = Vec::with_capacity(usize::from(shnum));
    for i in 0..u64::from(shnum) {
        let at = shoff
            .checked_add(i * shentsize)
            .ok_or("section header out of range")?;
        sections.push(Section {
            name: u32_at(image, at, "sh_name")?,
            kind: u32_at(image, at.saturating_add(4), "sh_type")?,
            addr: u64_at(image, at.saturating_add(16), "sh_addr")?,
            offset: u64_at(image, at.saturating_add(24), "sh_offset")?,
            size: u64_at(image, at.saturating_add(32), "sh_size")?,
            link: u32_at(image, at.saturating_add(40), "sh_link")?,
            info: u32_at(image, at.saturating_add(44), "sh_info")?,
            entsize: u64_at(image, at.saturating_add(56), "sh_entsize")?,
        });
    }
    let shstr = *sections
        .get(usize::from(shstrndx))
        .ok_or("no section name table")?;
    let names: Vec<String> = sections
        .iter()
        .map(|s| name_at(image, shstr.offset, shstr.size, s.name))
        .collect::<Result<_, _>>()?;
    let mut out = CubinSymbols::default();
    let mut writable: HashMap<usize, WritableSection> = HashMap::new();
    for (i, s) in sections.iter().enumerate() {
        if is_writable_data(&names[i]) && s.size > 0 {
            writable.insert(
                i,
                WritableSection {
                    name: names[i].clone(),
                    size: s.size,
                    symbols: Vec::new(),
                },
            );
        }
    }
    // Every symbol table's entries by index: (name, type, section index).
    let mut tables: HashMap<usize, Vec<(String, u8, u16)>> = HashMap::new();
    for (t, symtab) in sections.iter().enumerate() {
        if symtab.kind != SHT_SYMTAB {
            continue;
        }
        let strtab = *sections
            .get(symtab.link as usize)
            .ok_or("symbol table without a string table")?;
        let entsize = if symtab.entsize == 0 {
            24
        } else {
            symtab.entsize
        };
        if entsize < 24 {
            return Err(format!("symbol entries of {entsize} bytes"));
        }
        let table = tables.entry(t).or_default();
        for k in 0..symtab.size / entsize {
            let at = symtab.offset.saturating_add(k * entsize);
            let info = read::<1>(image, at.saturating_add(4), "st_info")?[0];
            let shndx = u16_at(image, at.saturating_add(6), "st_shndx")?;
            let kind = info & 0xf;
            let name = name_at(
                image,
                strtab.offset,
                strtab.size,
                u32_at(image, at, "st_name")?,
            )?;
            table.push((name.clone(), kind, shndx));
            if shndx == 0 || shndx >= SHN_LORESERVE {
                continue;
            }
            if kind != STT_OBJECT && kind != STT_FUNC {
                continue;
            }
            let section = usize::from(shndx);
            let section_name = names.get(section).ok_or("symbol in no section")?;
            if kind == STT_FUNC && section_name.starts_with(".text.") && !name.is_empty() {
                out.kernels.push(name);
            } else if kind == STT_OBJECT
                && let Some(w) = writable.get_mut(&section)
            {
                let value = u64_at(image, at.saturating_add(8), "st_value")?;
                let size = u64_at(image, at.saturating_add(16), "st_size")?;
                let base = sections[section].addr;
                let offset = if value >= base { value - base } else { value };
                if !name.is_empty() {
                    w.symbols.push(GlobalSymbol { name, offset, size });
                }
            }
        }
    }
    out.runtime_calls = runtime_calls(image, &sections, &names, &tables)?;
    let mut writable: Vec<(usize, WritableSection)> = writable.into_iter().collect();
    writable.sort_by_key(|(i, _)| *i);
    out.writable = writable.into_iter().map(|(_, w)| w).collect();
    Ok(out)
}

/// Calls between functions (symbol indices of one symbol table), from `.nv.callgraph` and
/// from the `EIATTR_EXTERNS` attributes of `.nv.info.<function>`.
fn call_edges(
    image: &[u8],
    sections: &[Section],
    names: &[String],
    tables: &HashMap<usize, Vec<(String, u8, u16)>>,
) -> Result<HashMap<(usize, u32), Vec<u32>>, String> {
    let mut edges: HashMap<(usize, u32), Vec<u32>> = HashMap::new();
    for (i, s) in sections.iter().enumerate() {
        let table = s.link as usize;
        if s.kind == SHT_CUDA_CALLGRAPH || names[i] == ".nv.callgraph" {
            for k in 0..s.size / 8 {
                let caller = u32_at(image, s.offset.saturating_add(8 * k), "call graph entry")?;
                let callee = u32_at(
                    image,
                    s.offset.saturating_add(8 * k + 4),
                    "call graph entry",
                )?;
                if caller != 0 {
                    edges.entry((table, caller)).or_default().push(callee);
                }
            }
        } else if s.kind == SHT_CUDA_INFO && names[i].starts_with(".nv.info.") {
            // The function whose text section this describes.
            let Some(function) = tables.get(&table).and_then(|t| {
                t.iter()
                    .position(|(_, kind, shndx)| *kind == STT_FUNC && u32::from(*shndx) == s.info)
            }) else {
                continue;
            };
            let mut at = s.offset;
            let end = s.offset.saturating_add(s.size);
            while at.saturating_add(4) <= end {
                let [format, attribute] = read::<2>(image, at, "attribute")?;
                match format {
                    EIFMT_HVAL => at = at.saturating_add(4),
                    EIFMT_SVAL => {
                        let len = u64::from(u16_at(image, at.saturating_add(2), "attribute size")?);
                        if attribute == EIATTR_EXTERNS {
                            for k in 0..len / 4 {
                                let callee = u32_at(image, at.saturating_add(4 + 4 * k), "extern")?;
                                edges
                                    .entry((table, function as u32))
                                    .or_default()
                                    .push(callee);
                            }
                        }
                        at = at.saturating_add(4 + len);
                    }
                    // A format whose length is not known here: the rest of the section is
                    // not read (the call graph lists the same calls).
                    _ => break,
                }
            }
        }
    }
    Ok(edges)
}

/// Functions device code calls to launch kernels from the device (dynamic parallelism,
/// `-rdc=true`): a launch is no call, so the call graph has no edge from the launching function
/// to the kernel it launches.
pub const DEVICE_LAUNCH_CALLS: [&str; 4] = [
    "cudaGetParameterBuffer",
    "cudaGetParameterBufferV2",
    "cudaLaunchDevice",
    "cudaLaunchDeviceV2",
];

/// For each function defined in a text section, the functions of [`DEVICE_RUNTIME_CALLS`] it
/// can reach through the call graph and the functions' extern lists. A device-runtime function
/// the image declares but no function is seen to call is counted against every function of
/// the image: a call kreplay cannot place is never taken as no call. A function that can launch
/// kernels from the device (one of [`DEVICE_LAUNCH_CALLS`], placed or not) reaches what any
/// function of the image reaches: which kernel it launches is a pointer kreplay cannot follow.
fn runtime_calls(
    image: &[u8],
    sections: &[Section],
    names: &[String],
    tables: &HashMap<usize, Vec<(String, u8, u16)>>,
) -> Result<BTreeMap<String, Vec<String>>, String> {
    let edges = call_edges(image, sections, names, tables)?;
    // Each function's runtime calls, and whether it launches from the device.
    let mut reached: Vec<(String, BTreeSet<String>, bool)> = Vec::new();
    for (&t, table) in tables {
        let external = |i: u32, list: &[&str]| -> Option<String> {
            let (name, _, shndx) = table.get(i as usize)?;
            (*shndx == 0 && list.contains(&name.as_str())).then(|| name.clone())
        };
        let declared: Vec<u32> = (0..table.len() as u32)
            .filter(|&i| {
                external(i, &DEVICE_RUNTIME_CALLS).is_some()
                    || external(i, &DEVICE_LAUNCH_CALLS).is_some()
            })
            .collect();
        if declared.is_empty() {
            continue;
        }
        let placed: HashSet<u32> = edges
            .iter()
            .filter(|((table, _), _)| *table == t)
            .flat_map(|(_, callees)| callees.iter().copied())
            .collect();
        for (f, (name, kind, shndx)) in table.iter().enumerate() {
            let defined = *shndx != 0 && *shndx < SHN_LORESERVE;
            let in_text = names
                .get(usize::from(*shndx))
                .is_some_and(|n| n.starts_with(".text."));
            if *kind != STT_FUNC || !defined || !in_text || name.is_empty() {
                continue;
            }
            let mut seen = HashSet::from([f as u32]);
            let mut todo = vec![f as u32];
            while let Some(node) = todo.pop() {
                for &callee in edges.get(&(t, node)).into_iter().flatten() {
                    if seen.insert(callee) {
                        todo.push(callee);
                    }
                }
            }
            seen.extend(declared.iter().filter(|d| !placed.contains(d)));
            let calls: BTreeSet<String> = seen
                .iter()
                .filter_map(|&i| external(i, &DEVICE_RUNTIME_CALLS))
                .collect();
            let launches = seen
                .iter()
                .any(|&i| external(i, &DEVICE_LAUNCH_CALLS).is_some());
            reached.push((name.clone(), calls, launches));
        }
    }
    let every: BTreeSet<String> = reached
        .iter()
        .flat_map(|(_, calls, _)| calls.iter().cloned())
        .collect();
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, calls, launches) in reached {
        let calls = if launches { &every } else { &calls };
        if !calls.is_empty() {
            let entry = out.entry(name).or_default();
            entry.extend(calls.iter().cloned());
            entry.sort();
            entry.dedup();
        }
    }
    Ok(out)
}

/// A device range: base address and size in bytes.
pub type Range = (u64, u64);

/// Where the launched function's module and its variables are (the driver in production).
pub trait ModuleLookup {
    /// The launched function's module (an opaque handle).
    fn module(&self) -> Result<u64, String>;
    /// The device address and size of variable `name` of `module`, `None` when it has none.
    fn global(&self, module: u64, name: &str) -> Option<Range>;
    /// Make sure the launched function's module is loaded in its context (with lazy loading
    /// its load, and the load's callback, may come only now). Called when no reported cubin
    /// defines the kernel.
    fn load(&self) {}
}

/// The device ranges of one cubin's writable sections in `module`, or why they cannot be
/// located.
pub fn locate(
    cubin: &CubinSymbols,
    module: u64,
    lookup: &dyn ModuleLookup,
) -> Result<Vec<Range>, String> {
    let mut out = Vec::new();
    for section in &cubin.writable {
        let resolved: Vec<(&GlobalSymbol, Option<Range>)> = section
            .symbols
            .iter()
            .map(|s| (s, lookup.global(module, &s.name)))
            .collect();
        // One base for the whole section, when every resolved variable agrees on it and sits
        // where the cubin says.
        let bases: Vec<Option<u64>> = resolved
            .iter()
            .filter_map(|(s, r)| {
                r.map(|(addr, size)| {
                    (s.size == 0 || size == s.size)
                        .then(|| addr.checked_sub(s.offset))
                        .flatten()
                        .filter(|_| s.offset.saturating_add(size) <= section.size)
                })
            })
            .collect();
        let base = match bases.first() {
            Some(Some(b)) if bases.iter().all(|x| *x == Some(*b)) => Some(*b),
            _ => None,
        };
        if let Some(base) = base {
            out.push((base, section.size));
            continue;
        }
        if section.symbols.is_empty() {
            return Err(format!(
                "section {} ({} bytes) names no variable the driver could locate",
                section.name, section.size
            ));
        }
        for (s, r) in resolved {
            match r {
                Some((addr, size)) if size > 0 => out.push((addr, size)),
                Some(_) => {}
                None => {
                    return Err(format!(
                        "cuModuleGetGlobal cannot locate variable {} ({} bytes in {})",
                        s.name, s.size, section.name
                    ));
                }
            }
        }
    }
    Ok(out)
}

#[derive(Default)]
struct Inner {
    /// Loaded modules (CUPTI's module id) and their symbols.
    modules: HashMap<u32, Arc<CubinSymbols>>,
    /// Loads of each module not unloaded yet: CUPTI gives a module the same id in every
    /// context it is loaded in.
    loads: HashMap<u32, usize>,
    /// Kernel name → the modules that define it.
    by_kernel: HashMap<String, Vec<u32>>,
    /// Modules whose cubin could not be read, and why.
    unreadable: HashMap<u32, String>,
    /// Located variables per (context, function), valid until a module is unloaded.
    located: HashMap<(usize, usize), Arc<[Range]>>,
    /// Module unloads so far: a function handle seen after one may name another function.
    unloads: u64,
}

/// The cubins of the process's loaded modules, and the variables located per launched function.
#[derive(Default)]
pub struct ModuleRegistry {
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for ModuleRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let i = self.inner.lock();
        f.debug_struct("ModuleRegistry")
            .field("modules", &i.modules.len())
            .field("unreadable", &i.unreadable.len())
            .finish()
    }
}

impl ModuleRegistry {
    /// An empty registry.
    pub fn new() -> ModuleRegistry {
        ModuleRegistry::default()
    }

    /// CUPTI reported module `id` loaded with this cubin image. Returns the number of writable
    /// variables found, or why the image could not be read (its kernels then decline).
    pub fn on_loaded(&self, id: u32, image: &[u8]) -> Result<usize, String> {
        let parsed = parse_cubin(image);
        let mut i = self.inner.lock();
        Self::forget(&mut i, id);
        *i.loads.entry(id).or_default() += 1;
        match parsed {
            Ok(symbols) => {
                let n = symbols.writable.iter().map(|w| w.symbols.len()).sum();
                for k in &symbols.kernels {
                    i.by_kernel.entry(k.clone()).or_default().push(id);
                }
                i.modules.insert(id, Arc::new(symbols));
                Ok(n)
            }
            Err(e) => {
                i.unreadable.insert(id, e.clone());
                Err(e)
            }
        }
    }

    fn forget(i: &mut Inner, id: u32) {
        if let Some(old) = i.modules.remove(&id) {
            for k in &old.kernels {
                if let Some(v) = i.by_kernel.get_mut(k) {
                    v.retain(|m| *m != id);
                    if v.is_empty() {
                        i.by_kernel.remove(k);
                    }
                }
            }
        }
        i.unreadable.remove(&id);
        // A function handle of the unloaded module may be handed out again for another one.
        i.located.clear();
    }

    /// CUPTI reported module `id` about to be unloaded (from one context: it stays known while
    /// another context has it loaded).
    pub fn on_unloading(&self, id: u32) {
        let mut i = self.inner.lock();
        i.unloads += 1;
        let left = i.loads.get(&id).map_or(0, |n| n.saturating_sub(1));
        if left > 0 {
            i.loads.insert(id, left);
            // A function handle of the unloaded copy may be handed out again for another one.
            i.located.clear();
        } else {
            i.loads.remove(&id);
            Self::forget(&mut i, id);
        }
    }

    fn candidates(&self, kernel: &str) -> Vec<Arc<CubinSymbols>> {
        let i = self.inner.lock();
        i.by_kernel
            .get(kernel)
            .map(|ids| {
                ids.iter()
                    .filter_map(|id| i.modules.get(id).cloned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The key under which what the launches of `function` taught is kept for its next launch
    /// (the write sets its restores learned, `auto`'s measured costs): its handle while no
    /// module has been unloaded, else the handle and the number of unloads so far, hashed. The
    /// driver may hand a function of a module loaded after an unload the handle of a function
    /// of the unloaded one; keyed by the handle alone, the new function would be restored by
    /// the write set the old one's restores learned. (Every function gets a new key at each
    /// unload: what they learned is learned again once.)
    pub fn kernel_key(&self, function: usize) -> u64 {
        match self.inner.lock().unloads {
            0 => function as u64,
            unloads => {
                use std::hash::{Hash, Hasher};
                let mut h = std::collections::hash_map::DefaultHasher::new();
                (function, unloads).hash(&mut h);
                h.finish()
            }
        }
    }

    /// A kernel of a loaded module that can call the device heap's functions (see
    /// [`is_heap_call`]), and its calls, if any: what a graph launch may run without kreplay
    /// seeing which kernels it runs. The first by name, so the answer does not depend on the
    /// order modules were loaded in.
    pub fn heap_user(&self) -> Option<(String, Vec<String>)> {
        let i = self.inner.lock();
        i.modules
            .values()
            .flat_map(|m| m.runtime_calls.iter())
            .filter(|(_, calls)| calls.iter().any(|c| is_heap_call(c)))
            .min_by(|a, b| a.0.cmp(b.0))
            .map(|(kernel, calls)| (kernel.clone(), calls.clone()))
    }

    /// The functions of [`DEVICE_RUNTIME_CALLS`] that `kernel` can call, in any loaded module
    /// that defines a kernel of that name (several such modules: all of their calls).
    pub fn runtime_calls(&self, kernel: &str) -> Vec<String> {
        let mut calls: Vec<String> = self
            .candidates(kernel)
            .iter()
            .filter_map(|c| c.runtime_calls.get(kernel))
            .flatten()
            .cloned()
            .collect();
        calls.sort();
        calls.dedup();
        calls
    }

    /// The writable module-scope variables of the module of `function` (launched in context
    /// `ctx` under the name `kernel`), as device ranges, or why they cannot be located (the
    /// launch is then declined).
    pub fn variables_of(
        &self,
        ctx: usize,
        function: usize,
        kernel: Option<&str>,
        lookup: &dyn ModuleLookup,
    ) -> Result<Arc<[Range]>, String> {
        if let Some(hit) = self.inner.lock().located.get(&(ctx, function)) {
            return Ok(hit.clone());
        }
        let kernel = kernel.ok_or("the launch names no kernel, so its module is unknown")?;
        let mut candidates = self.candidates(kernel);
        if candidates.is_empty() {
            lookup.load();
            candidates = self.candidates(kernel);
        }
        if candidates.is_empty() {
            let unreadable = self.inner.lock().unreadable.len();
            return Err(format!(
                "no loaded module reported to kreplay defines kernel {kernel}{}, so its \
                 module-scope variables are unknown",
                if unreadable > 0 {
                    format!(" ({unreadable} module image(s) could not be read)")
                } else {
                    String::new()
                }
            ));
        }
        let located: Arc<[Range]> = if candidates.iter().all(|c| c.writable.is_empty()) {
            Arc::from([])
        } else {
            let module = lookup.module()?;
            let mut ranges = Vec::new();
            let mut first_error = None;
            let mut any = false;
            for c in &candidates {
                if c.writable.is_empty() {
                    any = true;
                    continue;
                }
                match locate(c, module, lookup) {
                    Ok(r) => {
                        any = true;
                        ranges.extend(r);
                    }
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
            }
            if !any {
                return Err(format!(
                    "the module-scope variables of kernel {kernel}'s module cannot be located: {}",
                    first_error.unwrap_or_default()
                ));
            }
            ranges.sort_unstable();
            ranges.dedup();
            ranges.into()
        };
        self.inner
            .lock()
            .located
            .insert((ctx, function), located.clone());
        Ok(located)
    }
}

#[cfg(test)]
#[path = "../tests/fake_device/cubin.rs"]
mod cubin_image;

#[cfg(test)]
mod tests {
    use super::cubin_image::{Cubin, cubin};
    use super::*;
    use std::cell::Cell;

    #[test]
    fn a_cubin_yields_its_kernels_and_only_its_writable_variables() {
        let image = cubin(
            "bump",
            &[
                (".nv.global", 16, &[("counter", 0, 4), ("flags", 8, 8)]),
                (".nv.global.init", 8, &[("seed", 0, 8)]),
            ],
        );
        let s = parse_cubin(&image).unwrap();
        assert_eq!(s.kernels, vec!["bump".to_string()]);
        assert_eq!(s.writable.len(), 2);
        assert_eq!(s.writable[0].name, ".nv.global");
        assert_eq!(s.writable[0].size, 16);
        let names: Vec<&str> = s
            .writable
            .iter()
            .flat_map(|w| w.symbols.iter().map(|g| g.name.as_str()))
            .collect();
        assert_eq!(names, ["counter", "flags", "seed"]);
        assert_eq!(
            s.writable[0].symbols[1],
            GlobalSymbol {
                name: "flags".into(),
                offset: 8,
                size: 8
            }
        );
        assert!(
            !names.contains(&"read_only_table"),
            "constants are read-only"
        );
    }

    fn calls_of(s: &CubinSymbols) -> Vec<(&str, Vec<&str>)> {
        s.runtime_calls
            .iter()
            .map(|(k, v)| (k.as_str(), v.iter().map(String::as_str).collect()))
            .collect()
    }

    #[test]
    fn device_runtime_calls_are_followed_through_the_call_graph() {
        // `outer` prints only through `helper`, which is not inlined; `plain` calls nothing.
        let image = Cubin {
            functions: &["say", "outer", "helper", "plain", "grab"],
            externs: &["vprintf", "malloc"],
            calls: &[
                ("say", "vprintf"),
                ("outer", "helper"),
                ("helper", "vprintf"),
                ("grab", "malloc"),
            ],
            ..Cubin::default()
        }
        .image();
        let s = parse_cubin(&image).unwrap();
        assert_eq!(
            calls_of(&s),
            [
                ("grab", vec!["malloc"]),
                ("helper", vec!["vprintf"]),
                ("outer", vec!["vprintf"]),
                ("say", vec!["vprintf"]),
            ]
        );
    }

    #[test]
    fn an_extern_listed_in_a_functions_attributes_counts_without_a_call_graph() {
        let image = Cubin {
            functions: &["grab", "plain"],
            externs: &["malloc", "free"],
            listed: &[("grab", &["malloc", "free"])],
            ..Cubin::default()
        }
        .image();
        let s = parse_cubin(&image).unwrap();
        assert_eq!(calls_of(&s), [("grab", vec!["free", "malloc"])]);
    }

    #[test]
    fn a_loaded_kernel_that_can_use_the_heap_is_found_whichever_module_holds_it() {
        let r = ModuleRegistry::new();
        let printing = Cubin {
            functions: &["say"],
            externs: &["vprintf"],
            calls: &[("say", "vprintf")],
            ..Cubin::default()
        }
        .image();
        r.on_loaded(1, &printing).unwrap();
        assert_eq!(r.heap_user(), None, "printf is no heap call");
        let grabbing = Cubin {
            functions: &["plain", "grab"],
            externs: &["malloc"],
            calls: &[("grab", "malloc")],
            ..Cubin::default()
        }
        .image();
        r.on_loaded(2, &grabbing).unwrap();
        assert_eq!(
            r.heap_user(),
            Some(("grab".to_string(), vec!["malloc".to_string()]))
        );
        r.on_unloading(2);
        assert_eq!(r.heap_user(), None, "gone with its module");
    }

    #[test]
    fn a_runtime_function_no_call_places_counts_against_every_function() {
        let image = Cubin {
            functions: &["a", "b"],
            externs: &["vprintf", "cudaGetParameterBufferV2"],
            ..Cubin::default()
        }
        .image();
        let s = parse_cubin(&image).unwrap();
        assert_eq!(
            calls_of(&s),
            [("a", vec!["vprintf"]), ("b", vec!["vprintf"])]
        );
        // Without any runtime function declared, nothing is counted.
        let s = parse_cubin(&cubin("plain", &[])).unwrap();
        assert!(s.runtime_calls.is_empty());
    }

    #[test]
    fn the_registry_answers_a_kernels_runtime_calls_by_name_until_unloaded() {
        let modules = ModuleRegistry::new();
        let image = Cubin {
            functions: &["say"],
            externs: &["vprintf"],
            calls: &[("say", "vprintf")],
            ..Cubin::default()
        }
        .image();
        modules.on_loaded(3, &image).unwrap();
        assert_eq!(modules.runtime_calls("say"), ["vprintf"]);
        assert!(modules.runtime_calls("other").is_empty());
        modules.on_unloading(3);
        assert!(modules.runtime_calls("say").is_empty());
    }

    #[test]
    fn a_cubin_without_writable_data_has_no_variables() {
        let s = parse_cubin(&cubin("plain", &[])).unwrap();
        assert_eq!(s.kernels, vec!["plain".to_string()]);
        assert!(s.writable.is_empty());
    }

    #[test]
    fn images_that_are_not_cubins_are_refused_with_a_reason() {
        assert!(parse_cubin(b"").unwrap_err().contains("not an ELF"));
        assert!(
            parse_cubin(b"//\n// Generated by NVIDIA NVVM Compiler\n.version 8.0\n.target sm_90\n.address_size 64\n\n\n\n\n")
                .unwrap_err()
                .contains("not an ELF")
        );
        let mut image = cubin("k", &[(".nv.global", 4, &[("x", 0, 4)])]);
        let truncated = &image[..image.len() - 10];
        assert!(parse_cubin(truncated).unwrap_err().contains("past the end"));
        image[4] = 1;
        assert!(parse_cubin(&image).unwrap_err().contains("64-bit"));
    }

    /// The driver side of a fake module whose variables live at `base + offset`.
    struct FakeModule {
        module: Result<u64, String>,
        base: u64,
        known: Vec<(&'static str, u64, u64)>,
        loads: Cell<u32>,
    }

    impl ModuleLookup for FakeModule {
        fn module(&self) -> Result<u64, String> {
            self.module.clone()
        }
        fn global(&self, module: u64, name: &str) -> Option<Range> {
            (Ok(module) == self.module)
                .then(|| self.known.iter().find(|(n, _, _)| *n == name))
                .flatten()
                .map(|(_, off, size)| (self.base + off, *size))
        }
        fn load(&self) {
            self.loads.set(self.loads.get() + 1);
        }
    }

    fn fake(known: Vec<(&'static str, u64, u64)>) -> FakeModule {
        FakeModule {
            module: Ok(7),
            base: 0x7000_0000,
            known,
            loads: Cell::new(0),
        }
    }

    #[test]
    fn a_section_whose_variables_agree_on_its_base_is_covered_whole() {
        let r = ModuleRegistry::new();
        let image = cubin(
            "bump",
            &[(".nv.global", 32, &[("counter", 0, 4), ("flags", 8, 8)])],
        );
        assert_eq!(r.on_loaded(1, &image), Ok(2));
        // Only `counter` resolves by name (say `flags` is local): the base still covers all 32.
        let lookup = fake(vec![("counter", 0, 4)]);
        let v = r.variables_of(0, 0x10, Some("bump"), &lookup).unwrap();
        assert_eq!(&*v, &[(0x7000_0000, 32)]);
    }

    #[test]
    fn a_variable_the_driver_cannot_locate_declines_unless_its_section_base_is_known() {
        let r = ModuleRegistry::new();
        let image = cubin("bump", &[(".nv.global", 16, &[("counter", 0, 4)])]);
        r.on_loaded(1, &image).unwrap();
        let why = r
            .variables_of(0, 0x10, Some("bump"), &fake(vec![]))
            .unwrap_err();
        assert!(why.contains("counter"), "{why}");
        // A size that disagrees with the cubin: no section base, but the variable itself.
        let v = r
            .variables_of(0, 0x10, Some("bump"), &fake(vec![("counter", 0, 8)]))
            .unwrap();
        assert_eq!(&*v, &[(0x7000_0000, 8)]);
    }

    #[test]
    fn a_kernel_no_reported_module_defines_declines_after_asking_for_its_load() {
        let r = ModuleRegistry::new();
        let lookup = fake(vec![]);
        let why = r.variables_of(0, 0x10, Some("ghost"), &lookup).unwrap_err();
        assert!(why.contains("ghost"), "{why}");
        assert_eq!(lookup.loads.get(), 1, "the module's load was asked for");
        assert!(r.variables_of(0, 0x10, None, &lookup).is_err());
    }

    #[test]
    fn kernels_of_modules_without_writable_data_need_no_driver_call() {
        let r = ModuleRegistry::new();
        r.on_loaded(3, &cubin("plain", &[])).unwrap();
        let lookup = FakeModule {
            module: Err("must not be asked".into()),
            ..fake(vec![])
        };
        assert!(
            r.variables_of(0, 1, Some("plain"), &lookup)
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn an_unloaded_module_is_forgotten() {
        let r = ModuleRegistry::new();
        let image = cubin("bump", &[(".nv.global", 4, &[("counter", 0, 4)])]);
        r.on_loaded(1, &image).unwrap();
        let lookup = fake(vec![("counter", 0, 4)]);
        assert_eq!(
            r.variables_of(0, 9, Some("bump"), &lookup).unwrap().len(),
            1
        );
        r.on_unloading(1);
        assert!(r.variables_of(0, 9, Some("bump"), &lookup).is_err());
    }

    #[test]
    fn a_function_handle_handed_out_again_after_an_unload_is_another_kernel() {
        // The driver may give a function of a module loaded after an unload the handle a
        // function of the unloaded one had: what that function's launches taught (a write set
        // its restores trust) must not be applied to the new one.
        let r = ModuleRegistry::new();
        r.on_loaded(1, &cubin("bump", &[])).unwrap();
        let before = r.kernel_key(0x7000);
        assert_eq!(
            r.kernel_key(0x7000),
            before,
            "stable while its module is loaded"
        );
        assert_ne!(r.kernel_key(0x7100), before, "another function");
        r.on_unloading(1);
        r.on_loaded(2, &cubin("other", &[])).unwrap();
        let after = r.kernel_key(0x7000);
        assert_ne!(
            after, before,
            "the handle may name another module's function now"
        );
        assert_eq!(r.kernel_key(0x7000), after);
    }

    #[test]
    fn a_module_loaded_in_two_contexts_is_known_until_both_unloaded_it() {
        let r = ModuleRegistry::new();
        let image = cubin("bump", &[(".nv.global", 4, &[("counter", 0, 4)])]);
        r.on_loaded(1, &image).unwrap();
        r.on_loaded(1, &image).unwrap();
        let lookup = fake(vec![("counter", 0, 4)]);
        r.on_unloading(1);
        assert_eq!(
            r.variables_of(0, 9, Some("bump"), &lookup).unwrap().len(),
            1,
            "the other context still has it"
        );
        r.on_unloading(1);
        assert!(r.variables_of(0, 9, Some("bump"), &lookup).is_err());
        r.on_unloading(1);
        r.on_loaded(1, &image).unwrap();
        assert_eq!(
            r.variables_of(0, 9, Some("bump"), &lookup).unwrap().len(),
            1,
            "an unload too many does not hide a later load"
        );
    }

    #[test]
    fn the_module_of_the_launched_function_is_where_variables_are_looked_up() {
        let r = ModuleRegistry::new();
        r.on_loaded(
            1,
            &cubin("bump", &[(".nv.global", 4, &[("counter", 0, 4)])]),
        )
        .unwrap();
        let lookup = FakeModule {
            module: Err("cuFuncGetModule failed".into()),
            ..fake(vec![("counter", 0, 4)])
        };
        let why = r.variables_of(0, 9, Some("bump"), &lookup).unwrap_err();
        assert!(why.contains("cuFuncGetModule"), "{why}");
    }
}
