//! Unit tests of `extract.rs`.

use super::*;

fn req(path: &str) -> Request<()> {
    Request::get(path).body(()).unwrap_or_default()
}

#[test]
fn header_extractor() {
    let h = Header::new("x-id");
    let with = Request::get("/")
        .header("x-id", "abc")
        .body(())
        .unwrap_or_default();
    assert_eq!(h.extract(&with), Ok(Some(b"abc".to_vec())));
    assert_eq!(h.extract(&req("/")), Ok(None));
    assert!(h.clone().required().extract(&req("/")).is_err());
    let empty = Request::get("/")
        .header("x-id", "")
        .body(())
        .unwrap_or_default();
    assert!(h.extract(&empty).is_err());
}

fn with_headers(headers: &[(&str, &[u8])]) -> Request<()> {
    let mut req = req("/");
    for (name, value) in headers {
        let value = http::HeaderValue::from_bytes(value);
        let name = HeaderName::from_bytes(name.as_bytes());
        if let (Ok(name), Ok(value)) = (name, value) {
            req.headers_mut().append(name, value);
        }
    }
    req
}

#[test]
fn idempotency_keys_are_structured_field_strings_and_other_headers_are_raw() {
    let key = Header::new("Idempotency-Key");
    let from_name = Header::from_name(HeaderName::from_static("idempotency-key"));
    let raw_key = Header::new("idempotency-key").structured(false);
    let other = Header::new("x-id");
    let structured_other = Header::new("x-id").structured(true);
    let long = format!("\"{}", "s".repeat(300));
    type Want = Result<Option<&'static [u8]>, &'static str>;
    // (extractor, header, value, expected name or a part of the error message)
    let cases: &[(&Header, &str, &[u8], Want)] = &[
        (&key, "idempotency-key", b"\"k\"", Ok(Some(b"k"))),
        (&key, "idempotency-key", b"k", Ok(Some(b"k"))),
        (&from_name, "idempotency-key", b"\"k\"", Ok(Some(b"k"))),
        (
            &key,
            "idempotency-key",
            b" \"a\\\"b\";x=1 ",
            Ok(Some(b"a\"b")),
        ),
        (
            &key,
            "idempotency-key",
            b"\"\"",
            Err("the idempotency-key header is empty"),
        ),
        (
            &key,
            "idempotency-key",
            b"",
            Err("the idempotency-key header is empty"),
        ),
        (
            &key,
            "idempotency-key",
            b"\"k",
            Err("the string has no closing quote (at byte 0)"),
        ),
        (
            &key,
            "idempotency-key",
            b"\"a\\n\"",
            Err("a backslash may only escape"),
        ),
        (
            &key,
            "idempotency-key",
            b"\"\xc3\xa9\"",
            Err("printable ASCII (at byte 1)"),
        ),
        (
            &key,
            "idempotency-key",
            b"\"k\" x",
            Err("something after the string (at byte 4)"),
        ),
        (
            &key,
            "idempotency-key",
            b"\"a\", \"b\"",
            Err("it is a list; send one key (at byte 3)"),
        ),
        (
            &key,
            "idempotency-key",
            b"a b",
            Err("unquoted key holds only visible ASCII"),
        ),
        (
            &key,
            "idempotency-key",
            long.as_bytes(),
            Err("the idempotency-key header is not a structured-field string"),
        ),
        (&raw_key, "idempotency-key", b"\"k\"", Ok(Some(b"\"k\""))),
        (&raw_key, "idempotency-key", b"a, b", Ok(Some(b"a, b"))),
        (&other, "x-id", b"\"k\"", Ok(Some(b"\"k\""))),
        (&other, "x-id", b"a b\xff", Ok(Some(b"a b\xff"))),
        (&other, "x-id", b"", Err("the x-id header is empty")),
        (&structured_other, "x-id", b"\"k\"", Ok(Some(b"k"))),
        (
            &structured_other,
            "x-id",
            b"\"k",
            Err("the x-id header is not a structured-field string"),
        ),
        (&key, "x-other", b"\"k\"", Ok(None)),
    ];
    for (extractor, header, value, want) in cases {
        let got = extractor.extract(&with_headers(&[(header, value)]));
        let shown = String::from_utf8_lossy(value);
        match (got, want) {
            (Ok(got), Ok(want)) => assert_eq!(got.as_deref(), *want, "{header}: {shown}"),
            (Err(got), Err(want)) => {
                assert!(got.message().contains(want), "{header}: {shown}: {got}");
                assert!(got.message().len() < 200, "{header}: {shown}: {got}");
            }
            (got, want) => panic!("{header}: {shown}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn a_header_sent_more_than_once_is_refused_by_every_header_extractor() {
    for extractor in [
        Header::new("Idempotency-Key"),
        Header::new("idempotency-key").structured(false),
        Header::new("idempotency-key").required(),
        Header::new("x-id").structured(true),
    ] {
        let name = match &extractor.name {
            Ok(name) => name.as_str().to_owned(),
            Err(bad) => panic!("{bad}"),
        };
        for values in [&[&b"\"a\""[..], b"\"b\""][..], &[b"a", b"a"], &[b"a", b""]] {
            let headers: Vec<(&str, &[u8])> = values.iter().map(|v| (name.as_str(), *v)).collect();
            let got = extractor.extract(&with_headers(&headers));
            assert_eq!(
                got.map_err(|e| e.message().to_owned()),
                Err(format!("the {name} header is sent more than once")),
                "{values:?}"
            );
        }
        // Once is fine, and another header beside it does not count.
        let once = with_headers(&[(name.as_str(), b"\"a\""), ("x-other", b"\"b\"")]);
        assert!(matches!(extractor.extract(&once), Ok(Some(_))), "{name}");
    }
}

#[test]
fn path_segments_are_percent_decoded_and_bad_templates_do_not_panic() {
    let seg = PathSegment::new(1);
    assert_eq!(seg.extract(&req("/jobs/4%32")), Ok(Some(b"42".to_vec())));
    assert_eq!(seg.extract(&req("/jobs/42")), Ok(Some(b"42".to_vec())));
    assert_eq!(
        seg.extract(&req("/jobs/%zz%4")),
        Ok(Some(b"%zz%4".to_vec()))
    );
    let param = PathParam::new("/jobs/{id}/run", "id");
    assert_eq!(
        param.extract(&req("/jobs/4%32/r%75n")),
        Ok(Some(b"42".to_vec()))
    );
    let bad = PathParam::new("/jobs/{id}", "other");
    assert!(bad.extract(&req("/jobs/1")).is_err());
}

#[test]
fn header_names_are_case_insensitive_and_bad_ones_do_not_panic() {
    let mixed = Header::new("Idempotency-Key");
    let with = Request::get("/")
        .header("idempotency-key", "k1")
        .body(())
        .unwrap_or_default();
    assert_eq!(mixed.extract(&with), Ok(Some(b"k1".to_vec())));
    let bad = Header::new("not a header");
    let err = bad.extract(&req("/")).err().map(|e| e.message().to_owned());
    assert!(
        err.as_deref()
            .is_some_and(|m| m.contains("not a valid header name")),
        "{err:?}"
    );
}

#[test]
fn path_extractors() {
    assert_eq!(
        PathSegment::new(1).extract(&req("/a/b/c")),
        Ok(Some(b"b".to_vec()))
    );
    assert_eq!(PathSegment::new(3).extract(&req("/a/b/c")), Ok(None));
    let p = PathParam::new("/webhooks/{provider}/{id}", "id");
    assert_eq!(p.extract(&req("/webhooks/gh/42")), Ok(Some(b"42".to_vec())));
    assert_eq!(p.extract(&req("/webhooks/gh")), Ok(None));
    assert_eq!(p.extract(&req("/webhooks/gh/42/x")), Ok(None));
    assert_eq!(p.extract(&req("/other/gh/42")), Ok(None));
}

/// Rejection texts fit the request: (HTTP, gRPC) × (header, path parameter, body key) ×
/// rejection kind. A header's texts say "header" over HTTP and "metadata" over gRPC, and never the
/// other protocol's word; the texts of the other kinds name neither (nor an "idempotency
/// key" the request may not have sent), whatever the extractor.
#[test]
fn rejection_texts_name_what_the_request_used_in_its_protocol() {
    use crate::layer::reject::{Protocol, Rejection};
    use crate::{LockError, LostReason};

    let request = |protocol: Protocol, path: &str, header: Option<&[u8]>| {
        let mut b = Request::post(path);
        if protocol == Protocol::Grpc {
            b = b.header("content-type", "application/grpc");
        }
        if let Some(value) = header {
            b = b.header("x-delivery-id", value);
            b = b.header("x-twice", value).header("x-twice", value);
        }
        b.body(()).unwrap_or_default()
    };
    // What the client sees of a rejection: the text body, or the grpc-message.
    let seen = |r: Rejection| {
        let res = r.into_response();
        match res.headers().get("grpc-message") {
            Some(m) => m.to_str().unwrap_or("?").to_owned(),
            None => res.body().clone(),
        }
    };
    let header = Header::new("x-delivery-id").required();
    let structured = Header::new("x-delivery-id").structured(true);
    let twice = Header::new("x-twice");
    let path = PathParam::new("/accounts/{id}/credit", "missing");
    #[cfg(feature = "json")]
    let body_key = crate::layer::BodyKey::json("id");
    for protocol in [Protocol::Http, Protocol::Grpc] {
        let (word, other) = match protocol {
            Protocol::Http => ("header", "metadata"),
            Protocol::Grpc => ("metadata", "header"),
        };
        // (extractor's refusal, what the text must say)
        #[cfg_attr(not(feature = "json"), allow(unused_mut))]
        let mut refusals = vec![
            (
                header.extract(&request(protocol, "/hook", None)),
                format!("the x-delivery-id {word} is required"),
            ),
            (
                header.extract(&request(protocol, "/hook", Some(b""))),
                format!("the x-delivery-id {word} is empty"),
            ),
            (
                twice.extract(&request(protocol, "/hook", Some(b"k"))),
                format!("the x-twice {word} is sent more than once"),
            ),
            (
                structured.extract(&request(protocol, "/hook", Some(b"\"open"))),
                format!("the x-delivery-id {word} is not a structured-field string"),
            ),
            (
                path.extract(&request(protocol, "/accounts/46/credit", None)),
                "route template has no {missing} segment".to_owned(),
            ),
        ];
        #[cfg(feature = "json")]
        {
            let body_request = request(protocol, "/hook", None);
            let head = RequestHead::of(&body_request);
            let key =
                |body: &[u8]| ExtractLockName::<()>::extract_from_body(&body_key, &head, body);
            refusals.extend([
                (
                    key(b"{\"type\":\"charge\"}"),
                    "the request body has no `/id` field".to_owned(),
                ),
                (key(b"id=evt_1"), "the request body is not JSON".to_owned()),
                (
                    key(b"{\"id\":[1]}"),
                    "the request body's `/id` field is not a non-empty string or a number"
                        .to_owned(),
                ),
            ]);
        }
        for (i, (refusal, want)) in refusals.into_iter().enumerate() {
            let Err(refusal) = refusal else {
                panic!("case {i} ({protocol:?}) was not refused");
            };
            let text = seen(Rejection::bad_request(refusal.message(), protocol));
            assert!(text.contains(&want), "case {i} ({protocol:?}): {text}");
            assert!(!text.contains(other), "case {i} ({protocol:?}): {text}");
            assert!(!text.contains("gRPC"), "case {i} ({protocol:?}): {text}");
        }
        // The other kinds, the same for a header key, a path parameter and a body key.
        let busy = LockError::Busy {
            held_elsewhere: 2,
            nodes: 3,
            retry_after: None,
            attempts: 1,
        };
        let others = [
            Rejection::from_lock_error(busy, protocol),
            Rejection::key_reused(protocol),
            Rejection::response_not_kept(protocol),
            Rejection::lost(&LostReason::Expired, protocol),
            Rejection::unreadable_record(protocol),
            Rejection::body_too_large(65_536, protocol),
            Rejection::from_lock_error(
                LockError::Unverifiable {
                    vouching: 0,
                    granted: 2,
                    needed: 2,
                    retry_after: None,
                    attempts: 1,
                },
                protocol,
            ),
        ];
        for r in others {
            let kind = r.kind().clone();
            let text = seen(r);
            for word in ["header", "metadata", "gRPC", "idempotency key"] {
                assert!(!text.contains(word), "{kind:?} ({protocol:?}): {text}");
            }
        }
    }
}
