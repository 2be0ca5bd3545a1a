//! Kernels of a client process (docs/server.md, "Client kernels"): in client
//! mode, `gpu_context` gives the relay context, and a CUDA kernel that gets it
//! submits to the server from the device.
//!
//! Runs in client mode only (`CHI_MODE=client`, `CHI_SERVER_ADDRESS`, as
//! tests/run_with_server.sh sets them: ctest's rust_gpu_client with a server
//! that drives every GPU, and rust_cargo_test_client with one that drives
//! none), else it prints a note and returns.  Against a server that drives no GPU it
//! checks the refusals; against one with GPUs it also runs the kernels of
//! `$CHI_TEST_CLIENT_KERNEL` (libchi_bindings_client_kernel.so, built from
//! bindings/tests/client_kernel.cu in CUDA builds, opened with dlopen so that
//! cargo needs no nvcc).  With `CHI_TEST_REQUIRE_GPU=1` (the GPU machine,
//! lab/lab recipe bindings) a missing GPU or kernel library fails instead.

mod common;

use std::ffi::{CStr, CString};
use std::os::raw::{c_char, c_int, c_void};

use chimaera::{sys, Config, DevContext, HandlerError, Method, Mode, Route, Runtime, Status};

extern "C" {
    fn dlopen(filename: *const c_char, flag: c_int) -> *mut c_void;
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    fn dlerror() -> *mut c_char;
}
const RTLD_NOW: c_int = 2;

type DeviceCountFn = unsafe extern "C" fn() -> i32;
type RoutesFn = unsafe extern "C" fn(
    ctx: *const sys::chi_dev_context_t,
    gpu: i32,
    add: u32,
    echo: u32,
    mine: u32,
    blocks: u32,
    threads: u32,
    iters: u32,
    counts: *mut i64,
) -> i32;
type EdgesFn = unsafe extern "C" fn(
    ctx: *const sys::chi_dev_context_t,
    gpu: i32,
    add: u32,
    mine: u32,
    ngpus: i32,
    res: *mut i32,
) -> i32;

/// The entry points of bindings/tests/client_kernel.cu.
struct Kernels {
    device_count: DeviceCountFn,
    routes: RoutesFn,
    edges: EdgesFn,
}

fn require_gpu() -> bool {
    std::env::var("CHI_TEST_REQUIRE_GPU").map_or(false, |v| v == "1")
}

/// A skip: a note, or a failure where the GPU machine requires the case.
fn skip(why: &str) {
    assert!(!require_gpu(), "CHI_TEST_REQUIRE_GPU=1 but {}", why);
    eprintln!("{}: skipping", why);
}

fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string of its own.
    let e = unsafe { dlerror() };
    if e.is_null() {
        "unknown dlopen error".to_string()
    } else {
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// Opens `$CHI_TEST_CLIENT_KERNEL`; None when unset, a panic when it does not load.
fn kernels() -> Option<Kernels> {
    let path = std::env::var("CHI_TEST_CLIENT_KERNEL")
        .ok()
        .filter(|p| !p.is_empty())?;
    let cpath = CString::new(path.clone()).expect("path without NUL");
    // SAFETY: a NUL-terminated path; the library stays loaded for the process.
    let lib = unsafe { dlopen(cpath.as_ptr(), RTLD_NOW) };
    assert!(!lib.is_null(), "dlopen {}: {}", path, dl_error());
    let sym = |name: &str| {
        let cname = CString::new(name).unwrap();
        // SAFETY: a live handle and a NUL-terminated name.
        let p = unsafe { dlsym(lib, cname.as_ptr()) };
        assert!(!p.is_null(), "dlsym {} in {}: {}", name, path, dl_error());
        p
    };
    // SAFETY: the symbols are the extern "C" functions of client_kernel.cu,
    // whose signatures the types above repeat.
    unsafe {
        Some(Kernels {
            device_count: std::mem::transmute::<*mut c_void, DeviceCountFn>(sym("ck_device_count")),
            routes: std::mem::transmute::<*mut c_void, RoutesFn>(sym("ck_routes")),
            edges: std::mem::transmute::<*mut c_void, EdgesFn>(sym("ck_edges")),
        })
    }
}

/// A client runtime on the server of CHI_SERVER_ADDRESS, or None (a note)
/// outside client mode.
fn client() -> Option<Runtime> {
    if !common::client_mode() {
        skip("not in client mode (CHI_MODE=client, CHI_SERVER_ADDRESS: tests/run_with_server.sh)");
        return None;
    }
    Some(Runtime::new(&Config::new().mode(Mode::Client)).expect("client connects"))
}

/// The handler the kernel calls on CHI_ROUTE_CPU: run by the client's relay,
/// with the kernel's GPU as the source; input a u64 v, output 3 * v.
fn register_triple(rt: &Runtime) -> Method {
    rt.register_handler("rust.triple", |req, out| {
        if req.source() != Route::Gpu(0) {
            return Err(HandlerError::user(-1001));
        }
        let v = u64::from_le_bytes(req.input().try_into().map_err(|_| Status::Invalid)?);
        out.extend_from_slice(&v.wrapping_mul(3).to_le_bytes())
    })
    .expect("register rust.triple")
}

#[test]
fn client_gpu_context_statuses() {
    let rt = match client() {
        Some(rt) => rt,
        None => return,
    };
    let n = rt.gpu_count();
    // The orchestrators are the server's: a client pauses none.
    assert_eq!(rt.gpu_pause(None).unwrap_err().status(), Status::NoDevice);
    assert_eq!(rt.gpu_resume(None).unwrap_err().status(), Status::NoDevice);
    if n == 0 {
        let err = rt.gpu_context(0).unwrap_err();
        assert_eq!(err.status(), Status::NoDevice, "{}", err);
        skip("the server drives no GPU (checked: gpu_context, gpu_pause and gpu_resume refuse)");
        return;
    }
    assert_eq!(rt.gpu_context(n).unwrap_err().status(), Status::Invalid);
    assert_eq!(
        rt.gpu_pause(Some(0)).unwrap_err().status(),
        Status::NoDevice
    );
    let first = rt.gpu_context(0).expect("the relay context of GPU 0");
    let again = rt.gpu_context(0).expect("the same context again");
    assert_eq!(
        first.0.opaque, again.0.opaque,
        "later calls give the same context"
    );
}

#[test]
fn client_kernel_submits_to_the_server() {
    let rt = match client() {
        Some(rt) => rt,
        None => return,
    };
    // Opened first, so that a build without a GPU checks that it loads.
    let k = kernels();
    let ngpus = rt.gpu_count();
    if ngpus == 0 {
        skip("the server drives no GPU");
        return;
    }
    let k = match k {
        Some(k) => k,
        None => {
            skip("CHI_TEST_CLIENT_KERNEL names no kernel library");
            return;
        }
    };
    // SAFETY: no arguments.
    if unsafe { (k.device_count)() } == 0 {
        skip("this process sees no CUDA device");
        return;
    }
    let mine = register_triple(&rt);
    let ctx: DevContext = rt.gpu_context(0).expect("the relay context of GPU 0");

    let (blocks, threads, iters) = (8u32, 128u32, 24u32);
    let mut counts = [0i64; 4];
    // SAFETY: a context of this live runtime; ck_routes waits for its kernel
    // before it returns, so nothing uses the context after `rt` drops.
    let e = unsafe {
        (k.routes)(
            &ctx.0,
            0,
            Method::ADD.id(),
            Method::ECHO.id(),
            mine.id(),
            blocks,
            threads,
            iters,
            counts.as_mut_ptr(),
        )
    };
    let want = i64::from(blocks * threads * iters);
    eprintln!(
        "# client kernel: {} of {} tasks right (wrong: {}, first: case {} status {})",
        counts[0], want, counts[1], counts[2], counts[3]
    );
    assert_eq!(e, 0, "cudaError_t of the routes kernel");
    assert_eq!(counts[0], want, "every task right: {:?}", counts);

    let mut res = [0i32; 9];
    // SAFETY: as above.
    let e = unsafe {
        (k.edges)(
            &ctx.0,
            0,
            Method::ADD.id(),
            mine.id(),
            ngpus as i32,
            res.as_mut_ptr(),
        )
    };
    assert_eq!(e, 0, "cudaError_t of the edges kernel");
    let expect = [
        Status::Invalid.code(),
        Status::Invalid.code(),
        Status::NoDevice.code(),
        Status::TooLarge.code(),
        Status::NotFound.code(),
        Status::NotFound.code(),
        0,
        0,
        0,
    ];
    eprintln!("# client kernel refusals: {:?} (want {:?})", res, expect);
    assert_eq!(res, expect);
    rt.finalize().expect("finalize after the kernels");
}
