use std::ffi::CStr;
use std::fmt;

use chimaera_sys as sys;

/// A failure status of the C API (`CHI_ERR_*`), or a handler's own code.
///
/// `CHI_OK` has no variant: success is the `Ok` side of a [`Result`].
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
    /// `CHI_ERR_INVALID`: bad argument, or a stale or unknown future.
    Invalid,
    /// `CHI_ERR_NOMEM`: an allocation or a fixed table ran out.
    NoMem,
    /// `CHI_ERR_TIMEOUT`: a wait timed out (the future stays valid).
    Timeout,
    /// `CHI_ERR_AGAIN`: every task slot is in use; try again later.
    Again,
    /// `CHI_ERR_NOT_FOUND`: unknown method, name or module.
    NotFound,
    /// `CHI_ERR_NO_DEVICE`: a GPU route or GPU call with no usable GPU.
    NoDevice,
    /// `CHI_ERR_DISCONNECTED`: the server is gone (client mode).
    Disconnected,
    /// `CHI_ERR_PROTOCOL`: a malformed message or version skew (client mode).
    Protocol,
    /// `CHI_ERR_TOO_LARGE`: a payload over the configured limit.
    TooLarge,
    /// `CHI_ERR_CONFIG`: a bad configuration file or value.
    Config,
    /// `CHI_ERR_PERMISSION`: not allowed.
    Permission,
    /// `CHI_ERR_SHUTDOWN`: the runtime is finalizing.
    Shutdown,
    /// `CHI_ERR_INTERNAL`: a broken invariant, or a handler that panicked.
    Internal,
    /// A handler's own code, at or below `CHI_ERR_USER_BASE` (-1000).
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
