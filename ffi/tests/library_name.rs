//! libkreplay.so carries the SONAME `libkreplay.so.<ABI major>`, the name tools linked with
//! `-lkreplay` record and the dynamic loader matches against an already loaded libkreplay.

mod common;

use std::process::Command;

#[test]
fn libkreplay_soname_carries_the_abi_major_version() {
    let output = Command::new("readelf")
        .arg("-d")
        .arg(common::libkreplay())
        .output()
        .expect("readelf (binutils, installed with the C compiler) runs");
    assert!(output.status.success(), "readelf -d failed");
    let dynamic = String::from_utf8_lossy(&output.stdout);
    let expected = format!(
        "Library soname: [libkreplay.so.{}]",
        kreplay::abi::VERSION_MAJOR
    );
    assert!(
        dynamic.contains(&expected),
        "libkreplay.so must carry `{expected}`:\n{dynamic}"
    );
}
