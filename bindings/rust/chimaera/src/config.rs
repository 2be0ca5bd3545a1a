use std::ffi::{CString, OsString};
use std::mem::MaybeUninit;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use chimaera_sys as sys;

use crate::error::{Error, Result, Status};

/// Where the runtime lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Mode {
    /// The runtime runs inside this process (`CHI_MODE_EMBEDDED`, the default).
    Embedded,
    /// Connect to a `chimaera-server` process (`CHI_MODE_CLIENT`).
    Client,
}

impl Mode {
    fn raw(self) -> i32 {
        match self {
            Mode::Embedded => sys::CHI_MODE_EMBEDDED,
            Mode::Client => sys::CHI_MODE_CLIENT,
        }
    }
}

/// Options for [`Runtime::new`](crate::Runtime::new): one setter per field of
/// the C `chi_config_t`.
///
/// Fields left unset keep the defaults of `chi_config_init`, so settings come,
/// lowest priority first, from built-in defaults, the YAML file
/// ([`config_path`](Config::config_path), else `$CHI_CONFIG`), `CHI_*`
/// environment variables, and the fields set here.
///
/// ```
/// use chimaera::{Config, Mode, Runtime};
///
/// let config = Config::new().mode(Mode::Embedded).num_workers(2).gpus(0);
/// let rt = Runtime::new(&config)?;
/// assert_eq!(rt.gpu_count(), 0);
/// # Ok::<(), chimaera::Error>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Config {
    config_path: Option<OsString>,
    mode: Option<Mode>,
    server_address: Option<String>,
    num_workers: Option<u32>,
    gpus: Option<Gpus>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gpus {
    All,
    Count(u32),
}

impl Config {
    /// Options with every field at its default.
    pub fn new() -> Config {
        Config::default()
    }

    /// The YAML configuration file to read (`config_path`).  Unset: the file
    /// named by `$CHI_CONFIG`, else built-in defaults.
    pub fn config_path(mut self, path: impl AsRef<Path>) -> Config {
        self.config_path = Some(path.as_ref().as_os_str().to_owned());
        self
    }

    /// Embedded runtime or client of a server (`mode`); default
    /// [`Mode::Embedded`].
    pub fn mode(mut self, mode: Mode) -> Config {
        self.mode = Some(mode);
        self
    }

    /// The server to connect to in client mode (`server_address`):
    /// `"shm://NAME"`, `"ipc://PATH"` or `"tcp://HOST:PORT"`.  Unset: from
    /// the configuration or environment, else this user's default local
    /// server.
    pub fn server_address(mut self, address: impl Into<String>) -> Config {
        self.server_address = Some(address.into());
        self
    }

    /// The number of CPU worker threads (`num_workers`); 0 or unset: from the
    /// configuration, else the number of hardware threads (at least 2).
    pub fn num_workers(mut self, workers: u32) -> Config {
        self.num_workers = Some(workers);
        self
    }

    /// Use exactly the first `count` GPUs (`gpus`); 0 disables GPU use.
    /// [`Runtime::new`](crate::Runtime::new) fails with
    /// [`Status::NoDevice`] when fewer are usable.
    pub fn gpus(mut self, count: u32) -> Config {
        self.gpus = Some(Gpus::Count(count));
        self
    }

    /// Use every visible GPU (`gpus = -1`, the default).
    pub fn all_gpus(mut self) -> Config {
        self.gpus = Some(Gpus::All);
        self
    }

    /// Fills a `chi_config_t` through `chi_config_init` and calls `f` with it;
    /// the strings it points to live until `f` returns.
    pub(crate) fn with_raw<T>(&self, f: impl FnOnce(&sys::chi_config_t) -> T) -> Result<T> {
        let path = self
            .config_path
            .as_ref()
            .map(|p| c_string(p.as_bytes(), "config_path"))
            .transpose()?;
        let address = self
            .server_address
            .as_ref()
            .map(|a| c_string(a.as_bytes(), "server_address"))
            .transpose()?;

        let mut raw = MaybeUninit::<sys::chi_config_t>::zeroed();
        // SAFETY: chi_config_init fills every field of the (zeroed) struct.
        let mut raw = unsafe {
            sys::chi_config_init(raw.as_mut_ptr());
            raw.assume_init()
        };
        if let Some(p) = &path {
            raw.config_path = p.as_ptr();
        }
        if let Some(a) = &address {
            raw.server_address = a.as_ptr();
        }
        if let Some(mode) = self.mode {
            raw.mode = mode.raw();
        }
        if let Some(n) = self.num_workers {
            raw.num_workers = in_i32(n, "num_workers")?;
        }
        match self.gpus {
            Some(Gpus::All) => raw.gpus = -1,
            Some(Gpus::Count(n)) => raw.gpus = in_i32(n, "gpus")?,
            None => {}
        }
        // `path` and `address`, which `raw` points into, outlive this call.
        Ok(f(&raw))
    }
}

fn c_string(bytes: &[u8], field: &str) -> Result<CString> {
    CString::new(bytes)
        .map_err(|_| Error::new(Status::Invalid, format!("{} contains a NUL byte", field)))
}

fn in_i32(n: u32, field: &str) -> Result<i32> {
    i32::try_from(n)
        .map_err(|_| Error::new(Status::Invalid, format!("{} out of range: {}", field, n)))
}
