//! Unit tests of `reject.rs`.

use super::*;

#[test]
fn busy_maps_to_409_with_retry_after_and_aborted() {
    let err = LockError::Busy {
        held_elsewhere: 3,
        nodes: 5,
        retry_after: Some(Duration::from_millis(2_100)),
        attempts: 1,
    };
    // The holder's 2.1 s, capped at 1 s by default; rounded up under a larger cap.
    let http = Rejection::from_lock_error(err.clone(), Protocol::Http).into_response();
    assert_eq!(http.status(), StatusCode::CONFLICT);
    assert_eq!(http.headers()[header::RETRY_AFTER], "1");
    let capped = Rejection::from_lock_error(err.clone(), Protocol::Http)
        .with_retry_cap(Duration::from_secs(30))
        .into_response();
    assert_eq!(capped.headers()[header::RETRY_AFTER], "3");
    let grpc = Rejection::from_lock_error(err, Protocol::Grpc).into_response();
    assert_eq!(grpc.status(), StatusCode::OK);
    assert_eq!(grpc.headers()["grpc-status"], "10");
    assert!(grpc.body().is_empty());
}

/// A node in the restart quarantine for `remaining`.
fn quarantined_node(remaining: Duration) -> crate::error::NodeFailure {
    crate::error::NodeFailure {
        node: "n:1".into(),
        error: crate::error::NodeError::Quarantined {
            remaining,
            reason: crate::error::QuarantineReason::Restarted,
        },
    }
}

/// No quorum because of one node in the restart quarantine for `remaining`.
fn quarantined_for(remaining: Duration) -> LockError {
    LockError::NoQuorum {
        needed: 2,
        reached: 1,
        held_elsewhere: 0,
        failures: vec![quarantined_node(remaining)],
        attempts: 1,
    }
}

#[test]
fn grpc_answers_advise_retries_in_pushback_ms_and_http_answers_in_retry_after() {
    let busy = |ms: Option<u64>| LockError::Busy {
        held_elsewhere: 2,
        nodes: 3,
        retry_after: ms.map(Duration::from_millis),
        attempts: 1,
    };
    let quarantined = quarantined_for(Duration::from_millis(4_200));
    let quarantined_and_down = LockError::NoQuorum {
        needed: 2,
        reached: 0,
        held_elsewhere: 0,
        failures: vec![
            quarantined_node(Duration::from_millis(4_200)),
            crate::error::NodeFailure {
                node: "n:2".into(),
                error: crate::error::NodeError::Timeout,
            },
        ],
        attempts: 1,
    };
    let no_quorum = LockError::NoQuorum {
        needed: 2,
        reached: 0,
        held_elsewhere: 0,
        failures: vec![],
        attempts: 1,
    };
    let ms = Duration::from_millis;
    const U64_MAX: &str = "18446744073709551615";
    // (rejection, retry cap, Retry-After of HTTP, grpc-retry-pushback-ms of gRPC)
    let cases: Vec<(Rejection, Duration, Option<&str>, Option<&str>)> = vec![
        // The hint, not rounded, capped.
        (
            Rejection::from_lock_error(busy(Some(250)), Protocol::Http),
            ms(1_000),
            Some("1"),
            Some("250"),
        ),
        (
            Rejection::from_lock_error(busy(Some(2_100)), Protocol::Http),
            ms(1_000),
            Some("1"),
            Some("1000"),
        ),
        (
            Rejection::from_lock_error(busy(Some(2_100)), Protocol::Http),
            ms(30_000),
            Some("3"),
            Some("2100"),
        ),
        // No hint: the cap.
        (
            Rejection::from_lock_error(busy(None), Protocol::Http),
            ms(1_500),
            Some("2"),
            Some("1500"),
        ),
        (
            Rejection::from_lock_error(no_quorum.clone(), Protocol::Http),
            ms(1_000),
            Some("1"),
            Some("1000"),
        ),
        // The end of the quarantine: its real remaining time, up to the larger of the cap
        // and the quarantine's own cap (30 s).
        (
            Rejection::from_lock_error(quarantined.clone(), Protocol::Http),
            ms(60_000),
            Some("5"),
            Some("4200"),
        ),
        (
            Rejection::from_lock_error(quarantined, Protocol::Http),
            ms(1_000),
            Some("5"),
            Some("4200"),
        ),
        (
            Rejection::from_lock_error(quarantined_for(ms(45_000)), Protocol::Http),
            ms(1_000),
            Some("30"),
            Some("30000"),
        ),
        (
            Rejection::from_lock_error(quarantined_for(ms(45_000)), Protocol::Http),
            ms(40_000),
            Some("40"),
            Some("40000"),
        ),
        // A quarantined node next to one that is down: the usual cap.
        (
            Rejection::from_lock_error(quarantined_and_down.clone(), Protocol::Http),
            ms(1_000),
            Some("1"),
            Some("1000"),
        ),
        (
            Rejection::lost(&LostReason::MaxHoldReached, Protocol::Http),
            ms(700),
            Some("1"),
            Some("700"),
        ),
        // At least 1 ms, at least 1 s.
        (
            Rejection::from_lock_error(busy(Some(0)), Protocol::Http),
            ms(1_000),
            Some("1"),
            Some("1"),
        ),
        (
            Rejection::from_lock_error(busy(Some(5)), Protocol::Http),
            Duration::ZERO,
            Some("1"),
            Some("1"),
        ),
        (
            Rejection::from_lock_error(busy(Some(5)), Protocol::Http),
            Duration::from_micros(1_999),
            Some("1"),
            Some("1"),
        ),
        (
            Rejection::from_lock_error(busy(None), Protocol::Http),
            Duration::MAX,
            Some(U64_MAX),
            Some(U64_MAX),
        ),
        // Nothing to wait for.
        (
            Rejection::bad_request("bad", Protocol::Http),
            ms(1_000),
            None,
            None,
        ),
        (Rejection::key_reused(Protocol::Http), ms(1_000), None, None),
        (
            Rejection::response_not_kept(Protocol::Http),
            ms(1_000),
            None,
            None,
        ),
        (
            Rejection::from_lock_error(LockError::InvalidName { reason: "empty" }, Protocol::Http),
            ms(1_000),
            None,
            None,
        ),
    ];
    for (i, (rejection, cap, retry_after, pushback)) in cases.into_iter().enumerate() {
        let rejection = rejection.with_retry_cap(cap);
        let grpc = Rejection {
            protocol: Protocol::Grpc,
            ..rejection.clone()
        };
        let http = rejection.into_response();
        assert_eq!(
            http.headers().get("grpc-retry-pushback-ms"),
            None,
            "case {i}"
        );
        assert_eq!(
            http.headers()
                .get(header::RETRY_AFTER)
                .map(|v| v.to_str().unwrap_or("?")),
            retry_after,
            "case {i}"
        );
        let grpc = grpc.into_response();
        assert_eq!(grpc.headers().get(header::RETRY_AFTER), None, "case {i}");
        assert_eq!(
            grpc.headers()
                .get("grpc-retry-pushback-ms")
                .map(|v| v.to_str().unwrap_or("?")),
            pushback,
            "case {i}"
        );
    }
}

#[test]
fn unavailable_advises_the_end_of_the_quarantine_up_to_the_cap() {
    let quarantined = |secs| crate::error::NodeFailure {
        node: "n:1".into(),
        error: crate::error::NodeError::Quarantined {
            remaining: Duration::from_secs(secs),
            reason: crate::error::QuarantineReason::Restarted,
        },
    };
    let err = LockError::NoQuorum {
        needed: 2,
        reached: 1,
        held_elsewhere: 0,
        failures: vec![quarantined(7), quarantined(4)],
        attempts: 1,
    };
    let res = Rejection::from_lock_error(err.clone(), Protocol::Http)
        .with_retry_cap(Duration::from_secs(60))
        .into_response();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.headers()[header::RETRY_AFTER], "4");
    // The quarantine's real remaining time gets through the default cap of 1 s.
    let default = Rejection::from_lock_error(err, Protocol::Http).into_response();
    assert_eq!(default.headers()[header::RETRY_AFTER], "4");
}

/// A 503 during the restart quarantine can be told from a lost quorum: its own problem
/// type, text and gRPC message.
#[test]
fn the_quarantine_has_a_problem_type_and_a_message_of_its_own() {
    let quarantine =
        Rejection::from_lock_error(quarantined_for(Duration::from_secs(9)), Protocol::Grpc);
    assert_eq!(quarantine.kind(), &RejectionKind::Unavailable);
    assert_eq!(
        quarantine.problem_type(),
        super::super::problems::QUARANTINE
    );
    assert!(
        quarantine.message().contains("starting up"),
        "{}",
        quarantine.message()
    );
    let res = quarantine.into_response();
    assert_eq!(res.headers()["grpc-status"], "14");
    assert!(
        res.headers()["grpc-message"]
            .to_str()
            .is_ok_and(|m| m.contains("starting up")),
        "{:?}",
        res.headers()["grpc-message"]
    );
    assert_eq!(res.headers()["grpc-retry-pushback-ms"], "9000");
    for not_only in [
        LockError::NoQuorum {
            needed: 2,
            reached: 0,
            held_elsewhere: 0,
            failures: vec![],
            attempts: 1,
        },
        LockError::NoQuorum {
            needed: 2,
            reached: 0,
            held_elsewhere: 0,
            failures: vec![
                quarantined_node(Duration::from_secs(9)),
                crate::error::NodeFailure {
                    node: "n:2".into(),
                    error: crate::error::NodeError::Timeout,
                },
            ],
            attempts: 1,
        },
    ] {
        let r = Rejection::from_lock_error(not_only, Protocol::Grpc);
        assert_eq!(r.problem_type(), super::super::problems::UNAVAILABLE);
        assert!(!r.message().contains("starting up"));
    }
}

#[test]
fn grpc_messages_are_percent_encoded() {
    assert_eq!(percent_encode("a b%ç"), "a b%25%C3%A7");
}

#[test]
fn every_rejection_links_its_problem_type() {
    let busy = LockError::Busy {
        held_elsewhere: 2,
        nodes: 3,
        retry_after: None,
        attempts: 1,
    };
    let no_quorum = LockError::NoQuorum {
        needed: 2,
        reached: 0,
        held_elsewhere: 0,
        failures: Vec::new(),
        attempts: 1,
    };
    let http = Protocol::Http;
    let cases = [
        (Rejection::from_lock_error(busy, http), 409, "#busy", "busy"),
        (
            Rejection::from_lock_error(no_quorum, http),
            503,
            "#unavailable",
            "unavailable",
        ),
        (
            Rejection::from_lock_error(quarantined_for(Duration::from_secs(3)), http),
            503,
            "#quarantine",
            "unavailable",
        ),
        (
            Rejection::lost(&LostReason::MaxHoldReached, http),
            503,
            "#lost",
            "unavailable",
        ),
        (
            Rejection::lost(&LostReason::Expired, http),
            503,
            "#lost",
            "unavailable",
        ),
        (
            Rejection::unreadable_record(http),
            503,
            "#record-unreadable",
            "unavailable",
        ),
        (
            Rejection::bad_request("the key header is empty", http),
            400,
            "#bad-request",
            "bad_request",
        ),
        (
            Rejection::from_lock_error(LockError::InvalidName { reason: "empty" }, http),
            400,
            "#bad-request",
            "bad_request",
        ),
        (
            Rejection::key_reused(http),
            422,
            "#key-reused",
            "key_reused",
        ),
        (
            Rejection::response_not_kept(http),
            410,
            "#response-not-kept",
            "response_not_kept",
        ),
    ];
    let base = "https://docs.rs/tower-redlock/latest/tower_redlock/layer/problems/index.html";
    let mut accept = HeaderMap::new();
    accept.insert(header::ACCEPT, "application/problem+json".parse().unwrap());
    for (rejection, status, anchor, kind) in cases {
        let uri = format!("{base}{anchor}");
        assert_eq!(rejection.problem_type(), uri);
        let res = rejection.negotiate(&accept).into_response();
        assert_eq!(res.status(), status, "{anchor}");
        let body = res.body();
        assert!(
            body.starts_with(&format!(r#"{{"type":"{uri}","title":""#)),
            "{body}"
        );
        assert!(body.contains(&format!(r#""kind":"{kind}""#)), "{body}");
    }
}

/// Every problem type's URI points at a section of `problems.rs`'s documentation (a
/// heading whose rustdoc anchor is the URI's fragment), under the crate's docs.
#[test]
fn problem_types_have_their_sections() {
    let docs = include_str!("problems.rs");
    for problem in super::super::problems::Problem::ALL {
        let (base, anchor) = problem.uri().split_once('#').expect("a fragment");
        assert_eq!(
            base,
            "https://docs.rs/tower-redlock/latest/tower_redlock/layer/problems/index.html"
        );
        assert!(
            docs.contains(&format!("\n//! # {anchor}\n")),
            "no section {anchor}"
        );
        assert!(!problem.title().is_empty());
    }
}

/// A replayed key that too few nodes can answer for after restarts: its own problem type
/// and message, over HTTP and gRPC, advising the time until enough nodes can, up to the
/// quarantine's cap (or the layer's, if larger).
#[test]
fn an_unverifiable_replay_has_a_problem_type_and_advice_of_its_own() {
    let unverifiable = |secs| LockError::Unverifiable {
        vouching: 1,
        granted: 3,
        needed: 2,
        retry_after: Some(Duration::from_secs(secs)),
        attempts: 1,
    };
    let http = Rejection::from_lock_error(unverifiable(12), Protocol::Http);
    assert_eq!(http.kind(), &RejectionKind::Unavailable);
    assert_eq!(
        http.problem_type(),
        super::super::problems::REPLAY_UNVERIFIABLE
    );
    assert!(http.message().contains("already ran"), "{}", http.message());
    let res = http.into_response();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.headers()[header::RETRY_AFTER], "12");
    let long = Rejection::from_lock_error(unverifiable(86_000), Protocol::Http);
    assert_eq!(long.retry_after_secs(), Some(30), "the quarantine's cap");
    let long = long.with_retry_cap(Duration::from_secs(600));
    assert_eq!(long.retry_after_secs(), Some(600), "the layer's, if larger");

    let res = Rejection::from_lock_error(unverifiable(2), Protocol::Grpc).into_response();
    assert_eq!(res.headers()["grpc-status"], "14");
    assert!(
        res.headers()["grpc-message"]
            .to_str()
            .is_ok_and(|m| m.contains("already ran")),
        "{:?}",
        res.headers()["grpc-message"]
    );
    assert_eq!(res.headers()["grpc-retry-pushback-ms"], "2000");
}

/// A webhook receiver's busy and reused-key answers speak of delivery ids, with the same
/// kind, status and problem type; its other answers are unchanged.
#[test]
fn a_receivers_rejections_speak_of_deliveries() {
    let reused = Rejection::key_reused(Protocol::Http).of_a_delivery();
    assert_eq!(reused.kind(), &RejectionKind::KeyReused);
    assert!(
        reused.message().contains("delivery id"),
        "{}",
        reused.message()
    );
    assert!(!reused.message().contains("key"), "{}", reused.message());
    assert_eq!(reused.problem_type(), super::super::problems::KEY_REUSED);
    assert_eq!(
        reused.into_response().status(),
        StatusCode::UNPROCESSABLE_ENTITY
    );

    let busy = Rejection::from_lock_error(
        LockError::Busy {
            held_elsewhere: 2,
            nodes: 3,
            retry_after: None,
            attempts: 1,
        },
        Protocol::Http,
    )
    .of_a_delivery();
    assert!(busy.message().contains("delivery"), "{}", busy.message());
    assert_eq!(busy.into_response().status(), StatusCode::CONFLICT);

    let bad = Rejection::bad_request("the x-github-delivery header is missing", Protocol::Http);
    assert_eq!(bad.clone().of_a_delivery().message(), bad.message());
}
