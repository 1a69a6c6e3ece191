//! [`Signature`]: how each webhook sender signs a delivery, and the check of one delivery
//! (its headers and its whole body) against the endpoint's secret.
//!
//! ```
//! use tower_redlock::layer::webhook::Signature;
//!
//! let shopify = Signature::shopify("the app's client secret").unwrap();
//! assert!(shopify.verify(&http::HeaderMap::new(), b"{}").is_err()); // unsigned
//! ```

use std::fmt;
use std::time::Duration;

use base64::Engine;
use hmac::{Hmac, Mac};
use http::HeaderMap;
use sha2::Sha256;

/// How far a signed timestamp may be from this process's clock, either way, by default:
/// five minutes, as Standard Webhooks and Stripe recommend.
pub const DEFAULT_SIGNATURE_TOLERANCE: Duration = Duration::from_secs(300);

/// The largest delivery body a [`Signature`] layer reads to verify, by default: 4 MiB
/// (over it: 413, before the lock).
pub const DEFAULT_WEBHOOK_MAX_BODY: usize = 4 * 1024 * 1024;

/// A webhook sender's signature scheme with the endpoint's secret: checks that a delivery
/// was signed by the sender (and, where the sender signs a timestamp, recently). `Debug`
/// never shows the secret. As a tower layer it checks each delivery before the services
/// it wraps see it ([`Verified`](super::Verified)).
///
/// | sender | header | signed | timestamp |
/// |---|---|---|---|
/// | Standard Webhooks | `webhook-signature: v1,<base64>` (several, space-separated) | `{webhook-id}.{webhook-timestamp}.{body}` | `webhook-timestamp`, within the tolerance |
/// | Svix | `svix-signature` | `{svix-id}.{svix-timestamp}.{body}` | `svix-timestamp`, within the tolerance |
/// | GitHub | `X-Hub-Signature-256: sha256=<hex>` | the body | none |
/// | Stripe | `Stripe-Signature: t=<unix>,v1=<hex>` (several `v1`) | `{t}.{body}` | `t`, within the tolerance |
/// | Shopify | `X-Shopify-Hmac-Sha256: <base64>` | the body | none |
///
/// Every signature is an HMAC-SHA256, computed by `hmac` and `sha2` and compared by
/// `hmac`'s `verify_slice`, in constant time. A sender without a signed timestamp (GitHub, Shopify) cannot
/// be checked for staleness: a captured delivery sent again is a redelivery, which the
/// receiver's replay answers with the stored response.
///
/// ```
/// use tower_redlock::layer::webhook::Signature;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // GitHub's documented example: this secret, this body, this signature.
/// let github = Signature::github("It's a Secret to Everybody")?;
/// let mut headers = http::HeaderMap::new();
/// headers.insert(
///     "x-hub-signature-256",
///     "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17".parse()?,
/// );
/// assert!(github.verify(&headers, b"Hello, World!").is_ok());
/// assert!(github.verify(&headers, b"Hello, World?").is_err());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Signature {
    scheme: Scheme,
    tolerance: Duration,
    max_body: usize,
}

/// The headers each scheme signs with (a delivery without them is refused unread).
const STANDARD_HEADERS: [&str; 3] = ["webhook-id", "webhook-timestamp", "webhook-signature"];
const SVIX_HEADERS: [&str; 3] = ["svix-id", "svix-timestamp", "svix-signature"];
const GITHUB_HEADER: &str = "x-hub-signature-256";
const STRIPE_HEADER: &str = "stripe-signature";
const SHOPIFY_HEADER: &str = "x-shopify-hmac-sha256";

/// A Standard Webhooks key (the secret's base64 decoded), with its headers' prefix
/// (`webhook` or `svix`).
#[derive(Clone)]
struct Standard {
    prefix: &'static str,
    key: Vec<u8>,
}

#[derive(Clone)]
enum Scheme {
    /// Standard Webhooks (or Svix).
    Standard(Standard),
    GitHub(Vec<u8>),
    Stripe(Vec<u8>),
    Shopify(Vec<u8>),
}

/// A webhook secret that cannot be used: empty, or (Standard Webhooks, Svix) not base64.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SecretError {
    /// What is wrong with it (never the secret itself).
    pub reason: &'static str,
}

impl fmt::Display for SecretError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid webhook secret: {}", self.reason)
    }
}

impl std::error::Error for SecretError {}

/// Why a delivery's signature was refused (answered 401 in front of the lock).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SignatureError {
    /// A header the scheme needs is missing: its name.
    Missing(&'static str),
    /// A header is there but not in the scheme's form (or not a number): its name.
    Malformed(&'static str),
    /// The signed timestamp is further from this process's clock than the tolerance.
    Stale {
        /// How far it is, either way.
        off_by: Duration,
    },
    /// No signature in the delivery matches its body under the secret.
    Mismatch,
}

impl fmt::Display for SignatureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Missing(h) => write!(f, "the {h} header is missing"),
            Self::Malformed(h) => write!(f, "the {h} header is malformed"),
            Self::Stale { off_by } => write!(
                f,
                "the signed timestamp is {} s away from now, beyond the tolerance",
                off_by.as_secs()
            ),
            Self::Mismatch => f.write_str("no signature matches the delivery"),
        }
    }
}

impl std::error::Error for SignatureError {}

impl fmt::Debug for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sender = match &self.scheme {
            Scheme::Standard(standard) => standard.prefix,
            Scheme::GitHub(_) => "github",
            Scheme::Stripe(_) => "stripe",
            Scheme::Shopify(_) => "shopify",
        };
        f.debug_struct("Signature")
            .field("sender", &sender)
            .field("secret", &"<redacted>")
            .field("tolerance", &self.tolerance)
            .field("max_body", &self.max_body)
            .finish()
    }
}

fn raw(secret: impl AsRef<[u8]>) -> Result<Vec<u8>, SecretError> {
    let secret = secret.as_ref();
    if secret.is_empty() {
        return Err(SecretError {
            reason: "it is empty",
        });
    }
    Ok(secret.to_vec())
}

/// A Standard Webhooks secret, `whsec_` (optional) and the key in base64: the key.
fn standard_key(secret: &str) -> Result<Vec<u8>, SecretError> {
    let encoded = secret.strip_prefix("whsec_").unwrap_or(secret);
    let key = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|_| SecretError {
            reason: "it is not `whsec_` followed by base64",
        })?;
    raw(key)
}

impl Signature {
    fn of(scheme: Scheme) -> Self {
        Self {
            scheme,
            tolerance: DEFAULT_SIGNATURE_TOLERANCE,
            max_body: DEFAULT_WEBHOOK_MAX_BODY,
        }
    }

    /// [Standard Webhooks](https://www.standardwebhooks.com/): the `webhook-id`,
    /// `webhook-timestamp` and `webhook-signature` headers; `secret` as the sender shows
    /// it (`whsec_` and base64).
    pub fn standard(secret: &str) -> Result<Self, SecretError> {
        Ok(Self::of(Scheme::Standard(Standard {
            prefix: "webhook",
            key: standard_key(secret)?,
        })))
    }

    /// Svix: Standard Webhooks under the `svix-id`, `svix-timestamp` and
    /// `svix-signature` headers; `secret` as Svix shows it (`whsec_...`).
    pub fn svix(secret: &str) -> Result<Self, SecretError> {
        Ok(Self::of(Scheme::Standard(Standard {
            prefix: "svix",
            key: standard_key(secret)?,
        })))
    }

    /// GitHub: `X-Hub-Signature-256`, the HMAC-SHA256 of the body under the webhook's
    /// secret, in hex.
    pub fn github(secret: impl AsRef<[u8]>) -> Result<Self, SecretError> {
        Ok(Self::of(Scheme::GitHub(raw(secret)?)))
    }

    /// Stripe: `Stripe-Signature`, the HMAC-SHA256 of `{t}.{body}` under the endpoint's
    /// signing secret (`whsec_...`, used as it is), in hex, with its timestamp `t`.
    pub fn stripe(secret: impl AsRef<[u8]>) -> Result<Self, SecretError> {
        Ok(Self::of(Scheme::Stripe(raw(secret)?)))
    }

    /// Shopify: `X-Shopify-Hmac-Sha256`, the HMAC-SHA256 of the body under the app's
    /// client secret, in base64.
    pub fn shopify(secret: impl AsRef<[u8]>) -> Result<Self, SecretError> {
        Ok(Self::of(Scheme::Shopify(raw(secret)?)))
    }

    /// How far a signed timestamp may be from this process's clock, either way
    /// ([`DEFAULT_SIGNATURE_TOLERANCE`] unless set). No effect for senders that sign no
    /// timestamp (GitHub, Shopify).
    #[must_use]
    pub fn tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// The largest body read to verify a delivery ([`DEFAULT_WEBHOOK_MAX_BODY`] unless
    /// set): a longer one is answered 413 before the lock.
    #[must_use]
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }

    /// The largest body read to verify a delivery.
    pub(crate) fn body_limit(&self) -> usize {
        self.max_body
    }

    /// Whether `headers` has every header the scheme signs with: a delivery without them
    /// is refused before its body is read.
    pub(crate) fn has_headers(&self, headers: &HeaderMap) -> Result<(), SignatureError> {
        let needed: &[&'static str] = match &self.scheme {
            Scheme::Standard(standard) => standard.headers(),
            Scheme::GitHub(_) => &[GITHUB_HEADER],
            Scheme::Stripe(_) => &[STRIPE_HEADER],
            Scheme::Shopify(_) => &[SHOPIFY_HEADER],
        };
        match needed.iter().find(|name| !headers.contains_key(**name)) {
            Some(name) => Err(SignatureError::Missing(name)),
            None => Ok(()),
        }
    }

    /// Checks a delivery: its `headers` and its whole `body`, as received, against the
    /// secret, and a signed timestamp against this process's clock.
    pub fn verify(&self, headers: &HeaderMap, body: &[u8]) -> Result<(), SignatureError> {
        self.verify_at(headers, body, crate::clock::wall_ms() / 1_000)
    }

    /// [`verify`](Self::verify) at `now` (seconds since the Unix epoch).
    pub(crate) fn verify_at(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now: u64,
    ) -> Result<(), SignatureError> {
        match &self.scheme {
            Scheme::Standard(standard) => standard.verify(self, headers, body, now),
            Scheme::GitHub(secret) => {
                let name = GITHUB_HEADER;
                let value = header(headers, name)?;
                let hex = value
                    .strip_prefix("sha256=")
                    .ok_or(SignatureError::Malformed(name))?;
                let sig = from_hex(hex).ok_or(SignatureError::Malformed(name))?;
                check(secret, &[body], &sig)
            }
            Scheme::Shopify(secret) => {
                let name = SHOPIFY_HEADER;
                let sig = base64::engine::general_purpose::STANDARD
                    .decode(header(headers, name)?.trim())
                    .map_err(|_| SignatureError::Malformed(name))?;
                check(secret, &[body], &sig)
            }
            Scheme::Stripe(secret) => self.verify_stripe(secret, headers, body, now),
        }
    }

    fn within(&self, signed: u64, now: u64) -> Result<(), SignatureError> {
        let off_by = Duration::from_secs(signed.abs_diff(now));
        if off_by > self.tolerance {
            return Err(SignatureError::Stale { off_by });
        }
        Ok(())
    }

    fn verify_stripe(
        &self,
        secret: &[u8],
        headers: &HeaderMap,
        body: &[u8],
        now: u64,
    ) -> Result<(), SignatureError> {
        let name = STRIPE_HEADER;
        let value = header(headers, name)?;
        let mut t = None;
        let mut signatures = Vec::new();
        for part in value.split(',') {
            match part.trim().split_once('=') {
                Some(("t", v)) => t = Some(v),
                Some(("v1", v)) => signatures.push(v),
                _ => {}
            }
        }
        // Signed as sent: `{t}.{body}`, with `t` as the header spells it.
        let t = t.ok_or(SignatureError::Malformed(name))?;
        let at = t
            .parse::<u64>()
            .map_err(|_| SignatureError::Malformed(name))?;
        if signatures.is_empty() {
            return Err(SignatureError::Malformed(name));
        }
        self.within(at, now)?;
        let prefix = format!("{t}.");
        let matches = signatures.iter().any(|hex| {
            from_hex(hex).is_some_and(|sig| check(secret, &[prefix.as_bytes(), body], &sig).is_ok())
        });
        if matches {
            Ok(())
        } else {
            Err(SignatureError::Mismatch)
        }
    }
}

impl Standard {
    /// Its id, timestamp and signature headers.
    fn headers(&self) -> &'static [&'static str; 3] {
        if self.prefix == "svix" {
            &SVIX_HEADERS
        } else {
            &STANDARD_HEADERS
        }
    }

    fn verify(
        &self,
        signature: &Signature,
        headers: &HeaderMap,
        body: &[u8],
        now: u64,
    ) -> Result<(), SignatureError> {
        let &[id, timestamp, sig] = self.headers();
        let id = header(headers, id)?;
        let signed_at = header(headers, timestamp)?;
        let signed: u64 = signed_at
            .trim()
            .parse()
            .map_err(|_| SignatureError::Malformed(timestamp))?;
        // Space-separated `version,base64` pairs; only `v1` (HMAC-SHA256) is known.
        let v1: Vec<Vec<u8>> = header(headers, sig)?
            .split(' ')
            .filter_map(|s| s.split_once(','))
            .filter(|(version, _)| *version == "v1")
            .filter_map(|(_, b64)| base64::engine::general_purpose::STANDARD.decode(b64).ok())
            .collect();
        if v1.is_empty() {
            return Err(SignatureError::Malformed(sig));
        }
        signature.within(signed, now)?;
        let signed_content = [id.as_bytes(), b".", signed_at.as_bytes(), b".", body];
        if v1
            .iter()
            .any(|s| check(&self.key, &signed_content, s).is_ok())
        {
            Ok(())
        } else {
            Err(SignatureError::Mismatch)
        }
    }
}

/// The value of header `name` as text.
fn header<'a>(headers: &'a HeaderMap, name: &'static str) -> Result<&'a str, SignatureError> {
    headers
        .get(name)
        .ok_or(SignatureError::Missing(name))?
        .to_str()
        .map_err(|_| SignatureError::Malformed(name))
}

/// Whether `sig` is the HMAC-SHA256 of `parts` (one after the other) under `secret`,
/// compared in constant time by `hmac`.
fn check(secret: &[u8], parts: &[&[u8]], sig: &[u8]) -> Result<(), SignatureError> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).map_err(|_| SignatureError::Mismatch)?;
    for part in parts {
        mac.update(part);
    }
    mac.verify_slice(sig).map_err(|_| SignatureError::Mismatch)
}

/// Lower- or upper-case hex into bytes; `None` for anything else.
fn from_hex(hex: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| char::from(c).to_digit(16);
    let bytes = hex.as_bytes();
    if !bytes.len().is_multiple_of(2) {
        return None;
    }
    bytes
        .chunks(2)
        .map(|pair| match pair {
            [hi, lo] => Some(u8::try_from(digit(*hi)? * 16 + digit(*lo)?).ok()?),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
#[path = "signature_tests.rs"]
mod tests;
