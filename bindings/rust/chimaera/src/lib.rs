//! Safe Rust API of chimaera, a task runtime for CPUs and GPUs.
//!
//! A [`Runtime`] runs small tasks on CPU worker threads and, when the library
//! was built with CUDA or HIP, on a persistent kernel per GPU.  A task is a
//! [`Method`] plus input bytes, submitted along a [`Route`]; the [`Future`]
//! that [`submit`](RuntimeRef::submit) returns gives back the output bytes or
//! an [`Error`] carrying a [`Status`].  Rust closures become CPU handlers with
//! [`Runtime::register_handler`].  Many tasks go in one call with
//! [`submit_batch`](RuntimeRef::submit_batch) and come back in one with
//! [`wait_batch`](RuntimeRef::wait_batch), cheaper per task on the CPU route.
//!
//! ```
//! use chimaera::{Config, Method, Route, Runtime, Status};
//!
//! let rt = Runtime::new(&Config::new().num_workers(2))?;
//!
//! // A built-in method: chi.echo returns its input.
//! let future = rt.submit(Route::Cpu, Method::ECHO, b"hello")?;
//! assert_eq!(future.wait(None)?, b"hello");
//!
//! // A handler written in Rust, writing its output in place.
//! let double = rt.register_handler("example.double", |req, out| {
//!     let x = u64::from_le_bytes(req.input().try_into().map_err(|_| Status::Invalid)?);
//!     out.extend_from_slice(&(2 * x).to_le_bytes())
//! })?;
//! assert_eq!(rt.call(Route::Cpu, double, &21u64.to_le_bytes())?, 42u64.to_le_bytes());
//!
//! // Failures are statuses, with the library's detail message.
//! let err = rt.call(Route::Cpu, double, b"short").unwrap_err();
//! assert_eq!(err.status(), Status::Invalid);
//! # Ok::<(), chimaera::Error>(())
//! ```
//!
//! # Linking
//!
//! [`chimaera_sys`] links `libchimaera`: from `$CHIMAERA_LIB_DIR` if
//! set, else from `pkg-config --libs chimaera`.  Programs find the shared
//! library at run time through the system paths, `LD_LIBRARY_PATH`, or an
//! rpath of their own; this crate's tests and examples get an rpath to the
//! directory found.
//!
//! # Threads
//!
//! [`Runtime`], [`RuntimeRef`] and [`Future`] are `Send` and `Sync`: the C
//! API is thread-safe on one runtime.  Each type's documentation says why in
//! detail.

#![warn(missing_docs)]

mod batch;
mod config;
mod error;
mod future;
mod handler;
mod memory;
mod runtime;

pub use chimaera_sys as sys;

pub use crate::batch::{SubmitBatchError, TaskResult, WaitBatchError};
pub use crate::config::{Config, Mode};
pub use crate::error::{Error, Result, Status};
pub use crate::future::{Future, WaitError};
pub use crate::handler::{last_handler_panic, HandlerError, Output, Request};
pub use crate::memory::{HostRegion, MemRef};
pub use crate::runtime::{DevContext, Method, Route, Runtime, RuntimeRef};

/// `CHI_VERSION_MAJOR` of the header these bindings were generated from.
pub const VERSION_MAJOR: u32 = sys::CHI_VERSION_MAJOR as u32;
/// `CHI_VERSION_MINOR` of the header these bindings were generated from.
pub const VERSION_MINOR: u32 = sys::CHI_VERSION_MINOR as u32;
/// `CHI_VERSION_PATCH` of the header these bindings were generated from.
pub const VERSION_PATCH: u32 = sys::CHI_VERSION_PATCH as u32;
/// `CHI_VERSION_NUMBER` (MAJOR * 10000 + MINOR * 100 + PATCH) of the header
/// these bindings were generated from, comparable with [`version`].
pub const VERSION_NUMBER: u32 = sys::CHI_VERSION_NUMBER as u32;

/// The version of the library actually loaded, as MAJOR * 10000 + MINOR * 100
/// + PATCH (`chi_version`).
///
/// ```
/// // The same major version as the bindings: the ABI matches.
/// assert_eq!(chimaera::version() / 10000, chimaera::VERSION_MAJOR);
/// ```
pub fn version() -> u32 {
    // SAFETY: no preconditions.
    unsafe { sys::chi_version() }
}

/// The version of the library actually loaded, as `"MAJOR.MINOR.PATCH"`
/// (`chi_version_string`).
///
/// ```
/// let v = chimaera::version_string();
/// assert!(v.starts_with(&format!("{}.", chimaera::VERSION_MAJOR)));
/// ```
pub fn version_string() -> &'static str {
    // SAFETY: chi_version_string returns static NUL-terminated text.
    unsafe { error::static_str(sys::chi_version_string()) }
}
