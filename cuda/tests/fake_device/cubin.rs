//! A hand-built cubin-like ELF image for the GPU-free tests of module-scope variables: what
//! CUPTI's module-load callback hands over, reduced to what kreplay reads (section headers,
//! the symbol table and its names).

/// A writable section: its name, its size and its objects (name, offset, size).
pub type Section<'a> = (&'a str, u64, &'a [(&'a str, u64, u64)]);

/// A minimal cubin-like ELF: a kernel `name` in `.text.<name>`, a `.nv.constant0` object
/// (read-only), and the given writable sections with their objects (name, offset, size).
pub fn cubin(kernel: &str, writable: &[Section<'_>]) -> Vec<u8> {
    // Section names and their table.
    let mut shstr = vec![0u8];
    fn add(t: &mut Vec<u8>, s: &str) -> u32 {
        let at = t.len() as u32;
        t.extend_from_slice(s.as_bytes());
        t.push(0);
        at
    }
    let text_name = format!(".text.{kernel}");
    let mut sec_names = vec![
        0,
        add(&mut shstr, ".shstrtab"),
        add(&mut shstr, ".strtab"),
        add(&mut shstr, ".symtab"),
        add(&mut shstr, &text_name),
        add(&mut shstr, ".nv.constant0"),
    ];
    for (name, _, _) in writable {
        sec_names.push(add(&mut shstr, name));
    }
    // Symbols: null, the kernel (FUNC in section 4), a constant (OBJECT in 5), the
    // writable objects.
    let mut strtab = vec![0u8];
    let mut syms: Vec<(u32, u8, u16, u64, u64)> = vec![(0, 0, 0, 0, 0)];
    syms.push((add(&mut strtab, kernel), 0x12, 4, 0, 64));
    syms.push((add(&mut strtab, "read_only_table"), 0x11, 5, 0, 16));
    for (k, (_, _, objects)) in writable.iter().enumerate() {
        for (name, offset, size) in *objects {
            syms.push((add(&mut strtab, name), 0x11, (6 + k) as u16, *offset, *size));
        }
    }
    let mut symtab = Vec::new();
    for (name, info, shndx, value, size) in &syms {
        symtab.extend_from_slice(&name.to_le_bytes());
        symtab.push(*info);
        symtab.push(0);
        symtab.extend_from_slice(&shndx.to_le_bytes());
        symtab.extend_from_slice(&value.to_le_bytes());
        symtab.extend_from_slice(&size.to_le_bytes());
    }
    // Layout: header, then the tables, then the section headers.
    let mut image = vec![0u8; 64];
    fn place(image: &mut Vec<u8>, bytes: &[u8]) -> u64 {
        let at = image.len() as u64;
        image.extend_from_slice(bytes);
        at
    }
    let shstr_off = place(&mut image, &shstr);
    let strtab_off = place(&mut image, &strtab);
    let symtab_off = place(&mut image, &symtab);
    let text_off = place(&mut image, &[0u8; 64]);
    let const_off = place(&mut image, &[0u8; 16]);
    // (type, offset, size, link, entsize)
    let mut headers: Vec<(u32, u64, u64, u32, u64)> = vec![
        (0, 0, 0, 0, 0),
        (3, shstr_off, shstr.len() as u64, 0, 0),
        (3, strtab_off, strtab.len() as u64, 0, 0),
        (2, symtab_off, symtab.len() as u64, 2, 24),
        (1, text_off, 64, 0, 0),
        (1, const_off, 16, 0, 0),
    ];
    for (name, size, _) in writable {
        // .nv.global is NOBITS (8), .nv.global.init PROGBITS (1).
        let kind = if *name == ".nv.global" { 8 } else { 1 };
        let off = if kind == 1 {
            place(&mut image, &vec![0u8; *size as usize])
        } else {
            0
        };
        headers.push((kind, off, *size, 0, 0));
    }
    while !image.len().is_multiple_of(8) {
        image.push(0);
    }
    let shoff = image.len() as u64;
    for (i, (kind, off, size, link, entsize)) in headers.iter().enumerate() {
        let mut h = [0u8; 64];
        h[0..4].copy_from_slice(&sec_names[i].to_le_bytes());
        h[4..8].copy_from_slice(&kind.to_le_bytes());
        h[24..32].copy_from_slice(&off.to_le_bytes());
        h[32..40].copy_from_slice(&size.to_le_bytes());
        h[40..44].copy_from_slice(&link.to_le_bytes());
        h[56..64].copy_from_slice(&entsize.to_le_bytes());
        image.extend_from_slice(&h);
    }
    image[..4].copy_from_slice(b"\x7fELF");
    image[4] = 2;
    image[5] = 1;
    image[6] = 1;
    image[0x10..0x12].copy_from_slice(&2u16.to_le_bytes());
    image[0x28..0x30].copy_from_slice(&shoff.to_le_bytes());
    image[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
    image[0x3c..0x3e].copy_from_slice(&(headers.len() as u16).to_le_bytes());
    image[0x3e..0x40].copy_from_slice(&1u16.to_le_bytes());
    image
}
