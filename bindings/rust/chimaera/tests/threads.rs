//! Many threads on one runtime at once.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;

use chimaera::{Method, Route};
use common::{add_input, as_u64, fnv1a64, runtime_with};

const THREADS: u64 = 8;
const TASKS: u64 = 300;

#[test]
fn many_threads_submit_and_wait() {
    let rt = runtime_with(2, "queue_depth: 64\n");
    let total = Arc::new(AtomicU64::new(0));
    let t = Arc::clone(&total);
    let accumulate = rt
        .register_handler("test.accumulate", move |req, out| {
            let x = as_u64(req.input());
            let after = t.fetch_add(x, Ordering::SeqCst) + x;
            out.extend_from_slice(&after.to_le_bytes())
        })
        .unwrap();

    thread::scope(|s| {
        for id in 0..THREADS {
            let rt = &rt;
            s.spawn(move || {
                for i in 0..TASKS {
                    // Several futures in flight per thread, waited in reverse order.
                    let payload = format!("thread {} task {}", id, i).into_bytes();
                    let echo = rt.submit(Route::Cpu, Method::ECHO, &payload).unwrap();
                    let sum = rt
                        .submit(Route::Cpu, Method::ADD, &add_input(id, i))
                        .unwrap();
                    let check = rt.submit(Route::Local, Method::CHECKSUM, &payload).unwrap();
                    let acc = rt
                        .submit(Route::Cpu, accumulate, &(id * TASKS + i).to_le_bytes())
                        .unwrap();
                    assert!(as_u64(&acc.wait(None).unwrap()) >= id * TASKS + i);
                    assert_eq!(as_u64(&check.wait(None).unwrap()), fnv1a64(&payload));
                    assert_eq!(as_u64(&sum.wait(None).unwrap()), id + i);
                    assert_eq!(echo.wait(None).unwrap(), payload);
                }
            });
        }
    });
    let n = THREADS * TASKS;
    assert_eq!(total.load(Ordering::SeqCst), n * (n - 1) / 2);
}

#[test]
fn futures_move_between_threads() {
    let rt = runtime_with(2, "{}\n");
    let (tx, rx) = mpsc::channel();
    thread::scope(|s| {
        s.spawn(|| {
            for i in 0u64..500 {
                tx.send((
                    i,
                    rt.submit(Route::Cpu, Method::ECHO, &i.to_le_bytes())
                        .unwrap(),
                ))
                .unwrap();
            }
            drop(tx);
        });
        s.spawn(|| {
            for (i, future) in rx {
                assert_eq!(as_u64(&future.wait(None).unwrap()), i);
            }
        });
    });
}

#[test]
fn handlers_are_registered_while_tasks_run() {
    let rt = runtime_with(2, "{}\n");
    thread::scope(|s| {
        s.spawn(|| {
            for i in 0u64..2000 {
                assert_eq!(
                    as_u64(&rt.call(Route::Cpu, Method::ECHO, &i.to_le_bytes()).unwrap()),
                    i
                );
            }
        });
        for t in 0..2 {
            let rt = &rt;
            s.spawn(move || {
                for i in 0..50u64 {
                    let name = format!("test.dyn.{}.{}", t, i);
                    let m = rt
                        .register_handler(&name, move |_req, out| {
                            out.extend_from_slice(&i.to_le_bytes())
                        })
                        .unwrap();
                    assert_eq!(rt.lookup(&name).unwrap(), m);
                    assert_eq!(as_u64(&rt.call(Route::Cpu, m, b"").unwrap()), i);
                }
            });
        }
    });
}
