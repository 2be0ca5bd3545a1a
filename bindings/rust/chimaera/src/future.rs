use std::fmt;
use std::mem::MaybeUninit;
use std::os::raw::c_void;
use std::time::Duration;

use chimaera_sys as sys;

use crate::error::{check, Error, Result, Status};
use crate::runtime::{timeout_ns, RuntimeRef};

/// Outputs up to this size are received on the stack and copied into a
/// `Vec` of their exact size; larger ones are received into a `Vec` sized by
/// the library's answer.
const STACK_OUTPUT: usize = 512;

/// A submitted task, to be consumed exactly once: by [`wait`](Future::wait)
/// (or [`wait_into`](Future::wait_into)) returning its result, or by
/// [`release`](Future::release).  Dropping an unconsumed future releases it.
///
/// Consuming methods take `self`, so consuming twice does not compile; a
/// timeout hands the future back inside [`WaitError::Timeout`] to wait again.
/// A future borrows its runtime (`'rt`) and cannot outlive it.
///
/// ```
/// use std::time::Duration;
/// use chimaera::{Method, Route, Runtime, WaitError};
///
/// let rt = Runtime::with_defaults()?;
/// let mut future = rt.submit(Route::Cpu, Method::ECHO, b"hi")?;
/// let output = loop {
///     match future.wait(Some(Duration::from_millis(10))) {
///         Ok(output) => break output,
///         Err(WaitError::Timeout(again)) => future = again,
///         Err(e) => return Err(e.into()),
///     }
/// };
/// assert_eq!(output, b"hi");
/// # Ok::<(), chimaera::Error>(())
/// ```
///
/// # Thread safety
/// A `Future` is `Send` and `Sync` (it holds a `&RuntimeRef` and a number):
/// it may be waited on from another thread, and [`test`](Future::test) may be
/// called from several; the C calls it makes are thread-safe.
#[must_use = "dropping a Future releases the task and discards its result"]
pub struct Future<'rt> {
    rt: &'rt RuntimeRef,
    id: sys::chi_future_t, // 0 once consumed
}

enum Waited {
    Done(Result<usize>),
    Timeout,
    TooSmall(usize),
}

impl<'rt> Future<'rt> {
    /// Takes ownership of a raw future issued by `rt`.
    ///
    /// # Safety
    /// `id` came from `chi_submit` or `chi_submit_batch` on `rt` and nothing
    /// else will consume it.
    pub unsafe fn from_raw(rt: &'rt RuntimeRef, id: sys::chi_future_t) -> Future<'rt> {
        Future { rt, id }
    }

    /// The raw `chi_future_t`.
    pub fn id(&self) -> sys::chi_future_t {
        self.id
    }

    /// The runtime the task runs on.
    pub fn runtime(&self) -> &'rt RuntimeRef {
        self.rt
    }

    /// Gives up ownership and returns the raw future, which the caller must
    /// consume with `chi_wait` or `chi_release` (or leave to `chi_finalize`).
    pub fn into_raw(mut self) -> sys::chi_future_t {
        std::mem::replace(&mut self.id, 0)
    }

    /// Whether the task has finished, without blocking; the future stays
    /// valid either way.
    ///
    /// # Errors
    ///
    /// [`Status::Invalid`] if the library no longer knows the future.
    ///
    /// # Examples
    ///
    /// ```
    /// # use chimaera::{Method, Route};
    /// # let rt = chimaera::Runtime::with_defaults()?;
    /// let future = rt.submit(Route::Cpu, Method::ECHO, b"x")?;
    /// while !future.test()? {
    ///     std::thread::yield_now();
    /// }
    /// assert_eq!(future.wait(None)?, b"x");
    /// # Ok::<(), chimaera::Error>(())
    /// ```
    pub fn test(&self) -> Result<bool> {
        let mut done = 0;
        // SAFETY: valid runtime and out-pointer; the library checks the future.
        check(unsafe { sys::chi_test(self.rt.as_ptr(), self.id, &mut done) })?;
        Ok(done != 0)
    }

    /// Drops interest in the task: it still runs, its result is discarded.
    ///
    /// # Errors
    ///
    /// [`Status::Invalid`] if the library no longer knows the future.
    ///
    /// # Examples
    ///
    /// ```
    /// # use chimaera::{Method, Route};
    /// # let rt = chimaera::Runtime::with_defaults()?;
    /// rt.submit(Route::Cpu, Method::ECHO, b"fire and forget")?.release()?;
    /// # Ok::<(), chimaera::Error>(())
    /// ```
    pub fn release(mut self) -> Result<()> {
        let id = std::mem::replace(&mut self.id, 0);
        // SAFETY: valid runtime; the future is consumed here and never used again.
        check(unsafe { sys::chi_release(self.rt.as_ptr(), id) })
    }

    /// Waits for the task and returns its output.
    ///
    /// `timeout`: `None` waits as long as it takes, `Some(Duration::ZERO)`
    /// polls once.  Outputs of any size are received: when the first buffer
    /// is too small, the wait is repeated with the size the library reports.
    ///
    /// # Errors
    ///
    /// [`WaitError::Timeout`], holding the still valid future, when the task
    /// has not finished in time.  [`WaitError::Failed`], the future consumed,
    /// when the task failed: with the handler's status (a
    /// [`Status::Handler`] code, [`Status::Internal`] for a panicking Rust
    /// handler, [`Status::NotFound`] for a method with no handler on that
    /// executor, ...).
    ///
    /// # Examples
    ///
    /// ```
    /// # use chimaera::{Method, Route};
    /// # let rt = chimaera::Runtime::with_defaults()?;
    /// let big = vec![1u8; 3000];
    /// assert_eq!(rt.submit(Route::Cpu, Method::ECHO, &big)?.wait(None)?, big);
    /// # Ok::<(), chimaera::Error>(())
    /// ```
    pub fn wait(mut self, timeout: Option<Duration>) -> Result<Vec<u8>, WaitError<'rt>> {
        let t = timeout_ns(timeout);
        let mut stack = [MaybeUninit::<u8>::uninit(); STACK_OUTPUT];
        let mut needed = match self.wait_raw(stack.as_mut_ptr() as *mut c_void, STACK_OUTPUT, t) {
            Waited::Done(Ok(n)) => {
                // SAFETY: the library initialized the first n <= STACK_OUTPUT bytes.
                let bytes = unsafe {
                    std::slice::from_raw_parts(stack.as_ptr().cast::<u8>(), n.min(STACK_OUTPUT))
                };
                return Ok(bytes.to_vec());
            }
            Waited::Done(Err(e)) => return Err(WaitError::Failed(e)),
            Waited::Timeout => return Err(WaitError::Timeout(self)),
            Waited::TooSmall(needed) => needed,
        };
        // The task has finished, so these waits return at once.
        loop {
            let mut out = Vec::<u8>::with_capacity(needed);
            match self.wait_raw(out.as_mut_ptr() as *mut c_void, needed, t) {
                Waited::Done(Ok(n)) => {
                    // SAFETY: the library initialized the first n <= needed bytes.
                    unsafe { out.set_len(n.min(needed)) };
                    return Ok(out);
                }
                Waited::Done(Err(e)) => return Err(WaitError::Failed(e)),
                Waited::Timeout => return Err(WaitError::Timeout(self)),
                Waited::TooSmall(n) => needed = n.max(needed + 1),
            }
        }
    }

    /// Waits for the task and copies its output into `buf`, returning the
    /// number of bytes written; allocates nothing.
    ///
    /// # Errors
    ///
    /// As [`wait`](Future::wait), and when `buf` is too small the future
    /// comes back in [`WaitError::BufferTooSmall`] with the size needed.
    ///
    /// # Examples
    ///
    /// ```
    /// # use chimaera::{Method, Route, WaitError};
    /// # let rt = chimaera::Runtime::with_defaults()?;
    /// let mut buf = [0u8; 4];
    /// let future = rt.submit(Route::Cpu, Method::ECHO, b"too long")?;
    /// let future = match future.wait_into(&mut buf, None) {
    ///     Err(WaitError::BufferTooSmall { future, needed }) => {
    ///         assert_eq!(needed, 8);
    ///         future
    ///     }
    ///     other => panic!("unexpected {:?}", other),
    /// };
    /// let mut buf = [0u8; 8];
    /// assert_eq!(future.wait_into(&mut buf, None)?, 8);
    /// assert_eq!(&buf, b"too long");
    /// # Ok::<(), chimaera::Error>(())
    /// ```
    pub fn wait_into(
        mut self,
        buf: &mut [u8],
        timeout: Option<Duration>,
    ) -> Result<usize, WaitError<'rt>> {
        match self.wait_raw(
            buf.as_mut_ptr() as *mut c_void,
            buf.len(),
            timeout_ns(timeout),
        ) {
            Waited::Done(Ok(n)) => Ok(n),
            Waited::Done(Err(e)) => Err(WaitError::Failed(e)),
            Waited::Timeout => Err(WaitError::Timeout(self)),
            Waited::TooSmall(needed) => Err(WaitError::BufferTooSmall {
                future: self,
                needed,
            }),
        }
    }

    /// One chi_wait; marks the future consumed unless it stays valid.
    fn wait_raw(&mut self, out: *mut c_void, capacity: usize, timeout_ns: i64) -> Waited {
        let mut size = 0;
        // SAFETY: valid runtime; `out` is writable for `capacity` bytes.
        let status = unsafe {
            sys::chi_wait(
                self.rt.as_ptr(),
                self.id,
                timeout_ns,
                out,
                capacity,
                &mut size,
            )
        };
        if status == sys::CHI_OK {
            self.id = 0;
            return Waited::Done(Ok(size));
        }
        let err = Error::last(status);
        // TIMEOUT and TOO_LARGE leave the future valid when they come from the
        // wait itself, but a handler may return them too, which consumes it.
        if (status == sys::CHI_ERR_TIMEOUT || status == sys::CHI_ERR_TOO_LARGE) && self.is_live() {
            return if status == sys::CHI_ERR_TIMEOUT {
                Waited::Timeout
            } else {
                Waited::TooSmall(size)
            };
        }
        self.id = 0;
        Waited::Done(Err(err))
    }

    /// Records that a call outside this type (`chi_wait_batch`) consumed the
    /// future, so that dropping it releases nothing.
    pub(crate) fn mark_consumed(&mut self) {
        self.id = 0;
    }

    fn is_live(&self) -> bool {
        let mut done = 0;
        // SAFETY: valid runtime and out-pointer.
        unsafe { sys::chi_test(self.rt.as_ptr(), self.id, &mut done) == sys::CHI_OK }
    }
}

impl Drop for Future<'_> {
    fn drop(&mut self) {
        if self.id != 0 {
            // SAFETY: valid runtime; the future is unconsumed and never used again.
            unsafe { sys::chi_release(self.rt.as_ptr(), self.id) };
        }
    }
}

impl fmt::Debug for Future<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Future({:#x})", self.id)
    }
}

/// Why [`Future::wait`] or [`Future::wait_into`] returned no output.
///
/// Converts into [`Error`] with `?` (a future inside is then released).
#[derive(Debug)]
pub enum WaitError<'rt> {
    /// The task did not finish in time; the future is still valid.
    Timeout(Future<'rt>),
    /// The output does not fit the buffer given to
    /// [`wait_into`](Future::wait_into); the future is still valid.
    BufferTooSmall {
        /// The unconsumed future.
        future: Future<'rt>,
        /// Bytes the output needs.
        needed: usize,
    },
    /// The task (or the wait) failed; the future is consumed.
    Failed(Error),
}

impl<'rt> WaitError<'rt> {
    /// The status: [`Status::Timeout`], [`Status::TooLarge`], or the failure's.
    pub fn status(&self) -> Status {
        match self {
            WaitError::Timeout(_) => Status::Timeout,
            WaitError::BufferTooSmall { .. } => Status::TooLarge,
            WaitError::Failed(e) => e.status(),
        }
    }

    /// The future, if it is still valid.
    pub fn into_future(self) -> Option<Future<'rt>> {
        match self {
            WaitError::Timeout(f) | WaitError::BufferTooSmall { future: f, .. } => Some(f),
            WaitError::Failed(_) => None,
        }
    }
}

impl fmt::Display for WaitError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WaitError::Timeout(_) => {
                write!(f, "{}: the task has not finished yet", Status::Timeout)
            }
            WaitError::BufferTooSmall { needed, .. } => {
                write!(f, "{}: the output needs {} bytes", Status::TooLarge, needed)
            }
            WaitError::Failed(e) => fmt::Display::fmt(e, f),
        }
    }
}

impl std::error::Error for WaitError<'_> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            WaitError::Failed(e) => Some(e),
            _ => None,
        }
    }
}

impl From<WaitError<'_>> for Error {
    fn from(e: WaitError<'_>) -> Error {
        match e {
            WaitError::Timeout(_) => Error::new(
                Status::Timeout,
                "the task has not finished; its future was released",
            ),
            WaitError::BufferTooSmall { needed, .. } => Error::new(
                Status::TooLarge,
                format!("the output needs {} bytes; its future was released", needed),
            ),
            WaitError::Failed(e) => e,
        }
    }
}
