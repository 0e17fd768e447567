//! Hand-built cubin-like ELF images for the GPU-free tests of module-scope variables and of
//! device-runtime calls: what CUPTI's module-load callback hands over, reduced to what kreplay
//! reads (section headers, the symbol table and its names, the call graph and the per-function
//! attributes that list a function's external calls).

/// A writable section: its name, its size and its objects (name, offset, size).
pub type Section<'a> = (&'a str, u64, &'a [(&'a str, u64, u64)]);

/// The parts of a cubin a test sets.
#[derive(Clone, Copy, Default)]
pub struct Cubin<'a> {
    /// Functions defined in `.text.<name>` sections (kernels and device functions alike).
    pub functions: &'a [&'a str],
    /// Writable sections with their objects.
    pub writable: &'a [Section<'a>],
    /// Undefined function symbols (what the driver supplies: `vprintf`, `malloc`, ...).
    pub externs: &'a [&'a str],
    /// `.nv.callgraph` edges, caller to callee, by name.
    pub calls: &'a [(&'a str, &'a str)],
    /// `EIATTR_EXTERNS` attributes in `.nv.info.<function>`: a function and the externs it
    /// lists.
    pub listed: &'a [(&'a str, &'a [&'a str])],
}

/// A minimal cubin-like ELF: a kernel `name` in `.text.<name>`, a `.nv.constant0` object
/// (read-only), and the given writable sections with their objects (name, offset, size).
pub fn cubin(kernel: &str, writable: &[Section<'_>]) -> Vec<u8> {
    Cubin {
        functions: &[kernel],
        writable,
        ..Cubin::default()
    }
    .image()
}

fn add(t: &mut Vec<u8>, s: &str) -> u32 {
    let at = t.len() as u32;
    t.extend_from_slice(s.as_bytes());
    t.push(0);
    at
}

fn place(image: &mut Vec<u8>, bytes: &[u8]) -> u64 {
    let at = image.len() as u64;
    image.extend_from_slice(bytes);
    at
}

/// One section header: type, offset, size, link, info, entry size.
type Header = (u32, u64, u64, u32, u32, u64);

impl Cubin<'_> {
    /// The ELF image.
    pub fn image(&self) -> Vec<u8> {
        let functions = self.functions;
        // Sections: null, .shstrtab, .strtab, .symtab, one .text per function, .nv.constant0,
        // the writable ones, then .nv.callgraph and the .nv.info ones.
        let mut shstr = vec![0u8];
        let mut sec_names = vec![
            0,
            add(&mut shstr, ".shstrtab"),
            add(&mut shstr, ".strtab"),
            add(&mut shstr, ".symtab"),
        ];
        let text = |i: usize| (4 + i) as u16;
        for f in functions {
            sec_names.push(add(&mut shstr, &format!(".text.{f}")));
        }
        let constant = (4 + functions.len()) as u16;
        sec_names.push(add(&mut shstr, ".nv.constant0"));
        for (name, _, _) in self.writable {
            sec_names.push(add(&mut shstr, name));
        }
        // Symbols: null, the functions, a constant, the writable objects, the externs.
        let mut strtab = vec![0u8];
        let mut syms: Vec<(u32, u8, u16, u64, u64)> = vec![(0, 0, 0, 0, 0)];
        for (i, f) in functions.iter().enumerate() {
            syms.push((add(&mut strtab, f), 0x12, text(i), 0, 64));
        }
        syms.push((add(&mut strtab, "read_only_table"), 0x11, constant, 0, 16));
        for (k, (_, _, objects)) in self.writable.iter().enumerate() {
            for (name, offset, size) in *objects {
                let section = constant + 1 + k as u16;
                syms.push((add(&mut strtab, name), 0x11, section, *offset, *size));
            }
        }
        let first_extern = syms.len();
        for e in self.externs {
            syms.push((add(&mut strtab, e), 0x12, 0, 0, 0));
        }
        let index = |name: &str| -> u32 {
            if let Some(i) = functions.iter().position(|f| *f == name) {
                return (1 + i) as u32;
            }
            let e = self.externs.iter().position(|e| *e == name);
            (first_extern + e.expect("a function or an extern of the image")) as u32
        };
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
        let strtab_off = place(&mut image, &strtab);
        let symtab_off = place(&mut image, &symtab);
        let mut headers: Vec<Header> = vec![
            (0, 0, 0, 0, 0, 0),
            (3, 0, 0, 0, 0, 0), // .shstrtab, placed last, once every name is in
            (3, strtab_off, strtab.len() as u64, 0, 0, 0),
            (2, symtab_off, symtab.len() as u64, 2, 0, 24),
        ];
        for _ in functions {
            let off = place(&mut image, &[0u8; 64]);
            headers.push((1, off, 64, 3, 0, 0));
        }
        let const_off = place(&mut image, &[0u8; 16]);
        headers.push((1, const_off, 16, 0, 0, 0));
        for (name, size, _) in self.writable {
            // .nv.global is NOBITS (8), .nv.global.init PROGBITS (1).
            let kind = if *name == ".nv.global" { 8 } else { 1 };
            let off = if kind == 1 {
                place(&mut image, &vec![0u8; *size as usize])
            } else {
                0
            };
            headers.push((kind, off, *size, 0, 0, 0));
        }
        if !self.calls.is_empty() {
            // Pairs of symbol indices, and the driver's sentinel entries (caller 0).
            let mut graph = Vec::new();
            for (caller, callee) in self.calls {
                graph.extend_from_slice(&index(caller).to_le_bytes());
                graph.extend_from_slice(&index(callee).to_le_bytes());
            }
            graph.extend_from_slice(&0u32.to_le_bytes());
            graph.extend_from_slice(&u32::MAX.to_le_bytes());
            let off = place(&mut image, &graph);
            sec_names.push(add(&mut shstr, ".nv.callgraph"));
            headers.push((0x7000_0001, off, graph.len() as u64, 3, 0, 8));
        }
        for (function, externs) in self.listed {
            // An attribute before it (EIFMT_HVAL), then EIATTR_EXTERNS (EIFMT_SVAL).
            let mut info = vec![0x03, 0x1b, 0xff, 0x00, 0x04, 0x0f];
            info.extend_from_slice(&((externs.len() * 4) as u16).to_le_bytes());
            for e in *externs {
                info.extend_from_slice(&index(e).to_le_bytes());
            }
            let off = place(&mut image, &info);
            sec_names.push(add(&mut shstr, &format!(".nv.info.{function}")));
            let f = functions
                .iter()
                .position(|f| f == function)
                .expect("a function");
            headers.push((
                0x7000_0000,
                off,
                info.len() as u64,
                3,
                u32::from(text(f)),
                0,
            ));
        }
        let shstr_off = place(&mut image, &shstr);
        headers[1] = (3, shstr_off, shstr.len() as u64, 0, 0, 0);
        while !image.len().is_multiple_of(8) {
            image.push(0);
        }
        let shoff = image.len() as u64;
        for (i, (kind, off, size, link, info, entsize)) in headers.iter().enumerate() {
            let mut h = [0u8; 64];
            h[0..4].copy_from_slice(&sec_names[i].to_le_bytes());
            h[4..8].copy_from_slice(&kind.to_le_bytes());
            h[24..32].copy_from_slice(&off.to_le_bytes());
            h[32..40].copy_from_slice(&size.to_le_bytes());
            h[40..44].copy_from_slice(&link.to_le_bytes());
            h[44..48].copy_from_slice(&info.to_le_bytes());
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
}
