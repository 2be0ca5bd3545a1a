//! Gives this crate's tests and examples an rpath to the libchimaera that
//! chimaera-sys linked (`DEP_CHIMAERA_LIB_DIR`), so that `cargo test` and
//! `cargo run --example` work without LD_LIBRARY_PATH.  Programs that depend on
//! this crate choose their own way (system path, rpath or LD_LIBRARY_PATH).

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=DEP_CHIMAERA_LIB_DIR");
    if let Ok(dir) = std::env::var("DEP_CHIMAERA_LIB_DIR") {
        // Applies to this package's own test, example and bench binaries only.
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir);
    }
}
