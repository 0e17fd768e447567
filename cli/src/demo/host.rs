//! Hosting tools written in C (or anything with the C ABI) in `kreplay demo`.
//!
//! A tool library given with `--tool PATH` or listed in `KREPLAY_TOOL_LIBRARIES` must work
//! against the one kreplay in this process, the one installed in the demo's HSA table: its
//! `kreplay_*` calls have to land there. The `kreplay` binary links kreplay statically and exports
//! every function of `kreplay.h` in its dynamic symbol table (see `cli/build.rs`), so a tool
//! library resolves them from the binary, whether it was linked with `-lkreplay` or not (the
//! executable comes first in the dynamic loader's lookup order).
//!
//! The demo loads each library itself, before any work starts, and registers its
//! `kreplay_configure` ahead of the demo's own tool, so an external tool that configures kernel
//! replay gets the service and the demo's tool steps aside (see [`super::tool`]). Everything that
//! keeps a requested tool from working is an error, never a warning: a path that does not load (a
//! missing file, an unresolved symbol), a library without `kreplay_configure`, a tool that
//! declines or fails its initialize, and a tool whose calls went to another copy of kreplay.

use std::path::{Path, PathBuf};

use kreplay::abi::ConfigureFn;
use kreplay::lifecycle::{ENV_TOOL_LIBRARIES, ToolState};
use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};

/// A tool library asked for, and whether `KREPLAY_TOOL_LIBRARIES` named it (else `--tool`).
#[derive(Clone, Debug)]
pub struct Requested {
    /// The library's path.
    pub path: PathBuf,
    /// Listed in `KREPLAY_TOOL_LIBRARIES`.
    pub from_variable: bool,
}

impl Requested {
    /// `why` it cannot be used, saying where the path came from when it was the variable: a
    /// malformed setting is named, as every other one is.
    fn noted(&self, why: String) -> String {
        if self.from_variable {
            format!("{why} (listed in {ENV_TOOL_LIBRARIES})")
        } else {
            why
        }
    }
}

/// The tool libraries asked for: `--tool` paths first, then those of `KREPLAY_TOOL_LIBRARIES`
/// (colon-separated, empty entries skipped).
pub fn requested(from_options: &[PathBuf]) -> Vec<Requested> {
    let mut paths: Vec<Requested> = from_options
        .iter()
        .map(|path| Requested {
            path: path.clone(),
            from_variable: false,
        })
        .collect();
    if let Some(value) = std::env::var_os(ENV_TOOL_LIBRARIES) {
        paths.extend(
            std::env::split_paths(&value)
                .filter(|p| !p.as_os_str().is_empty())
                .map(|path| Requested {
                    path,
                    from_variable: true,
                }),
        );
    }
    paths
}

/// Tool libraries loaded and registered with kreplay, in priority order.
#[derive(Default)]
pub struct ExternalTools {
    tools: Vec<ExternalTool>,
}

struct ExternalTool {
    requested: Requested,
    /// Keeps the library loaded for the rest of the process (kreplay calls into it until the
    /// process ends; unloading tool libraries is never safe).
    _library: Library,
}

impl ExternalTools {
    /// Loads every library of `paths` and registers its `kreplay_configure` with
    /// [`kreplay::lifecycle::force_configure_library`] (`kreplay_force_configure` that also
    /// names the file). Call before anything else is registered, so these tools are configured
    /// and initialized first (client handles 1, 2, ...). A library listed twice is used once.
    pub fn load(paths: &[Requested]) -> Result<ExternalTools, String> {
        let mut loaded = ExternalTools::default();
        if paths.is_empty() {
            return Ok(loaded);
        }
        check_host_exports()?;
        let mut registered: Vec<usize> = Vec::new();
        for requested in paths {
            let path = &requested.path;
            let (library, configure) = open(path).map_err(|why| requested.noted(why))?;
            if registered.contains(&(configure as usize)) {
                continue;
            }
            // Registered with its path, so kreplay's own messages about it name the file.
            if let Err(status) = kreplay::lifecycle::force_configure_library(configure, path) {
                return Err(requested.noted(format!(
                    "cannot use tool {}: registering it: {status}",
                    path.display()
                )));
            }
            registered.push(configure as usize);
            loaded.tools.push(ExternalTool {
                requested: requested.clone(),
                _library: library,
            });
        }
        Ok(loaded)
    }

    /// Are there any?
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// After kreplay initialized its tools: every loaded tool must be active and must have
    /// created its contexts in this process's kreplay. Returns their names (the name a tool set
    /// in its client id, else its path).
    pub fn check_initialized(&self) -> Result<Vec<String>, String> {
        let summaries = kreplay::lifecycle::tools();
        let mut names = Vec::new();
        for (index, tool) in self.tools.iter().enumerate() {
            // Forced configure functions come first, in registration order: client 1, 2, ...
            let client = index as u32 + 1;
            let Some(summary) = summaries.iter().find(|s| s.client == client) else {
                return Err(tool.requested.noted(format!(
                    "tool {} was never configured by kreplay",
                    tool.requested.path.display()
                )));
            };
            let cannot = |why: &str| {
                Err(tool.requested.noted(format!(
                    "cannot use tool {}: {why}",
                    tool.requested.path.display()
                )))
            };
            match summary.state {
                ToolState::Active | ToolState::Finalized => {}
                ToolState::Declined => {
                    return cannot("its kreplay_configure returned NULL (the tool declined)");
                }
                ToolState::Rejected => {
                    return cannot(
                        "its kreplay_configure returned a result whose size field is too small",
                    );
                }
                ToolState::Failed => return cannot("its initialize returned non-zero"),
                ToolState::Configured | ToolState::Initializing => {
                    return cannot("its initialize never completed");
                }
            }
            if summary.contexts.is_empty() {
                return cannot(
                    "it created no context in this process's kreplay during its initialize (its \
                     kreplay_* calls reached another copy of kreplay, or it configures nothing)",
                );
            }
            names.push(
                summary
                    .name
                    .clone()
                    .unwrap_or_else(|| tool.requested.path.display().to_string()),
            );
        }
        Ok(names)
    }
}

/// Refuses to load tools when this executable does not export kreplay's C functions: a tool
/// would then fail to load, or bind to a second copy of kreplay that never sees a dispatch.
fn check_host_exports() -> Result<(), String> {
    let this = Library::this();
    // SAFETY: only the address is compared; the symbol is never called through this pointer.
    let exported = unsafe { this.get::<*const ()>(b"kreplay_create_context\0") }
        .ok()
        .map(|symbol| *symbol as usize);
    let ours = kreplay::api::kreplay_create_context as *const () as usize;
    if exported == Some(ours) {
        Ok(())
    } else {
        Err(format!(
            "this program does not export kreplay's C functions to the libraries it loads, so \
             it cannot host tools ({ENV_TOOL_LIBRARIES} / --tool); run the kreplay binary"
        ))
    }
}

fn open(path: &Path) -> Result<(Library, ConfigureFn), String> {
    let cannot = |why: String| format!("cannot use tool {}: {why}", path.display());
    if let Some(why) = crate::format::not_a_library_file(path) {
        return Err(cannot(why));
    }
    // SAFETY: loading a library runs its initializers; the user asked for exactly this library.
    let library = unsafe { Library::open(Some(path), RTLD_NOW | RTLD_LOCAL) }
        .map_err(|e| cannot(kreplay::lifecycle::explain_load_error(e.to_string())))?;
    // SAFETY: a tool's `kreplay_configure` has the type kreplay.h declares, which `ConfigureFn`
    // mirrors; the pointer is used only while the library stays loaded (for the process).
    let configure = unsafe { library.get::<Option<ConfigureFn>>(b"kreplay_configure\0") }
        .map(|symbol| *symbol)
        .map_err(|e| cannot(format!("it does not define kreplay_configure ({e})")))?;
    match configure {
        Some(configure) => match kreplay::lifecycle::not_a_function(configure as *const _) {
            None => Ok((library, configure)),
            Some(what) => Err(cannot(format!(
                "kreplay_configure is not a function: {what}"
            ))),
        },
        None => Err(cannot("its kreplay_configure symbol is NULL".into())),
    }
}
