//! `cargo xtask ptx [--check]`: regenerate the PTX of kreplay's CUDA kernels
//! (`cuda/kernels/*.cu` → `.ptx` beside each) with `nvcc`, or with `--check` fail when the
//! committed PTX differs from what this `nvcc` makes of the sources (the PTX names the compiler
//! build, so compare with the release the committed file names in its header).
//!
//! Only this command needs a CUDA toolkit; building kreplay uses the committed PTX, which the
//! driver JIT-compiles at run time.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The kernel sources, relative to the workspace root.
pub const SOURCES: [&str; 1] = ["cuda/kernels/kreplay_kernels.cu"];

/// The virtual architecture the PTX targets: the oldest CUDA 13's nvcc accepts (Turing), so the
/// same PTX JIT-compiles on every GPU a current driver supports, the H200 included.
pub const ARCH: &str = "compute_75";

/// `nvcc`: `$NVCC`, else `nvcc` on the PATH, else the toolkit's default place.
fn nvcc() -> Result<PathBuf, String> {
    if let Ok(path) = std::env::var("NVCC") {
        return Ok(PathBuf::from(path));
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("nvcc"))
            .find(|p| p.is_file())
    });
    on_path
        .or_else(|| Some(PathBuf::from("/usr/local/cuda/bin/nvcc")).filter(|p| p.is_file()))
        .ok_or_else(|| {
            "nvcc not found (set NVCC, put it on the PATH, or install the CUDA toolkit); \
             the committed PTX is used as is"
                .to_string()
        })
}

/// The `nvcc` command that turns `source` into PTX at `out`.
pub fn command(nvcc: &Path, source: &Path, out: &Path) -> Command {
    let mut cmd = Command::new(nvcc);
    cmd.arg("-ptx")
        .arg(format!("-arch={ARCH}"))
        .arg("-O3")
        .arg(source)
        .arg("-o")
        .arg(out);
    cmd
}

/// Run the task from the workspace root `root`.
pub fn run(root: &Path, check: bool) -> Result<(), String> {
    let nvcc = nvcc()?;
    for source in SOURCES {
        let source = root.join(source);
        let target = source.with_extension("ptx");
        let out = if check {
            std::env::temp_dir().join(format!("kreplay-xtask-{}.ptx", std::process::id()))
        } else {
            target.clone()
        };
        let status = command(&nvcc, &source, &out)
            .status()
            .map_err(|e| format!("cannot run {}: {e}", nvcc.display()))?;
        if !status.success() {
            return Err(format!(
                "{} failed on {}: {status}",
                nvcc.display(),
                source.display()
            ));
        }
        if check {
            let made = std::fs::read_to_string(&out)
                .map_err(|e| format!("cannot read {}: {e}", out.display()));
            let _ = std::fs::remove_file(&out);
            let committed = std::fs::read_to_string(&target)
                .map_err(|e| format!("cannot read {}: {e}", target.display()))?;
            if made? != committed {
                return Err(format!(
                    "{} is not what {} makes of {}: run `cargo xtask ptx`",
                    target.display(),
                    nvcc.display(),
                    source.display()
                ));
            }
            println!("{} is up to date", target.display());
        } else {
            println!("wrote {}", target.display());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ptx_command_targets_the_portable_architecture_and_names_its_output() {
        let cmd = command(
            Path::new("/opt/cuda/bin/nvcc"),
            Path::new("k.cu"),
            Path::new("k.ptx"),
        );
        assert_eq!(cmd.get_program(), "/opt/cuda/bin/nvcc");
        let args: Vec<_> = cmd.get_args().map(|a| a.to_str().unwrap()).collect();
        assert_eq!(
            args,
            ["-ptx", "-arch=compute_75", "-O3", "k.cu", "-o", "k.ptx"]
        );
    }

    #[test]
    fn every_kernel_source_is_in_the_tree_with_its_committed_ptx() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        for source in SOURCES {
            let source = root.join(source);
            assert!(source.is_file(), "{}", source.display());
            let ptx = std::fs::read_to_string(source.with_extension("ptx")).unwrap();
            assert!(
                ptx.contains(".entry"),
                "{} holds no kernel",
                source.display()
            );
        }
    }
}
