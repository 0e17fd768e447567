//! `OnLoad` with a table of a runtime kreplay does not know: refused before any tool is
//! initialized, with the shape it saw, and the table left as it was.

use kreplay_softhsa::{OwnedApiTable, TableLayout};

#[test]
fn an_unknown_table_major_is_refused_before_tools_are_initialized() {
    let mut table = OwnedApiTable::softhsa_with(TableLayout::Rocm62);
    let root = table.as_mut_ptr();
    // SAFETY: the root is owned by `table` and alive.
    unsafe { (*(*root).amd_ext_).version.major_id = 3 };
    // SAFETY: the AMD table holds 576 bytes.
    let before: Vec<u8> =
        unsafe { std::slice::from_raw_parts((*root).amd_ext_.cast::<u8>(), 576).to_vec() };
    // SAFETY: a valid table, ours to modify, alive for the call.
    let why = unsafe { kreplay::hsa_tool::on_load(root) }.expect_err("refused");
    assert!(
        why.contains("AMD extension major 3 size 576 step 3"),
        "the message names what was seen: {why}"
    );
    assert!(
        !kreplay::lifecycle::is_initialized(),
        "no tool was initialized"
    );
    assert!(!kreplay_hsa::is_installed(), "nothing was installed");
    // SAFETY: as above.
    let after = unsafe { std::slice::from_raw_parts((*root).amd_ext_.cast::<u8>(), 576) };
    assert_eq!(after, &before[..], "the table is untouched");
}
