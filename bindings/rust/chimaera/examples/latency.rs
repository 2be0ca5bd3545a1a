//! Round-trip latency of small tasks: submit, then wait, one at a time.
//!
//!     cargo run --release --example latency -- [ITERATIONS]
//!
//! Prints p50, p99 and max per route and method: CPU workers always, each GPU
//! too when the runtime drives any.

use std::time::{Duration, Instant};

use chimaera::{Config, Method, Route, Runtime};

fn measure(
    rt: &Runtime,
    route: Route,
    method: Method,
    input: &[u8],
    iterations: usize,
) -> Vec<Duration> {
    let mut out = [0u8; 64];
    // Warm-up: wake the workers or orchestrator, fault in the slots.
    for _ in 0..iterations / 10 + 1 {
        let f = rt.submit(route, method, input).expect("submit");
        f.wait_into(&mut out, None).expect("wait");
    }
    let mut samples = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let start = Instant::now();
        let f = rt.submit(route, method, input).expect("submit");
        f.wait_into(&mut out, None).expect("wait");
        samples.push(start.elapsed());
    }
    samples.sort_unstable();
    samples
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn main() -> Result<(), chimaera::Error> {
    let iterations: usize = match std::env::args().nth(1) {
        Some(arg) => arg.parse().unwrap_or_else(|_| {
            eprintln!("usage: latency [ITERATIONS]");
            std::process::exit(2)
        }),
        None => 20_000,
    };
    let rt = Runtime::new(&Config::new())?;
    println!(
        "chimaera {}: {} iterations per row, {} GPU(s)",
        chimaera::version_string(),
        iterations,
        rt.gpu_count()
    );

    let mut add = [0u8; 16];
    add[..8].copy_from_slice(&1u64.to_le_bytes());
    add[8..].copy_from_slice(&2u64.to_le_bytes());
    let echo = [0x5au8; 64];

    let mut routes = vec![Route::Cpu];
    routes.extend((0..rt.gpu_count()).map(Route::Gpu));

    println!(
        "{:<8} {:<10} {:>10} {:>10} {:>10}",
        "route", "method", "p50 us", "p99 us", "max us"
    );
    for &route in &routes {
        for (name, method, input) in [
            ("chi.add", Method::ADD, &add[..]),
            ("chi.echo", Method::ECHO, &echo[..]),
        ] {
            let s = measure(&rt, route, method, input, iterations);
            let us = |d: Duration| d.as_secs_f64() * 1e6;
            println!(
                "{:<8} {:<10} {:>10.2} {:>10.2} {:>10.2}",
                match route {
                    Route::Gpu(g) => format!("gpu{}", g),
                    _ => "cpu".to_string(),
                },
                name,
                us(percentile(&s, 0.50)),
                us(percentile(&s, 0.99)),
                us(*s.last().unwrap())
            );
        }
    }
    Ok(())
}
