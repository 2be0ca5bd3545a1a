//! Limits a new user meets: every configuration key from `Config`, deep
//! queues with the defaults, a handler with a large stack frame, another
//! runtime's method ids, and quiet handler panics.

mod common;

use std::process::Command;

use chimaera::{sys, Config, Method, Route, Runtime, Status};

fn slots_total(rt: &Runtime) -> u64 {
    // SAFETY: zeroed chi_stats_t with struct_size set, as chi_stats requires.
    unsafe {
        let mut st: sys::chi_stats_t = std::mem::zeroed();
        st.struct_size = std::mem::size_of::<sys::chi_stats_t>();
        assert_eq!(sys::chi_stats(rt.as_ptr(), &mut st), sys::CHI_OK);
        st.slots_total
    }
}

#[test]
fn every_key_through_config() {
    if common::client_mode() {
        eprintln!("skipped in client mode: the server's settings apply");
        return;
    }
    let config = Config::new()
        .gpus(0)
        .num_workers(2)
        .queue_depth(1 << 18)
        .worker_stack_size(8 << 20)
        .set("submit_timeout_ms", 5000)
        .set("max_inline_payload", 512)
        .set("log_level", "warn")
        .set("submit_blocking", true)
        .set("gpu.lease_us", 0)
        .set("server.max_clients", 16)
        .set_list("modules", Vec::<&str>::new());
    let rt = Runtime::new(&config).unwrap();
    assert_eq!(slots_total(&rt), 1 << 18);
    let err = rt
        .submit(Route::Cpu, Method::ECHO, &[0u8; 513])
        .unwrap_err();
    assert_eq!(err.status(), Status::TooLarge);

    // A later set of the same key wins.
    let rt = Runtime::new(&Config::new().gpus(0).queue_depth(64).queue_depth(128)).unwrap();
    assert_eq!(slots_total(&rt), 128);

    for bad in [
        Config::new().gpus(0).set("wrokers", 2),
        Config::new().gpus(0).queue_depth(1000),
        Config::new().gpus(0).set("gpu.nope", 1),
        Config::new().gpus(0).set("worker_stack_size", "12X"),
        Config::new().gpus(0).set("Bad Key", 1),
    ] {
        let err = Runtime::new(&bad).unwrap_err();
        assert_eq!(err.status(), Status::Config, "{}", err);
        assert!(!err.message().is_empty());
    }
    let err = Runtime::new(&Config::new().gpus(0).set("wrokers", 2)).unwrap_err();
    assert!(err.message().contains("chi_config_t.settings"), "{}", err);
}

#[test]
fn hundred_thousand_before_any_wait() {
    if common::client_mode() {
        eprintln!("skipped in client mode: the server's queue_depth applies");
        return;
    }
    let rt = Runtime::new(&Config::new().gpus(0)).unwrap();
    let futures: Vec<_> = (0..100_000u64)
        .map(|i| {
            rt.submit(Route::Cpu, Method::ECHO, &i.to_le_bytes())
                .unwrap()
        })
        .collect();
    for (i, f) in futures.into_iter().enumerate() {
        assert_eq!(f.wait(None).unwrap(), (i as u64).to_le_bytes());
    }
}

#[test]
fn handler_with_a_32_mib_frame() {
    if common::client_mode() {
        eprintln!("skipped in client mode");
        return;
    }
    let rt = Runtime::new(
        &Config::new()
            .gpus(0)
            .num_workers(2)
            .worker_stack_size(64 << 20),
    )
    .unwrap();
    let big = rt
        .register_handler("limits.big_frame", |_, out| {
            // Volatile accesses keep the whole 32 MiB frame on the stack
            // (std::hint::black_box needs Rust 1.66; the crates support 1.63).
            let mut frame = [0u8; 32 << 20];
            for i in (0..frame.len()).step_by(4096) {
                // SAFETY: i < frame.len(), an aligned u8 in a live array.
                unsafe { std::ptr::write_volatile(&mut frame[i], (i >> 12) as u8) };
            }
            let sum: u64 = (0..frame.len())
                .step_by(4096)
                // SAFETY: as above.
                .map(|i| unsafe { std::ptr::read_volatile(&frame[i]) } as u64)
                .sum();
            out.extend_from_slice(&sum.to_le_bytes())
        })
        .unwrap();
    let want: u64 = (0..(32usize << 20))
        .step_by(4096)
        .map(|i| (i >> 12) as u8 as u64)
        .sum();
    for _ in 0..4 {
        assert_eq!(rt.call(Route::Cpu, big, b"").unwrap(), want.to_le_bytes());
    }
}

#[test]
fn another_runtimes_method_is_refused() {
    if common::client_mode() {
        eprintln!("skipped in client mode");
        return;
    }
    let a = Runtime::new(&Config::new().gpus(0).num_workers(1)).unwrap();
    let b = Runtime::new(&Config::new().gpus(0).num_workers(1)).unwrap();
    let ma = a
        .register_handler("limits.same", |_, out| out.extend_from_slice(b"a"))
        .unwrap();
    let mb = b
        .register_handler("limits.same", |_, out| out.extend_from_slice(b"b"))
        .unwrap();
    assert_ne!(ma, mb);
    let err = b.submit(Route::Cpu, ma, b"").unwrap_err();
    assert_eq!(err.status(), Status::NotFound);
    assert!(err.message().contains("another runtime"), "{}", err);
    assert_eq!(a.call(Route::Cpu, ma, b"").unwrap(), b"a");
    assert_eq!(b.call(Route::Cpu, mb, b"").unwrap(), b"b");
    assert_eq!(
        b.submit(Route::Cpu, Method::from_id(4000), b"")
            .unwrap_err()
            .status(),
        Status::NotFound
    );
}

/// Set in the child process that runs the panicking handlers.
const CHILD: &str = "CHIMAERA_TEST_PANIC_CHILD";

#[test]
fn handler_panics_are_quiet() {
    if std::env::var_os(CHILD).is_some() {
        let rt = Runtime::new(&Config::new().gpus(0).num_workers(2)).unwrap();
        let m = rt
            .register_handler("limits.panics", |req, _| {
                panic!("limits-test handler panic {}", req.input().len())
            })
            .unwrap();
        for _ in 0..3 {
            let err = rt.call(Route::Cpu, m, b"abc").unwrap_err();
            assert_eq!(err.status(), Status::Internal);
        }
        let text = chimaera::last_handler_panic().unwrap();
        assert!(text.contains("limits-test handler panic 3"), "{}", text);
        assert!(text.contains("limits.rs"), "{}", text);
        // Panics outside handlers still reach the previous (default) hook.
        let outside = std::thread::spawn(|| panic!("limits-test outside panic")).join();
        assert!(outside.is_err());
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "handler_panics_are_quiet",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed:\n{}\n{}",
        stdout,
        stderr
    );
    assert!(
        !stderr.contains("limits-test handler panic"),
        "handler panic printed:\n{}",
        stderr
    );
    assert!(
        !stdout.contains("limits-test handler panic"),
        "handler panic printed:\n{}",
        stdout
    );
    assert!(
        stderr.contains("limits-test outside panic"),
        "other panics must still print:\n{}",
        stderr
    );
}
