use std::fmt;
use std::os::raw::c_void;
use std::ptr;
use std::time::{Duration, Instant};

use chimaera_sys as sys;

use crate::error::{Error, Status};
use crate::future::Future;
use crate::runtime::{timeout_ns, Method, Route, RuntimeRef};

/// The most tasks (futures) one `chi_submit_batch` (`chi_wait_batch`) call
/// takes; longer slices go in several calls.
const CALL_MAX: usize = sys::CHI_BATCH_MAX as usize;

/// Futures per `chi_wait_batch` call of [`RuntimeRef::wait_batch`]: bounds its
/// scratch buffer (`WAIT_WINDOW * SLOT_OUTPUT` bytes).
const WAIT_WINDOW: usize = 1024;

/// Output bytes each future of a window gets in the scratch buffer; a larger
/// output is taken with [`Future::wait`], which sizes its own buffer.
const SLOT_OUTPUT: usize = 512;

/// One task's result from [`RuntimeRef::wait_batch`]: its output, or its
/// failure (a handler's status, [`Status::NotFound`] for a method with no
/// handler on that executor, ...), as [`Future::wait`] would give it.
///
/// A failed task's [`Error`] has the status only: the library keeps no
/// message per task of a batch.
pub type TaskResult = Result<Vec<u8>, Error>;

impl RuntimeRef {
    /// Submits several tasks on one route, in order, as that many calls of
    /// [`submit`](Self::submit) would (`chi_submit_batch`), and returns their
    /// futures in the same order.  Every input is copied before this returns.
    ///
    /// On an embedded runtime's [`Route::Cpu`] and [`Route::Local`] the
    /// library queues the tasks in groups, cheaper than one call per task;
    /// other routes and client runtimes give the same results without the
    /// saving.  Any number of tasks is accepted: more than `CHI_BATCH_MAX`
    /// (1048576) go in several calls.
    ///
    /// # Errors
    ///
    /// Submission stops at the first task that cannot be queued: the
    /// [`SubmitBatchError`] holds the futures of the tasks before it (which
    /// run; drop them to release them), that task's index and its [`Error`]
    /// (the statuses of [`submit`](Self::submit); the message names the task
    /// as `tasks[i]`).  The tasks from that index on never run.  In the
    /// non-blocking submit mode (`submit_blocking: false`), and from a
    /// handler, a batch larger than the free task slots stops with
    /// [`Status::Again`]: wait for the futures returned, then submit the rest.
    ///
    /// # Examples
    ///
    /// ```
    /// use chimaera::{Method, Route};
    /// # let rt = chimaera::Runtime::with_defaults()?;
    /// let futures = rt.submit_batch(Route::Cpu, &[(Method::ECHO, &b"a"[..]), (Method::ECHO, b"bc")])?;
    /// let outputs = rt.wait_batch(futures, None)?;
    /// assert_eq!(outputs[1].as_deref(), Ok(&b"bc"[..]));
    /// # Ok::<(), chimaera::Error>(())
    /// ```
    pub fn submit_batch(
        &self,
        route: Route,
        tasks: &[(Method, &[u8])],
    ) -> Result<Vec<Future<'_>>, SubmitBatchError<'_>> {
        let mut futures = Vec::with_capacity(tasks.len());
        let mut descs = Vec::with_capacity(tasks.len().min(CALL_MAX));
        let mut ids = Vec::with_capacity(tasks.len().min(CALL_MAX));
        for chunk in tasks.chunks(CALL_MAX) {
            descs.clear();
            descs.extend(chunk.iter().map(|&(method, input)| sys::chi_task_desc_t {
                method: method.id(),
                input: if input.is_empty() {
                    ptr::null()
                } else {
                    input.as_ptr() as *const c_void
                },
                input_size: input.len(),
            }));
            ids.clear();
            ids.resize(chunk.len(), 0);
            let mut submitted = 0;
            // SAFETY: valid runtime; `descs` and `ids` hold chunk.len()
            // elements, and every input is readable for its length and copied
            // before chi_submit_batch returns; valid out-pointer.
            let status = unsafe {
                sys::chi_submit_batch(
                    self.as_ptr(),
                    route.raw(),
                    descs.as_ptr(),
                    chunk.len(),
                    ids.as_mut_ptr(),
                    &mut submitted,
                )
            };
            let error = (status != sys::CHI_OK).then(|| Error::last(status));
            let base = futures.len();
            // SAFETY: chi_submit_batch issued ids[..submitted] on this runtime
            // and nothing consumed them.
            futures.extend(
                ids[..submitted.min(chunk.len())]
                    .iter()
                    .map(|&id| unsafe { Future::from_raw(self, id) }),
            );
            if let Some(error) = error {
                let error = reindex(error, "tasks", base, submitted);
                return Err(SubmitBatchError { futures, error });
            }
        }
        Ok(futures)
    }

    /// Waits for several tasks, in order, and takes their results
    /// (`chi_wait_batch`): one [`TaskResult`] per future, its output or its
    /// failure.  A task's own failure does not stop the batch.
    ///
    /// The futures may come from [`submit`](Self::submit) or
    /// [`submit_batch`](Self::submit_batch), on any route, of this runtime.
    /// `timeout` bounds the whole call: `None` waits as long as it takes,
    /// `Some(Duration::ZERO)` polls each future once.  Outputs of any size
    /// are received.
    ///
    /// # Errors
    ///
    /// The batch stops at the first future that gives no result; the
    /// [`WaitBatchError`] holds the results taken before it, its index, why
    /// (an [`Error`] whose message names it as `futures[i]`), and that
    /// future and the ones after it, unconsumed, to wait on again:
    /// [`Status::Timeout`] (the task has not finished in time),
    /// [`Status::Invalid`] (a future of another runtime, or one the library
    /// no longer knows), [`Status::Disconnected`] (client runtime, the server
    /// is gone).
    ///
    /// # Examples
    ///
    /// ```
    /// use chimaera::{Method, Route, Status};
    /// # let rt = chimaera::Runtime::with_defaults()?;
    /// let futures = vec![
    ///     rt.submit(Route::Cpu, Method::ECHO, b"ok")?,
    ///     rt.submit(Route::Cpu, Method::ADD, b"not 16 bytes")?,
    /// ];
    /// let results = rt.wait_batch(futures, None)?;
    /// assert_eq!(results[0].as_deref(), Ok(&b"ok"[..]));
    /// assert_eq!(results[1].as_ref().unwrap_err().status(), Status::Invalid);
    /// # Ok::<(), chimaera::Error>(())
    /// ```
    pub fn wait_batch<'rt>(
        &self,
        mut futures: Vec<Future<'rt>>,
        timeout: Option<Duration>,
    ) -> Result<Vec<TaskResult>, WaitBatchError<'rt>> {
        let n = futures.len();
        // None: no deadline (also for a timeout too long for an Instant).
        let deadline = timeout.and_then(|d| Instant::now().checked_add(d));
        let left = || deadline.map(|t| t.saturating_duration_since(Instant::now()));
        let window = n.min(WAIT_WINDOW);
        let mut scratch = vec![0u8; window * SLOT_OUTPUT];
        let mut ids = Vec::with_capacity(window);
        let mut raw = Vec::with_capacity(window);
        let mut results = Vec::with_capacity(n);
        let mut pos = 0;
        let stop = loop {
            if pos == n {
                break None;
            }
            // The library would refuse a future of another runtime too; this
            // check does not depend on it telling the runtimes' futures apart.
            ids.clear();
            ids.extend(
                futures[pos..n.min(pos + window)]
                    .iter()
                    .take_while(|f| ptr::eq(f.runtime(), self))
                    .map(|f| f.id()),
            );
            let m = ids.len();
            if m == 0 {
                break Some(Error::new(
                    Status::Invalid,
                    format!("futures[{}]: a future of another runtime", pos),
                ));
            }
            raw.clear();
            raw.extend((0..m).map(|k| sys::chi_task_result_t {
                // SAFETY (of the pointer arithmetic): k < window, so the slot
                // lies inside `scratch`.
                output: unsafe { scratch.as_mut_ptr().add(k * SLOT_OUTPUT) } as *mut c_void,
                output_capacity: SLOT_OUTPUT,
                output_size: 0,
                status: sys::CHI_OK,
            }));
            let mut done = 0;
            // SAFETY: valid runtime; `ids` and `raw` hold m elements, each
            // result's buffer is SLOT_OUTPUT writable bytes of `scratch`.
            let status = unsafe {
                sys::chi_wait_batch(
                    self.as_ptr(),
                    ids.as_ptr(),
                    m,
                    timeout_ns(left()),
                    raw.as_mut_ptr(),
                    &mut done,
                )
            };
            let error = (status != sys::CHI_OK).then(|| Error::last(status));
            let done = done.min(m);
            for (k, r) in raw[..done].iter().enumerate() {
                futures[pos + k].mark_consumed();
                results.push(if r.status == sys::CHI_OK {
                    let start = k * SLOT_OUTPUT;
                    Ok(scratch[start..start + r.output_size.min(SLOT_OUTPUT)].to_vec())
                } else {
                    let status = Status::from_code(r.status).unwrap_or(Status::Unknown(r.status));
                    Err(Error::new(status, ""))
                });
            }
            let base = pos;
            pos += done;
            let error = match error {
                None => continue,
                Some(e) => e,
            };
            if status != sys::CHI_ERR_TOO_LARGE {
                break Some(reindex(error, "futures", base, done));
            }
            // Where the library takes futures one at a time, a handler's own
            // CHI_ERR_TOO_LARGE stops the batch too, yet consumes the future
            // (as with chi_wait): then it is that task's result.
            if futures[pos].test().is_err() {
                futures[pos].mark_consumed();
                results.push(Err(Error::new(Status::TooLarge, "")));
                pos += 1;
                continue;
            }
            // Else the task has finished with an output over SLOT_OUTPUT
            // bytes: Future::wait sizes a buffer for it.
            let rt = futures[pos].runtime();
            // SAFETY: future 0 is no task; dropping the placeholder releases nothing.
            let future = std::mem::replace(&mut futures[pos], unsafe { Future::from_raw(rt, 0) });
            match future.wait(left()) {
                Ok(output) => results.push(Ok(output)),
                Err(crate::WaitError::Failed(e)) => results.push(Err(e)),
                Err(e) => {
                    let status = e.status();
                    futures[pos] = e.into_future().expect("an unconsumed future");
                    break Some(Error::new(
                        status,
                        format!("futures[{}]: the task has not finished", pos),
                    ));
                }
            }
            pos += 1;
        };
        // futures[..pos] are consumed (marked, or placeholders): dropping
        // them releases nothing.
        let rest = futures.split_off(pos);
        match stop {
            None => Ok(results),
            Some(error) => Err(WaitBatchError {
                results,
                error,
                futures: rest,
            }),
        }
    }
}

/// The library's message names the element by its index within one call;
/// make that index the slice's when the call covered a later part of it.
fn reindex(error: Error, array: &str, base: usize, index: usize) -> Error {
    if base == 0 {
        return error;
    }
    let prefix = format!("{}[{}]: ", array, index);
    match error.message().strip_prefix(prefix.as_str()) {
        Some(rest) => Error::new(
            error.status(),
            format!("{}[{}]: {}", array, base + index, rest),
        ),
        None => error,
    }
}

/// Why [`RuntimeRef::submit_batch`] stopped before the last task, with the
/// futures of the tasks it did submit.
///
/// Those futures are owned here: take them with
/// [`into_futures`](Self::into_futures) (or [`into_parts`](Self::into_parts))
/// to wait on them; dropping the error, or converting it into [`Error`]
/// with `?`, releases them (their tasks still run, their results are
/// discarded).
///
/// ```
/// use chimaera::{Method, Route, Status};
/// # let rt = chimaera::Runtime::with_defaults()?;
/// let huge = vec![0u8; (1 << 20) + 1]; // over any max_inline_payload
/// let tasks = [(Method::ECHO, &b"a"[..]), (Method::ECHO, &huge[..]), (Method::ECHO, b"c")];
/// let err = rt.submit_batch(Route::Cpu, &tasks).unwrap_err();
/// assert_eq!((err.index(), err.status()), (1, Status::TooLarge));
/// let done = rt.wait_batch(err.into_futures(), None)?;
/// assert_eq!(done.len(), 1);
/// # Ok::<(), chimaera::Error>(())
/// ```
#[must_use = "dropping a SubmitBatchError releases the futures already submitted"]
pub struct SubmitBatchError<'rt> {
    futures: Vec<Future<'rt>>,
    error: Error,
}

impl<'rt> SubmitBatchError<'rt> {
    /// The index of the task that could not be submitted; the tasks before
    /// it were, as many as [`futures`](Self::futures) holds.
    pub fn index(&self) -> usize {
        self.futures.len()
    }

    /// The status of the task that could not be submitted.
    pub fn status(&self) -> Status {
        self.error.status()
    }

    /// Why that task could not be submitted; the message names it as
    /// `tasks[i]`.
    pub fn error(&self) -> &Error {
        &self.error
    }

    /// The futures of the tasks submitted, in order.
    pub fn futures(&self) -> &[Future<'rt>] {
        &self.futures
    }

    /// The futures of the tasks submitted, in order, to wait on.
    pub fn into_futures(self) -> Vec<Future<'rt>> {
        self.futures
    }

    /// The futures of the tasks submitted, and the error.
    pub fn into_parts(self) -> (Vec<Future<'rt>>, Error) {
        (self.futures, self.error)
    }
}

impl fmt::Debug for SubmitBatchError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Counts, not the futures: a batch may hold a million.
        f.debug_struct("SubmitBatchError")
            .field("index", &self.index())
            .field("error", &self.error)
            .field("submitted", &self.futures.len())
            .finish()
    }
}

impl fmt::Display for SubmitBatchError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({} tasks before it were submitted)",
            self.error,
            self.futures.len()
        )
    }
}

impl std::error::Error for SubmitBatchError<'_> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl From<SubmitBatchError<'_>> for Error {
    /// The error of the task that could not be submitted; the futures of the
    /// tasks before it are released.
    fn from(e: SubmitBatchError<'_>) -> Error {
        e.error
    }
}

/// Why [`RuntimeRef::wait_batch`] stopped before the last future: the
/// results taken before it, and that future and the ones after it,
/// unconsumed.
///
/// Wait on [`into_futures`](Self::into_futures) again (later, for a
/// timeout); dropping the error, or converting it into [`Error`] with `?`,
/// releases them.
///
/// ```
/// use std::time::Duration;
/// use chimaera::{Route, Status};
/// # let rt = chimaera::Runtime::with_defaults()?;
/// let slow = rt.register_handler("example.slow", |req, out| {
///     std::thread::sleep(Duration::from_millis(200));
///     out.extend_from_slice(req.input())
/// })?;
/// let futures = rt.submit_batch(Route::Cpu, &[(slow, &b"x"[..])])?;
/// let err = rt.wait_batch(futures, Some(Duration::ZERO)).unwrap_err();
/// assert_eq!((err.index(), err.status()), (0, Status::Timeout));
/// let (_, _, left) = err.into_parts();
/// assert_eq!(rt.wait_batch(left, None)?[0].as_deref(), Ok(&b"x"[..]));
/// # Ok::<(), chimaera::Error>(())
/// ```
#[must_use = "dropping a WaitBatchError releases the futures not yet waited on"]
pub struct WaitBatchError<'rt> {
    results: Vec<TaskResult>,
    error: Error,
    futures: Vec<Future<'rt>>,
}

impl<'rt> WaitBatchError<'rt> {
    /// The index of the future that gave no result: the number of results
    /// taken.
    pub fn index(&self) -> usize {
        self.results.len()
    }

    /// Why that future gave no result: [`Status::Timeout`],
    /// [`Status::Invalid`] or [`Status::Disconnected`].
    pub fn status(&self) -> Status {
        self.error.status()
    }

    /// Why that future gave no result; the message names it as `futures[i]`.
    pub fn error(&self) -> &Error {
        &self.error
    }

    /// The results of the futures before it, in order.
    pub fn results(&self) -> &[TaskResult] {
        &self.results
    }

    /// That future and the ones after it, unconsumed, in order.
    pub fn futures(&self) -> &[Future<'rt>] {
        &self.futures
    }

    /// That future and the ones after it, to wait on again; the results
    /// taken are dropped.
    pub fn into_futures(self) -> Vec<Future<'rt>> {
        self.futures
    }

    /// The results taken, the error, and the futures left.
    pub fn into_parts(self) -> (Vec<TaskResult>, Error, Vec<Future<'rt>>) {
        (self.results, self.error, self.futures)
    }
}

impl fmt::Debug for WaitBatchError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Counts, not the results and futures: a batch may hold a million.
        f.debug_struct("WaitBatchError")
            .field("index", &self.index())
            .field("error", &self.error)
            .field("results", &self.results.len())
            .field("futures_left", &self.futures.len())
            .finish()
    }
}

impl fmt::Display for WaitBatchError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({} results taken before it, {} futures left)",
            self.error,
            self.results.len(),
            self.futures.len()
        )
    }
}

impl std::error::Error for WaitBatchError<'_> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl From<WaitBatchError<'_>> for Error {
    /// The stop error; the results taken are dropped and the futures left
    /// released.
    fn from(e: WaitBatchError<'_>) -> Error {
        e.error
    }
}
