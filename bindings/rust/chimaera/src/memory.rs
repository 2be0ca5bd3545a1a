use std::convert::TryInto;
use std::marker::PhantomData;

use chimaera_sys as sys;

use crate::error::{check, Result};
use crate::runtime::RuntimeRef;

/// A reference to registered memory (`chi_mem_ref_t`): bulk data travels in a
/// task's input as one of these instead of inline.
///
/// ```
/// use chimaera::MemRef;
///
/// let r = MemRef { region: 5, offset: 64, length: 4096 };
/// assert_eq!(MemRef::from_bytes(&r.to_bytes()), Some(r));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct MemRef {
    /// The region id from registration.
    pub region: u64,
    /// Bytes from the region's start.
    pub offset: u64,
    /// Length in bytes.
    pub length: u64,
}

impl MemRef {
    /// Size of the encoded form, [`to_bytes`](MemRef::to_bytes).
    pub const SIZE: usize = 24;

    /// The `chi_mem_ref_t` layout: region, offset, length as native-endian
    /// `u64`, for a task's input.
    pub fn to_bytes(&self) -> [u8; MemRef::SIZE] {
        let mut b = [0u8; MemRef::SIZE];
        b[0..8].copy_from_slice(&self.region.to_ne_bytes());
        b[8..16].copy_from_slice(&self.offset.to_ne_bytes());
        b[16..24].copy_from_slice(&self.length.to_ne_bytes());
        b
    }

    /// Decodes the first [`SIZE`](MemRef::SIZE) bytes of `bytes` (as written
    /// by [`to_bytes`](MemRef::to_bytes) or by C code copying a
    /// `chi_mem_ref_t`); `None` if there are fewer.
    pub fn from_bytes(bytes: &[u8]) -> Option<MemRef> {
        if bytes.len() < MemRef::SIZE {
            return None;
        }
        let word = |i: usize| u64::from_ne_bytes(bytes[i..i + 8].try_into().unwrap());
        Some(MemRef {
            region: word(0),
            offset: word(8),
            length: word(16),
        })
    }

    pub(crate) fn to_raw(self) -> sys::chi_mem_ref_t {
        sys::chi_mem_ref_t {
            region: self.region,
            offset: self.offset,
            length: self.length,
        }
    }
}

/// Host memory registered with
/// [`RuntimeRef::register_host_mem`]; unregistered on drop.
///
/// The memory stays mutably borrowed while registered, since handlers may
/// access it (through [`RuntimeRef::resolve_mem`]); read it again after the
/// region is gone.
///
/// ```
/// # let rt = chimaera::Runtime::with_defaults()?;
/// let mut buf = [0u8; 256];
/// let region = rt.register_host_mem(&mut buf)?;
/// assert_eq!(region.len(), 256);
/// assert!(region.mem_ref(200, 100).is_none()); // past the end
/// let whole = region.whole();
/// assert_eq!((whole.offset, whole.length), (0, 256));
/// region.unregister()?;
/// # Ok::<(), chimaera::Error>(())
/// ```
#[derive(Debug)]
#[must_use = "dropping a HostRegion unregisters it at once"]
pub struct HostRegion<'rt, 'm> {
    rt: &'rt RuntimeRef,
    id: u64,
    len: usize,
    _mem: PhantomData<&'m mut [u8]>,
}

impl<'rt, 'm> HostRegion<'rt, 'm> {
    pub(crate) fn new(rt: &'rt RuntimeRef, id: u64, mem: &'m mut [u8]) -> HostRegion<'rt, 'm> {
        HostRegion {
            rt,
            id,
            len: mem.len(),
            _mem: PhantomData,
        }
    }

    /// The region id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Size of the region in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty (never: registration refuses that).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A reference to `length` bytes at `offset`, or `None` if that range
    /// does not lie inside the region.
    pub fn mem_ref(&self, offset: usize, length: usize) -> Option<MemRef> {
        let end = offset.checked_add(length)?;
        if end > self.len {
            return None;
        }
        Some(MemRef {
            region: self.id,
            offset: offset as u64,
            length: length as u64,
        })
    }

    /// A reference to the whole region.
    pub fn whole(&self) -> MemRef {
        MemRef {
            region: self.id,
            offset: 0,
            length: self.len as u64,
        }
    }

    /// Unregisters the region now and reports the status (drop does the same
    /// and ignores it).
    ///
    /// # Errors
    ///
    /// [`Status::Invalid`](crate::Status::Invalid) if the library no longer
    /// knows the region.
    pub fn unregister(mut self) -> Result<()> {
        let id = std::mem::replace(&mut self.id, 0);
        // SAFETY: valid runtime; the library checks the id.
        check(unsafe { sys::chi_unregister_mem(self.rt.as_ptr(), id) })
    }
}

impl Drop for HostRegion<'_, '_> {
    fn drop(&mut self) {
        if self.id != 0 {
            // SAFETY: valid runtime; the library checks the id.
            unsafe { sys::chi_unregister_mem(self.rt.as_ptr(), self.id) };
        }
    }
}
