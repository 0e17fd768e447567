//! A reader of the parts of an ELF64 little-endian file a code object's metadata needs: the
//! header, the notes (from `PT_NOTE` segments, else `SHT_NOTE` sections) and sections by name.
//!
//! Every offset, size and count read from the file is checked against the file's length with
//! checked arithmetic before it is used: a truncated or hostile file gives an [`Error`].

use crate::Error;

pub(crate) const MAGIC: &[u8; 4] = b"\x7fELF";
const ELFCLASS64: u8 = 2;
const ELFDATA2LSB: u8 = 1;
const EHDR_SIZE: usize = 64;
const PHDR_SIZE: usize = 56;
const SHDR_SIZE: usize = 64;
/// The most notes read from one file (code objects have one or two): segments or sections
/// that overlap, or many headers naming the same bytes, cannot make the reading grow past it.
const MAX_NOTES: usize = 4096;
pub(crate) const PT_NOTE: u32 = 4;
pub(crate) const SHT_NOTE: u32 = 7;

/// A parsed ELF64 little-endian file.
#[derive(Debug)]
pub struct Elf<'a> {
    bytes: &'a [u8],
    /// `e_machine`.
    pub machine: u16,
    /// `e_ident[EI_ABIVERSION]`.
    pub abi_version: u8,
    phoff: usize,
    phnum: usize,
    shoff: usize,
    shnum: usize,
    shstrndx: usize,
}

/// One note: its owner name (without the terminating NUL), type and descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Note<'a> {
    pub name: &'a [u8],
    pub kind: u32,
    pub desc: &'a [u8],
}

fn bad(what: &str) -> Error {
    Error::Elf(what.to_string())
}

fn range(bytes: &[u8], offset: u64, size: u64, what: &str) -> Result<(usize, usize), Error> {
    let offset = usize::try_from(offset).map_err(|_| bad(what))?;
    let size = usize::try_from(size).map_err(|_| bad(what))?;
    let end = offset.checked_add(size).ok_or_else(|| bad(what))?;
    if end > bytes.len() {
        return Err(Error::Elf(format!(
            "{what} ({offset}..{end}) lies past the end of the file ({} bytes)",
            bytes.len()
        )));
    }
    Ok((offset, end))
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl<'a> Elf<'a> {
    /// Whether `bytes` start like an ELF file (of any class).
    pub fn is_elf(bytes: &[u8]) -> bool {
        bytes.starts_with(MAGIC)
    }

    /// Reads the header. Only 64-bit little-endian files are accepted.
    pub fn parse(bytes: &'a [u8]) -> Result<Elf<'a>, Error> {
        let h = bytes
            .get(..EHDR_SIZE)
            .ok_or_else(|| bad("shorter than an ELF64 header"))?;
        if &h[..4] != MAGIC {
            return Err(bad("no ELF magic"));
        }
        if h[4] != ELFCLASS64 || h[5] != ELFDATA2LSB {
            return Err(bad("not a 64-bit little-endian ELF file"));
        }
        let to = |v: u64, what| usize::try_from(v).map_err(|_| bad(what));
        let elf = Elf {
            bytes,
            machine: u16_at(h, 18),
            abi_version: h[8],
            phoff: to(u64_at(h, 32), "e_phoff")?,
            shoff: to(u64_at(h, 40), "e_shoff")?,
            phnum: usize::from(u16_at(h, 56)),
            shnum: usize::from(u16_at(h, 60)),
            shstrndx: usize::from(u16_at(h, 62)),
        };
        if elf.phnum > 0 && usize::from(u16_at(h, 54)) != PHDR_SIZE {
            return Err(bad("e_phentsize is not 56"));
        }
        if elf.shnum > 0 && usize::from(u16_at(h, 58)) != SHDR_SIZE {
            return Err(bad("e_shentsize is not 64"));
        }
        Ok(elf)
    }

    fn phdr(&self, i: usize) -> Result<&'a [u8], Error> {
        let at = i
            .checked_mul(PHDR_SIZE)
            .and_then(|o| o.checked_add(self.phoff))
            .ok_or_else(|| bad("program header table"))?;
        let (s, e) = range(self.bytes, at as u64, PHDR_SIZE as u64, "program header")?;
        Ok(&self.bytes[s..e])
    }

    fn shdr(&self, i: usize) -> Result<&'a [u8], Error> {
        let at = i
            .checked_mul(SHDR_SIZE)
            .and_then(|o| o.checked_add(self.shoff))
            .ok_or_else(|| bad("section header table"))?;
        let (s, e) = range(self.bytes, at as u64, SHDR_SIZE as u64, "section header")?;
        Ok(&self.bytes[s..e])
    }

    /// The bytes of section header `h`'s contents (none for `SHT_NOBITS`).
    fn contents(&self, h: &[u8]) -> Result<&'a [u8], Error> {
        const SHT_NOBITS: u32 = 8;
        if u32_at(h, 4) == SHT_NOBITS {
            return Ok(&[]);
        }
        let (s, e) = range(self.bytes, u64_at(h, 24), u64_at(h, 32), "section")?;
        Ok(&self.bytes[s..e])
    }

    /// Every note of the file: those of its `PT_NOTE` segments where it has any, else those of
    /// its `SHT_NOTE` sections (the two usually hold the same bytes).
    pub fn notes(&self) -> Result<Vec<Note<'a>>, Error> {
        let notes = self.segment_notes()?;
        if !notes.is_empty() {
            return Ok(notes);
        }
        self.section_notes()
    }

    /// The notes of the file's `PT_NOTE` segments.
    pub fn segment_notes(&self) -> Result<Vec<Note<'a>>, Error> {
        let mut notes = Vec::new();
        for i in 0..self.phnum {
            let p = self.phdr(i)?;
            if u32_at(p, 0) == PT_NOTE {
                let (s, e) = range(self.bytes, u64_at(p, 8), u64_at(p, 32), "note segment")?;
                read_notes(&self.bytes[s..e], u64_at(p, 48), &mut notes)?;
            }
        }
        Ok(notes)
    }

    /// The notes of the file's `SHT_NOTE` sections.
    pub fn section_notes(&self) -> Result<Vec<Note<'a>>, Error> {
        let mut notes = Vec::new();
        for i in 0..self.shnum {
            let h = self.shdr(i)?;
            if u32_at(h, 4) == SHT_NOTE {
                read_notes(self.contents(h)?, u64_at(h, 48), &mut notes)?;
            }
        }
        Ok(notes)
    }

    /// The contents of the first section named `name`, if the file has one.
    pub fn section(&self, name: &str) -> Result<Option<&'a [u8]>, Error> {
        if self.shnum == 0 {
            return Ok(None);
        }
        if self.shstrndx >= self.shnum {
            return Err(bad("e_shstrndx names no section"));
        }
        let names = self.contents(self.shdr(self.shstrndx)?)?;
        for i in 0..self.shnum {
            let h = self.shdr(i)?;
            let at = u32_at(h, 0) as usize;
            let tail = names
                .get(at..)
                .ok_or_else(|| bad("section name past its string table"))?;
            let len = tail
                .iter()
                .position(|&b| b == 0)
                .ok_or_else(|| bad("section name without its NUL"))?;
            if &tail[..len] == name.as_bytes() {
                return self.contents(h).map(Some);
            }
        }
        Ok(None)
    }
}

fn align_up(v: usize, align: usize) -> Option<usize> {
    v.checked_add(align - 1).map(|v| v & !(align - 1))
}

/// The notes of one note segment or section. Entries are padded to 4 bytes, or to 8 where the
/// segment or section says so.
fn read_notes<'a>(mut b: &'a [u8], align: u64, out: &mut Vec<Note<'a>>) -> Result<(), Error> {
    let align = if align == 8 { 8 } else { 4 };
    while !b.is_empty() {
        if out.len() >= MAX_NOTES {
            return Err(Error::Elf(format!("more than {MAX_NOTES} notes")));
        }
        if b.len() < 12 {
            return Err(bad("truncated note header"));
        }
        let namesz = u32_at(b, 0) as usize;
        let descsz = u32_at(b, 4) as usize;
        let kind = u32_at(b, 8);
        let name_end = 12usize
            .checked_add(namesz)
            .ok_or_else(|| bad("note name"))?;
        let desc_at = align_up(name_end, align).ok_or_else(|| bad("note name"))?;
        let desc_end = desc_at
            .checked_add(descsz)
            .ok_or_else(|| bad("note descriptor"))?;
        if desc_end > b.len() {
            return Err(bad("note past the end of its segment"));
        }
        let name = &b[12..name_end];
        let name = name.strip_suffix(&[0]).unwrap_or(name);
        out.push(Note {
            name,
            kind,
            desc: &b[desc_at..desc_end],
        });
        let next = align_up(desc_end, align)
            .ok_or_else(|| bad("note descriptor"))?
            .min(b.len());
        b = &b[next..];
    }
    Ok(())
}
