//! The bodies of the default rejections: which format the client accepts (`Accept`), and
//! the problem document (RFC 9457) for JSON clients. What each problem `type` means is
//! documented in [`problems`](crate::layer::problems).
//!
//! A client that accepts `application/problem+json` gets one, `application/json` gets the
//! same document as plain JSON, and `text/plain` (or `text/*`) a line of text. Quality
//! values count: `application/problem+json;q=0` refuses it. A client that states no
//! preference (no `Accept`, only `*/*`, several formats at the same quality) or accepts
//! none of them gets the layer's default: text, or with
//! [`replay`](crate::RedlockLayer::replay) on a problem document, the answer the IETF
//! Idempotency-Key draft specifies. The most specific range decides, so
//! `text/plain, */*` is text whatever the default.
//!
//! ```
//! use http::{Request, StatusCode, header};
//! use tower_redlock::layer::{Protocol, Rejection};
//!
//! let req = Request::post("/orders")
//!     .header(header::ACCEPT, "application/problem+json, */*;q=0.1")
//!     .body(())
//!     .unwrap();
//! let (parts, _) = req.into_parts();
//! let res = Rejection::bad_request("the idempotency-key header is empty", Protocol::Http)
//!     .negotiate(&parts.headers)
//!     .into_response();
//! assert_eq!(res.status(), StatusCode::BAD_REQUEST);
//! assert_eq!(res.headers()[header::CONTENT_TYPE], "application/problem+json");
//! assert!(res.body().contains(r#""detail":"the idempotency-key header is empty""#));
//! ```

use http::{HeaderMap, StatusCode, header};

use crate::layer::problems::Problem;

/// The format of a default rejection body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// `text/plain`: the message and a newline.
    Text,
    /// `application/problem+json`.
    Problem,
    /// The problem document as `application/json`.
    Json,
}

impl Format {
    /// The formats in the order preferred, after the default, when the client likes
    /// several equally.
    const PREFERENCE: [Format; 3] = [Format::Text, Format::Problem, Format::Json];

    /// The body's `content-type`.
    pub(crate) fn content_type(self) -> &'static str {
        match self {
            Format::Text => "text/plain; charset=utf-8",
            Format::Problem => "application/problem+json",
            Format::Json => "application/json",
        }
    }

    fn media_type(self) -> (&'static str, &'static str) {
        match self {
            Format::Text => ("text", "plain"),
            Format::Problem => ("application", "problem+json"),
            Format::Json => ("application", "json"),
        }
    }

    /// The format the request's `Accept` headers rate best, `default` when they state no
    /// preference: no `Accept`, the same quality and specificity for `default` as for the
    /// best other (`*/*` alone, for one), or none of the formats acceptable.
    pub(crate) fn negotiate(headers: &HeaderMap, default: Format) -> Format {
        let mut accept = headers.get_all(header::ACCEPT).iter().peekable();
        if accept.peek().is_none() {
            return default;
        }
        let mut order = [default; 3];
        for (slot, format) in order
            .iter_mut()
            .skip(1)
            .zip(Self::PREFERENCE.into_iter().filter(|f| *f != default))
        {
            *slot = format;
        }
        // Per format of `order`: the quality of the most specific range that matches it,
        // and that specificity.
        let mut best: [(u16, u8); 3] = [(0, 0); 3];
        for range in accept
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
        {
            let Some((ty, sub, q)) = parse_range(range) else {
                continue;
            };
            for (format, slot) in order.iter().zip(best.iter_mut()) {
                let (fty, fsub) = format.media_type();
                let specificity = match (ty, sub) {
                    ("*", "*") => 1,
                    (t, "*") if t.eq_ignore_ascii_case(fty) => 2,
                    (t, s) if t.eq_ignore_ascii_case(fty) && s.eq_ignore_ascii_case(fsub) => 3,
                    _ => continue,
                };
                if specificity > slot.1 || (specificity == slot.1 && q > slot.0) {
                    *slot = (q, specificity);
                }
            }
        }
        // The best quality wins, then the more specific range, then the earlier in `order`.
        let mut chosen = (default, 0u16, 0u8);
        for (format, (q, specificity)) in order.into_iter().zip(best) {
            if q > chosen.1 || (q == chosen.1 && q > 0 && specificity > chosen.2) {
                chosen = (format, q, specificity);
            }
        }
        chosen.0
    }
}

/// A media range's type, subtype and quality (in thousandths); `None` when malformed.
fn parse_range(range: &str) -> Option<(&str, &str, u16)> {
    let mut params = range.split(';');
    let (ty, sub) = params.next()?.trim().split_once('/')?;
    let (ty, sub) = (ty.trim(), sub.trim());
    if ty.is_empty() || sub.is_empty() {
        return None;
    }
    let mut q = 1000;
    for param in params {
        if let Some((k, v)) = param.split_once('=')
            && k.trim().eq_ignore_ascii_case("q")
        {
            q = parse_quality(v.trim())?;
        }
    }
    Some((ty, sub, q))
}

/// A `qvalue` (`0`, `0.5`, `1.000`) in thousandths.
fn parse_quality(v: &str) -> Option<u16> {
    let (whole, frac) = v.split_once('.').unwrap_or((v, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let thousandths = frac
        .bytes()
        .chain(std::iter::repeat(b'0'))
        .take(3)
        .fold(0u16, |n, b| n * 10 + u16::from(b - b'0'));
    match whole {
        "0" => Some(thousandths),
        "1" if thousandths == 0 => Some(1000),
        _ => None,
    }
}

/// The problem document (RFC 9457) of a rejection: `type` (a section of
/// [`problems`](crate::layer::problems)), `title`, `status`, `detail`, and the members `kind` and,
/// when advised, `retry_after` (seconds).
pub(crate) fn document(
    problem: Problem,
    status: StatusCode,
    kind: &str,
    detail: &str,
    retry_after: Option<u64>,
) -> String {
    let mut out = String::with_capacity(192 + detail.len());
    out.push_str(r#"{"type":"#);
    push_json_string(&mut out, problem.uri());
    out.push_str(r#","title":"#);
    push_json_string(&mut out, problem.title());
    out.push_str(r#","status":"#);
    out.push_str(&status.as_u16().to_string());
    out.push_str(r#","detail":"#);
    push_json_string(&mut out, detail);
    out.push_str(r#","kind":"#);
    push_json_string(&mut out, kind);
    if let Some(secs) = retry_after {
        out.push_str(r#","retry_after":"#);
        out.push_str(&secs.to_string());
    }
    out.push('}');
    out
}

/// Appends `s` as a JSON string literal.
fn push_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 || c == '\u{2028}' || c == '\u{2029}' => {
                out.push_str(&format!("\\u{:04x}", u32::from(c)));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept_or(values: &[&str], default: Format) -> Format {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(header::ACCEPT, v.parse().expect("header value"));
        }
        Format::negotiate(&h, default)
    }

    fn accept(values: &[&str]) -> Format {
        accept_or(values, Format::Text)
    }

    #[test]
    fn accept_picks_the_format_the_client_rates_best() {
        assert_eq!(accept(&[]), Format::Text);
        assert_eq!(accept(&["*/*"]), Format::Text);
        assert_eq!(accept(&["application/problem+json"]), Format::Problem);
        assert_eq!(accept(&["application/json"]), Format::Json);
        assert_eq!(accept(&["application/*"]), Format::Problem);
        assert_eq!(accept(&["application/json, */*;q=0.8"]), Format::Json);
        assert_eq!(
            accept(&["application/json;q=0.5", "application/problem+json;q=0.9"]),
            Format::Problem
        );
        assert_eq!(accept(&["text/html, application/json;q=0.9"]), Format::Json);
        assert_eq!(accept(&["*/*, text/plain;q=0"]), Format::Problem);
        assert_eq!(accept(&["application/problem+json;q=0"]), Format::Text);
        assert_eq!(accept(&["text/html"]), Format::Text);
        assert_eq!(accept(&["garbage, application/json;q=2"]), Format::Text);
        assert_eq!(
            accept(&["APPLICATION/Problem+JSON ; Q=1.0"]),
            Format::Problem
        );
    }

    #[test]
    fn a_client_without_a_preference_gets_the_default() {
        use Format::{Json, Problem, Text};
        // (Accept, with a text default, with a problem default)
        let cases: &[(&[&str], Format, Format)] = &[
            // No preference: the default.
            (&[], Text, Problem),
            (&["*/*"], Text, Problem),
            (&["*/*;q=0.3"], Text, Problem),
            (&["*/*", "*/*;q=0.5"], Text, Problem),
            (&["text/plain, application/problem+json"], Text, Problem),
            (
                &["text/plain;q=0.5, application/problem+json;q=0.5"],
                Text,
                Problem,
            ),
            (
                &["text/html,application/xhtml+xml,*/*;q=0.8"],
                Text,
                Problem,
            ),
            // Nothing acceptable: the default.
            (&["text/html"], Text, Problem),
            (&["image/png, application/xml"], Text, Problem),
            (&["*/*;q=0"], Text, Problem),
            (&["garbage"], Text, Problem),
            // A stated preference wins over the default.
            (&["text/plain"], Text, Text),
            (&["text/*"], Text, Text),
            (&["text/plain, */*"], Text, Text),
            (&["text/plain, */*;q=0.9"], Text, Text),
            (&["*/*, application/problem+json;q=0"], Text, Text),
            (
                &["application/problem+json, text/plain;q=0.9"],
                Problem,
                Problem,
            ),
            (&["application/json"], Json, Json),
            (&["application/json, */*;q=0.1"], Json, Json),
            (&["application/*"], Problem, Problem),
            (
                &["application/json, application/problem+json"],
                Problem,
                Problem,
            ),
            (&["*/*, text/plain;q=0"], Problem, Problem),
        ];
        for (values, text_default, problem_default) in cases {
            assert_eq!(
                accept_or(values, Text),
                *text_default,
                "{values:?}, text default"
            );
            assert_eq!(
                accept_or(values, Problem),
                *problem_default,
                "{values:?}, problem default"
            );
        }
        // A JSON default, for completeness: equal preferences go to it.
        assert_eq!(accept_or(&["*/*"], Json), Json);
        assert_eq!(accept_or(&["application/*"], Json), Json);
        assert_eq!(accept_or(&["text/plain"], Json), Text);
    }

    #[test]
    fn qualities_parse_to_thousandths() {
        assert_eq!(parse_quality("0"), Some(0));
        assert_eq!(parse_quality("0.5"), Some(500));
        assert_eq!(parse_quality("0.125"), Some(125));
        assert_eq!(parse_quality("1.000"), Some(1000));
        assert_eq!(parse_quality("1.5"), None);
        assert_eq!(parse_quality("0.1234"), None);
        assert_eq!(parse_quality("x"), None);
    }

    #[test]
    fn documents_escape_the_detail() {
        let doc = document(
            Problem::Busy,
            StatusCode::CONFLICT,
            "busy",
            "a \"b\"\n\u{1}",
            Some(2),
        );
        assert_eq!(
            doc,
            r#"{"type":"https://docs.rs/tower-redlock/latest/tower_redlock/layer/problems/index.html#busy","title":"The key is locked by another request","status":409,"detail":"a \"b\"\n\u0001","kind":"busy","retry_after":2}"#
        );
    }
}
