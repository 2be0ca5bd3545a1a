//! Batches: submit_batch and wait_batch, and their futures with the one-task calls.

mod common;

use std::sync::Arc;
use std::time::Duration;

use chimaera::{Error, HandlerError, Method, Route, Status, WaitError};
use common::{add_input, as_u64, fnv1a64, runtime, runtime_with, Gate};

/// Over the largest max_inline_payload any configuration allows (1 MiB).
const HUGE: usize = (1 << 20) + 1;

fn echo_input(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 13 + len) as u8).collect()
}

#[test]
fn mixed_sizes_and_methods() {
    let rt = runtime();
    // Outputs below, at and above the 512 bytes wait_batch receives in its
    // scratch buffer, up to the default max_inline_payload (4096).
    let lens = [0usize, 1, 7, 8, 511, 512, 513, 1000, 4000, 4096];
    let inputs: Vec<Vec<u8>> = lens.iter().map(|&len| echo_input(len)).collect();
    let sums: Vec<[u8; 16]> = (0..10u64).map(|i| add_input(i, 1 << i)).collect();
    for route in [Route::Cpu, Route::Local] {
        let mut tasks: Vec<(Method, &[u8])> = Vec::new();
        for (input, sum) in inputs.iter().zip(&sums) {
            tasks.push((Method::ECHO, input));
            tasks.push((Method::ADD, sum));
            tasks.push((Method::CHECKSUM, input));
        }
        let futures = rt.submit_batch(route, &tasks).unwrap();
        assert_eq!(futures.len(), tasks.len());
        let results = rt.wait_batch(futures, None).unwrap();
        assert_eq!(results.len(), tasks.len());
        for (i, (input, sum)) in inputs.iter().zip(&sums).enumerate() {
            let echoed = results[3 * i].as_ref().unwrap();
            assert_eq!(echoed, input, "{:?}: echo of {} bytes", route, input.len());
            let (a, b) = (as_u64(&sum[..8]), as_u64(&sum[8..]));
            assert_eq!(as_u64(results[3 * i + 1].as_ref().unwrap()), a + b);
            assert_eq!(as_u64(results[3 * i + 2].as_ref().unwrap()), fnv1a64(input));
        }
    }

    // Empty batches are no calls at all.
    assert!(rt.submit_batch(Route::Cpu, &[]).unwrap().is_empty());
    assert!(rt.wait_batch(Vec::new(), None).unwrap().is_empty());
}

#[test]
fn batches_longer_than_one_wait_window() {
    // 5000 results take several chi_wait_batch calls of wait_batch; every
    // 7th output is over its scratch slot.
    if common::client_mode() {
        eprintln!("skipped in client mode: a client has 1024 task slots (server.client_slots)");
        return;
    }
    let rt = runtime_with(2, "queue_depth: 8192\n");
    let inputs: Vec<Vec<u8>> = (0..5000)
        .map(|i| echo_input(if i % 7 == 0 { 600 + i % 100 } else { i % 64 }))
        .collect();
    let tasks: Vec<(Method, &[u8])> = inputs.iter().map(|v| (Method::ECHO, &v[..])).collect();
    let futures = rt.submit_batch(Route::Cpu, &tasks).unwrap();
    let results = rt.wait_batch(futures, None).unwrap();
    assert_eq!(results.len(), inputs.len());
    for (i, (r, input)) in results.iter().zip(&inputs).enumerate() {
        assert_eq!(r.as_ref().unwrap(), input, "task {}", i);
    }
}

#[test]
fn a_handler_error_is_that_task_s_result() {
    let rt = runtime();
    let fails = rt
        .register_handler("test.batch_fails", |req, out| match req.input() {
            b"user" => Err(HandlerError::user(-1234)),
            b"invalid" => Err(Status::Invalid.into()),
            b"panic" => panic!("deliberate panic in a batch"),
            other => out.extend_from_slice(other),
        })
        .unwrap();
    let tasks: [(Method, &[u8]); 7] = [
        (fails, b"one"),
        (fails, b"user"),
        (Method::ADD, b"short"), // chi.add wants 16 bytes
        (fails, b"invalid"),
        (fails, b"panic"),
        (Method::ECHO, b"after"),
        (fails, b"last"),
    ];
    let futures = rt.submit_batch(Route::Cpu, &tasks).unwrap();
    let results = rt.wait_batch(futures, None).unwrap();
    let statuses: Vec<Option<Status>> = results
        .iter()
        .map(|r| r.as_ref().err().map(Error::status))
        .collect();
    assert_eq!(
        statuses,
        [
            None,
            Some(Status::Handler(-1234)),
            Some(Status::Invalid),
            Some(Status::Invalid),
            Some(Status::Internal),
            None,
            None
        ]
    );
    assert_eq!(results[0].as_deref(), Ok(&b"one"[..]));
    assert_eq!(results[5].as_deref(), Ok(&b"after"[..]));
    assert_eq!(results[6].as_deref(), Ok(&b"last"[..]));
    assert_eq!(results[1].as_ref().unwrap_err().code(), -1234);
}

#[test]
fn a_too_large_input_stops_submission() {
    let rt = runtime();
    let huge = vec![0u8; HUGE];
    let tasks: [(Method, &[u8]); 5] = [
        (Method::ECHO, b"zero"),
        (Method::ECHO, b"one"),
        (Method::ECHO, &huge),
        (Method::ECHO, b"three"),
        (Method::ECHO, b"four"),
    ];
    let err = rt.submit_batch(Route::Cpu, &tasks).unwrap_err();
    assert_eq!(err.index(), 2);
    assert_eq!(err.status(), Status::TooLarge);
    assert!(
        err.error().message().contains("tasks[2]"),
        "message: {}",
        err.error().message()
    );
    assert!(err.to_string().contains("2 tasks before it"), "{}", err);
    assert_eq!(err.futures().len(), 2);

    // The tasks before it were submitted and run.
    let results = rt.wait_batch(err.into_futures(), None).unwrap();
    assert_eq!(results[0].as_deref(), Ok(&b"zero"[..]));
    assert_eq!(results[1].as_deref(), Ok(&b"one"[..]));

    // The first task already: no future; as Error through `?`.
    let first = rt.submit_batch(Route::Cpu, &tasks[2..]).unwrap_err();
    assert_eq!(first.index(), 0);
    assert!(first.futures().is_empty());
    let e: Error = first.into();
    assert_eq!(e.status(), Status::TooLarge);

    // Method 0 and an unknown method stop it the same way.
    let err = rt
        .submit_batch(
            Route::Cpu,
            &[(Method::ECHO, b"a"), (Method::from_id(0), b"b")],
        )
        .unwrap_err();
    assert_eq!((err.index(), err.status()), (1, Status::Invalid));
    let err = rt
        .submit_batch(
            Route::Cpu,
            &[(Method::from_id(0x7fff_0000), b"a"), (Method::ECHO, b"b")],
        )
        .unwrap_err();
    assert_eq!((err.index(), err.status()), (0, Status::NotFound));
}

#[test]
fn again_stops_a_non_blocking_batch() {
    if common::client_mode() {
        eprintln!("skipped in client mode: the server's slots, not this YAML's queue_depth");
        return;
    }
    let rt = runtime_with(1, "queue_depth: 4\nsubmit_blocking: false\n");
    let gate = Arc::new(Gate::default());
    let g = Arc::clone(&gate);
    let blocked = rt
        .register_handler("test.batch_blocked", move |req, out| {
            g.wait();
            out.extend_from_slice(req.input())
        })
        .unwrap();
    let inputs: Vec<[u8; 1]> = (0..10u8).map(|i| [i]).collect();
    let tasks: Vec<(Method, &[u8])> = inputs.iter().map(|v| (blocked, &v[..])).collect();
    let err = rt.submit_batch(Route::Cpu, &tasks).unwrap_err();
    assert_eq!(err.status(), Status::Again);
    let sent = err.index();
    assert!(
        sent >= 1 && sent <= 4,
        "{} of 10 submitted into 4 slots",
        sent
    );
    gate.open();
    let results = rt.wait_batch(err.into_futures(), None).unwrap();
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r.as_deref(), Ok(&[i as u8][..]));
    }
    // The slots are back: the rest goes now.
    let rest = rt.submit_batch(Route::Cpu, &tasks[sent..sent + 4]).unwrap();
    assert_eq!(rt.wait_batch(rest, None).unwrap().len(), 4);
}

#[test]
fn batch_futures_with_the_one_task_calls() {
    let rt = runtime();
    let big = echo_input(3000);
    let tasks: [(Method, &[u8]); 5] = [
        (Method::ECHO, b"wait"),
        (Method::ECHO, &big),
        (Method::ECHO, b"wait_into"),
        (Method::ECHO, b"release"),
        (Method::ECHO, b"dropped"),
    ];
    let mut futures = rt.submit_batch(Route::Cpu, &tasks).unwrap().into_iter();
    let first = futures.next().unwrap();
    while !first.test().unwrap() {
        std::thread::yield_now();
    }
    assert_eq!(first.wait(None).unwrap(), b"wait");
    assert_eq!(futures.next().unwrap().wait(None).unwrap(), big);
    let mut buf = [0u8; 4];
    let f = match futures.next().unwrap().wait_into(&mut buf, None) {
        Err(WaitError::BufferTooSmall { future, needed }) => {
            assert_eq!(needed, 9);
            future
        }
        other => panic!("expected BufferTooSmall, got {:?}", other),
    };
    assert_eq!(f.wait(None).unwrap(), b"wait_into");
    futures.next().unwrap().release().unwrap();
    drop(futures.next().unwrap());

    // And the other way round: single submits, one batched wait.
    let singles = vec![
        rt.submit(Route::Cpu, Method::ECHO, b"a").unwrap(),
        rt.submit(Route::Local, Method::ADD, &add_input(2, 3))
            .unwrap(),
        rt.submit(Route::Cpu, Method::ECHO, &big).unwrap(),
    ];
    let results = rt.wait_batch(singles, None).unwrap();
    assert_eq!(results[0].as_deref(), Ok(&b"a"[..]));
    assert_eq!(as_u64(results[1].as_ref().unwrap()), 5);
    assert_eq!(results[2].as_ref().unwrap(), &big);
}

#[test]
fn a_timeout_gives_back_the_futures_left() {
    let rt = runtime();
    let gate = Arc::new(Gate::default());
    let g = Arc::clone(&gate);
    let slow = rt
        .register_handler("test.batch_slow", move |req, out| {
            g.wait();
            out.extend_from_slice(req.input())
        })
        .unwrap();
    let mut futures = rt
        .submit_batch(
            Route::Cpu,
            &[(Method::ECHO, b"quick"), (Method::ECHO, b"quick too")],
        )
        .unwrap();
    // Both finished before the slow ones are queued.
    for f in &futures {
        while !f.test().unwrap() {
            std::thread::yield_now();
        }
    }
    futures.extend(
        rt.submit_batch(Route::Cpu, &[(slow, b"late"), (Method::ECHO, b"after")])
            .unwrap(),
    );
    let err = rt
        .wait_batch(futures, Some(Duration::from_millis(20)))
        .unwrap_err();
    assert_eq!((err.index(), err.status()), (2, Status::Timeout));
    assert!(
        err.error().message().contains("futures[2]"),
        "message: {}",
        err.error().message()
    );
    assert_eq!(err.results()[1].as_deref(), Ok(&b"quick too"[..]));
    assert_eq!(err.futures().len(), 2);
    let (results, _, left) = err.into_parts();
    assert_eq!(results.len(), 2);

    // Polling once gives the same; after the gate opens, the rest comes.
    let left = rt
        .wait_batch(left, Some(Duration::ZERO))
        .unwrap_err()
        .into_futures();
    assert_eq!(left.len(), 2);
    gate.open();
    let results = rt.wait_batch(left, None).unwrap();
    assert_eq!(results[0].as_deref(), Ok(&b"late"[..]));
    assert_eq!(results[1].as_deref(), Ok(&b"after"[..]));
}

#[test]
fn a_future_of_another_runtime_stops_the_wait() {
    let rt = runtime();
    let other = runtime();
    let mut futures = rt
        .submit_batch(Route::Cpu, &[(Method::ECHO, b"mine")])
        .unwrap();
    futures.push(other.submit(Route::Cpu, Method::ECHO, b"theirs").unwrap());
    futures.push(rt.submit(Route::Cpu, Method::ECHO, b"mine too").unwrap());
    let err = rt.wait_batch(futures, None).unwrap_err();
    assert_eq!((err.index(), err.status()), (1, Status::Invalid));
    assert_eq!(err.results()[0].as_deref(), Ok(&b"mine"[..]));
    let mut left = err.into_futures().into_iter();
    assert_eq!(left.next().unwrap().wait(None).unwrap(), b"theirs");
    assert_eq!(other.wait_batch(Vec::new(), None).unwrap().len(), 0);
    assert_eq!(
        rt.wait_batch(left.collect(), None).unwrap()[0].as_deref(),
        Ok(&b"mine too"[..])
    );
}

#[test]
fn batches_from_a_handler() {
    let rt = runtime();
    let fan_out = rt
        .register_handler("test.batch_fan_out", |req, out| {
            let rt = req.runtime();
            let tasks: Vec<(Method, &[u8])> =
                req.input().chunks(1).map(|c| (Method::ECHO, c)).collect();
            let futures = rt.submit_batch(Route::Cpu, &tasks)?;
            for r in rt.wait_batch(futures, None)? {
                out.extend_from_slice(&r?)?;
            }
            Ok(())
        })
        .unwrap();
    assert_eq!(rt.call(Route::Cpu, fan_out, b"fan").unwrap(), b"fan");
}

#[test]
fn a_stop_past_the_first_wait_window_names_its_index() {
    // wait_batch takes 1024 futures a call: the message counts from the
    // start of the whole slice.
    if common::client_mode() {
        eprintln!("skipped in client mode: a client has 1024 task slots (server.client_slots)");
        return;
    }
    let rt = runtime_with(2, "queue_depth: 4096\n");
    let gate = Arc::new(Gate::default());
    let g = Arc::clone(&gate);
    let slow = rt
        .register_handler("test.batch_gated", move |_req, _out| {
            g.wait();
            Ok(())
        })
        .unwrap();
    let mut tasks: Vec<(Method, &[u8])> = vec![(Method::ECHO, b"e"); 1100];
    tasks.push((slow, b""));
    let futures = rt.submit_batch(Route::Cpu, &tasks).unwrap();
    let err = rt
        .wait_batch(futures, Some(Duration::from_millis(300)))
        .unwrap_err();
    assert_eq!((err.index(), err.status()), (1100, Status::Timeout));
    assert!(
        err.error().message().starts_with("futures[1100]: "),
        "message: {}",
        err.error().message()
    );
    gate.open();
    assert_eq!(
        rt.wait_batch(err.into_futures(), None).unwrap()[0].as_deref(),
        Ok(&b""[..])
    );
}
