//! Gives the C library (`libkreplay.so`, the cdylib) its SONAME.
//!
//! The SONAME is `libkreplay.so.<major>`, the ABI's major version (`KREPLAY_VERSION_MAJOR` of
//! kreplay.h, which the package's major version follows): a tool linked with `-lkreplay`
//! records `libkreplay.so.<major>` as its dependency, and the dynamic loader matches it against
//! an already loaded libkreplay (the one `HSA_TOOLS_LIB` loaded) by that name, so tool and
//! runtime share one kreplay. See docs/c-tools.md for the install layout
//! (`libkreplay.so.X.Y.Z`, with `libkreplay.so.X` and `libkreplay.so` linking to it).
//!
//! The library is also marked never to be unloaded (`-z nodelete`): ROCm's `hsa_shut_down`
//! closes every tools library after its `OnUnload` (`dlclose`), but kreplay's code must outlive
//! that: hooks it registered run at the end of each thread that called into it (the Rust
//! runtime's, of `std::thread::current`), its completion threads may still be winding down,
//! and state such as "tools are initialized once per process" must hold for a runtime loaded
//! again. Unmapped, the first of those killed the application's thread with SIGSEGV as it ended.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").expect("set by cargo");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libkreplay.so.{major}");
        println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    }
}
