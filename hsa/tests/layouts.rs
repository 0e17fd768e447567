//! The API table's shape, checked before kreplay reads or writes anything in it, and the
//! entries it wraps in each supported layout (ROCm 5.2, 5.5, 5.6 and 6.x/7.x).

#[macro_use]
#[allow(dead_code, unused_macros)]
mod support;

use hsa_sys::layouts::{AmdExtTableV2, sizes};
use kreplay_hsa::{AmdOrder, InstallError, check_table};
use kreplay_softhsa::{OwnedApiTable, TableLayout};
use support::tool::TestHooks;

/// Overwrites the (major, size) of the root, core and AMD extension version headers.
fn set_versions(
    table: &mut OwnedApiTable,
    root: Option<(u32, u32)>,
    core: Option<(u32, u32)>,
    amd: Option<(u32, u32)>,
) {
    let ptr = table.as_mut_ptr();
    // SAFETY: the root and its sub-tables are owned by `table` and alive.
    unsafe {
        if let Some((major, size)) = root {
            (*ptr).version.major_id = major;
            (*ptr).version.minor_id = size;
        }
        if let Some((major, size)) = core {
            (*(*ptr).core_).version.major_id = major;
            (*(*ptr).core_).version.minor_id = size;
        }
        if let Some((major, size)) = amd {
            (*(*ptr).amd_ext_).version.major_id = major;
            (*(*ptr).amd_ext_).version.minor_id = size;
        }
    }
}

/// The first `bytes` bytes of the AMD extension table, as words.
fn amd_words(table: &mut OwnedApiTable, bytes: usize) -> Vec<u64> {
    let ptr = table.as_mut_ptr();
    // SAFETY: the AMD extension table owned by `table` is at least `bytes` long (callers pass
    // at most the size of the struct behind it).
    unsafe {
        let amd = (*ptr).amd_ext_.cast::<u64>();
        (0..bytes / 8).map(|i| amd.add(i).read()).collect()
    }
}

fn refused(table: &mut OwnedApiTable) -> String {
    // SAFETY: the table is valid; check_table reads only version headers and two pointers.
    match unsafe { check_table(table.as_mut_ptr()) } {
        Err(InstallError::Table(why)) => why,
        other => panic!("the table was accepted: {other:?}"),
    }
}

#[test]
fn every_layout_softhsa_hands_out_is_accepted_with_its_order() {
    for (layout, order, release) in [
        (TableLayout::Rocm52, AmdOrder::Rocm52, "ROCm 5.2 to 5.4"),
        (TableLayout::Rocm56, AmdOrder::Rocm56, "ROCm 5.6 or 5.7"),
        (TableLayout::Rocm62, AmdOrder::Rocm56, "ROCm 6.1 or later"),
    ] {
        let mut table = OwnedApiTable::softhsa_with(layout);
        // SAFETY: softhsa's table copy is valid and as long as it declares.
        let shape = unsafe { check_table(table.as_mut_ptr()) }.expect("accepted");
        assert_eq!(
            (shape.amd_order, shape.release),
            (order, release),
            "{layout:?}"
        );
    }
    // ROCm 5.5: the 5.2 order with three entries more at the end of the AMD table.
    let mut table = OwnedApiTable::softhsa_with(TableLayout::Rocm52);
    set_versions(&mut table, None, None, Some((1, sizes::AMD_5_5)));
    // SAFETY: as above (the 5.5 size only promises entries kreplay does not read).
    let shape = unsafe { check_table(table.as_mut_ptr()) }.expect("accepted");
    assert_eq!(
        (shape.amd_order, shape.release),
        (AmdOrder::Rocm52, "ROCm 5.5")
    );
    // A newer 7.x runtime: a longer AMD table (appended entries) of the same major.
    let mut table = OwnedApiTable::softhsa_with(TableLayout::Rocm62);
    set_versions(&mut table, None, None, Some((2, sizes::AMD_6_0)));
    // SAFETY: as above; 552 bytes is within softhsa's 576-byte table.
    let shape = unsafe { check_table(table.as_mut_ptr()) }.expect("accepted");
    assert_eq!(shape.amd.size, sizes::AMD_6_0);
}

#[test]
fn an_unknown_major_is_refused_naming_what_was_seen() {
    let mut table = OwnedApiTable::softhsa_with(TableLayout::Rocm62);
    set_versions(&mut table, Some((4, 72)), None, None);
    let why = refused(&mut table);
    assert!(why.contains("unknown root table major"), "{why}");
    assert!(why.contains("root major 4 size 72 step 1"), "{why}");
    assert!(why.contains("runs without it"), "{why}");

    let mut table = OwnedApiTable::softhsa_with(TableLayout::Rocm62);
    set_versions(&mut table, None, None, Some((3, sizes::AMD_6_2)));
    let why = refused(&mut table);
    assert!(
        why.contains("root major 3 size 64 step 1, core major 2 size 1016 step 0, AMD extension major 3 size 576 step 3"),
        "{why}"
    );
}

/// A table layout, the (major, size) written over its root, core and AMD extension headers, and
/// what the refusal must say.
type Case = (
    TableLayout,
    Option<(u32, u32)>,
    Option<(u32, u32)>,
    Option<(u32, u32)>,
    &'static str,
);

#[test]
fn inconsistent_sizes_and_mixed_majors_are_refused() {
    let cases: [Case; 6] = [
        // A major-1 AMD table of a size no 5.x release had: neither order can be assumed.
        (
            TableLayout::Rocm56,
            None,
            None,
            Some((1, 432)),
            "AMD extension table of major 1",
        ),
        // A major-2 AMD table shorter than ROCm 6.0's.
        (
            TableLayout::Rocm62,
            None,
            None,
            Some((2, 456)),
            "at least 552",
        ),
        // A major-1 core table of the wrong size.
        (
            TableLayout::Rocm52,
            None,
            Some((1, 1008)),
            None,
            "core table's size",
        ),
        // A major-3 root without room for tools_.
        (
            TableLayout::Rocm62,
            Some((3, 48)),
            None,
            None,
            "root table's size",
        ),
        // A ROCm 6 root with ROCm 5 sub-tables.
        (
            TableLayout::Rocm52,
            Some((3, 64)),
            None,
            None,
            "goes with core and AMD",
        ),
        // A size that is not a whole number of entries.
        (
            TableLayout::Rocm62,
            None,
            None,
            Some((2, 580)),
            "at least 552",
        ),
    ];
    for (layout, root, core, amd, expected) in cases {
        let mut table = OwnedApiTable::softhsa_with(layout);
        set_versions(&mut table, root, core, amd);
        let why = refused(&mut table);
        assert!(
            why.contains(expected),
            "{layout:?} {root:?} {core:?} {amd:?}: {why}"
        );
    }
}

#[test]
fn a_null_table_or_sub_table_is_refused() {
    // SAFETY: null is allowed.
    assert!(unsafe { check_table(std::ptr::null()) }.is_err());
    let mut table = OwnedApiTable::softhsa_with(TableLayout::Rocm62);
    // SAFETY: the root is owned by `table`.
    unsafe { (*table.as_mut_ptr()).amd_ext_ = std::ptr::null_mut() };
    assert!(refused(&mut table).contains("no core or no AMD extension table"));
}

#[test]
fn a_refused_install_leaves_every_byte_of_the_table_unchanged() {
    let mut table = OwnedApiTable::softhsa_with(TableLayout::Rocm56);
    set_versions(&mut table, None, None, Some((1, 440)));
    let before = amd_words(&mut table, sizes::AMD_6_2 as usize);
    // SAFETY: the table is valid, ours, and outlives the call.
    let result =
        unsafe { kreplay_hsa::install(table.as_mut_ptr(), TestHooks::new(0), Default::default()) };
    assert!(matches!(result, Err(InstallError::Table(_))), "{result:?}");
    assert_eq!(amd_words(&mut table, sizes::AMD_6_2 as usize), before);
    assert!(!kreplay_hsa::is_installed());
}

/// Installs into a table of `layout` and returns the byte offsets of the AMD extension entries
/// that changed (the wrappers), after checking that nothing past the declared size changed.
fn wrapped_amd_offsets(layout: TableLayout) -> Vec<usize> {
    let table: &'static mut OwnedApiTable =
        Box::leak(Box::new(OwnedApiTable::softhsa_with(layout)));
    let struct_bytes = match layout {
        TableLayout::Rocm52 => sizes::AMD_5_2,
        _ => sizes::AMD_6_2,
    } as usize;
    let declared = amd_words(table, 16)[0] >> 32;
    if layout == TableLayout::Rocm56 {
        // Entries a 5.6 runtime does not have hold garbage a tool must never read or call.
        let ptr = table.as_mut_ptr();
        for offset in (sizes::AMD_5_6 as usize..struct_bytes).step_by(8) {
            // SAFETY: inside softhsa's 576-byte table owned by `table`.
            unsafe {
                (*ptr)
                    .amd_ext_
                    .cast::<u8>()
                    .add(offset)
                    .cast::<u64>()
                    .write(0xbad0_0000 + offset as u64)
            };
        }
    }
    let before = amd_words(table, struct_bytes);
    // SAFETY: softhsa's init through the copy, then the table is valid, ours, and outlives
    // every call made through it (leaked).
    unsafe {
        assert_eq!((*table.table().core_).hsa_init_fn.expect("hsa_init")(), 0);
        kreplay_hsa::install(table.as_mut_ptr(), TestHooks::new(0), Default::default())
            .expect("kreplay installs");
    }
    let after = amd_words(table, struct_bytes);
    let changed: Vec<usize> = (0..before.len())
        .filter(|&i| before[i] != after[i])
        .map(|i| i * 8)
        .collect();
    assert!(
        changed.iter().all(|&o| o + 8 <= declared as usize),
        "{layout:?}: wrote past the declared size {declared}: {changed:?}"
    );
    changed
}

scenarios! {
    /// In the ROCm 5.2 layout: the bound offsets.
    fn the_rocm_5_2_layout_gets_its_wrappers_at_the_bound_offsets() {
        assert_eq!(
            wrapped_amd_offsets(TableLayout::Rocm52),
            // profiler enable, async copy time, pool allocate/free, async copy, agents allow
            // access, lock, unlock, fill, interop map/unmap, image create, signal create, IPC
            // attach/detach, intercept queue create and register, rect copy, lock to pool, SVM
            // attributes set
            vec![
                32, 56, 120, 128, 136, 152, 176, 184, 192, 200, 208, 216, 248, 256, 264, 296, 304,
                320, 336, 368,
            ]
        );
    }

    /// In the ROCm 5.6 layout: every entry after the async copy sits 16 bytes later, the
    /// on-engine copy is wrapped, and nothing past the table's 456 bytes is read or written.
    fn the_rocm_5_6_layout_gets_its_wrappers_at_the_shifted_offsets() {
        assert_eq!(
            wrapped_amd_offsets(TableLayout::Rocm56),
            vec![
                32, 56, 120, 128, 136, 144, 168, 192, 200, 208, 216, 224, 232, 264, 272, 280, 312,
                320, 336, 352, 384
            ]
        );
    }

    /// In the ROCm 6.x/7.x layout: the same, plus the virtual memory entries kreplay tracks.
    fn the_rocm_6_layout_also_gets_the_virtual_memory_wrappers() {
        assert_eq!(
            wrapped_amd_offsets(TableLayout::Rocm62),
            vec![
                32, 56, 120, 128, 136, 144, 168, 192, 200, 208, 216, 224, 232, 264, 272, 280, 312,
                320, 336, 352, 384,
                // address reserve and free, handle create/release, map, unmap, set access,
                // import, retain, address reserve with alignment
                456, 464, 472, 480, 488, 496, 504, 528, 536, 568,
            ]
        );
    }
}

scenarios! {
    /// A ROCm 7.x AMD extension table is longer than any layout kreplay knows (entries appended
    /// after the last it knows, `hsa_amd_agent_preload`): kreplay wraps what it knows (of the
    /// entries past ROCm 6.2's 576 bytes, `hsa_amd_ais_file_read` and
    /// `hsa_amd_memory_async_batch_copy`), never
    /// touches the others nor anything past 656 bytes, and allocations through the table are
    /// tracked.
    fn a_longer_rocm_7_table_is_used_up_to_the_entries_kreplay_knows() {
        const BYTES: usize = 704;
        let table: &'static mut OwnedApiTable =
            Box::leak(Box::new(OwnedApiTable::softhsa_with(TableLayout::Rocm62)));
        let longer: &'static mut [u64; BYTES / 8] = Box::leak(Box::new([0u64; BYTES / 8]));
        let root = table.as_mut_ptr();
        // SAFETY: softhsa's 576-byte table is copied into the front of the 704-byte one; the
        // appended entries hold garbage that must never be read or called.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (*root).amd_ext_.cast::<u64>(),
                longer.as_mut_ptr(),
                sizes::AMD_6_2 as usize / 8,
            );
        }
        for (i, word) in longer.iter_mut().enumerate().skip(sizes::AMD_6_2 as usize / 8) {
            *word = 0xbad0_0000 + i as u64;
        }
        longer[0] = (BYTES as u64) << 32 | 2; // major 2, minor_id 704
        // SAFETY: the root is owned by `table`; the longer table lives for the process.
        unsafe { (*root).amd_ext_ = longer.as_mut_ptr().cast() };
        let tail_before = longer[sizes::AMD_6_2 as usize / 8..].to_vec();

        // SAFETY: softhsa's init through the copy, then a valid table, ours, alive for the
        // process.
        unsafe {
            assert_eq!((*table.table().core_).hsa_init_fn.expect("hsa_init")(), 0);
            let shape = kreplay_hsa::check_table(root).expect("accepted");
            assert_eq!((shape.amd.size, shape.amd_order), (BYTES as u32, AmdOrder::Rocm56));
            kreplay_hsa::install(root, TestHooks::new(0), Default::default())
                .expect("kreplay installs");
        }
        let wrapped = [
            std::mem::offset_of!(AmdExtTableV2, hsa_amd_ais_file_read_fn) / 8,
            std::mem::offset_of!(AmdExtTableV2, hsa_amd_memory_async_batch_copy_fn) / 8,
        ];
        let first = sizes::AMD_6_2 as usize / 8;
        for (i, (now, before)) in longer[first..].iter().zip(&tail_before).enumerate() {
            if wrapped.contains(&(first + i)) {
                assert_ne!(now, before, "entry at byte {} wrapped", (first + i) * 8);
            } else {
                assert_eq!(now, before, "entry at byte {} untouched", (first + i) * 8);
            }
        }

        let app = support::app::App::from_installed(table.table());
        let gpu = app.gpus[0];
        let buffer = app.alloc(app.pools(gpu).coarse, 4096);
        assert_eq!(
            kreplay_hsa::tracked_kind(buffer.0),
            Some(kreplay_snapshot::MemoryKind::CoarseDevice)
        );
    }
}

/// Installs into a table of the layout the scenario runs on, after `prepare` changed its image
/// extension table (a leaked copy the root points at, of `bytes` bytes declared), and returns
/// the byte offsets of the image entries that changed.
fn wrapped_image_offsets(prepare: fn(&mut hsa_sys::ImageExtTable)) -> Vec<usize> {
    let layout = TableLayout::from_env().expect("a known table layout");
    let table: &'static mut OwnedApiTable =
        Box::leak(Box::new(OwnedApiTable::softhsa_with(layout)));
    let root = table.as_mut_ptr();
    // SAFETY: the root and its image table are owned by `table` and alive.
    let image: &'static mut hsa_sys::ImageExtTable =
        Box::leak(Box::new(unsafe { *(*root).image_ext_ }));
    prepare(image);
    let words = |t: &hsa_sys::ImageExtTable| -> Vec<u64> {
        let first = std::ptr::from_ref(t).cast::<u64>();
        // SAFETY: the table is a whole number of 8-byte words, all initialized.
        (0..std::mem::size_of::<hsa_sys::ImageExtTable>() / 8)
            .map(|i| unsafe { first.add(i).read() })
            .collect()
    };
    let before = words(image);
    // SAFETY: the root is owned by `table`; the image table copy lives for the process; then
    // softhsa's init through the copy and a valid table, ours, alive for the process.
    unsafe {
        (*root).image_ext_ = &raw mut *image;
        assert_eq!((*table.table().core_).hsa_init_fn.expect("hsa_init")(), 0);
        kreplay_hsa::install(root, TestHooks::new(0), Default::default())
            .expect("kreplay installs");
    }
    let after = words(image);
    (0..before.len())
        .filter(|&i| before[i] != after[i])
        .map(|i| i * 8)
        .collect()
}

scenarios! {
    /// The image extension table has one layout in every release: its writes (import, export,
    /// copy, clear) and the entries that make and end images (create, destroy, create with
    /// layout) are wrapped.
    fn the_image_table_gets_its_wrappers_in_every_layout() {
        assert_eq!(
            wrapped_image_offsets(|_| {}),
            vec![32, 40, 48, 56, 64, 72, 112]
        );
    }

    /// A runtime whose image extension is not loaded (major 0, as ROCm leaves the table when
    /// images are disabled) keeps its image table untouched.
    fn an_image_table_of_major_0_is_left_alone() {
        assert_eq!(
            wrapped_image_offsets(|t| t.version.major_id = 0),
            Vec::<usize>::new()
        );
    }

    /// An image table declaring fewer bytes (no `_with_layout` entries) is wrapped only inside
    /// them.
    fn a_shorter_image_table_is_wrapped_only_inside_its_declared_size() {
        assert_eq!(
            wrapped_image_offsets(|t| t.version.minor_id = 96),
            vec![32, 40, 48, 56, 64, 72]
        );
    }
}
