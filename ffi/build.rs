//! Gives the C library (`libkreplay.so`, the cdylib) its SONAME.
//!
//! The SONAME is `libkreplay.so.<major>`, the ABI's major version (`KREPLAY_VERSION_MAJOR` of
//! kreplay.h, which the package's major version follows): a tool linked with `-lkreplay`
//! records `libkreplay.so.<major>` as its dependency, and the dynamic loader matches it against
//! an already loaded libkreplay (the one `HSA_TOOLS_LIB` loaded) by that name, so tool and
//! runtime share one kreplay. See docs/c-tools.md for the install layout
//! (`libkreplay.so.X.Y.Z`, with `libkreplay.so.X` and `libkreplay.so` linking to it).

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").expect("set by cargo");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libkreplay.so.{major}");
    }
}
