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
            Err("the idempotency-key header (gRPC: metadata) is empty"),
        ),
        (
            &key,
            "idempotency-key",
            b"",
            Err("the idempotency-key header (gRPC: metadata) is empty"),
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
        (
            &other,
            "x-id",
            b"",
            Err("the x-id header (gRPC: metadata) is empty"),
        ),
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
