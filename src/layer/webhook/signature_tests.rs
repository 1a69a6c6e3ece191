//! Each sender's signature against a vector computed outside the crate (GitHub's and
//! Standard Webhooks' own published examples; Stripe's and Shopify's, which publish none,
//! from Python's `hmac`), and each way a delivery fails: a changed body, a wrong secret, a
//! stale or future timestamp, a missing or malformed header.

use std::time::Duration;

use http::HeaderMap;

use super::{SecretError, Signature, SignatureError};

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(*name, value.parse().expect("header value"));
    }
    map
}

// GitHub's example ("Validating webhook deliveries", testing the signature).
const GITHUB_SECRET: &str = "It's a Secret to Everybody";
const GITHUB_SIG: &str = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";

#[test]
fn github_verifies_its_documented_example_and_nothing_else() {
    let sig = Signature::github(GITHUB_SECRET).expect("secret");
    let good = headers(&[("x-hub-signature-256", GITHUB_SIG)]);
    assert_eq!(sig.verify(&good, b"Hello, World!"), Ok(()));
    assert_eq!(
        sig.verify(&good, b"Hello, World?"),
        Err(SignatureError::Mismatch)
    );
    let other = Signature::github("another secret").expect("secret");
    assert_eq!(
        other.verify(&good, b"Hello, World!"),
        Err(SignatureError::Mismatch)
    );
    let upper = headers(&[(
        "x-hub-signature-256",
        &GITHUB_SIG.to_uppercase().replace("SHA256=", "sha256="),
    )]);
    assert_eq!(sig.verify(&upper, b"Hello, World!"), Ok(()));
    assert_eq!(
        sig.verify(&HeaderMap::new(), b"Hello, World!"),
        Err(SignatureError::Missing("x-hub-signature-256"))
    );
    for bad in ["757107ea", "sha1=757107ea", "sha256=75710", "sha256=zz"] {
        assert_eq!(
            sig.verify(&headers(&[("x-hub-signature-256", bad)]), b"Hello, World!"),
            Err(SignatureError::Malformed("x-hub-signature-256")),
            "{bad}"
        );
    }
    // A hex signature of the wrong length is no match.
    let short = headers(&[("x-hub-signature-256", "sha256=757107ea")]);
    assert_eq!(
        sig.verify(&short, b"Hello, World!"),
        Err(SignatureError::Mismatch)
    );
}

// The Standard Webhooks reference library's example.
const STANDARD_SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
const STANDARD_ID: &str = "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk";
const STANDARD_AT: u64 = 1_649_367_553;
const STANDARD_BODY: &[u8] = br#"{"email":"test@example.com","username":"test_user"}"#;
const STANDARD_SIG: &str = "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=";

fn standard_headers(prefix: &str, signature: &str, at: u64) -> HeaderMap {
    let mut map = HeaderMap::new();
    let name = |n: &str| http::HeaderName::try_from(format!("{prefix}-{n}")).expect("name");
    map.insert(name("id"), STANDARD_ID.parse().expect("id"));
    map.insert(name("timestamp"), at.to_string().parse().expect("at"));
    map.insert(name("signature"), signature.parse().expect("signature"));
    map
}

#[test]
fn standard_webhooks_and_svix_verify_the_reference_example_within_the_tolerance() {
    for (prefix, sig) in [
        ("webhook", Signature::standard(STANDARD_SECRET)),
        ("svix", Signature::svix(STANDARD_SECRET)),
    ] {
        let sig = sig.expect("secret");
        let good = standard_headers(prefix, STANDARD_SIG, STANDARD_AT);
        assert_eq!(
            sig.verify_at(&good, STANDARD_BODY, STANDARD_AT),
            Ok(()),
            "{prefix}"
        );
        // Several signatures (a key rotation): any one that matches.
        let rotated = standard_headers(prefix, &format!("v1,AAAA {STANDARD_SIG}"), STANDARD_AT);
        assert_eq!(
            sig.verify_at(&rotated, STANDARD_BODY, STANDARD_AT),
            Ok(()),
            "{prefix}"
        );
        // Within the tolerance either way, not beyond.
        assert_eq!(
            sig.verify_at(&good, STANDARD_BODY, STANDARD_AT + 300),
            Ok(())
        );
        assert_eq!(
            sig.verify_at(&good, STANDARD_BODY, STANDARD_AT - 300),
            Ok(())
        );
        assert_eq!(
            sig.verify_at(&good, STANDARD_BODY, STANDARD_AT + 301),
            Err(SignatureError::Stale {
                off_by: Duration::from_secs(301)
            })
        );
        assert_eq!(
            sig.verify_at(&good, STANDARD_BODY, STANDARD_AT - 301),
            Err(SignatureError::Stale {
                off_by: Duration::from_secs(301)
            })
        );
        let wide = sig.clone().tolerance(Duration::from_secs(3_600));
        assert_eq!(
            wide.verify_at(&good, STANDARD_BODY, STANDARD_AT + 3_000),
            Ok(())
        );
        // A body or timestamp changed, an unknown version, a header missing.
        assert_eq!(
            sig.verify_at(&good, b"{}", STANDARD_AT),
            Err(SignatureError::Mismatch)
        );
        let moved = standard_headers(prefix, STANDARD_SIG, STANDARD_AT + 1);
        assert_eq!(
            sig.verify_at(&moved, STANDARD_BODY, STANDARD_AT),
            Err(SignatureError::Mismatch)
        );
        let v2 = standard_headers(prefix, &STANDARD_SIG.replace("v1,", "v2,"), STANDARD_AT);
        assert!(matches!(
            sig.verify_at(&v2, STANDARD_BODY, STANDARD_AT),
            Err(SignatureError::Malformed(_))
        ));
        let mut no_id = good.clone();
        no_id.remove(format!("{prefix}-id"));
        assert!(matches!(
            sig.verify_at(&no_id, STANDARD_BODY, STANDARD_AT),
            Err(SignatureError::Missing(_))
        ));
    }
    // Svix's headers do not verify a Standard Webhooks receiver, nor the reverse.
    let standard = Signature::standard(STANDARD_SECRET).expect("secret");
    let svix_headers = standard_headers("svix", STANDARD_SIG, STANDARD_AT);
    assert!(matches!(
        standard.verify_at(&svix_headers, STANDARD_BODY, STANDARD_AT),
        Err(SignatureError::Missing("webhook-id"))
    ));
}

// Computed with Python: hmac.new(b"whsec_test_secret", b"1700000000." + body, sha256).
const STRIPE_SECRET: &str = "whsec_test_secret";
const STRIPE_BODY: &[u8] = br#"{"id":"evt_1","object":"event"}"#;
const STRIPE_V1: &str = "0c8670ed117751cc551a20e35839447075c42800ea3cf3e8a2fbda99cd1e6edd";

#[test]
fn stripe_verifies_t_and_v1_within_the_tolerance() {
    let sig = Signature::stripe(STRIPE_SECRET).expect("secret");
    let at = 1_700_000_000;
    let good = headers(&[("stripe-signature", &format!("t={at},v1={STRIPE_V1}"))]);
    assert_eq!(sig.verify_at(&good, STRIPE_BODY, at), Ok(()));
    // Stripe's own form: several v1 (a rolled secret) and a v0 in test mode.
    let several = headers(&[(
        "stripe-signature",
        &format!("t={at},v1=00,v1={STRIPE_V1},v0=6ffbb59b"),
    )]);
    assert_eq!(sig.verify_at(&several, STRIPE_BODY, at + 10), Ok(()));
    assert_eq!(
        sig.verify_at(&good, STRIPE_BODY, at + 301),
        Err(SignatureError::Stale {
            off_by: Duration::from_secs(301)
        })
    );
    assert_eq!(
        sig.verify_at(&good, br#"{"id":"evt_2","object":"event"}"#, at),
        Err(SignatureError::Mismatch)
    );
    let replayed_t = headers(&[("stripe-signature", &format!("t={},v1={STRIPE_V1}", at + 60))]);
    assert_eq!(
        sig.verify_at(&replayed_t, STRIPE_BODY, at + 60),
        Err(SignatureError::Mismatch)
    );
    for bad in [
        format!("v1={STRIPE_V1}"),
        format!("t={at}"),
        format!("t=soon,v1={STRIPE_V1}"),
    ] {
        assert_eq!(
            sig.verify_at(&headers(&[("stripe-signature", &bad)]), STRIPE_BODY, at),
            Err(SignatureError::Malformed("stripe-signature")),
            "{bad}"
        );
    }
    assert_eq!(
        sig.verify_at(&HeaderMap::new(), STRIPE_BODY, at),
        Err(SignatureError::Missing("stripe-signature"))
    );
}

// Computed with Python: base64(hmac.new(b"shpss_test_secret", body, sha256)).
const SHOPIFY_SECRET: &str = "shpss_test_secret";
const SHOPIFY_BODY: &[u8] = br#"{"id":820982911946154500}"#;
const SHOPIFY_SIG: &str = "yYDzzGXpa38/AEhKuoflSKD+8mPXiMc4goA7uHZ4dYw=";

#[test]
fn shopify_verifies_the_base64_hmac_of_the_body() {
    let sig = Signature::shopify(SHOPIFY_SECRET).expect("secret");
    let good = headers(&[("x-shopify-hmac-sha256", SHOPIFY_SIG)]);
    assert_eq!(sig.verify(&good, SHOPIFY_BODY), Ok(()));
    assert_eq!(sig.verify(&good, b"{}"), Err(SignatureError::Mismatch));
    assert_eq!(
        sig.verify(
            &headers(&[("x-shopify-hmac-sha256", "not base64!")]),
            SHOPIFY_BODY
        ),
        Err(SignatureError::Malformed("x-shopify-hmac-sha256"))
    );
    assert_eq!(
        sig.verify(&HeaderMap::new(), SHOPIFY_BODY),
        Err(SignatureError::Missing("x-shopify-hmac-sha256"))
    );
}

#[test]
fn an_unusable_secret_is_a_typed_error_and_debug_never_shows_a_secret() {
    assert!(matches!(Signature::github(""), Err(SecretError { .. })));
    assert!(matches!(Signature::stripe(""), Err(SecretError { .. })));
    assert!(matches!(Signature::shopify(""), Err(SecretError { .. })));
    assert!(matches!(
        Signature::standard("whsec_"),
        Err(SecretError { .. })
    ));
    assert!(matches!(
        Signature::svix("whsec_not base64"),
        Err(SecretError { .. })
    ));
    let shown = format!("{:?}", Signature::github(GITHUB_SECRET).expect("secret"));
    assert!(!shown.contains("Secret to Everybody"), "{shown}");
    assert!(shown.contains("redacted"), "{shown}");
}

#[test]
fn a_delivery_without_its_signature_headers_is_known_before_its_body_is_read() {
    let schemes = [
        (
            Signature::github(GITHUB_SECRET),
            vec!["x-hub-signature-256"],
        ),
        (
            Signature::shopify(SHOPIFY_SECRET),
            vec!["x-shopify-hmac-sha256"],
        ),
        (Signature::stripe(STRIPE_SECRET), vec!["stripe-signature"]),
        (
            Signature::standard(STANDARD_SECRET),
            vec!["webhook-id", "webhook-timestamp", "webhook-signature"],
        ),
        (
            Signature::svix(STANDARD_SECRET),
            vec!["svix-id", "svix-timestamp", "svix-signature"],
        ),
    ];
    for (sig, names) in schemes {
        let sig = sig.expect("secret");
        let all: Vec<(&'static str, &str)> = names.iter().map(|n| (*n, "x")).collect();
        assert_eq!(sig.has_headers(&headers(&all)), Ok(()), "{names:?}");
        for missing in &names {
            let some: Vec<_> = all.iter().copied().filter(|(n, _)| n != missing).collect();
            assert_eq!(
                sig.has_headers(&headers(&some)),
                Err(SignatureError::Missing(missing)),
                "{names:?}"
            );
        }
    }
}
