use std::ffi::CString;
use std::fmt;
use std::marker::{PhantomData, PhantomPinned};
use std::ops::Deref;
use std::os::raw::c_void;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr::{self, NonNull};
use std::sync::Mutex;
use std::time::Duration;

use chimaera_sys as sys;

use crate::config::Config;
use crate::error::{check, Error, Result, Status};
use crate::future::Future;
use crate::handler::{install_quiet_hook, trampoline, HandlerBox, HandlerError, Output, Request};
use crate::memory::{HostRegion, MemRef};

/// Where a task runs.
///
/// ```
/// use chimaera::Route;
///
/// assert_eq!(Route::Cpu.raw(), chimaera::sys::CHI_ROUTE_CPU);
/// assert_eq!(Route::from_raw(2), Some(Route::Gpu(2)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    /// A CPU worker (`CHI_ROUTE_CPU`).
    Cpu,
    /// Where the caller runs (`CHI_ROUTE_LOCAL`): a CPU worker from host code.
    Local,
    /// Any GPU orchestrator the runtime picks (`CHI_ROUTE_GPU_ANY`).
    GpuAny,
    /// The orchestrator of GPU number `n` (`CHI_ROUTE_GPU(n)`).
    Gpu(u32),
}

impl Route {
    /// The raw `chi_route_t`.  A GPU number beyond `i32::MAX` maps to
    /// `i32::MAX`, which the library rejects as out of range.
    pub fn raw(self) -> sys::chi_route_t {
        match self {
            Route::Cpu => sys::CHI_ROUTE_CPU,
            Route::Local => sys::CHI_ROUTE_LOCAL,
            Route::GpuAny => sys::CHI_ROUTE_GPU_ANY,
            Route::Gpu(n) => i32::try_from(n).unwrap_or(i32::MAX),
        }
    }

    /// The route for a raw `chi_route_t`, or `None` for values the library
    /// does not define.
    pub fn from_raw(raw: sys::chi_route_t) -> Option<Route> {
        match raw {
            sys::CHI_ROUTE_CPU => Some(Route::Cpu),
            sys::CHI_ROUTE_LOCAL => Some(Route::Local),
            sys::CHI_ROUTE_GPU_ANY => Some(Route::GpuAny),
            n if n >= 0 => Some(Route::Gpu(n as u32)),
            _ => None,
        }
    }
}

/// A method id: fixed for the runtime's life, found by name with
/// [`RuntimeRef::lookup`] or returned by [`Runtime::register_handler`].
///
/// ```
/// use chimaera::{Method, Runtime};
///
/// let rt = Runtime::with_defaults()?;
/// assert_eq!(rt.lookup("chi.echo")?, Method::ECHO);
/// # Ok::<(), chimaera::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Method(sys::chi_method_t);

impl Method {
    /// `chi.echo`: the output is the input.
    pub const ECHO: Method = Method(sys::CHI_METHOD_ECHO);
    /// `chi.add`: input two little-endian `u64`, output their `u64` sum.
    pub const ADD: Method = Method(sys::CHI_METHOD_ADD);
    /// `chi.checksum`: output the 64-bit FNV-1a of the input as a
    /// little-endian `u64`.
    pub const CHECKSUM: Method = Method(sys::CHI_METHOD_CHECKSUM);

    /// A method from its raw id (not checked here: submitting an id that was
    /// never registered on that runtime, or one of another runtime, fails
    /// with [`Status::NotFound`]; id 0 with [`Status::Invalid`]).
    pub const fn from_id(id: sys::chi_method_t) -> Method {
        Method(id)
    }

    /// The raw `chi_method_t`.
    pub const fn id(self) -> sys::chi_method_t {
        self.0
    }
}

/// A borrowed chimaera runtime: every operation except handler registration
/// and finalization.  [`Runtime`] dereferences to it; handlers reach it through
/// [`Request::runtime`].
///
/// `&RuntimeRef` is the C `chi_runtime_t *` itself (this type has no size).
///
/// # Thread safety
/// `RuntimeRef` is `Sync` (so `&RuntimeRef` is `Send`): the C API makes every
/// function this type calls thread-safe on one runtime.  The one call that is
/// not, `chi_finalize`, is only made by [`Runtime`], which needs exclusive
/// ownership for it, while no borrow of the runtime is alive.
pub struct RuntimeRef {
    _opaque: [u8; 0],
    // Neither Send nor Sync by default, not Unpin: the impls below are deliberate.
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}

// SAFETY: see "Thread safety" above; RuntimeRef is only ever used by shared
// reference, and the C runtime synchronizes internally.
unsafe impl Sync for RuntimeRef {}
unsafe impl Send for RuntimeRef {}

impl RuntimeRef {
    /// Borrows a runtime created by C code (for instance the `rt` handed to a
    /// module's `chimaera_module_init` written in Rust).
    ///
    /// # Safety
    /// `ptr` is a live runtime from `chi_init` that is not finalized during
    /// `'a`.
    pub unsafe fn from_ptr<'a>(ptr: *mut sys::chi_runtime_t) -> &'a RuntimeRef {
        &*(ptr as *const RuntimeRef)
    }

    /// The C handle, for calls to [`chimaera_sys`](crate::sys) functions.
    pub fn as_ptr(&self) -> *mut sys::chi_runtime_t {
        self as *const RuntimeRef as *mut sys::chi_runtime_t
    }

    /// Looks a method up by name (CPU and GPU methods alike).
    ///
    /// # Errors
    ///
    /// [`Status::NotFound`] for an unknown name, [`Status::Invalid`]
    /// for a name containing a NUL byte.
    ///
    /// # Examples
    ///
    /// ```
    /// # let rt = chimaera::Runtime::with_defaults()?;
    /// let add = rt.lookup("chi.add")?;
    /// assert_eq!(add, chimaera::Method::ADD);
    /// # Ok::<(), chimaera::Error>(())
    /// ```
    pub fn lookup(&self, name: &str) -> Result<Method> {
        let name = name_cstring(name)?;
        let mut id = 0;
        // SAFETY: valid runtime, NUL-terminated name, valid out-pointer.
        check(unsafe { sys::chi_method_lookup(self.as_ptr(), name.as_ptr(), &mut id) })?;
        Ok(Method(id))
    }

    /// Submits a task; the input is copied before this returns.
    ///
    /// # Errors
    ///
    /// [`Status::Invalid`] (bad route, GPU number out of range, method id
    /// 0), [`Status::NotFound`] (method never registered on this runtime, or
    /// a method of another runtime: refused, never run),
    /// [`Status::TooLarge`] (input over `max_inline_payload`),
    /// [`Status::Again`] (every task slot in use),
    /// [`Status::NoDevice`] (GPU route without a usable GPU),
    /// [`Status::Shutdown`].  A method with no handler on the chosen executor
    /// fails later, at [`Future::wait`], with [`Status::NotFound`].
    ///
    /// # Examples
    ///
    /// ```
    /// use chimaera::{Method, Route};
    /// # let rt = chimaera::Runtime::with_defaults()?;
    /// let future = rt.submit(Route::Cpu, Method::ECHO, b"ping")?;
    /// assert_eq!(future.wait(None)?, b"ping");
    /// # Ok::<(), chimaera::Error>(())
    /// ```
    pub fn submit(&self, route: Route, method: Method, input: &[u8]) -> Result<Future<'_>> {
        let mut id = 0;
        let data = if input.is_empty() {
            ptr::null()
        } else {
            input.as_ptr() as *const c_void
        };
        // SAFETY: valid runtime; `input` is readable for its length and copied
        // before chi_submit returns; valid out-pointer.
        check(unsafe {
            sys::chi_submit(
                self.as_ptr(),
                route.raw(),
                method.id(),
                data,
                input.len(),
                &mut id,
            )
        })?;
        // SAFETY: chi_submit issued `id` on this runtime and nothing consumed it.
        Ok(unsafe { Future::from_raw(self, id) })
    }

    /// Submits a task and waits for its output: [`submit`](Self::submit) then
    /// [`Future::wait`] with no timeout.
    ///
    /// # Errors
    ///
    /// Those of [`submit`](Self::submit), then the task's failure.
    ///
    /// # Examples
    ///
    /// ```
    /// use chimaera::{Method, Route};
    /// # let rt = chimaera::Runtime::with_defaults()?;
    /// let mut input = [0u8; 16];
    /// input[..8].copy_from_slice(&40u64.to_le_bytes());
    /// input[8..].copy_from_slice(&2u64.to_le_bytes());
    /// let sum = rt.call(Route::Cpu, Method::ADD, &input)?;
    /// assert_eq!(sum, 42u64.to_le_bytes());
    /// # Ok::<(), chimaera::Error>(())
    /// ```
    pub fn call(&self, route: Route, method: Method, input: &[u8]) -> Result<Vec<u8>> {
        Ok(self.submit(route, method, input)?.wait(None)?)
    }

    /// The number of GPUs this runtime drives (0 without a GPU backend, a GPU,
    /// or with [`Config::gpus(0)`](Config::gpus)).
    ///
    /// ```
    /// # let rt = chimaera::Runtime::new(&chimaera::Config::new().gpus(0))?;
    /// assert_eq!(rt.gpu_count(), 0);
    /// # Ok::<(), chimaera::Error>(())
    /// ```
    pub fn gpu_count(&self) -> u32 {
        let mut count = 0;
        // SAFETY: valid runtime and out-pointer; the only failure is a NULL argument.
        let status = unsafe { sys::chi_gpu_count(self.as_ptr(), &mut count) };
        if status == sys::CHI_OK {
            count.max(0) as u32
        } else {
            0
        }
    }

    /// Loads a module: a shared object whose `chimaera_module_init` registers
    /// its handlers.  It stays loaded until the runtime is finalized.
    ///
    /// # Errors
    ///
    /// [`Status::NotFound`] (cannot open, or no
    /// `chimaera_module_init`), [`Status::Invalid`] (path with a NUL byte), or
    /// the status the module's init function returned.
    ///
    /// # Examples
    ///
    /// ```
    /// # let rt = chimaera::Runtime::with_defaults()?;
    /// let err = rt.load_module("/nonexistent/module.so").unwrap_err();
    /// assert_eq!(err.status(), chimaera::Status::NotFound);
    /// # Ok::<(), chimaera::Error>(())
    /// ```
    pub fn load_module(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = CString::new(path.as_ref().as_os_str().as_bytes())
            .map_err(|_| Error::new(Status::Invalid, "module path contains a NUL byte"))?;
        // SAFETY: valid runtime and NUL-terminated path.
        check(unsafe { sys::chi_load_module(self.as_ptr(), path.as_ptr()) })
    }

    /// Registers host memory that tasks may reference by [`MemRef`]; the
    /// region is unregistered when the returned guard drops.  The memory stays
    /// mutably borrowed until then, because handlers may read and write it.
    ///
    /// # Errors
    ///
    /// [`Status::Invalid`] for an empty slice, [`Status::NoMem`] when
    /// the region table is full.
    ///
    /// # Examples
    ///
    /// ```
    /// # let rt = chimaera::Runtime::with_defaults()?;
    /// let mut data = vec![7u8; 64];
    /// let region = rt.register_host_mem(&mut data)?;
    /// let r = region.mem_ref(16, 8).expect("in range");
    /// let (ptr, place) = rt.resolve_mem(&r)?;
    /// assert_eq!(place, chimaera::Route::Cpu);
    /// assert_eq!(unsafe { *ptr.as_ptr() }, 7);
    /// # Ok::<(), chimaera::Error>(())
    /// ```
    pub fn register_host_mem<'m>(&self, mem: &'m mut [u8]) -> Result<HostRegion<'_, 'm>> {
        let mut region = 0;
        // SAFETY: valid runtime; `mem` stays alive and borrowed until the guard
        // unregisters it.
        check(unsafe {
            sys::chi_register_gpu_mem(
                self.as_ptr(),
                sys::CHI_ROUTE_CPU,
                mem.as_mut_ptr() as *mut c_void,
                mem.len(),
                &mut region,
            )
        })?;
        Ok(HostRegion::new(self, region, mem))
    }

    /// Registers device memory of GPU `gpu` and returns the region id; undo it
    /// with [`unregister_mem`](Self::unregister_mem).
    ///
    /// # Errors
    ///
    /// [`Status::Invalid`] (NULL pointer, size 0, pointer not on that
    /// GPU), [`Status::NoDevice`], [`Status::NoMem`].
    ///
    /// # Safety
    /// `device_ptr` points to `size` bytes of that GPU's memory, which stay
    /// allocated until the region is unregistered or the runtime finalized.
    pub unsafe fn register_gpu_mem(
        &self,
        gpu: u32,
        device_ptr: *mut c_void,
        size: usize,
    ) -> Result<u64> {
        let mut region = 0;
        check(sys::chi_register_gpu_mem(
            self.as_ptr(),
            Route::Gpu(gpu).raw(),
            device_ptr,
            size,
            &mut region,
        ))?;
        Ok(region)
    }

    /// Forgets a region registered with
    /// [`register_gpu_mem`](Self::register_gpu_mem); later references to it
    /// are rejected.
    ///
    /// # Errors
    ///
    /// [`Status::Invalid`] for an unknown region.
    pub fn unregister_mem(&self, region: u64) -> Result<()> {
        // SAFETY: valid runtime; the library checks the id.
        check(unsafe { sys::chi_unregister_mem(self.as_ptr(), region) })
    }

    /// Resolves a reference to registered memory: the address of its first
    /// byte, after checking that it lies inside its region, and where that
    /// memory lives ([`Route::Cpu`] or [`Route::Gpu`]).
    ///
    /// Dereferencing the pointer is up to the caller (`unsafe`): the memory is
    /// shared with whoever registered it and with other tasks.
    ///
    /// # Errors
    ///
    /// [`Status::Invalid`] (unknown region, range outside it).
    pub fn resolve_mem(&self, r: &MemRef) -> Result<(NonNull<u8>, Route)> {
        let raw = r.to_raw();
        let mut p = ptr::null_mut();
        let mut gpu = 0;
        // SAFETY: valid runtime and pointers.
        check(unsafe { sys::chi_mem_resolve(self.as_ptr(), &raw, &mut p, &mut gpu) })?;
        let p = NonNull::new(p as *mut u8)
            .ok_or_else(|| Error::new(Status::Internal, "chi_mem_resolve returned NULL"))?;
        Ok((p, Route::from_raw(gpu).unwrap_or(Route::Cpu)))
    }

    /// The device context of GPU `gpu`, to pass by value to kernels that use
    /// `chimaera_device.h` (`chi_gpu_context`).  Valid until the runtime is
    /// finalized: the kernels that use it must have finished by then.
    ///
    /// In a client ([`Mode::Client`](crate::Mode::Client)) it is the relay
    /// context of the process's own kernels on the server's GPU `gpu`, the
    /// client's CUDA device of the same number (run client and server with
    /// the same `CUDA_VISIBLE_DEVICES`): every route those kernels submit on
    /// goes through a relay in this process to the server, and
    /// [`Route::Cpu`] also reaches this runtime's own
    /// [`register_handler`](Runtime::register_handler) closures, which then
    /// see [`Request::source`] `Route::Gpu(gpu)` (docs/server.md, "Client
    /// kernels").  The first call for a GPU allocates the relay's memory and
    /// starts its threads, so make it before launching the kernels; later
    /// calls return the same context.
    ///
    /// # Errors
    ///
    /// [`Status::Invalid`] (`gpu` out of range: at or above
    /// [`gpu_count`](Self::gpu_count), the server's count in a client),
    /// [`Status::NoDevice`] (no such GPU; in a client: the server drives
    /// none, or this process sees no CUDA device `gpu`), [`Status::NoMem`].
    ///
    /// ```
    /// # let rt = chimaera::Runtime::new(&chimaera::Config::new().gpus(0))?;
    /// let err = rt.gpu_context(0).unwrap_err();
    /// assert_eq!(err.status(), chimaera::Status::NoDevice);
    /// # Ok::<(), chimaera::Error>(())
    /// ```
    pub fn gpu_context(&self, gpu: u32) -> Result<DevContext> {
        let mut ctx = sys::chi_dev_context_t { opaque: [0; 32] };
        // SAFETY: valid runtime and out-pointer.
        check(unsafe { sys::chi_gpu_context(self.as_ptr(), Route::Gpu(gpu).raw(), &mut ctx) })?;
        Ok(DevContext(ctx))
    }

    /// Stops the orchestrator kernel of GPU `gpu` (`None`: every GPU) so that
    /// device-wide synchronization (`cudaDeviceSynchronize`, `cudaFree`) can
    /// run; tasks submitted meanwhile wait for [`gpu_resume`](Self::gpu_resume).
    ///
    /// # Errors
    ///
    /// [`Status::Invalid`], [`Status::NoDevice`] (also always in a client:
    /// the orchestrators are the server's), [`Status::Internal`].
    pub fn gpu_pause(&self, gpu: Option<u32>) -> Result<()> {
        let g = gpu.map_or(-1, |g| Route::Gpu(g).raw());
        // SAFETY: valid runtime.
        check(unsafe { sys::chi_gpu_pause(self.as_ptr(), g) })
    }

    /// Relaunches orchestrators stopped by [`gpu_pause`](Self::gpu_pause).
    ///
    /// # Errors
    ///
    /// As [`gpu_pause`](Self::gpu_pause).
    pub fn gpu_resume(&self, gpu: Option<u32>) -> Result<()> {
        let g = gpu.map_or(-1, |g| Route::Gpu(g).raw());
        // SAFETY: valid runtime.
        check(unsafe { sys::chi_gpu_resume(self.as_ptr(), g) })
    }
}

impl fmt::Debug for RuntimeRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RuntimeRef").field(&self.as_ptr()).finish()
    }
}

/// A GPU's device context (`chi_dev_context_t`), a plain value that kernels
/// receive by value, from [`RuntimeRef::gpu_context`].
///
/// Kernels are CUDA/HIP code: hand the context to a launcher of your own
/// through FFI, as `&ctx.0` (`const chi_dev_context_t *`) or by value
/// (`ctx.0`), and have the launcher pass it to the kernel by value.  The
/// launch is `unsafe` in Rust: the kernels must finish before the runtime is
/// finalized.  `tests/gpu_client.rs` with `bindings/tests/client_kernel.cu`
/// shows one in a client process.
#[derive(Debug, Clone, Copy)]
#[repr(transparent)]
pub struct DevContext(pub sys::chi_dev_context_t);

/// An owned chimaera runtime: created by [`Runtime::new`], finalized on drop.
///
/// Everything but handler registration lives on [`RuntimeRef`], which this
/// type dereferences to.  Rust handlers are kept alive here until the C
/// runtime is finalized, so no task can call a freed closure.
///
/// ```
/// use chimaera::{Config, Method, Route, Runtime};
///
/// let rt = Runtime::new(&Config::new().num_workers(2))?;
/// let future = rt.submit(Route::Cpu, Method::CHECKSUM, b"abc")?;
/// let sum = future.wait(None)?;
/// assert_eq!(sum.len(), 8);
/// drop(rt); // chi_finalize: waits for in-flight tasks, joins the workers
/// # Ok::<(), chimaera::Error>(())
/// ```
///
/// # Thread safety
/// `Runtime` is `Send` and `Sync`: every C function it calls through `&self`
/// is thread-safe on one runtime, the handler list is behind a mutex, and
/// the handlers themselves are `Send + Sync`.  `chi_finalize`, the one
/// function that must not run concurrently with others, is only called from
/// `drop` or [`finalize`](Runtime::finalize), which own the runtime
/// exclusively; every [`Future`] and [`HostRegion`] borrows the runtime, so
/// none can outlive it.
pub struct Runtime {
    raw: NonNull<sys::chi_runtime_t>,
    // Boxed because each box's address is a handler's user_data and must not
    // move when the Vec grows.
    #[allow(clippy::vec_box)]
    handlers: Mutex<Vec<Box<HandlerBox>>>,
    finalized: bool,
}

// SAFETY: see "Thread safety" above.
unsafe impl Send for Runtime {}
unsafe impl Sync for Runtime {}

impl Runtime {
    /// Starts a runtime with the given options (`chi_init`).
    ///
    /// # Errors
    ///
    /// [`Status::Config`] (file unreadable, unknown key, value out of
    /// range: the message names file:line:column), [`Status::Invalid`],
    /// [`Status::NoDevice`] (more GPUs asked for than usable),
    /// [`Status::Disconnected`] (client mode, no server), [`Status::NoMem`],
    /// [`Status::Internal`].
    ///
    /// # Examples
    ///
    /// ```
    /// use chimaera::{Config, Runtime, Status};
    ///
    /// let err = Runtime::new(&Config::new().config_path("/nonexistent.yaml")).unwrap_err();
    /// assert_eq!(err.status(), Status::Config);
    /// ```
    pub fn new(config: &Config) -> Result<Runtime> {
        config.with_raw(|raw| {
            let mut rt = ptr::null_mut();
            // SAFETY: `raw` was filled by chi_config_init and its strings are alive.
            check(unsafe { sys::chi_init(raw, &mut rt) })?;
            let raw = NonNull::new(rt)
                .ok_or_else(|| Error::new(Status::Internal, "chi_init returned no runtime"))?;
            Ok(Runtime {
                raw,
                handlers: Mutex::new(Vec::new()),
                finalized: false,
            })
        })?
    }

    /// Starts a runtime with default options: `$CHI_CONFIG` if set, `CHI_*`
    /// environment variables, else built-in defaults.
    ///
    /// # Errors
    ///
    /// As [`new`](Runtime::new).
    ///
    /// # Examples
    ///
    /// ```
    /// let rt = chimaera::Runtime::with_defaults()?;
    /// # Ok::<(), chimaera::Error>(())
    /// ```
    pub fn with_defaults() -> Result<Runtime> {
        Runtime::new(&Config::new())
    }

    /// Registers a CPU handler under a unique name and returns its method id.
    ///
    /// The closure gets the task's [`Request`] and writes its result into the
    /// [`Output`] buffer in place; an `Err` reaches the waiter unchanged, and
    /// a panic is caught and reported as [`Status::Internal`] (it never
    /// unwinds into C).  A handler's panic is not printed: the first
    /// registration installs a panic hook that records it for
    /// [`last_handler_panic`](crate::last_handler_panic) and passes every
    /// other panic to the hook installed before (a hook the program sets
    /// later replaces it).  It runs on the runtime's worker threads, possibly on
    /// several at once.  It stays alive until the runtime is finalized.
    ///
    /// # Errors
    ///
    /// [`Status::Invalid`] (name not 1..127 bytes of printable ASCII,
    /// or already registered), [`Status::NoMem`] (method table full),
    /// [`Status::Shutdown`].
    ///
    /// # Examples
    ///
    /// ```
    /// use chimaera::{Route, Runtime};
    ///
    /// let rt = Runtime::with_defaults()?;
    /// let upper = rt.register_handler("example.upper", |req, out| {
    ///     for (dst, src) in out.extend_zeroed(req.input().len())?.iter_mut().zip(req.input()) {
    ///         *dst = src.to_ascii_uppercase();
    ///     }
    ///     Ok(())
    /// })?;
    /// assert_eq!(rt.call(Route::Cpu, upper, b"shout")?, b"SHOUT");
    /// # Ok::<(), chimaera::Error>(())
    /// ```
    pub fn register_handler<F>(&self, name: &str, handler: F) -> Result<Method>
    where
        F: Fn(&Request<'_>, &mut Output<'_>) -> std::result::Result<(), HandlerError>
            + Send
            + Sync
            + 'static,
    {
        let cname = name_cstring(name)?;
        install_quiet_hook();
        let hb = Box::new(HandlerBox {
            rt: self.raw,
            f: Box::new(handler),
        });
        let user_data = &*hb as *const HandlerBox as *mut c_void;
        let mut id = 0;
        // SAFETY: valid runtime and name; `user_data` points to the boxed
        // closure, which `self.handlers` keeps alive until after chi_finalize.
        check(unsafe {
            sys::chi_register_handler(
                self.raw.as_ptr(),
                cname.as_ptr(),
                Some(trampoline),
                user_data,
                &mut id,
            )
        })?;
        self.handlers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(hb);
        Ok(Method(id))
    }

    /// Finalizes the runtime now (`chi_finalize`) and reports its status;
    /// dropping the runtime does the same and ignores the status.  In-flight
    /// tasks run to completion first.
    ///
    /// # Errors
    ///
    /// The status of `chi_finalize` (for instance a failure to stop a GPU
    /// orchestrator); the runtime is gone either way.
    ///
    /// # Examples
    ///
    /// ```
    /// let rt = chimaera::Runtime::with_defaults()?;
    /// rt.finalize()?;
    /// # Ok::<(), chimaera::Error>(())
    /// ```
    pub fn finalize(mut self) -> Result<()> {
        self.finalize_inner()
    }

    fn finalize_inner(&mut self) -> Result<()> {
        if self.finalized {
            return Ok(());
        }
        self.finalized = true;
        // SAFETY: we own the runtime exclusively (by value or in drop); no
        // borrow of it, hence no Future or region guard, is alive.
        let status = unsafe { sys::chi_finalize(self.raw.as_ptr()) };
        let handlers = std::mem::take(self.handlers.get_mut().unwrap_or_else(|e| e.into_inner()));
        if status == sys::CHI_OK {
            // No task can call a handler any more.
            drop(handlers);
        } else {
            // The runtime may still be running (finalize from inside one of its
            // own handlers is refused): leak the closures rather than free them
            // under a live runtime.
            std::mem::forget(handlers);
        }
        check(status)
    }
}

impl Deref for Runtime {
    type Target = RuntimeRef;

    fn deref(&self) -> &RuntimeRef {
        // SAFETY: the runtime lives until drop, which needs `&mut self`.
        unsafe { RuntimeRef::from_ptr(self.raw.as_ptr()) }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        let _ = self.finalize_inner();
    }
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Runtime").field(&self.raw.as_ptr()).finish()
    }
}

fn name_cstring(name: &str) -> Result<CString> {
    CString::new(name).map_err(|_| Error::new(Status::Invalid, "name contains a NUL byte"))
}

/// Converts an optional timeout to the C convention (< 0: forever).
pub(crate) fn timeout_ns(timeout: Option<Duration>) -> i64 {
    match timeout {
        None => -1,
        Some(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
    }
}
