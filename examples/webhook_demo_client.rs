//! The load generator of `scripts/demo`: fires concurrent duplicate deliveries at the
//! `axum_webhook` example and prints, per delivery id, how often the server processed it
//! (from `GET /stats`) and how the duplicates were answered.
//!
//! ```text
//! cargo run --features axum --example axum_webhook &      # listens on 127.0.0.1:3000
//! cargo run --example webhook_demo_client -- \
//!     --url http://127.0.0.1:3000 --ids 20 --dups 10 --prefix phase1 [--expect once|none]
//! ```
//!
//! All `ids x dups` requests are sent at once, duplicates interleaved. `--expect once`
//! (the default) exits with status 1 unless every id was processed exactly once;
//! `--expect none` unless no id was processed (no quorum of nodes is up). In the table,
//! "200 new" counts requests that did the work and "200 dup" those answered "already
//! processed" (a duplicate that arrived after the first had finished).

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

struct Args {
    url: String,
    ids: usize,
    dups: usize,
    prefix: String,
    expect_once: bool,
}

fn parse_args() -> Result<Args, Box<dyn Error>> {
    let mut args = Args {
        url: "http://127.0.0.1:3000".into(),
        ids: 20,
        dups: 10,
        prefix: "delivery".into(),
        expect_once: true,
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
                args.expect_once = match value()?.as_str() {
                    "once" => true,
                    "none" => false,
                    other => return Err(format!("--expect once|none, not {other:?}").into()),
                }
            }
            "-h" | "--help" => {
                println!(
                    "usage: webhook_demo_client [--url URL] [--ids N] [--dups N] \
                     [--prefix P] [--expect once|none]"
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
    ok_already: usize,
    conflict: usize,
    unavailable: usize,
    other: usize,
}

/// Sends one delivery: its status and body, or the transport error.
async fn deliver(
    client: HttpClient,
    uri: Uri,
    id: String,
) -> (String, Result<(StatusCode, Bytes), String>) {
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
        let body = res.into_body().collect().await?.to_bytes();
        Ok::<_, Box<dyn Error + Send + Sync>>((status, body))
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
        let (status, body) = match outcome {
            Ok(answer) => answer,
            Err(e) => {
                t.other += 1;
                samples.entry("transport error".into()).or_insert(e);
                continue;
            }
        };
        match status {
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
        "  {:<14} {:>9} {:>7} {:>7} {:>5} {:>5} {:>5}",
        "delivery id", "processed", "200 new", "200 dup", "409", "503", "other"
    );
    let mut once = true;
    let mut none = true;
    for (id, t) in &tally {
        let n = counts.get(id).copied().unwrap_or(0);
        once &= n == 1;
        none &= n == 0;
        println!(
            "  {:<14} {:>9} {:>7} {:>7} {:>5} {:>5} {:>5}",
            id, n, t.ok_processed, t.ok_already, t.conflict, t.unavailable, t.other
        );
    }
    for (what, said) in &samples {
        println!("  {what}: {said}");
    }
    let verdict = if once { "yes" } else { "no" };
    if args.expect_once {
        println!("processed exactly once per id: {verdict}");
        if !once {
            println!("NOT AS EXPECTED: every id should have been processed exactly once");
            std::process::exit(1);
        }
    } else if none {
        println!(
            "processed exactly once per id: {verdict} (as expected without a quorum: \
             no id was processed)"
        );
    } else {
        println!("processed exactly once per id: {verdict}");
        println!("NOT AS EXPECTED: no id should have been processed");
        std::process::exit(1);
    }
    Ok(())
}
