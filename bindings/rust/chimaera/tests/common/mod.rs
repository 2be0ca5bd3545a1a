//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};

use chimaera::{Config, Runtime};

/// A YAML file in the temp directory, removed on drop.
pub struct YamlFile(pub PathBuf);

impl YamlFile {
    pub fn new(text: &str) -> YamlFile {
        static N: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "chimaera-rust-{}-{}.yaml",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&path, text).expect("write yaml");
        YamlFile(path)
    }
}

impl Drop for YamlFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Whether the suite runs in client mode (`CHI_MODE=client`, the
/// rust_cargo_test_client variant against a chimaera-server): cases that only
/// an embedded runtime can show skip themselves.
pub fn client_mode() -> bool {
    std::env::var("CHI_MODE").map_or(false, |m| m.eq_ignore_ascii_case("client"))
}

/// A CPU-only runtime with `workers` threads and the given extra YAML keys.
pub fn runtime_with(workers: u32, yaml: &str) -> Runtime {
    let file = YamlFile::new(yaml);
    Runtime::new(
        &Config::new()
            .config_path(&file.0)
            .num_workers(workers)
            .gpus(0),
    )
    .expect("runtime starts")
}

/// A CPU-only runtime with two workers and default settings.
pub fn runtime() -> Runtime {
    runtime_with(2, "{}\n")
}

/// A gate that handlers block on until the test opens it.
#[derive(Default)]
pub struct Gate {
    open: Mutex<bool>,
    cv: Condvar,
}

impl Gate {
    pub fn wait(&self) {
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.cv.wait(open).unwrap();
        }
    }

    pub fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.cv.notify_all();
    }
}

/// 64-bit FNV-1a, the function behind chi.checksum.
pub fn fnv1a64(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for &b in data {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// The input of chi.add.
pub fn add_input(a: u64, b: u64) -> [u8; 16] {
    let mut input = [0u8; 16];
    input[..8].copy_from_slice(&a.to_le_bytes());
    input[8..].copy_from_slice(&b.to_le_bytes());
    input
}

pub fn as_u64(bytes: &[u8]) -> u64 {
    u64::from_le_bytes(bytes.try_into().expect("8 bytes"))
}
