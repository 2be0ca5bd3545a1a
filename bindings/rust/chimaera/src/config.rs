use std::ffi::{CString, OsString};
use std::fmt;
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

/// Options for [`Runtime::new`](crate::Runtime::new): a setter per field of
/// the C `chi_config_t`, and [`set`](Config::set) for every key of the
/// configuration file (docs/configuration.md lists them).
///
/// Fields left unset keep the defaults of `chi_config_init`, so settings come,
/// lowest priority first, from built-in defaults, the YAML file
/// ([`config_path`](Config::config_path), else `$CHI_CONFIG`), `CHI_*`
/// environment variables, keys given with [`set`](Config::set) (passed as
/// `chi_config_t.settings`), and the named fields set here.
///
/// ```
/// use chimaera::{Config, Mode, Runtime};
///
/// let config = Config::new()
///     .mode(Mode::Embedded)
///     .num_workers(2)
///     .gpus(0)
///     .queue_depth(1 << 18)
///     .worker_stack_size(64 << 20)
///     .set("submit_timeout_ms", 5000)
///     .set("gpu.lease_us", 0);
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
    settings: Vec<(String, String)>, // key, YAML value; a key at most once
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

    /// Sets any key of the configuration file, by its name there, nested
    /// keys dotted: `"queue_depth"`, `"log_level"`, `"gpu.lease_us"`,
    /// `"server.max_clients"`.  The value is written as text: numbers and
    /// booleans as they are (`4096`, `true`, sizes like `"64M"`), anything
    /// else as a quoted string.  A later call for the same key replaces the
    /// earlier one.  Unknown keys and bad values fail at
    /// [`Runtime::new`](crate::Runtime::new) with [`Status::Config`] and a
    /// message naming `chi_config_t.settings`.
    pub fn set(mut self, key: &str, value: impl fmt::Display) -> Config {
        let text = value.to_string();
        let yaml = if plain_scalar(&text) {
            text
        } else {
            quote(&text)
        };
        self.put(key, yaml);
        self
    }

    /// Sets a key whose value is a list (`"modules"`, `"server.listen"`).
    pub fn set_list<I, T>(mut self, key: &str, items: I) -> Config
    where
        I: IntoIterator<Item = T>,
        T: AsRef<str>,
    {
        let items: Vec<String> = items.into_iter().map(|i| quote(i.as_ref())).collect();
        self.put(key, format!("[{}]", items.join(", ")));
        self
    }

    /// The most CPU task slots in use at once (`queue_depth`, a power of
    /// two up to 2^20; default 131072).  Slot memory is committed as the
    /// pool first needs it, so a large value costs nothing until used.
    pub fn queue_depth(self, slots: u32) -> Config {
        self.set("queue_depth", slots)
    }

    /// Stack size of each CPU worker thread in bytes (`worker_stack_size`;
    /// 0: the system default for new threads, typically 8 MiB).  Raise it
    /// for handlers with large local arrays.
    pub fn worker_stack_size(self, bytes: u64) -> Config {
        self.set("worker_stack_size", bytes)
    }

    fn put(&mut self, key: &str, yaml: String) {
        match self.settings.iter_mut().find(|(k, _)| k == key) {
            Some(entry) => entry.1 = yaml,
            None => self.settings.push((key.to_owned(), yaml)),
        }
    }

    /// The `chi_config_t.settings` text of the keys given with `set`.
    fn settings_text(&self) -> Result<Option<CString>> {
        if self.settings.is_empty() {
            return Ok(None);
        }
        let mut text = String::new();
        for (key, value) in &self.settings {
            let ok = !key.is_empty()
                && key.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'.'
                });
            if !ok {
                return Err(Error::new(
                    Status::Config,
                    format!("setting key {:?}: expected a configuration key such as \"queue_depth\" or \"gpu.lease_us\"", key),
                ));
            }
            text.push_str(key);
            text.push_str(": ");
            text.push_str(value);
            text.push('\n');
        }
        c_string(text.as_bytes(), "a setting").map(Some)
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
        let settings = self.settings_text()?;

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
        if let Some(s) = &settings {
            raw.settings = s.as_ptr();
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
        // `path`, `address` and `settings`, which `raw` points into, outlive
        // this call.
        Ok(f(&raw))
    }
}

/// Text that YAML reads back unchanged as a number, size or boolean.
fn plain_scalar(text: &str) -> bool {
    let digits = text.strip_prefix('-').unwrap_or(text);
    let n = digits.bytes().take_while(|b| b.is_ascii_digit()).count();
    if n > 0 && matches!(&digits[n..], "" | "K" | "M" | "G" | "KiB" | "MiB" | "GiB") {
        return true;
    }
    ["true", "false", "yes", "no", "on", "off"]
        .iter()
        .any(|b| text.eq_ignore_ascii_case(b))
}

/// A YAML single-quoted scalar: the text as it is.
fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

fn c_string(bytes: &[u8], field: &str) -> Result<CString> {
    CString::new(bytes)
        .map_err(|_| Error::new(Status::Invalid, format!("{} contains a NUL byte", field)))
}

fn in_i32(n: u32, field: &str) -> Result<i32> {
    i32::try_from(n)
        .map_err(|_| Error::new(Status::Invalid, format!("{} out of range: {}", field, n)))
}
