use std::cell::Cell;
use std::fmt;
use std::io;
use std::marker::PhantomData;
use std::os::raw::c_void;
use std::panic::{self, AssertUnwindSafe};
use std::ptr::{self, NonNull};
use std::slice;
use std::sync::{Mutex, Once};

use chimaera_sys as sys;

use crate::batch::{SubmitBatchError, WaitBatchError};
use crate::error::{Error, Status};
use crate::future::WaitError;
use crate::runtime::{Method, Route, RuntimeRef};

/// The closure type behind every Rust handler.
pub(crate) type HandlerFn =
    dyn Fn(&Request<'_>, &mut Output<'_>) -> Result<(), HandlerError> + Send + Sync + 'static;

/// What the C runtime's `user_data` points to: the closure and the runtime it
/// was registered on.  Owned by [`Runtime`](crate::Runtime) until after
/// `chi_finalize`.
pub(crate) struct HandlerBox {
    pub(crate) rt: NonNull<sys::chi_runtime_t>,
    pub(crate) f: Box<HandlerFn>,
}

/// A task as its handler sees it: the method, the caller and the input bytes.
///
/// ```
/// use chimaera::{Route, Runtime};
///
/// let rt = Runtime::with_defaults()?;
/// let len = rt.register_handler("example.len", |req, out| {
///     assert_eq!(req.source(), Route::Cpu); // a host caller
///     out.extend_from_slice(&(req.input().len() as u64).to_le_bytes())
/// })?;
/// let reply = rt.call(Route::Cpu, len, b"12345")?;
/// assert_eq!(reply, 5u64.to_le_bytes());
/// # Ok::<(), chimaera::Error>(())
/// ```
pub struct Request<'a> {
    method: Method,
    source: sys::chi_route_t,
    input: &'a [u8],
    rt: &'a RuntimeRef,
}

impl<'a> Request<'a> {
    /// The method being run.
    pub fn method(&self) -> Method {
        self.method
    }

    /// Who submitted the task: [`Route::Cpu`] for host code, [`Route::Gpu`]
    /// for a kernel on that GPU.
    pub fn source(&self) -> Route {
        Route::from_raw(self.source).unwrap_or(Route::Cpu)
    }

    /// The task's input bytes, valid for the duration of the call.
    pub fn input(&self) -> &'a [u8] {
        self.input
    }

    /// The runtime running this task, for submitting subtasks or resolving
    /// registered memory.  Waiting on subtasks from a handler occupies a
    /// worker; see docs/threading.md for the rules that avoid deadlock.
    pub fn runtime(&self) -> &'a RuntimeRef {
        self.rt
    }
}

/// The output buffer of a task, written in place (no allocation).
///
/// Its capacity is the runtime's inline payload limit (`max_inline_payload`,
/// 4 KiB by default).  Writes that do not fit fail with
/// [`Status::TooLarge`] and write nothing.  It also implements
/// [`std::io::Write`].
///
/// ```
/// use std::io::Write;
/// use chimaera::{Route, Runtime};
///
/// let rt = Runtime::with_defaults()?;
/// let greet = rt.register_handler("example.greet", |req, out| {
///     write!(out, "hello, {}", String::from_utf8_lossy(req.input()))?;
///     Ok(())
/// })?;
/// assert_eq!(rt.call(Route::Cpu, greet, b"rust")?, b"hello, rust");
/// # Ok::<(), chimaera::Error>(())
/// ```
pub struct Output<'a> {
    ptr: *mut u8,
    capacity: usize,
    len: usize,
    _buf: PhantomData<&'a mut [u8]>,
}

impl<'a> Output<'a> {
    /// Bytes the buffer can hold in all.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing was written yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes that can still be written.
    pub fn remaining(&self) -> usize {
        self.capacity - self.len
    }

    /// The bytes written so far.
    pub fn as_slice(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: the first `len` bytes lie in the buffer and were initialized.
        unsafe { slice::from_raw_parts(self.ptr, self.len) }
    }

    /// Appends `bytes`.
    ///
    /// # Errors
    ///
    /// [`Status::TooLarge`] (and nothing written) when they do not fit.
    pub fn extend_from_slice(&mut self, bytes: &[u8]) -> Result<(), HandlerError> {
        let dst = self.extend_uninit(bytes.len())?;
        // SAFETY: `dst` is valid for bytes.len() writes and cannot overlap the input.
        unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), dst, bytes.len()) };
        Ok(())
    }

    /// Appends `n` zero bytes and returns them to be filled in place.
    ///
    /// # Errors
    ///
    /// [`Status::TooLarge`] (and nothing appended) when they do not fit.
    pub fn extend_zeroed(&mut self, n: usize) -> Result<&mut [u8], HandlerError> {
        let dst = self.extend_uninit(n)?;
        if n == 0 {
            return Ok(&mut []);
        }
        // SAFETY: `dst` is valid for `n` bytes, which are initialized here first.
        unsafe {
            ptr::write_bytes(dst, 0, n);
            Ok(slice::from_raw_parts_mut(dst, n))
        }
    }

    /// Forgets everything written.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    fn extend_uninit(&mut self, n: usize) -> Result<*mut u8, HandlerError> {
        if n > self.remaining() {
            return Err(HandlerError::from(Status::TooLarge));
        }
        let dst = if n == 0 {
            self.ptr
        } else {
            self.ptr.wrapping_add(self.len)
        };
        self.len += n;
        Ok(dst)
    }
}

impl io::Write for Output<'_> {
    /// Writes all of `buf`, or nothing and an error of kind `WriteZero` when
    /// it does not fit.
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.extend_from_slice(buf)
            .map(|_| buf.len())
            .map_err(|_| io::Error::new(io::ErrorKind::WriteZero, "task output buffer full"))
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl fmt::Debug for Output<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Output")
            .field("len", &self.len)
            .field("capacity", &self.capacity)
            .finish()
    }
}

impl fmt::Debug for Request<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Request")
            .field("method", &self.method)
            .field("source", &self.source())
            .field("input_len", &self.input.len())
            .finish()
    }
}

/// The status a handler fails with; the waiter's
/// [`Future::wait`](crate::Future::wait) returns it unchanged.
///
/// Build it from a library [`Status`] (`Status::Invalid.into()`), from an
/// [`Error`] (so `?` works on chimaera calls inside a handler), or with
/// [`HandlerError::user`] for the handler's own codes.
///
/// ```
/// use chimaera::{HandlerError, Route, Runtime, Status};
///
/// let rt = Runtime::with_defaults()?;
/// let picky = rt.register_handler("example.picky", |req, _out| {
///     if req.input().is_empty() {
///         return Err(HandlerError::user(-1001));
///     }
///     Ok(())
/// })?;
/// let err = rt.call(Route::Cpu, picky, b"").unwrap_err();
/// assert_eq!(err.status(), Status::Handler(-1001));
/// assert_eq!(rt.call(Route::Cpu, picky, b"x")?, b"");
/// # Ok::<(), chimaera::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HandlerError {
    code: sys::chi_status_t,
}

impl HandlerError {
    /// A handler-defined code, which must be at or below
    /// `CHI_ERR_USER_BASE` (-1000); the waiter sees
    /// [`Status::Handler(code)`](Status::Handler).
    ///
    /// # Panics
    /// If `code` is above -1000 (library statuses come from [`Status`]).
    pub const fn user(code: i32) -> HandlerError {
        assert!(
            code <= sys::CHI_ERR_USER_BASE,
            "handler codes must be <= -1000"
        );
        HandlerError { code }
    }

    /// The raw status code returned to the runtime.
    pub fn code(&self) -> sys::chi_status_t {
        self.code
    }

    /// The status the waiter will see.
    pub fn status(&self) -> Status {
        Status::from_code(self.code).unwrap_or(Status::Internal)
    }
}

impl From<Status> for HandlerError {
    /// The status as a handler failure; a non-negative
    /// [`Status::Unknown`] code, which would read as success, becomes
    /// [`Status::Internal`].
    fn from(status: Status) -> HandlerError {
        let code = status.code();
        HandlerError {
            code: if code < 0 {
                code
            } else {
                sys::CHI_ERR_INTERNAL
            },
        }
    }
}

impl From<Error> for HandlerError {
    fn from(err: Error) -> HandlerError {
        HandlerError::from(err.status())
    }
}

impl From<WaitError<'_>> for HandlerError {
    /// The wait's status (a subtask's timeout becomes [`Status::Timeout`]).
    fn from(err: WaitError<'_>) -> HandlerError {
        HandlerError::from(err.status())
    }
}

impl From<SubmitBatchError<'_>> for HandlerError {
    /// The status of the subtask that could not be submitted (the futures
    /// of those before it are released).
    fn from(err: SubmitBatchError<'_>) -> HandlerError {
        HandlerError::from(err.status())
    }
}

impl From<WaitBatchError<'_>> for HandlerError {
    /// The batched wait's stop status (the futures left are released).
    fn from(err: WaitBatchError<'_>) -> HandlerError {
        HandlerError::from(err.status())
    }
}

impl From<io::Error> for HandlerError {
    /// `WriteZero` (a full [`Output`]) becomes [`Status::TooLarge`], anything
    /// else [`Status::Internal`].
    fn from(err: io::Error) -> HandlerError {
        match err.kind() {
            io::ErrorKind::WriteZero => Status::TooLarge.into(),
            _ => Status::Internal.into(),
        }
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "handler failed: {}", self.status())
    }
}

impl std::error::Error for HandlerError {}

thread_local! {
    // Depth of Rust handler calls on this thread's stack (a waiting worker
    // may run another handler nested inside one).
    static IN_HANDLER: Cell<u32> = Cell::new(0);
}

static QUIET_HOOK: Once = Once::new();
static LAST_PANIC: Mutex<Option<String>> = Mutex::new(None);

/// Installs, once per process, a panic hook that keeps handler panics quiet:
/// a panic inside a Rust handler is recorded (see [`last_handler_panic`])
/// instead of printed by the hook that was installed before, which still
/// sees every other panic.  A hook the program sets later replaces this
/// one, and handler panics are then printed as that hook decides.
pub(crate) fn install_quiet_hook() {
    QUIET_HOOK.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if IN_HANDLER.with(|d| d.get()) == 0 {
                previous(info);
                return;
            }
            let what = if let Some(s) = info.payload().downcast_ref::<&str>() {
                (*s).to_owned()
            } else if let Some(s) = info.payload().downcast_ref::<String>() {
                s.clone()
            } else {
                "a non-string payload".to_owned()
            };
            let text = match info.location() {
                Some(l) => format!(
                    "handler panicked at {}:{}:{}: {}",
                    l.file(),
                    l.line(),
                    l.column(),
                    what
                ),
                None => format!("handler panicked: {}", what),
            };
            *LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner()) = Some(text);
        }));
    });
}

/// The message and location of the most recent panic of a Rust handler in
/// this process, if any handler panicked.
///
/// A panicking handler's task ends with [`Status::Internal`] at its waiter;
/// the panic is not printed (the default hook would print it from a worker
/// thread, in the middle of the program's own output).  This keeps its text
/// for a log or a test.
///
/// ```
/// use chimaera::{Route, Runtime, Status};
///
/// let rt = Runtime::with_defaults()?;
/// let m = rt.register_handler("example.panics", |_, _| panic!("bad input"))?;
/// let err = rt.call(Route::Cpu, m, b"").unwrap_err();
/// assert_eq!(err.status(), Status::Internal);
/// assert!(chimaera::last_handler_panic().unwrap().contains("bad input"));
/// # Ok::<(), chimaera::Error>(())
/// ```
pub fn last_handler_panic() -> Option<String> {
    LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Counts this thread into a handler call until dropped (also on unwind).
struct HandlerScope;

impl HandlerScope {
    fn enter() -> HandlerScope {
        IN_HANDLER.with(|d| d.set(d.get() + 1));
        HandlerScope
    }
}

impl Drop for HandlerScope {
    fn drop(&mut self) {
        IN_HANDLER.with(|d| d.set(d.get().saturating_sub(1)));
    }
}

/// The `chi_handler_t` behind every Rust handler.  A panic never crosses into
/// C: it is caught here and reported as `CHI_ERR_INTERNAL`, without output
/// (see [`install_quiet_hook`]).
pub(crate) extern "C" fn trampoline(
    req: *mut sys::chi_request_t,
    user_data: *mut c_void,
) -> sys::chi_status_t {
    if req.is_null() || user_data.is_null() {
        return sys::CHI_ERR_INVALID;
    }
    let outcome = panic::catch_unwind(AssertUnwindSafe(|| {
        let _scope = HandlerScope::enter();
        // SAFETY: user_data is the HandlerBox registered with this trampoline,
        // alive until after chi_finalize; req is valid for this call, and its
        // input and output buffers are as chi_request_t documents.
        let (hb, raw) = unsafe { (&*(user_data as *const HandlerBox), &*req) };
        let input: &[u8] = if raw.input.is_null() || raw.input_size == 0 {
            &[]
        } else {
            unsafe { slice::from_raw_parts(raw.input as *const u8, raw.input_size) }
        };
        let request = Request {
            method: Method::from_id(raw.method),
            source: raw.source,
            input,
            rt: unsafe { RuntimeRef::from_ptr(hb.rt.as_ptr()) },
        };
        let mut output = Output {
            ptr: raw.output as *mut u8,
            capacity: if raw.output.is_null() {
                0
            } else {
                raw.output_capacity
            },
            len: 0,
            _buf: PhantomData,
        };
        (hb.f)(&request, &mut output).map(|()| output.len)
    }));
    // SAFETY: req is valid for this call; the closure's borrows of it ended.
    let req = unsafe { &mut *req };
    match outcome {
        Ok(Ok(len)) => {
            req.output_size = len;
            sys::CHI_OK
        }
        Ok(Err(e)) => {
            req.output_size = 0;
            e.code()
        }
        Err(payload) => {
            // Dropping a panic payload can itself panic; never let that escape.
            if let Err(again) = panic::catch_unwind(AssertUnwindSafe(move || drop(payload))) {
                std::mem::forget(again);
            }
            req.output_size = 0;
            sys::CHI_ERR_INTERNAL
        }
    }
}
