//! libkreplay.so carries the SONAME `libkreplay.so.<ABI major>`, the name tools linked with
//! `-lkreplay` record and the dynamic loader matches against an already loaded libkreplay.

use std::path::PathBuf;
use std::process::Command;

fn libkreplay() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("deps folder");
    [
        deps.join("libkreplay.so"),
        deps.parent().expect("target folder").join("libkreplay.so"),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .expect("cargo builds libkreplay.so (the cdylib) beside this test binary")
}

#[test]
fn libkreplay_soname_carries_the_abi_major_version() {
    let output = Command::new("readelf")
        .arg("-d")
        .arg(libkreplay())
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
