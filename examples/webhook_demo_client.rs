//! The load generator of `scripts/demo`: fires concurrent duplicate deliveries at the
//! `axum_webhook` example and prints, per delivery id, how often the server processed it
//! (from `GET /stats`) and how the duplicates were answered.
//!
//! ```text
//! cargo run --features axum --example axum_webhook &      # listens on 127.0.0.1:3000
//! cargo run --example webhook_demo_client -- \
//!     --url http://127.0.0.1:3000 --ids 20 --dups 10 --prefix phase1 \
//!     [--expect once|none|replayed]
//! ```
//!
//! All `ids x dups` requests are sent at once, duplicates interleaved. `--expect once`
//! (the default) exits with status 1 unless every id was processed exactly once;
//! `--expect none` unless no id was processed (no quorum of nodes is up);
//! `--expect replayed` (redeliveries of ids processed earlier) unless every request got
//! the stored response back (`idempotent-replayed: true`) and every id is still processed
//! exactly once. In the table, "200 new" counts requests that did the work, "200 replay"
//! those answered with the stored response of a delivery that had finished, and "200 dup"
//! those the handler answered "already processed".

use std::collections::BTreeMap;
use std::error::Error;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::{Method, Request, StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// What a run expects of the server.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Every id processed exactly once.
    Once,
    /// No id processed (no quorum).
    None,
    /// Every request answered by replay; every id still processed exactly once.
    Replayed,
}

struct Args {
    url: String,
    ids: usize,
    dups: usize,
    prefix: String,
    expect: Expect,
}

fn parse_args() -> Result<Args, Box<dyn Error>> {
    let mut args = Args {
        url: "http://127.0.0.1:3000".into(),
        ids: 20,
        dups: 10,
        prefix: "delivery".into(),
        expect: Expect::Once,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--url" => args.url = value()?,
            "--ids" => args.ids = value()?.parse()?,
            "--dups" => args.dups = value()?.parse()?,
            "--prefix" => args.prefix = value()?,
            "--expect" => {
                args.expect = match value()?.as_str() {
                    "once" => Expect::Once,
                    "none" => Expect::None,
                    "replayed" => Expect::Replayed,
                    other => {
                        return Err(format!("--expect once|none|replayed, not {other:?}").into());
                    }
                }
            }
            "-h" | "--help" => {
                println!(
                    "usage: webhook_demo_client [--url URL] [--ids N] [--dups N] \
                     [--prefix P] [--expect once|none|replayed]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}; try --help").into()),
        }
    }
    args.url = args.url.trim_end_matches('/').to_owned();
    Ok(args)
}

/// How one delivery id's requests were answered.
#[derive(Default)]
struct Tally {
    ok_processed: usize,
    ok_replayed: usize,
    ok_already: usize,
    conflict: usize,
    unavailable: usize,
    other: usize,
}

/// A delivery's answer: status, body, and whether it was a replayed stored response.
type Answer = (StatusCode, Bytes, bool);

/// Sends one delivery: its answer, or the transport error.
async fn deliver(client: HttpClient, uri: Uri, id: String) -> (String, Result<Answer, String>) {
    let outcome = async {
        let req = Request::builder()
            .method(Method::POST)
            .uri(uri)
            .header("x-github-delivery", &id)
            .header("x-github-event", "push")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(
                b"{\"ref\":\"refs/heads/main\"}",
            )))?;
        let res = client.request(req).await?;
        let status = res.status();
        let replayed = res.headers().contains_key("idempotent-replayed");
        let body = res.into_body().collect().await?.to_bytes();
        Ok::<_, Box<dyn Error + Send + Sync>>((status, body, replayed))
    }
    .await;
    (id, outcome.map_err(|e| e.to_string()))
}

async fn processed_counts(
    url: &str,
    prefix: &str,
) -> Result<BTreeMap<String, u64>, Box<dyn Error>> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let res = client.get(format!("{url}/stats").parse()?).await?;
    if !res.status().is_success() {
        return Err(format!("GET /stats answered {}", res.status()).into());
    }
    let body = res.into_body().collect().await?.to_bytes();
    let ours = format!("{prefix}-");
    let mut counts = BTreeMap::new();
    for line in String::from_utf8_lossy(&body).lines() {
        if let Some((id, n)) = line.split_once(' ')
            && id.starts_with(&ours)
        {
            counts.insert(id.to_owned(), n.trim().parse()?);
        }
    }
    Ok(counts)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let args = parse_args()?;
    let uri: Uri = format!("{}/webhook", args.url).parse()?;
    let client: HttpClient = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(5))
        .build_http();
    let ids: Vec<String> = (0..args.ids)
        .map(|i| format!("{}-{i:02}", args.prefix))
        .collect();

    // Every request at once; the duplicates of one id are spread over the batch.
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(args.ids * args.dups);
    for _ in 0..args.dups {
        for id in &ids {
            tasks.push(tokio::spawn(deliver(
                client.clone(),
                uri.clone(),
                id.clone(),
            )));
        }
    }
    let mut tally: BTreeMap<String, Tally> = ids
        .iter()
        .map(|id| (id.clone(), Tally::default()))
        .collect();
    let mut samples: BTreeMap<String, String> = BTreeMap::new();
    for task in tasks {
        let (id, outcome) = task.await?;
        let t = tally.entry(id).or_default();
        let (status, body, replayed) = match outcome {
            Ok(answer) => answer,
            Err(e) => {
                t.other += 1;
                samples.entry("transport error".into()).or_insert(e);
                continue;
            }
        };
        match status {
            StatusCode::OK if replayed => t.ok_replayed += 1,
            StatusCode::OK if body.starts_with(b"already") => t.ok_already += 1,
            StatusCode::OK => t.ok_processed += 1,
            StatusCode::CONFLICT => t.conflict += 1,
            StatusCode::SERVICE_UNAVAILABLE => t.unavailable += 1,
            _ => t.other += 1,
        }
        if status != StatusCode::OK {
            samples
                .entry(format!("a {}", status.as_u16()))
                .or_insert_with(|| String::from_utf8_lossy(&body).trim().to_owned());
        }
    }
    let elapsed = started.elapsed();

    let counts = processed_counts(&args.url, &args.prefix).await?;
    println!(
        "{}: {} deliveries ({} ids x {} duplicates, all at once) answered in {} ms",
        args.prefix,
        args.ids * args.dups,
        args.ids,
        args.dups,
        elapsed.as_millis()
    );
    println!(
        "  {:<14} {:>9} {:>7} {:>10} {:>7} {:>5} {:>5} {:>5}",
        "delivery id", "processed", "200 new", "200 replay", "200 dup", "409", "503", "other"
    );
    let mut once = true;
    let mut none = true;
    let mut all_replayed = true;
    for (id, t) in &tally {
        let n = counts.get(id).copied().unwrap_or(0);
        once &= n == 1;
        none &= n == 0;
        all_replayed &= t.ok_replayed == args.dups;
        println!(
            "  {:<14} {:>9} {:>7} {:>10} {:>7} {:>5} {:>5} {:>5}",
            id, n, t.ok_processed, t.ok_replayed, t.ok_already, t.conflict, t.unavailable, t.other
        );
    }
    for (what, said) in &samples {
        println!("  {what}: {said}");
    }
    let verdict = if once { "yes" } else { "no" };
    match args.expect {
        Expect::Once | Expect::Replayed => {
            println!("processed exactly once per id: {verdict}");
            if !once {
                println!("NOT AS EXPECTED: every id should have been processed exactly once");
                std::process::exit(1);
            }
            if args.expect == Expect::Replayed {
                let said = if all_replayed { "yes" } else { "no" };
                println!("every redelivery got the stored response back: {said}");
                if !all_replayed {
                    println!("NOT AS EXPECTED: every redelivery should have been replayed");
                    std::process::exit(1);
                }
            }
        }
        Expect::None if none => println!(
            "processed exactly once per id: {verdict} (as expected without a quorum: \
             no id was processed)"
        ),
        Expect::None => {
            println!("processed exactly once per id: {verdict}");
            println!("NOT AS EXPECTED: no id should have been processed");
            std::process::exit(1);
        }
    }
    Ok(())
}
