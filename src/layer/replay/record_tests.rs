//! Unit tests of `record.rs`.

use super::*;

#[test]
fn records_round_trip_and_garbage_is_refused() {
    let policy = ReplayPolicy::new(Duration::from_secs(60));
    let (mut parts, ()) = Response::new(()).into_parts();
    parts.status = StatusCode::CREATED;
    parts
        .headers
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    parts
        .headers
        .insert("x-secret", HeaderValue::from_static("not kept"));
    let encoded = policy
        .encode(&[7; 32], parts.status, &parts.headers, Some(b"hello"), None)
        .unwrap_or_default();
    assert_eq!(decode(&encoded).map(|r| r.fingerprint), Ok([7; 32]));
    let (res, trailers) = decode(&encoded)
        .ok()
        .and_then(Record::into_response)
        .unwrap_or_default();
    assert!(trailers.is_none());
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(res.headers()[header::CONTENT_TYPE], "text/plain");
    assert!(res.headers().get("x-secret").is_none());
    assert_eq!(res.headers()[REPLAYED_HEADER], "true");
    assert_eq!(res.body(), &Bytes::from_static(b"hello"));
    assert_eq!(
        decode(b"#record\n\x00").err(),
        Some(RecordError::Unreadable)
    );
    assert_eq!(decode(b"0123abcd").err(), Some(RecordError::Unreadable));
    // Over the limit: "completed, not kept", never an empty success.
    let not_kept = policy
        .encode(&[7; 32], parts.status, &parts.headers, None, None)
        .unwrap_or_default();
    let record = decode(&not_kept).expect("a record");
    assert_eq!(record.fingerprint, [7; 32]);
    assert!(record.into_response().is_none());
    // An empty body is kept as empty.
    let empty = policy
        .encode(
            &[7; 32],
            StatusCode::NO_CONTENT,
            &parts.headers,
            Some(b""),
            None,
        )
        .unwrap_or_default();
    let (res, _) = decode(&empty)
        .ok()
        .and_then(Record::into_response)
        .unwrap_or_default();
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    assert!(res.body().is_empty());
    // An unknown body flag is unreadable, not an empty body.
    let mut unknown = policy
        .encode_head(&[7; 32], parts.status, &parts.headers)
        .unwrap_or_default();
    unknown.push(7);
    assert_eq!(decode(&unknown).err(), Some(RecordError::Unreadable));
}

#[test]
fn grpc_records_keep_trailers_and_one_message_only() {
    let policy = ReplayPolicy::new(Duration::from_secs(60));
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    trailers.insert("x-internal", HeaderValue::from_static("not kept"));
    trailers.insert("grpc-custom-bin", HeaderValue::from_static("AAE"));
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc+proto"),
    );
    headers.insert("grpc-encoding", HeaderValue::from_static("gzip"));
    headers.insert("x-internal", HeaderValue::from_static("not kept"));
    let message = b"\x00\x00\x00\x00\x02hi";
    // A header list without content-type: gRPC's fields are kept all the same.
    let policy = policy.headers([header::LOCATION]);
    let encoded = policy
        .encode(
            &[1; 32],
            StatusCode::OK,
            &headers,
            Some(message),
            Some(&trailers),
        )
        .unwrap_or_default();
    let (res, kept) = decode(&encoded)
        .ok()
        .and_then(Record::into_response)
        .unwrap_or_default();
    assert_eq!(res.body().as_ref(), message);
    assert_eq!(
        res.headers()[header::CONTENT_TYPE],
        "application/grpc+proto"
    );
    assert_eq!(res.headers()["grpc-encoding"], "gzip");
    assert!(res.headers().get("x-internal").is_none());
    let kept = kept.unwrap_or_default();
    assert_eq!(grpc_status(&kept), Some(0));
    assert_eq!(kept["grpc-custom-bin"], "AAE");
    assert!(kept.get("x-internal").is_none());
    assert!(policy.keeps_grpc(0) && policy.keeps_grpc(5));
    assert!(!policy.keeps_grpc(10) && !policy.keeps_grpc(14));
}

#[test]
fn retentions_are_ones_the_nodes_accept() {
    let kept = |d: Duration| ReplayPolicy::new(d).retention();
    assert_eq!(kept(Duration::ZERO), Duration::from_millis(1));
    assert_eq!(kept(Duration::MAX), LONGEST_RETENTION);
    assert_eq!(kept(Duration::from_secs(60)), Duration::from_secs(60));
}

#[test]
fn header_counts_are_capped_when_written_and_when_read() {
    let policy = ReplayPolicy::new(Duration::from_secs(60));
    let mut headers = HeaderMap::new();
    for i in 0..=MAX_RECORD_HEADERS {
        let value = HeaderValue::from(i);
        headers.append(header::LOCATION, value);
    }
    assert_eq!(
        policy.encode(&[0; 32], StatusCode::OK, &headers, None, None),
        None,
        "more fields than a record holds: not kept"
    );
    // A hand-made record with 40,000 distinct fields (a HeaderMap holds 32,768).
    let mut forged = RECORD_MARKER.to_vec();
    forged.extend_from_slice(&[0; 32]);
    forged.extend_from_slice(&201u16.to_be_bytes());
    put_len(&mut forged, 40_000);
    for i in 0..40_000 {
        put_bytes(&mut forged, format!("x-h{i}").as_bytes());
        put_bytes(&mut forged, b"v");
    }
    forged.push(0);
    assert_eq!(
        decode(&forged).err(),
        Some(RecordError::TooManyHeaders { count: 40_000 })
    );
}

/// Statuses a forged or unauthenticated request can cause are not kept by default, nor an
/// inner timeout or a replayed early-data request; the policy changes the rule one status
/// at a time, the last word winning.
#[test]
fn statuses_that_could_poison_are_not_kept_unless_asked() {
    let policy = ReplayPolicy::new(Duration::from_secs(60));
    for status in [401, 403, 407, 408, 409, 425, 429, 500, 503] {
        let status = StatusCode::from_u16(status).unwrap_or_default();
        assert!(!policy.keeps(status), "{status}");
    }
    for status in [200, 201, 204, 400, 404, 410, 422] {
        let status = StatusCode::from_u16(status).unwrap_or_default();
        assert!(policy.keeps(status), "{status}");
    }
    assert!(
        !policy.keeps_grpc(7) && !policy.keeps_grpc(16),
        "PERMISSION_DENIED, UNAUTHENTICATED"
    );
    let changed = policy
        .keep_status(StatusCode::UNAUTHORIZED, true)
        .keep_status(StatusCode::NOT_FOUND, false)
        .keep_status(StatusCode::NOT_FOUND, true)
        .keep_status(StatusCode::CREATED, false)
        .keep_grpc_code(16, true)
        .keep_grpc_code(0, false);
    assert!(changed.keeps(StatusCode::UNAUTHORIZED));
    assert!(changed.keeps(StatusCode::NOT_FOUND), "the last word wins");
    assert!(!changed.keeps(StatusCode::CREATED));
    assert!(changed.keeps_grpc(16) && !changed.keeps_grpc(0));
}
