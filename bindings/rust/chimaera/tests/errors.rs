//! Every status a CPU-only machine can produce, as Rust sees it.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chimaera::{
    Config, Error, HandlerError, MemRef, Method, Mode, Route, Runtime, Status, WaitError,
};
use common::{runtime, runtime_with, Gate, YamlFile};

fn wait_status(result: Result<Vec<u8>, WaitError<'_>>) -> Status {
    match result {
        Err(WaitError::Failed(e)) => e.status(),
        other => panic!("expected a failed task, got {:?}", other),
    }
}

#[test]
fn status_codes_round_trip() {
    let all = [
        (Status::Invalid, -1),
        (Status::NoMem, -2),
        (Status::Timeout, -3),
        (Status::Again, -4),
        (Status::NotFound, -5),
        (Status::NoDevice, -6),
        (Status::Disconnected, -7),
        (Status::Protocol, -8),
        (Status::TooLarge, -9),
        (Status::Config, -10),
        (Status::Permission, -11),
        (Status::Shutdown, -12),
        (Status::Internal, -13),
        (Status::Handler(-1000), -1000),
        (Status::Handler(i32::MIN), i32::MIN),
        (Status::Unknown(-14), -14),
        (Status::Unknown(-999), -999),
        (Status::Unknown(7), 7),
    ];
    let mut texts = std::collections::HashSet::new();
    for (status, code) in all {
        assert_eq!(status.code(), code);
        assert_eq!(Status::from_code(code), Some(status));
        assert!(!status.description().is_empty());
        if code > -14 {
            assert!(
                texts.insert(status.description()),
                "{:?} shares its text",
                status
            );
        }
    }
    assert_eq!(Status::from_code(0), None);
    assert!(Status::Handler(-1234).to_string().contains("-1234"));
}

#[test]
fn invalid() {
    let rt = runtime();
    let never = Method::from_id(9999);
    let err = rt.submit(Route::Cpu, never, b"").unwrap_err();
    assert_eq!(err.status(), Status::NotFound);
    assert!(!err.message().is_empty());
    assert!(err.to_string().contains(err.message()));
    assert_eq!(
        rt.submit(Route::Cpu, Method::from_id(0), b"")
            .unwrap_err()
            .status(),
        Status::Invalid
    );

    let ok = |_: &chimaera::Request<'_>, _: &mut chimaera::Output<'_>| Ok(());
    rt.register_handler("test.twice", ok).unwrap();
    assert_eq!(
        rt.register_handler("test.twice", ok).unwrap_err().status(),
        Status::Invalid
    );
    assert_eq!(
        rt.register_handler("chi.echo", ok).unwrap_err().status(),
        Status::Invalid
    );
    assert_eq!(
        rt.register_handler("", ok).unwrap_err().status(),
        Status::Invalid
    );
    assert_eq!(
        rt.register_handler("bad\nname", ok).unwrap_err().status(),
        Status::Invalid
    );
    assert_eq!(
        rt.register_handler(&"x".repeat(128), ok)
            .unwrap_err()
            .status(),
        Status::Invalid
    );
    assert_eq!(
        rt.register_handler("nul\0byte", ok).unwrap_err().status(),
        Status::Invalid
    );
    assert_eq!(
        rt.lookup("nul\0byte").unwrap_err().status(),
        Status::Invalid
    );

    assert_eq!(
        rt.unregister_mem(12345).unwrap_err().status(),
        Status::Invalid
    );
    let bogus = MemRef {
        region: 12345,
        offset: 0,
        length: 1,
    };
    assert_eq!(
        rt.resolve_mem(&bogus).unwrap_err().status(),
        Status::Invalid
    );
    assert_eq!(
        rt.register_host_mem(&mut []).unwrap_err().status(),
        Status::Invalid
    );

    let err = Runtime::new(&Config::new().num_workers(u32::MAX)).unwrap_err();
    assert_eq!(err.status(), Status::Invalid);
    let err = Runtime::new(&Config::new().config_path("bad\0path")).unwrap_err();
    assert_eq!(err.status(), Status::Invalid);
}

#[test]
fn timeout_from_the_wait_and_from_a_handler() {
    let rt = runtime();
    let gate = Arc::new(Gate::default());
    let g = Arc::clone(&gate);
    let blocked = rt.register_handler("test.blocked", move |_req, _out| {
        g.wait();
        Ok(())
    });
    let blocked = blocked.unwrap();
    let future = rt.submit(Route::Cpu, blocked, b"").unwrap();
    let err = future.wait(Some(Duration::from_millis(10))).unwrap_err();
    assert_eq!(err.status(), Status::Timeout);
    // Converting to Error releases the future; the task still runs.
    let err: Error = err.into();
    assert_eq!(err.status(), Status::Timeout);
    gate.open();

    // A handler's own Timeout consumes the future: it is not handed back.
    let says_timeout = rt
        .register_handler(
            "test.says_timeout",
            |_req, _out| Err(Status::Timeout.into()),
        )
        .unwrap();
    let future = rt.submit(Route::Cpu, says_timeout, b"").unwrap();
    assert_eq!(
        wait_status(future.wait(Some(Duration::from_secs(600)))),
        Status::Timeout
    );
}

#[test]
fn not_found() {
    let rt = runtime();
    let err = rt.lookup("no.such.method").unwrap_err();
    assert_eq!(err.status(), Status::NotFound);
    assert_eq!(
        rt.load_module("/nonexistent/libmodule.so")
            .unwrap_err()
            .status(),
        Status::NotFound
    );
    // A shared object that is not a chimaera module.
    assert_eq!(
        rt.load_module("libm.so.6").unwrap_err().status(),
        Status::NotFound
    );
}

#[test]
fn no_device_without_gpus() {
    let rt = Runtime::new(&Config::new().gpus(0)).unwrap();
    assert_eq!(rt.gpu_count(), 0);
    for route in [Route::GpuAny, Route::Gpu(0)] {
        let err = rt.submit(route, Method::ECHO, b"x").unwrap_err();
        assert_eq!(err.status(), Status::NoDevice, "route {:?}", route);
    }
    assert_eq!(rt.gpu_context(0).unwrap_err().status(), Status::NoDevice);
    assert_eq!(rt.gpu_pause(None).unwrap_err().status(), Status::NoDevice);
    assert_eq!(
        rt.gpu_resume(Some(0)).unwrap_err().status(),
        Status::NoDevice
    );

    // Asking for more GPUs than there are.
    let visible = Runtime::new(&Config::new().all_gpus()).unwrap().gpu_count();
    let err = Runtime::new(&Config::new().gpus(visible + 1)).unwrap_err();
    assert_eq!(err.status(), Status::NoDevice);
}

#[test]
fn too_large() {
    let rt = runtime_with(2, "max_inline_payload: 256\n");
    if common::client_mode() {
        eprintln!(
            "skipped in client mode: the server's max_inline_payload, not this YAML's, \
             limits chi.echo's input"
        );
    } else {
        let err = rt
            .submit(Route::Cpu, Method::ECHO, &[0u8; 257])
            .unwrap_err();
        assert_eq!(err.status(), Status::TooLarge);
        assert!(rt.submit(Route::Cpu, Method::ECHO, &[0u8; 256]).is_ok());
    }

    // A handler whose output does not fit gets TooLarge from Output and
    // passes it on; the waiter's future is consumed.
    let overflow = rt
        .register_handler("test.overflow", |_req, out| {
            let n = out.capacity() + 1;
            out.extend_from_slice(&vec![1u8; n])
        })
        .unwrap();
    assert_eq!(
        wait_status(rt.submit(Route::Cpu, overflow, b"").unwrap().wait(None)),
        Status::TooLarge
    );
}

#[test]
fn config_errors_name_the_file_and_line() {
    let bad = YamlFile::new("workers: 2\nwrokers: 3\n");
    let err = Runtime::new(&Config::new().config_path(&bad.0)).unwrap_err();
    assert_eq!(err.status(), Status::Config);
    let name = bad.0.file_name().unwrap().to_str().unwrap();
    assert!(err.message().contains(name), "message: {}", err.message());
    assert!(err.message().contains(":2:"), "message: {}", err.message());

    let range = YamlFile::new("queue_depth: 3\n");
    assert_eq!(
        Runtime::new(&Config::new().config_path(&range.0))
            .unwrap_err()
            .status(),
        Status::Config
    );

    let missing = Config::new().config_path("/nonexistent/chimaera.yaml");
    assert_eq!(Runtime::new(&missing).unwrap_err().status(), Status::Config);
}

#[test]
fn again_when_every_slot_is_taken() {
    let rt = runtime_with(1, "queue_depth: 2\nsubmit_blocking: false\n");
    let gate = Arc::new(Gate::default());
    let g = Arc::clone(&gate);
    let blocked = rt
        .register_handler("test.blocked", move |_req, _out| {
            g.wait();
            Ok(())
        })
        .unwrap();
    let mut futures = Vec::new();
    let err = loop {
        match rt.submit(Route::Cpu, blocked, b"") {
            Ok(f) => futures.push(f),
            Err(e) => break e,
        }
        assert!(
            futures.len() <= 64,
            "no Again after 64 submits into 2 slots"
        );
    };
    assert_eq!(err.status(), Status::Again);
    assert_eq!(futures.len(), 2);
    gate.open();
    for f in futures {
        f.wait(None).unwrap();
    }
    rt.call(Route::Cpu, Method::ECHO, b"room again").unwrap();
}

#[test]
fn handler_codes_pass_through() {
    let rt = runtime();
    let fails = rt
        .register_handler("test.fails", |req, _out| match req.input() {
            b"user" => Err(HandlerError::user(-1234)),
            b"lowest" => Err(HandlerError::user(i32::MIN)),
            b"invalid" => Err(Status::Invalid.into()),
            _ => Ok(()),
        })
        .unwrap();
    let err = rt.call(Route::Cpu, fails, b"user").unwrap_err();
    assert_eq!(err.status(), Status::Handler(-1234));
    assert_eq!(err.code(), -1234);
    assert_eq!(
        rt.call(Route::Cpu, fails, b"lowest").unwrap_err().status(),
        Status::Handler(i32::MIN)
    );
    assert_eq!(
        rt.call(Route::Cpu, fails, b"invalid").unwrap_err().status(),
        Status::Invalid
    );
    assert_eq!(rt.call(Route::Cpu, fails, b"fine").unwrap(), b"");
}

#[test]
#[should_panic(expected = "<= -1000")]
fn handler_error_user_refuses_library_codes() {
    let _ = HandlerError::user(-5);
}

const DELIBERATE: &str = "handler panicked on purpose";

/// Keeps the deliberate panics out of the test log; other panics print as usual.
fn quiet_deliberate_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<&str>() != Some(&DELIBERATE) {
                default(info);
            }
        }));
    });
}

#[test]
fn panicking_handler_is_internal() {
    quiet_deliberate_panics();
    let rt = runtime();
    let calls = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&calls);
    let flaky = rt
        .register_handler("test.flaky", move |req, out| {
            c.fetch_add(1, Ordering::SeqCst);
            if req.input() == b"panic" {
                std::panic::panic_any(DELIBERATE);
            }
            out.extend_from_slice(b"fine")
        })
        .unwrap();
    for _ in 0..3 {
        let err = rt.call(Route::Cpu, flaky, b"panic").unwrap_err();
        assert_eq!(err.status(), Status::Internal);
    }
    // The workers survived the panics.
    assert_eq!(rt.call(Route::Cpu, flaky, b"ok").unwrap(), b"fine");
    assert_eq!(calls.load(Ordering::SeqCst), 4);
}

#[test]
fn client_mode_without_a_server_is_disconnected() {
    let config = Config::new()
        .mode(Mode::Client)
        .server_address("ipc:///nonexistent/chimaera.sock");
    assert_eq!(
        Runtime::new(&config).unwrap_err().status(),
        Status::Disconnected
    );
}

#[test]
fn wait_error_converts_for_question_mark() {
    fn run(rt: &Runtime, m: Method) -> Result<Vec<u8>, Error> {
        Ok(rt.submit(Route::Cpu, m, b"user")?.wait(None)?)
    }
    let rt = runtime();
    let m = rt
        .register_handler("test.always_fails", |_r, _o| Err(HandlerError::user(-1001)))
        .unwrap();
    let err = run(&rt, m).unwrap_err();
    assert_eq!(err.status(), Status::Handler(-1001));
    let boxed: Box<dyn std::error::Error> = Box::new(err);
    assert!(boxed.to_string().contains("-1001"));
}
