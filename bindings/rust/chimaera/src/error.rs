use std::ffi::CStr;
use std::fmt;

use chimaera_sys as sys;

/// A failure status of the C API (`CHI_ERR_*`), or a handler's own code.
///
/// `CHI_OK` has no variant: success is the `Ok` side of a [`Result`].  Each
/// variant lists every case that gives it; the [`Error`] that carries it
/// also has the library's message, which names the case.
///
/// ```
/// use chimaera::Status;
///
/// assert_eq!(Status::from_code(-5), Some(Status::NotFound));
/// assert_eq!(Status::from_code(-1234), Some(Status::Handler(-1234)));
/// assert_eq!(Status::from_code(0), None);
/// assert_eq!(Status::Timeout.code(), chimaera::sys::CHI_ERR_TIMEOUT);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Status {
    /// `CHI_ERR_INVALID`, a bad argument:
    /// - a future that is stale (already waited on or released), of another
    ///   runtime, or never issued, at [`Future`](crate::Future) calls;
    /// - method id 0; a route below `CHI_ROUTE_LOCAL` or a GPU number out
    ///   of range;
    /// - a method name that is not 1..127 bytes of printable ASCII, or that
    ///   already has a handler of that kind;
    /// - a string with a NUL byte, or a number out of range for its C field;
    ///   a bad [`Config`](crate::Config) field (`num_workers` over 1024,
    ///   `gpus` over 1024, a malformed `server_address`);
    /// - an unknown region, or a [`MemRef`](crate::MemRef) outside its
    ///   region; a device pointer not on that GPU;
    /// - finalizing a runtime from one of its own handlers;
    /// - a handler that returns it (`chi.add` does, for an input that is not
    ///   16 bytes).
    Invalid,
    /// `CHI_ERR_NOMEM`: an allocation failed; no memory could be committed
    /// for more task slots; a worker thread could not start; or a fixed
    /// table is full (4092 methods among the live runtimes of the process,
    /// the region table).
    NoMem,
    /// `CHI_ERR_TIMEOUT`: a wait with a timeout ran out before the task
    /// finished; the future stays valid and may be waited on again.
    Timeout,
    /// `CHI_ERR_AGAIN`: every task slot of the route is in use (all
    /// `queue_depth` CPU slots): at once when `submit_blocking` is false or
    /// the submit comes from inside a handler, else after
    /// `submit_timeout_ms`.  Nothing was queued.
    Again,
    /// `CHI_ERR_NOT_FOUND`:
    /// - [`lookup`](crate::RuntimeRef::lookup) of a name no method has;
    /// - a submit of a method id never registered on this runtime, or of an
    ///   id of another runtime (refused, never run);
    /// - at the waiter: the method has no handler on the executor the route
    ///   chose (a CPU-only method on a GPU route, for instance);
    /// - a module that cannot be opened or exports no
    ///   `chimaera_module_init`.
    NotFound,
    /// `CHI_ERR_NO_DEVICE`: a GPU route or GPU call on a runtime without a
    /// usable GPU, or [`Config::gpus`](crate::Config::gpus) asked for more
    /// GPUs than are usable.
    NoDevice,
    /// `CHI_ERR_DISCONNECTED` (client mode): no server at the address when
    /// the runtime starts, or the server went away; waits on its tasks end
    /// with this status.
    Disconnected,
    /// `CHI_ERR_PROTOCOL` (client mode): a malformed message from the
    /// server, or a server of another library version.
    Protocol,
    /// `CHI_ERR_TOO_LARGE`: an input over `max_inline_payload` at submit;
    /// at a wait into a buffer, a result larger than the buffer (the future
    /// stays valid); in a handler, writing more [`Output`](crate::Output)
    /// than its capacity.
    TooLarge,
    /// `CHI_ERR_CONFIG`: the configuration file cannot be read or holds an
    /// unknown key, a wrong type or a value out of range; a bad `CHI_*`
    /// environment variable; a bad key or value given with
    /// [`Config::set`](crate::Config::set); a `worker_stack_size` the system
    /// refuses.  The message names the file, line and column, the variable,
    /// or `chi_config_t.settings`.
    Config,
    /// `CHI_ERR_PERMISSION` (server mode): a client of another user refused,
    /// or the server's lock file cannot be opened.
    Permission,
    /// `CHI_ERR_SHUTDOWN`: the runtime is finalizing: submits from outside
    /// its handlers, handler registrations.
    Shutdown,
    /// `CHI_ERR_INTERNAL`: a handler that panicked (see
    /// [`last_handler_panic`](crate::last_handler_panic)), a C handler that
    /// reported more output than the capacity or returned a positive value,
    /// a GPU fault, or a broken invariant in the library.
    Internal,
    /// A handler's own code, at or below `CHI_ERR_USER_BASE` (-1000),
    /// passed to the waiter unchanged.
    Handler(i32),
    /// Any other nonzero code (from a newer library, for instance).
    Unknown(i32),
}

impl Status {
    /// The status for a raw `chi_status_t`, or `None` for `CHI_OK` (0).
    pub fn from_code(code: sys::chi_status_t) -> Option<Status> {
        Some(match code {
            sys::CHI_OK => return None,
            sys::CHI_ERR_INVALID => Status::Invalid,
            sys::CHI_ERR_NOMEM => Status::NoMem,
            sys::CHI_ERR_TIMEOUT => Status::Timeout,
            sys::CHI_ERR_AGAIN => Status::Again,
            sys::CHI_ERR_NOT_FOUND => Status::NotFound,
            sys::CHI_ERR_NO_DEVICE => Status::NoDevice,
            sys::CHI_ERR_DISCONNECTED => Status::Disconnected,
            sys::CHI_ERR_PROTOCOL => Status::Protocol,
            sys::CHI_ERR_TOO_LARGE => Status::TooLarge,
            sys::CHI_ERR_CONFIG => Status::Config,
            sys::CHI_ERR_PERMISSION => Status::Permission,
            sys::CHI_ERR_SHUTDOWN => Status::Shutdown,
            sys::CHI_ERR_INTERNAL => Status::Internal,
            c if c <= sys::CHI_ERR_USER_BASE => Status::Handler(c),
            c => Status::Unknown(c),
        })
    }

    /// The raw `chi_status_t` value.
    pub fn code(self) -> sys::chi_status_t {
        match self {
            Status::Invalid => sys::CHI_ERR_INVALID,
            Status::NoMem => sys::CHI_ERR_NOMEM,
            Status::Timeout => sys::CHI_ERR_TIMEOUT,
            Status::Again => sys::CHI_ERR_AGAIN,
            Status::NotFound => sys::CHI_ERR_NOT_FOUND,
            Status::NoDevice => sys::CHI_ERR_NO_DEVICE,
            Status::Disconnected => sys::CHI_ERR_DISCONNECTED,
            Status::Protocol => sys::CHI_ERR_PROTOCOL,
            Status::TooLarge => sys::CHI_ERR_TOO_LARGE,
            Status::Config => sys::CHI_ERR_CONFIG,
            Status::Permission => sys::CHI_ERR_PERMISSION,
            Status::Shutdown => sys::CHI_ERR_SHUTDOWN,
            Status::Internal => sys::CHI_ERR_INTERNAL,
            Status::Handler(c) | Status::Unknown(c) => c,
        }
    }

    /// The library's static English text for this status
    /// (`chi_status_string`).
    ///
    /// ```
    /// assert!(!chimaera::Status::NotFound.description().is_empty());
    /// ```
    pub fn description(self) -> &'static str {
        // SAFETY: chi_status_string returns static, NUL-terminated text, never NULL.
        unsafe { static_str(sys::chi_status_string(self.code())) }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Status::Handler(c) | Status::Unknown(c) => write!(f, "{} ({})", self.description(), c),
            _ => f.write_str(self.description()),
        }
    }
}

/// A failed chimaera call: its [`Status`] and the library's detail message.
///
/// The message is the calling thread's `chi_last_error_message()` taken right
/// after the failure (for example `"bad.yaml:3:5: unknown key 'wrokers'"`), or
/// text from this crate; it may be empty, for instance for a handler's own
/// code.
///
/// ```
/// use chimaera::{Runtime, Status};
///
/// let rt = Runtime::with_defaults()?;
/// let err = rt.lookup("no.such.method").unwrap_err();
/// assert_eq!(err.status(), Status::NotFound);
/// println!("{}", err); // the status text, then the detail
/// # Ok::<(), chimaera::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    status: Status,
    message: String,
}

impl Error {
    /// An error with the given status and message.
    pub fn new(status: Status, message: impl Into<String>) -> Error {
        Error {
            status,
            message: message.into(),
        }
    }

    /// The error's status.
    pub fn status(&self) -> Status {
        self.status
    }

    /// The raw `chi_status_t` value of the status.
    pub fn code(&self) -> sys::chi_status_t {
        self.status.code()
    }

    /// The detail message (may be empty).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The error for a raw failure status, with this thread's last error
    /// message.  Must be called right after the failing call.
    pub(crate) fn last(code: sys::chi_status_t) -> Error {
        // SAFETY: chi_last_error_message never returns NULL; the text stays valid
        // until this thread's next chi_* call, and is copied before that.
        let message = unsafe { CStr::from_ptr(sys::chi_last_error_message()) }
            .to_string_lossy()
            .into_owned();
        Error {
            status: Status::from_code(code).unwrap_or(Status::Unknown(code)),
            message,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            write!(f, "{}", self.status)
        } else {
            write!(f, "{}: {}", self.status, self.message)
        }
    }
}

impl std::error::Error for Error {}

/// `Result` with [`Error`] as the error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `Ok(())` for `CHI_OK`, else the error with this thread's message.
pub(crate) fn check(code: sys::chi_status_t) -> Result<()> {
    if code == sys::CHI_OK {
        Ok(())
    } else {
        Err(Error::last(code))
    }
}

/// # Safety
/// `p` is a non-NULL pointer to static NUL-terminated text.
pub(crate) unsafe fn static_str(p: *const std::os::raw::c_char) -> &'static str {
    // The library's static strings are ASCII; anything else shows as empty.
    CStr::from_ptr(p).to_str().unwrap_or("")
}
