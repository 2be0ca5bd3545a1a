//! CPU routes: built-in methods, Rust handlers, futures and registered memory.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chimaera::{MemRef, Method, Route, Runtime, Status, WaitError};
use common::{add_input, as_u64, fnv1a64, runtime, runtime_with, Gate};

#[test]
fn builtin_ids_match_the_header() {
    let rt = runtime();
    assert_eq!(rt.lookup("chi.echo").unwrap(), Method::ECHO);
    assert_eq!(rt.lookup("chi.add").unwrap(), Method::ADD);
    assert_eq!(rt.lookup("chi.checksum").unwrap(), Method::CHECKSUM);
}

#[test]
fn versions_agree() {
    assert_eq!(chimaera::version(), chimaera::VERSION_NUMBER);
    assert_eq!(
        chimaera::version_string(),
        format!(
            "{}.{}.{}",
            chimaera::VERSION_MAJOR,
            chimaera::VERSION_MINOR,
            chimaera::VERSION_PATCH
        )
    );
}

#[test]
fn echo_on_cpu_and_local_routes() {
    let rt = runtime();
    for route in [Route::Cpu, Route::Local] {
        for len in [0usize, 1, 8, 511, 512, 513, 4000] {
            let input: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let out = rt
                .submit(route, Method::ECHO, &input)
                .unwrap()
                .wait(None)
                .unwrap();
            assert_eq!(out, input, "route {:?}, {} bytes", route, len);
        }
    }
}

#[test]
fn add_sums_and_wraps() {
    let rt = runtime();
    for (a, b) in [(0u64, 0u64), (40, 2), (u64::MAX, 1), (1 << 40, 1 << 41)] {
        let out = rt.call(Route::Cpu, Method::ADD, &add_input(a, b)).unwrap();
        assert_eq!(as_u64(&out), a.wrapping_add(b));
    }
}

#[test]
fn checksum_is_fnv1a() {
    let rt = runtime();
    for input in [&b""[..], b"a", b"chimaera", &[0xffu8; 1000][..]] {
        let out = rt.call(Route::Cpu, Method::CHECKSUM, input).unwrap();
        assert_eq!(as_u64(&out), fnv1a64(input));
    }
}

#[test]
fn closure_handler_sees_request_and_writes_output() {
    let rt = runtime();
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&calls);
    let reverse = rt
        .register_handler("test.reverse", move |req, out| {
            seen.fetch_add(1, Ordering::SeqCst);
            assert_eq!(req.source(), Route::Cpu);
            for (dst, src) in out
                .extend_zeroed(req.input().len())?
                .iter_mut()
                .zip(req.input().iter().rev())
            {
                *dst = *src;
            }
            Ok(())
        })
        .unwrap();
    assert!(reverse.id() > Method::CHECKSUM.id());
    assert_eq!(rt.lookup("test.reverse").unwrap(), reverse);
    assert_eq!(rt.call(Route::Cpu, reverse, b"abcdef").unwrap(), b"fedcba");
    assert_eq!(rt.call(Route::Cpu, reverse, b"").unwrap(), b"");
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    let method_seen = rt
        .register_handler("test.method_id", |req, out| {
            out.extend_from_slice(&req.method().id().to_le_bytes())
        })
        .unwrap();
    let out = rt.call(Route::Cpu, method_seen, b"").unwrap();
    assert_eq!(out, method_seen.id().to_le_bytes());
}

#[test]
fn output_capacity_is_the_inline_limit() {
    let rt = runtime_with(2, "max_inline_payload: 1024\n");
    let cap = rt
        .register_handler("test.capacity", |_req, out| {
            let cap = out.capacity() as u64;
            out.extend_from_slice(&cap.to_le_bytes())
        })
        .unwrap();
    assert_eq!(as_u64(&rt.call(Route::Cpu, cap, b"").unwrap()), 1024);

    // Writing exactly the capacity works; the Vec grows past the stack buffer.
    let fill = rt
        .register_handler("test.fill", |_req, out| {
            let n = out.remaining();
            out.extend_zeroed(n)?.fill(0xab);
            Ok(())
        })
        .unwrap();
    assert_eq!(rt.call(Route::Cpu, fill, b"").unwrap(), vec![0xab; 1024]);
}

#[test]
fn io_write_into_output() {
    use std::io::Write;
    let rt = runtime();
    let fmt = rt
        .register_handler("test.format", |req, out| {
            write!(out, "{} bytes", req.input().len())?;
            Ok(())
        })
        .unwrap();
    assert_eq!(rt.call(Route::Cpu, fmt, b"xyz").unwrap(), b"3 bytes");
}

#[test]
fn wait_into_reports_the_size_needed_and_keeps_the_future() {
    let rt = runtime();
    let future = rt.submit(Route::Cpu, Method::ECHO, &[9u8; 100]).unwrap();
    let mut small = [0u8; 10];
    let future = match future.wait_into(&mut small, None) {
        Err(WaitError::BufferTooSmall { future, needed }) => {
            assert_eq!(needed, 100);
            future
        }
        other => panic!("expected BufferTooSmall, got {:?}", other),
    };
    assert!(future.test().unwrap());
    let mut buf = [0u8; 128];
    assert_eq!(future.wait_into(&mut buf, None).unwrap(), 100);
    assert_eq!(&buf[..100], &[9u8; 100][..]);
}

#[test]
fn timeout_returns_the_future_to_wait_again() {
    let rt = runtime();
    let gate = Arc::new(Gate::default());
    let g = Arc::clone(&gate);
    let slow = rt
        .register_handler("test.slow", move |req, out| {
            g.wait();
            out.extend_from_slice(req.input())
        })
        .unwrap();
    let future = rt.submit(Route::Cpu, slow, b"late").unwrap();
    let future = match future.wait(Some(Duration::from_millis(20))) {
        Err(WaitError::Timeout(f)) => f,
        other => panic!("expected a timeout, got {:?}", other),
    };
    let future = match future.wait(Some(Duration::ZERO)) {
        Err(e @ WaitError::Timeout(_)) => {
            assert_eq!(e.status(), Status::Timeout);
            e.into_future().unwrap()
        }
        other => panic!("expected a timeout, got {:?}", other),
    };
    assert!(!future.test().unwrap());
    gate.open();
    assert_eq!(future.wait(None).unwrap(), b"late");
}

#[test]
fn dropped_and_released_futures_free_their_slots() {
    // Two slots and no blocking: a future that kept its slot would make a
    // later submit fail with Again.
    let rt = runtime_with(1, "queue_depth: 2\nsubmit_blocking: false\n");
    let ran = Arc::new(AtomicUsize::new(0));
    let r = Arc::clone(&ran);
    let count = rt
        .register_handler("test.count", move |_req, _out| {
            r.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
        .unwrap();
    for i in 0..200 {
        let f = loop {
            match rt.submit(Route::Cpu, count, b"") {
                Ok(f) => break f,
                // Released tasks still have to run before their slots come back.
                Err(e) if e.status() == Status::Again => std::thread::yield_now(),
                Err(e) => panic!("submit: {}", e),
            }
        };
        if i % 2 == 0 {
            drop(f);
        } else {
            f.release().unwrap();
        }
    }
    drop(rt); // finalize runs every queued task
    assert_eq!(ran.load(Ordering::SeqCst), 200);
}

#[test]
fn handlers_live_until_the_runtime_is_finalized() {
    struct SetOnDrop(Arc<AtomicBool>);
    impl Drop for SetOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let dropped = Arc::new(AtomicBool::new(false));
    let rt = runtime();
    let guard = SetOnDrop(Arc::clone(&dropped));
    let m = rt
        .register_handler("test.guarded", move |_req, out| {
            let _ = &guard;
            out.extend_from_slice(b"ok")
        })
        .unwrap();
    assert_eq!(rt.call(Route::Cpu, m, b"").unwrap(), b"ok");
    assert!(!dropped.load(Ordering::SeqCst));
    rt.finalize().unwrap();
    assert!(dropped.load(Ordering::SeqCst));
}

#[test]
fn handler_submits_a_subtask() {
    let rt = runtime();
    let outer = rt
        .register_handler("test.outer", |req, out| {
            let inner = req
                .runtime()
                .submit(Route::Cpu, Method::CHECKSUM, req.input())?;
            let sum = inner.wait(None)?;
            out.extend_from_slice(&sum)
        })
        .unwrap();
    let out = rt.call(Route::Cpu, outer, b"nested").unwrap();
    assert_eq!(as_u64(&out), fnv1a64(b"nested"));
}

#[test]
fn host_memory_by_reference() {
    let rt = runtime();
    // Sums the bytes a MemRef in the input points at.
    let sum = rt
        .register_handler("test.sum_ref", |req, out| {
            let r = MemRef::from_bytes(req.input()).ok_or(Status::Invalid)?;
            let (ptr, place) = req.runtime().resolve_mem(&r)?;
            assert_eq!(place, Route::Cpu);
            // SAFETY: the region stays registered until the task is waited on.
            let bytes = unsafe { std::slice::from_raw_parts(ptr.as_ptr(), r.length as usize) };
            let total: u64 = bytes.iter().map(|&b| u64::from(b)).sum();
            out.extend_from_slice(&total.to_le_bytes())
        })
        .unwrap();
    let mut data: Vec<u8> = (0..=255).collect();
    let region = rt.register_host_mem(&mut data).unwrap();
    let r = region.mem_ref(10, 5).unwrap();
    assert_eq!(
        as_u64(&rt.call(Route::Cpu, sum, &r.to_bytes()).unwrap()),
        10 + 11 + 12 + 13 + 14
    );
    let whole = region.whole();
    assert_eq!(
        as_u64(&rt.call(Route::Cpu, sum, &whole.to_bytes()).unwrap()),
        255 * 256 / 2
    );

    // A range past the end is refused by the library as well.
    let outside = MemRef {
        length: 257,
        ..whole
    };
    let err = rt.call(Route::Cpu, sum, &outside.to_bytes()).unwrap_err();
    assert_eq!(err.status(), Status::Invalid);

    let id = region.id();
    region.unregister().unwrap();
    let err = rt
        .resolve_mem(&MemRef {
            region: id,
            offset: 0,
            length: 1,
        })
        .unwrap_err();
    assert_eq!(err.status(), Status::Invalid);
    data[0] = 1; // the borrow ended with the region
}

#[test]
fn several_runtimes_side_by_side() {
    let a = runtime();
    let b = runtime();
    let ma = a
        .register_handler("test.same_name", |_r, out| out.extend_from_slice(b"a"))
        .unwrap();
    let mb = b
        .register_handler("test.same_name", |_r, out| out.extend_from_slice(b"b"))
        .unwrap();
    assert_eq!(a.call(Route::Cpu, ma, b"").unwrap(), b"a");
    assert_eq!(b.call(Route::Cpu, mb, b"").unwrap(), b"b");
}

#[test]
fn default_runtime_starts() {
    let rt = Runtime::with_defaults().unwrap();
    assert_eq!(rt.call(Route::Cpu, Method::ECHO, b"x").unwrap(), b"x");
}
