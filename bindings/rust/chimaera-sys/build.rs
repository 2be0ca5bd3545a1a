//! Finds libchimaera without any helper crate.
//!
//! 1. `CHIMAERA_LIB_DIR`: the directory holding `libchimaera.so` (a build
//!    tree's top directory, or an install's `lib/`).
//! 2. Otherwise the `pkg-config` program (`$PKG_CONFIG` if set):
//!    `pkg-config --libs chimaera`, which finds an installed `chimaera.pc`
//!    (set `PKG_CONFIG_PATH` for a non-system prefix).
//! 3. Otherwise plain `-lchimaera`, left to the linker's default paths.
//!
//! The directory found is passed to dependents as `DEP_CHIMAERA_LIB_DIR`, and
//! this crate's own test binaries get it as an rpath.

use std::env;
use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    for var in [
        "CHIMAERA_LIB_DIR",
        "PKG_CONFIG",
        "PKG_CONFIG_PATH",
        "PKG_CONFIG_LIBDIR",
        "PKG_CONFIG_SYSROOT_DIR",
    ] {
        println!("cargo:rerun-if-env-changed={}", var);
    }

    if let Some(dir) = env::var_os("CHIMAERA_LIB_DIR").filter(|d| !d.is_empty()) {
        let dir = Path::new(&dir);
        if !dir.join("libchimaera.so").exists() && !dir.join("libchimaera.dylib").exists() {
            println!(
                "cargo:warning=CHIMAERA_LIB_DIR={} holds no libchimaera shared library",
                dir.display()
            );
        }
        emit_dir(&dir.display().to_string());
        println!("cargo:rustc-link-lib=dylib=chimaera");
        return;
    }

    let pkg_config = env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".to_string());
    match Command::new(&pkg_config)
        .args(["--libs", "chimaera"])
        .output()
    {
        Ok(out) if out.status.success() => {
            let flags = String::from_utf8_lossy(&out.stdout).into_owned();
            let mut linked = false;
            for flag in flags.split_whitespace() {
                if let Some(dir) = flag.strip_prefix("-L") {
                    emit_dir(dir);
                } else if let Some(lib) = flag.strip_prefix("-l") {
                    println!("cargo:rustc-link-lib=dylib={}", lib);
                    linked |= lib == "chimaera";
                }
            }
            if !linked {
                println!("cargo:rustc-link-lib=dylib=chimaera");
            }
        }
        result => {
            let why = match result {
                Ok(out) => String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_string(),
                Err(e) => format!("cannot run {}: {}", pkg_config, e),
            };
            println!(
                "cargo:warning=libchimaera not located ({}); set CHIMAERA_LIB_DIR to the \
                 directory holding libchimaera.so, or PKG_CONFIG_PATH to the one holding \
                 chimaera.pc; trying the linker's default paths",
                why
            );
            println!("cargo:rustc-link-lib=dylib=chimaera");
        }
    }
}

fn emit_dir(dir: &str) {
    println!("cargo:rustc-link-search=native={}", dir);
    // Metadata for dependents (DEP_CHIMAERA_LIB_DIR) and an rpath for this
    // crate's tests, so that `cargo test` runs without LD_LIBRARY_PATH.
    println!("cargo:lib_dir={}", dir);
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir);
}
