//! The cubin reader (`kreplay_cuda::globals::parse_cubin`) on malformed images, and on images
//! whose kernels reach device-side printf or malloc only through a kernel they launch: what
//! CUPTI hands over is refused with an error (its kernels then decline), never a panic, a loop
//! or a read out of bounds, and a kernel that launches kernels from the device is declined
//! wherever the image's kernels may print or allocate.

use std::panic::{AssertUnwindSafe, catch_unwind};

use kreplay_cuda::devruntime::{DeviceRuntime, HeapPolicy};
use kreplay_cuda::globals::{ModuleRegistry, parse_cubin};

#[allow(dead_code)]
#[path = "fake_device/cubin.rs"]
mod cubin_image;
use cubin_image::Cubin;

/// A raw ELF header section: (name offset, type, offset, size, link, info, entsize).
type Sh = (u32, u32, u64, u64, u32, u32, u64);

/// An image of 64-byte header, `body` placed at 64, then the section headers.
fn elf(body: &[u8], headers: &[Sh], shstrndx: u16) -> Vec<u8> {
    let mut image = vec![0u8; 64];
    image.extend_from_slice(body);
    while !image.len().is_multiple_of(8) {
        image.push(0);
    }
    let shoff = image.len() as u64;
    for &(name, kind, off, size, link, info, entsize) in headers {
        let mut h = [0u8; 64];
        h[0..4].copy_from_slice(&name.to_le_bytes());
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
    image[0x28..0x30].copy_from_slice(&shoff.to_le_bytes());
    image[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
    image[0x3c..0x3e].copy_from_slice(&(headers.len() as u16).to_le_bytes());
    image[0x3e..0x40].copy_from_slice(&shstrndx.to_le_bytes());
    image
}

static WHERE: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

fn no_panic(what: &str, image: &[u8]) -> Result<(), String> {
    match catch_unwind(AssertUnwindSafe(|| parse_cubin(image))) {
        Ok(_) => Ok(()),
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            let at = WHERE.lock().map(|w| w.clone()).unwrap_or_default();
            Err(format!("{what}: parse_cubin panicked at {at}: {msg}"))
        }
    }
}

/// The section name table's offset near `u64::MAX`: `name_at` adds the table's offset and
/// length unchecked.
#[test]
fn a_section_name_table_at_an_offset_near_the_end_of_the_address_space_is_an_error() {
    let shstr = b"\0.shstrtab\0";
    let image = elf(
        shstr,
        &[
            (0, 0, 0, 0, 0, 0, 0),
            (1, 3, u64::MAX - 4, shstr.len() as u64, 0, 0, 0),
        ],
        1,
    );
    no_panic("shstrtab at u64::MAX - 4", &image).unwrap();
    assert!(parse_cubin(&image).is_err());
}

/// A symbol table at an offset near `u64::MAX`: `at + 4` for `st_info` is unchecked.
#[test]
fn a_symbol_table_at_an_offset_near_the_end_of_the_address_space_is_an_error() {
    let shstr = b"\0.shstrtab\0.strtab\0.symtab\0";
    let image = elf(
        shstr,
        &[
            (0, 0, 0, 0, 0, 0, 0),
            (1, 3, 64, shstr.len() as u64, 0, 0, 0),
            (11, 3, 64, shstr.len() as u64, 0, 0, 0),
            (19, 2, u64::MAX - 2, 24, 2, 0, 24),
        ],
        1,
    );
    no_panic("symtab at u64::MAX - 2", &image).unwrap();
    assert!(parse_cubin(&image).is_err());
}

/// A `.nv.info.<function>` section at an offset near `u64::MAX` (its `sh_info` naming the text
/// section of a defined function): `at + 4 <= end` is unchecked.
#[test]
fn a_function_attribute_section_at_an_offset_near_the_end_is_an_error_not_a_panic() {
    // Names.
    let mut shstr = b"\0.shstrtab\0.strtab\0.symtab\0.text.k\0.nv.info.k\0".to_vec();
    let n_text = 27u32;
    let n_info = 35u32;
    let strtab = b"\0k\0".to_vec();
    // Symbols: null, `k` FUNC GLOBAL in section 4.
    let mut symtab = vec![0u8; 24];
    let mut k = [0u8; 24];
    k[0..4].copy_from_slice(&1u32.to_le_bytes());
    k[4] = 0x12;
    k[6..8].copy_from_slice(&4u16.to_le_bytes());
    symtab.extend_from_slice(&k);
    let mut body = Vec::new();
    let shstr_off = 64 + body.len() as u64;
    body.append(&mut shstr.clone());
    let strtab_off = 64 + body.len() as u64;
    body.extend_from_slice(&strtab);
    while !(64 + body.len()).is_multiple_of(8) {
        body.push(0);
    }
    let symtab_off = 64 + body.len() as u64;
    body.extend_from_slice(&symtab);
    let text_off = 64 + body.len() as u64;
    body.extend_from_slice(&[0u8; 16]);
    let len = shstr.len() as u64;
    shstr.clear();
    let image = elf(
        &body,
        &[
            (0, 0, 0, 0, 0, 0, 0),
            (1, 3, shstr_off, len, 0, 0, 0),
            (11, 3, strtab_off, strtab.len() as u64, 0, 0, 0),
            (19, 2, symtab_off, symtab.len() as u64, 2, 0, 24),
            (n_text, 1, text_off, 16, 3, 0, 0),
            (n_info, 0x7000_0000, u64::MAX - 1, 0, 3, 4, 0),
        ],
        1,
    );
    no_panic(".nv.info.k at u64::MAX - 1", &image).unwrap();
}

/// A call graph with a cycle (recursion: a -> b -> a, b -> vprintf) terminates and both
/// functions reach vprintf.
#[test]
fn a_cyclic_call_graph_terminates_and_every_function_on_the_cycle_reaches_the_call() {
    let image = Cubin {
        functions: &["a", "b", "c"],
        externs: &["vprintf"],
        calls: &[("a", "b"), ("b", "a"), ("b", "vprintf"), ("c", "c")],
        ..Cubin::default()
    }
    .image();
    let s = parse_cubin(&image).unwrap();
    assert_eq!(s.runtime_calls.get("a"), Some(&vec!["vprintf".to_string()]));
    assert_eq!(s.runtime_calls.get("b"), Some(&vec!["vprintf".to_string()]));
    assert_eq!(s.runtime_calls.get("c"), None);
}

/// xorshift64*: a deterministic generator for the mutation loop.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// Mutations of well-formed images (bytes flipped, header fields set to extreme values,
/// truncations): parse_cubin answers every one, Ok or Err, without panicking.
#[test]
fn mutated_cubins_never_panic() {
    let bases = [
        Cubin {
            functions: &["say", "outer", "helper", "grab"],
            externs: &["vprintf", "malloc"],
            calls: &[
                ("say", "vprintf"),
                ("outer", "helper"),
                ("helper", "vprintf"),
                ("grab", "malloc"),
            ],
            listed: &[("grab", &["malloc"])],
            writable: &[(".nv.global", 16, &[("counter", 0, 4)])],
        }
        .image(),
        Cubin {
            functions: &["k"],
            writable: &[(".nv.global.init", 8, &[("seed", 0, 8)])],
            listed: &[("k", &[])],
            ..Cubin::default()
        }
        .image(),
    ];
    let extremes = [
        0u64,
        1,
        7,
        u64::MAX,
        u64::MAX - 1,
        u64::MAX - 7,
        u64::MAX / 2,
        1 << 32,
        u32::MAX as u64,
        0xffff,
    ];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut panics: Vec<String> = Vec::new();
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(|info| {
        if let (Some(l), Ok(mut w)) = (info.location(), WHERE.lock()) {
            *w = format!("{}:{}", l.file(), l.line());
        }
    }));
    for iteration in 0..40_000u32 {
        let mut image = bases[(iteration % 2) as usize].clone();
        let shoff = u64::from_le_bytes(image[0x28..0x30].try_into().unwrap()) as usize;
        let shnum = u16::from_le_bytes(image[0x3c..0x3e].try_into().unwrap()) as usize;
        let mutations = 1 + rng.next() % 3;
        for _ in 0..mutations {
            match rng.next() % 4 {
                // A random byte anywhere.
                0 => {
                    let at = (rng.next() as usize) % image.len();
                    image[at] = rng.next() as u8;
                }
                // An 8-byte field of a section header (offset, size, addr, entsize) set to an
                // extreme value.
                1 => {
                    let sh = (rng.next() as usize) % shnum;
                    let field = [16usize, 24, 32, 56][(rng.next() % 4) as usize];
                    let v = extremes[(rng.next() as usize) % extremes.len()];
                    let at = shoff + 64 * sh + field;
                    image[at..at + 8].copy_from_slice(&v.to_le_bytes());
                }
                // A 4-byte field (name, type, link, info) set to an extreme value.
                2 => {
                    let sh = (rng.next() as usize) % shnum;
                    let field = [0usize, 4, 40, 44][(rng.next() % 4) as usize];
                    let v = extremes[(rng.next() as usize) % extremes.len()] as u32;
                    let at = shoff + 64 * sh + field;
                    image[at..at + 4].copy_from_slice(&v.to_le_bytes());
                }
                // Truncation.
                _ => {
                    let keep = 64 + (rng.next() as usize) % (image.len() - 63);
                    image.truncate(keep);
                    break;
                }
            }
        }
        if let Err(e) = no_panic(&format!("iteration {iteration}"), &image) {
            panics.push(e);
        }
    }
    std::panic::set_hook(prev);
    // Distinct panic sites, with the first iteration that hit each.
    let mut sites: std::collections::BTreeMap<String, (usize, String)> = Default::default();
    for p in &panics {
        let site = p.split(" panicked at ").nth(1).unwrap_or("").to_string();
        sites.entry(site).or_insert((0, p.clone())).0 += 1;
    }
    let report: Vec<String> = sites
        .iter()
        .map(|(site, (n, first))| format!("{n:6} x {site}   (first: {first})"))
        .collect();
    assert!(
        panics.is_empty(),
        "{} of 40000 mutated images panicked:\n{}",
        panics.len(),
        report.join("\n")
    );
}

/// Dynamic parallelism (`nvcc -rdc=true`): `parent` launches `child` from the device
/// (`cudaGetParameterBufferV2` + `cudaLaunchDeviceV2`), and `child` prints and allocates. The
/// call graph has no edge from parent to child (a device launch is not a call); unless parent
/// counts as reaching what the image's kernels reach, it is replayed, makes child print and
/// allocate once per pass, and never marks the context's heap as used.
#[test]
fn a_kernel_that_launches_a_printing_allocating_child_is_declined() {
    let image = Cubin {
        functions: &["parent", "child"],
        externs: &[
            "cudaGetParameterBufferV2",
            "cudaLaunchDeviceV2",
            "vprintf",
            "malloc",
        ],
        calls: &[
            ("parent", "cudaGetParameterBufferV2"),
            ("parent", "cudaLaunchDeviceV2"),
            ("child", "vprintf"),
            ("child", "malloc"),
        ],
        ..Cubin::default()
    }
    .image();
    let parsed = parse_cubin(&image).unwrap();
    assert_eq!(
        parsed.runtime_calls.get("child"),
        Some(&vec!["malloc".to_string(), "vprintf".to_string()])
    );
    let modules = ModuleRegistry::new();
    modules.on_loaded(1, &image).unwrap();
    let calls = modules.runtime_calls("parent");
    let runtime = DeviceRuntime::new();
    let verdict = runtime.check("parent", &calls, HeapPolicy::Decline);
    assert!(
        verdict.is_err(),
        "parent (which launches a child that calls vprintf and malloc) would be replayed: \
         runtime_calls(parent) = {calls:?}"
    );
    assert!(
        runtime.heap_user().is_some(),
        "after parent ran, the context's heap is not marked as used"
    );
}
