//! Makes the `kreplay` binary a host for tools written in C.
//!
//! The binary links the kreplay library statically. A tool library that `kreplay demo --tool`
//! (or `KREPLAY_TOOL_LIBRARIES`) loads calls `kreplay_create_context` and the other functions of
//! `kreplay.h`; those calls must reach this one statically linked copy, the one that sees the
//! demo's dispatches. So every function the header declares is
//! - kept in the binary (`--undefined`: the linker pulls it in even when the CLI never calls it),
//! - and exported in the binary's dynamic symbol table (`--dynamic-list`), where the dynamic
//!   loader finds it first: a tool that resolves the symbols from its host binds to it, and so
//!   does a tool linked with `-lkreplay` (the executable comes before the tool's own
//!   dependencies in the lookup order, so the libkreplay.so it pulls in stays unused).
//!
//! The list is read from the header, so a function added there is exported without touching
//! this file; `kreplay_configure` is excluded (tools define it, kreplay looks it up).

use std::fmt::Write as _;
use std::path::PathBuf;

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let header = manifest.join("../ffi/include/kreplay.h");
    println!("cargo:rerun-if-changed={}", header.display());
    println!("cargo:rerun-if-changed=build.rs");

    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if target_os != "linux" {
        // The dynamic-list mechanism below is ELF-specific; other targets cannot host C tools.
        return;
    }

    let text = std::fs::read_to_string(&header)
        .unwrap_or_else(|err| panic!("cannot read {}: {err}", header.display()));
    let functions = declared_functions(&text);
    assert!(
        functions.iter().any(|f| f == "kreplay_create_context"),
        "found no function declarations in {} (parser out of date?)",
        header.display()
    );

    let mut list = String::from("{\n");
    for function in &functions {
        writeln!(list, "  {function};").expect("write to a String");
    }
    list.push_str("};\n");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("set by cargo"));
    let list_path = out.join("kreplay-exports.list");
    std::fs::write(&list_path, list)
        .unwrap_or_else(|err| panic!("cannot write {}: {err}", list_path.display()));

    println!(
        "cargo:rustc-link-arg-bins=-Wl,--dynamic-list={}",
        list_path.display()
    );
    for function in &functions {
        println!("cargo:rustc-link-arg-bins=-Wl,--undefined={function}");
    }
}

/// The names of the functions `kreplay.h` declares (not typedefs, not macros), except
/// `kreplay_configure`, which a tool defines.
fn declared_functions(header: &str) -> Vec<String> {
    let code = strip_preprocessor(&strip_comments(header));
    let mut names = Vec::new();
    for declaration in code.split(';') {
        let declaration = declaration.trim_start();
        let declaration = declaration
            .strip_prefix("extern \"C\" {")
            .unwrap_or(declaration)
            .trim_start();
        if declaration.starts_with("typedef")
            || declaration.starts_with("enum")
            || declaration.starts_with("struct")
            || declaration.starts_with('}')
        {
            continue;
        }
        let Some(open) = declaration.find('(') else {
            continue;
        };
        let before = declaration[..open].trim_end();
        let name: String = before
            .chars()
            .rev()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        if name.starts_with("kreplay_") && name != "kreplay_configure" && !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("/*").into_iter().chain(rest.find("//")).min() {
        out.push_str(&rest[..start]);
        if rest[start..].starts_with("/*") {
            let end = rest[start + 2..]
                .find("*/")
                .map_or(rest.len(), |e| start + 2 + e + 2);
            out.push(' ');
            rest = &rest[end..];
        } else {
            let end = rest[start..].find('\n').map_or(rest.len(), |e| start + e);
            rest = &rest[end..];
        }
    }
    out.push_str(rest);
    out
}

/// Drops preprocessor lines, including their backslash continuations.
fn strip_preprocessor(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut continued = false;
    for line in text.lines() {
        let directive = continued || line.trim_start().starts_with('#');
        continued = directive && line.trim_end().ends_with('\\');
        if !directive {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}
