//! Builds AMDGPU ELF code objects with a metadata note: what the software runtime writes for
//! tests that exercise code object metadata, and what this crate's own tests read back.

use crate::msgpack::Encoder;
use crate::{EM_AMDGPU, NOTE_OWNER, NT_AMDGPU_METADATA};

/// One kernel argument in the metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Arg {
    /// `.value_kind`: `by_value`, `global_buffer`, `hidden_printf_buffer`, ...
    pub value_kind: String,
    pub offset: u32,
    pub size: u32,
}

/// One kernel in the metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelMeta {
    /// `.name`; `.symbol` is `name.kd`.
    pub name: String,
    pub args: Vec<Arg>,
}

impl KernelMeta {
    /// A kernel whose argument block is `explicit` bytes passed by value, followed by one
    /// 8-byte hidden argument of each kind in `hidden`.
    pub fn new(name: &str, explicit: u32, hidden: &[&str]) -> KernelMeta {
        let mut args = Vec::new();
        if explicit > 0 {
            args.push(Arg {
                value_kind: "by_value".into(),
                offset: 0,
                size: explicit,
            });
        }
        let mut offset = explicit.next_multiple_of(8);
        for kind in hidden {
            args.push(Arg {
                value_kind: (*kind).into(),
                offset,
                size: 8,
            });
            offset += 8;
        }
        KernelMeta {
            name: name.into(),
            args,
        }
    }

    fn segment_size(&self) -> u32 {
        self.args
            .iter()
            .map(|a| a.offset + a.size)
            .max()
            .unwrap_or(0)
    }
}

/// The MessagePack metadata map of `kernels` (code object V5's version, 1.2).
pub fn metadata(kernels: &[KernelMeta]) -> Vec<u8> {
    let mut e = Encoder::default();
    e.map(3);
    e.str("amdhsa.version");
    e.array(2);
    e.uint(1);
    e.uint(2);
    e.str("amdhsa.target");
    e.str("amdgcn-amd-amdhsa--gfx90a");
    e.str("amdhsa.kernels");
    e.array(kernels.len());
    for k in kernels {
        e.map(5);
        e.str(".name");
        e.str(&k.name);
        e.str(".symbol");
        e.str(&format!("{}.kd", k.name));
        e.str(".kernarg_segment_size");
        e.uint(u64::from(k.segment_size()));
        e.str(".kernarg_segment_align");
        e.uint(8);
        e.str(".args");
        e.array(k.args.len());
        for a in &k.args {
            e.map(3);
            e.str(".offset");
            e.uint(u64::from(a.offset));
            e.str(".size");
            e.uint(u64::from(a.size));
            e.str(".value_kind");
            e.str(&a.value_kind);
        }
    }
    e.out
}

fn pad(out: &mut Vec<u8>, align: usize) {
    while !out.len().is_multiple_of(align) {
        out.push(0);
    }
}

/// The bytes of one ELF note: `owner` (NUL-terminated) and `desc`, each padded to 4 bytes.
pub fn note(owner: &[u8], kind: u32, desc: &[u8]) -> Vec<u8> {
    let mut n = Vec::new();
    n.extend_from_slice(&(owner.len() as u32 + 1).to_le_bytes());
    n.extend_from_slice(&(desc.len() as u32).to_le_bytes());
    n.extend_from_slice(&kind.to_le_bytes());
    n.extend_from_slice(owner);
    n.push(0);
    pad(&mut n, 4);
    n.extend_from_slice(desc);
    pad(&mut n, 4);
    n
}

/// An ELF64 AMDGPU code object (`ET_DYN`, code object V5's ABI version) with one `PT_NOTE`
/// segment and `.note` section holding `kernels`' metadata, and the sections `extra` (name,
/// contents) as `SHT_PROGBITS`.
pub fn amdgpu_elf(kernels: &[KernelMeta], extra: &[(&str, &[u8])]) -> Vec<u8> {
    const SHT_PROGBITS: u32 = 1;
    const SHT_STRTAB: u32 = 3;
    let notes = note(NOTE_OWNER, NT_AMDGPU_METADATA, &metadata(kernels));
    let mut out = vec![0u8; 64 + 56];
    let note_at = out.len();
    out.extend_from_slice(&notes);
    // Section name table: "", ".note", extras..., ".shstrtab".
    let mut strtab = vec![0u8];
    let name_of = |s: &str, strtab: &mut Vec<u8>| {
        let at = strtab.len() as u32;
        strtab.extend_from_slice(s.as_bytes());
        strtab.push(0);
        at
    };
    let note_name = name_of(".note", &mut strtab);
    let mut sections = Vec::new();
    for (name, data) in extra {
        pad(&mut out, 8);
        let at = out.len();
        out.extend_from_slice(data);
        sections.push((
            name_of(name, &mut strtab),
            SHT_PROGBITS,
            at,
            data.len(),
            8u64,
        ));
    }
    let strtab_name = name_of(".shstrtab", &mut strtab);
    let strtab_at = out.len();
    out.extend_from_slice(&strtab);
    pad(&mut out, 8);
    let shoff = out.len();
    let mut headers: Vec<(u32, u32, usize, usize, u64)> = vec![(0, 0, 0, 0, 0)];
    headers.push((note_name, crate::elf::SHT_NOTE, note_at, notes.len(), 4));
    headers.extend(sections);
    headers.push((strtab_name, SHT_STRTAB, strtab_at, strtab.len(), 1));
    for (name, kind, offset, size, align) in &headers {
        let mut h = [0u8; 64];
        h[0..4].copy_from_slice(&name.to_le_bytes());
        h[4..8].copy_from_slice(&kind.to_le_bytes());
        h[24..32].copy_from_slice(&(*offset as u64).to_le_bytes());
        h[32..40].copy_from_slice(&(*size as u64).to_le_bytes());
        h[48..56].copy_from_slice(&align.to_le_bytes());
        out.extend_from_slice(&h);
    }
    // ELF header.
    let e = &mut out[..64];
    e[..4].copy_from_slice(crate::elf::MAGIC);
    e[4] = 2; // ELFCLASS64
    e[5] = 1; // ELFDATA2LSB
    e[6] = 1; // EV_CURRENT
    e[7] = 64; // ELFOSABI_AMDGPU_HSA
    e[8] = 3; // ELFABIVERSION_AMDGPU_HSA_V5
    e[16..18].copy_from_slice(&3u16.to_le_bytes()); // ET_DYN
    e[18..20].copy_from_slice(&EM_AMDGPU.to_le_bytes());
    e[20..24].copy_from_slice(&1u32.to_le_bytes());
    e[32..40].copy_from_slice(&64u64.to_le_bytes()); // e_phoff
    e[40..48].copy_from_slice(&(shoff as u64).to_le_bytes());
    e[52..54].copy_from_slice(&64u16.to_le_bytes()); // e_ehsize
    e[54..56].copy_from_slice(&56u16.to_le_bytes());
    e[56..58].copy_from_slice(&1u16.to_le_bytes());
    e[58..60].copy_from_slice(&64u16.to_le_bytes());
    e[60..62].copy_from_slice(&(headers.len() as u16).to_le_bytes());
    e[62..64].copy_from_slice(&(headers.len() as u16 - 1).to_le_bytes());
    // The note segment.
    let p = &mut out[64..120];
    p[0..4].copy_from_slice(&crate::elf::PT_NOTE.to_le_bytes());
    p[4..8].copy_from_slice(&4u32.to_le_bytes()); // PF_R
    p[8..16].copy_from_slice(&(note_at as u64).to_le_bytes());
    p[16..24].copy_from_slice(&(note_at as u64).to_le_bytes());
    p[24..32].copy_from_slice(&(note_at as u64).to_le_bytes());
    p[32..40].copy_from_slice(&(notes.len() as u64).to_le_bytes());
    p[40..48].copy_from_slice(&(notes.len() as u64).to_le_bytes());
    p[48..56].copy_from_slice(&4u64.to_le_bytes());
    out
}
