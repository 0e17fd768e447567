use super::write::{KernelMeta, amdgpu_elf, metadata, note};
use super::*;

fn sample() -> Vec<u8> {
    amdgpu_elf(
        &[
            KernelMeta::new(
                "plain",
                24,
                &["hidden_block_count_x", "hidden_multigrid_sync_arg"],
            ),
            KernelMeta::new("say", 8, &[HIDDEN_PRINTF_BUFFER]),
            KernelMeta::new("call", 0, &[HIDDEN_HOSTCALL_BUFFER, HIDDEN_HEAP_V1]),
        ],
        &[(".payload", b"hello")],
    )
}

fn expected() -> Vec<Kernel> {
    vec![
        Kernel {
            name: "plain".into(),
            symbol: "plain.kd".into(),
            ..Kernel::default()
        },
        Kernel {
            name: "say".into(),
            symbol: "say.kd".into(),
            printf: true,
            ..Kernel::default()
        },
        Kernel {
            name: "call".into(),
            symbol: "call.kd".into(),
            hostcall: true,
            heap: true,
            ..Kernel::default()
        },
    ]
}

/// Where the note segment lies in `sample()` (from its program header).
fn note_range(bytes: &[u8]) -> std::ops::Range<usize> {
    let off = u64::from_le_bytes(bytes[64 + 8..64 + 16].try_into().unwrap()) as usize;
    let size = u64::from_le_bytes(bytes[64 + 32..64 + 40].try_into().unwrap()) as usize;
    off..off + size
}

#[test]
fn kernels_and_their_hidden_arguments_are_read() {
    let bytes = sample();
    assert_eq!(kernels(&bytes), Ok(Some(expected())));
    let elf = Elf::parse(&bytes).unwrap();
    assert_eq!(elf.machine, EM_AMDGPU);
    assert_eq!(elf.section(".payload"), Ok(Some(&b"hello"[..])));
    assert_eq!(elf.section(".absent"), Ok(None));
}

#[test]
fn the_decline_message_names_kernel_and_argument() {
    let k = &expected()[1];
    let why = k.why_not_replayable().unwrap();
    assert!(
        why.contains("kernel say may print (hidden_printf_buffer)"),
        "{why}"
    );
    assert!(why.contains("every pass would print again"), "{why}");
    assert_eq!(expected()[0].why_not_replayable(), None);
    let both = expected()[2].why_not_replayable().unwrap();
    assert!(
        both.contains(HIDDEN_HOSTCALL_BUFFER) && both.contains(HIDDEN_HEAP_V1),
        "{both}"
    );
}

#[test]
fn notes_are_found_in_sections_when_no_segment_holds_them() {
    let mut bytes = sample();
    bytes[56..58].copy_from_slice(&0u16.to_le_bytes()); // e_phnum = 0
    assert_eq!(kernels(&bytes), Ok(Some(expected())));
}

#[test]
fn other_formats_and_missing_metadata_teach_nothing() {
    assert_eq!(kernels(b"SHSACO01\x00\x00\x00\x00"), Ok(None));
    assert_eq!(kernels(b""), Ok(None));
    let mut x86 = sample();
    x86[18..20].copy_from_slice(&62u16.to_le_bytes()); // EM_X86_64
    assert_eq!(kernels(&x86), Ok(None));
    // The note is of another type (a code object V2 note, say).
    let mut other = sample();
    let at = note_range(&other).start;
    other[at + 8..at + 12].copy_from_slice(&10u32.to_le_bytes());
    assert_eq!(kernels(&other), Ok(None));
    // Metadata without amdhsa.kernels: no kernels.
    let mut e = crate::msgpack::Encoder::default();
    e.map(0);
    assert_eq!(from_metadata(&e.out), Ok(Vec::new()));
}

#[test]
fn truncated_code_objects_are_errors_never_panics() {
    let bytes = sample();
    let notes = note_range(&bytes);
    for cut in 0..bytes.len() {
        let got = kernels(&bytes[..cut]);
        if cut < 4 {
            assert_eq!(got, Ok(None), "cut at {cut}: no ELF magic yet");
        } else if cut < notes.end {
            assert!(got.is_err(), "cut at {cut}: {got:?}");
        } else {
            // Past the note: what is left after it (other sections, the section headers) is
            // not needed.
            assert!(
                got.is_err() || got == Ok(Some(expected())),
                "cut at {cut}: {got:?}"
            );
        }
        let _ = Elf::parse(&bytes[..cut]).map(|e| (e.notes(), e.section(".payload")));
    }
}

#[test]
fn corrupted_bytes_are_errors_never_panics() {
    let bytes = sample();
    for at in 0..bytes.len() {
        for value in [0x00u8, 0x01, 0x7f, 0x80, 0xff] {
            let mut b = bytes.clone();
            b[at] = value;
            let _ = kernels(&b);
            if let Ok(elf) = Elf::parse(&b) {
                let _ = elf.notes();
                let _ = elf.section(".payload");
                let _ = elf.section(".note");
            }
        }
    }
}

#[test]
fn hostile_headers_are_errors() {
    let bytes = sample();
    // e_phoff far past the end, e_shoff overflowing, a note size overflowing.
    let mut b = bytes.clone();
    b[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(kernels(&b).is_err());
    let mut b = bytes.clone();
    b[56..58].copy_from_slice(&0u16.to_le_bytes());
    b[40..48].copy_from_slice(&(u64::MAX - 8).to_le_bytes());
    assert!(kernels(&b).is_err());
    let mut b = bytes.clone();
    let at = note_range(&b).start;
    b[at + 4..at + 8].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(kernels(&b).is_err());
    let mut b = bytes.clone();
    b[64 + 32..64 + 40].copy_from_slice(&u64::MAX.to_le_bytes()); // p_filesz
    assert!(kernels(&b).is_err());
    // A 32-bit or big-endian ELF is not read.
    let mut b = bytes.clone();
    b[4] = 1;
    assert!(kernels(&b).is_err());
    let mut b = bytes;
    b[5] = 2;
    assert!(kernels(&b).is_err());
}

#[test]
fn malformed_metadata_is_an_error() {
    let mut e = crate::msgpack::Encoder::default();
    e.array(0);
    assert!(from_metadata(&e.out).is_err(), "not a map");
    let mut e = crate::msgpack::Encoder::default();
    e.map(1);
    e.str("amdhsa.kernels");
    e.uint(3);
    assert!(from_metadata(&e.out).is_err(), "kernels not an array");
    let mut e = crate::msgpack::Encoder::default();
    e.map(1);
    e.str("amdhsa.kernels");
    e.array(1);
    e.map(1);
    e.str(".symbol");
    e.str("x.kd");
    assert!(from_metadata(&e.out).is_err(), "a kernel without a name");
    let mut e = crate::msgpack::Encoder::default();
    e.map(1);
    e.str("amdhsa.kernels");
    e.array(1);
    e.map(2);
    e.str(".name");
    e.str("x");
    e.str(".args");
    e.array(1);
    e.map(0);
    assert!(
        from_metadata(&e.out).is_err(),
        "an argument without a value kind"
    );
    // The whole metadata, every truncation.
    let full = metadata(&[KernelMeta::new("say", 8, &[HIDDEN_PRINTF_BUFFER])]);
    for cut in 0..full.len() {
        assert!(from_metadata(&full[..cut]).is_err(), "cut at {cut}");
    }
    // A kernel without .symbol gets name.kd.
    let mut e = crate::msgpack::Encoder::default();
    e.map(1);
    e.str("amdhsa.kernels");
    e.array(1);
    e.map(1);
    e.str(".name");
    e.str("x");
    assert_eq!(from_metadata(&e.out).unwrap()[0].symbol, "x.kd");
}

#[test]
fn many_headers_naming_the_same_notes_are_an_error() {
    // 8000 program headers, each a PT_NOTE segment over the same metadata note: the reading
    // stops at its limit instead of growing with the headers.
    let base = sample();
    let note = base[64..120].to_vec();
    let mut b = base.clone();
    let phoff = b.len() as u64;
    for _ in 0..8000 {
        b.extend_from_slice(&note);
    }
    b[32..40].copy_from_slice(&phoff.to_le_bytes());
    b[56..58].copy_from_slice(&8000u16.to_le_bytes());
    assert!(matches!(kernels(&b), Err(Error::Elf(why)) if why.contains("notes")));
    // A handful of them is still read.
    b[56..58].copy_from_slice(&3u16.to_le_bytes());
    assert_eq!(kernels(&b), Ok(Some(expected())));
}

/// A code object whose note segment holds other notes only (a build ID, say) and whose
/// metadata note lies in a `SHT_NOTE` section no segment covers was read as carrying no
/// metadata (`Ok(None)`): its printing kernels were replayed, printing once per pass. The
/// runtime's metadata readers look in the sections when the segments do not have it; so does
/// this one now.
#[test]
fn metadata_in_a_section_is_found_when_the_segments_hold_only_other_notes() {
    let mut b = sample();
    // A GNU build-ID note at the end of the file, the only one the note segment covers.
    let at = b.len();
    b.extend_from_slice(&4u32.to_le_bytes()); // namesz: "GNU\0"
    b.extend_from_slice(&8u32.to_le_bytes()); // descsz
    b.extend_from_slice(&3u32.to_le_bytes()); // NT_GNU_BUILD_ID
    b.extend_from_slice(b"GNU\0");
    b.extend_from_slice(&[0x5a; 8]);
    let len = b.len() - at;
    let p = 64;
    b[p + 8..p + 16].copy_from_slice(&(at as u64).to_le_bytes()); // p_offset
    b[p + 32..p + 40].copy_from_slice(&(len as u64).to_le_bytes()); // p_filesz
    let elf = Elf::parse(&b).unwrap();
    assert!(
        elf.notes().unwrap().iter().all(|n| n.name == b"GNU"),
        "the segment holds the build ID only"
    );
    assert_eq!(kernels(&b), Ok(Some(expected())));
}

/// A code object linked from several objects has one metadata note per object (the linker
/// puts their `.note` sections end to end), each listing its own kernels. Only the first was
/// read: a printing kernel listed in another note was replayed, printing once per pass. The
/// runtime's metadata reader merges the kernels of every note; so does this one now.
#[test]
fn kernels_of_every_metadata_note_are_read() {
    let mut b = sample();
    let first = b[note_range(&b)].to_vec();
    let second = note(
        NOTE_OWNER,
        NT_AMDGPU_METADATA,
        &metadata(&[KernelMeta::new("later", 8, &[HIDDEN_PRINTF_BUFFER])]),
    );
    let at = b.len();
    b.extend_from_slice(&first);
    b.extend_from_slice(&second);
    let len = b.len() - at;
    b[64 + 8..64 + 16].copy_from_slice(&(at as u64).to_le_bytes()); // p_offset
    b[64 + 32..64 + 40].copy_from_slice(&(len as u64).to_le_bytes()); // p_filesz
    let mut want = expected();
    want.push(Kernel {
        name: "later".into(),
        symbol: "later.kd".into(),
        printf: true,
        ..Kernel::default()
    });
    assert_eq!(kernels(&b), Ok(Some(want)));
}
