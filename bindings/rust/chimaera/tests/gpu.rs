//! GPU routes; each test prints a note and returns when no GPU is usable.

mod common;

use chimaera::{Config, Method, Route, Runtime, Status};
use common::{add_input, as_u64, fnv1a64};

fn gpu_runtime() -> Option<Runtime> {
    let rt = Runtime::new(&Config::new().all_gpus().num_workers(2)).expect("runtime starts");
    if rt.gpu_count() == 0 {
        eprintln!("no usable GPU (or a build without CUDA/HIP): skipping");
        return None;
    }
    Some(rt)
}

#[test]
fn builtins_on_every_gpu() {
    let rt = match gpu_runtime() {
        Some(rt) => rt,
        None => return,
    };
    let payload: Vec<u8> = (0..200u32).map(|i| i as u8).collect();
    for g in 0..rt.gpu_count() {
        let route = Route::Gpu(g);
        assert_eq!(
            rt.call(route, Method::ECHO, &payload).unwrap(),
            payload,
            "GPU {}",
            g
        );
        assert_eq!(
            as_u64(&rt.call(route, Method::ADD, &add_input(40, 2)).unwrap()),
            42
        );
        assert_eq!(
            as_u64(&rt.call(route, Method::CHECKSUM, &payload).unwrap()),
            fnv1a64(&payload)
        );
    }
    assert_eq!(
        rt.call(Route::GpuAny, Method::ECHO, b"any").unwrap(),
        b"any"
    );
}

#[test]
fn many_tasks_in_flight_on_a_gpu() {
    let rt = match gpu_runtime() {
        Some(rt) => rt,
        None => return,
    };
    let futures: Vec<_> = (0..256u64)
        .map(|i| {
            rt.submit(Route::GpuAny, Method::ADD, &add_input(i, 1000))
                .unwrap()
        })
        .collect();
    for (i, f) in futures.into_iter().enumerate() {
        assert_eq!(as_u64(&f.wait(None).unwrap()), i as u64 + 1000);
    }
}

#[test]
fn cpu_only_methods_are_not_found_on_a_gpu() {
    let rt = match gpu_runtime() {
        Some(rt) => rt,
        None => return,
    };
    let m = rt
        .register_handler("test.cpu_only", |_r, _o| Ok(()))
        .unwrap();
    let err = rt.call(Route::Gpu(0), m, b"").unwrap_err();
    assert_eq!(err.status(), Status::NotFound);
}

#[test]
fn context_pause_resume_and_range_checks() {
    let rt = match gpu_runtime() {
        Some(rt) => rt,
        None => return,
    };
    let n = rt.gpu_count();
    rt.gpu_context(0).unwrap();
    assert_eq!(rt.gpu_context(n).unwrap_err().status(), Status::Invalid);
    assert_eq!(
        rt.submit(Route::Gpu(n), Method::ECHO, b"")
            .unwrap_err()
            .status(),
        Status::Invalid
    );

    rt.gpu_pause(Some(0)).unwrap();
    let queued = rt.submit(Route::Gpu(0), Method::ECHO, b"paused").unwrap();
    rt.gpu_resume(Some(0)).unwrap();
    assert_eq!(queued.wait(None).unwrap(), b"paused");
    rt.gpu_pause(None).unwrap();
    rt.gpu_resume(None).unwrap();
    assert_eq!(
        rt.call(Route::Gpu(0), Method::ECHO, b"again").unwrap(),
        b"again"
    );
}
