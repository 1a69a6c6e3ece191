//! [`PathSegment`] and [`PathParam`]: a lock name from the URI path, by a segment's
//! position or by a route template's parameter. Segments are percent-decoded.
//!
//! ```
//! use http::Request;
//! use tower_redlock::layer::{ExtractLockName, PathParam, PathSegment};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let req = Request::post("/jobs/42/run").body(())?;
//! assert_eq!(PathSegment::new(1).extract(&req)?, Some(b"42".to_vec()));
//! assert_eq!(PathParam::new("/jobs/{id}/run", "id").extract(&req)?, Some(b"42".to_vec()));
//! # Ok(()) }
//! ```

use std::borrow::Cow;

use http::Request;

use super::{ExtractError, ExtractLockName};

fn segments(path: &str) -> impl Iterator<Item = &str> {
    path.split('/').filter(|s| !s.is_empty())
}

/// A path segment with its `%XX` escapes decoded, so `/jobs/4%32` and `/jobs/42` name the
/// same lock. A `%` not followed by two hex digits stays as it is.
fn percent_decode(segment: &str) -> Vec<u8> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let hex = |j: usize| bytes.get(j).and_then(|c| char::from(*c).to_digit(16));
        match (b, hex(i + 1), hex(i + 2)) {
            (b'%', Some(hi), Some(lo)) => {
                out.push(u8::try_from(hi * 16 + lo).unwrap_or(b'%'));
                i += 3;
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

/// The lock name is the path segment at a position (0 is the first after the leading
/// `/`); requests with fewer segments pass through.
#[derive(Debug, Clone, Copy)]
pub struct PathSegment {
    index: usize,
}

impl PathSegment {
    /// Uses segment `index`.
    ///
    /// ```
    /// use http::Request;
    /// use tower_redlock::layer::{ExtractLockName, PathSegment};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Paths like /jobs/{id}/run: segment 1 is the job id.
    /// let job = PathSegment::new(1);
    /// let req = Request::post("/jobs/42/run").body(())?;
    /// assert_eq!(job.extract(&req)?, Some(b"42".to_vec()));
    /// assert_eq!(job.extract(&Request::get("/jobs").body(())?)?, None); // too short: no lock
    /// # Ok(()) }
    /// ```
    pub fn new(index: usize) -> Self {
        Self { index }
    }
}

impl<B> ExtractLockName<B> for PathSegment {
    fn extract(&self, request: &Request<B>) -> Result<Option<Vec<u8>>, ExtractError> {
        Ok(segments(request.uri().path())
            .nth(self.index)
            .map(percent_decode))
    }

    /// `path-segment:{index}`.
    fn namespace(&self) -> Cow<'_, str> {
        Cow::Owned(format!("path-segment:{}", self.index))
    }
}

/// The lock name is a parameter of a route template such as `/webhooks/{provider}/{id}`:
/// requests whose path does not match the template pass through.
#[derive(Debug, Clone)]
pub struct PathParam {
    template: Vec<String>,
    /// The parameter's position in the template, or the parameter the template lacks.
    index: Result<usize, String>,
}

impl PathParam {
    /// Uses parameter `param` (written `{param}` in `template`). Path segments are
    /// percent-decoded before they are compared or become names.
    ///
    /// A `template` without a `{param}` segment never panics: every request is then
    /// rejected as bad input, with a message that names the setting.
    ///
    /// ```
    /// use http::Request;
    /// use tower_redlock::layer::{ExtractLockName, PathParam};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // One lock per delivery id, from any provider; other paths pass through.
    /// let delivery = PathParam::new("/webhooks/{provider}/{id}", "id");
    /// let req = Request::post("/webhooks/github/8f2c").body(())?;
    /// assert_eq!(delivery.extract(&req)?, Some(b"8f2c".to_vec()));
    /// assert_eq!(delivery.extract(&Request::get("/health").body(())?)?, None);
    /// # Ok(()) }
    /// ```
    pub fn new(template: &str, param: &str) -> Self {
        let template: Vec<String> = segments(template).map(str::to_owned).collect();
        let wanted = format!("{{{param}}}");
        let index = template.iter().position(|s| *s == wanted).ok_or(wanted);
        Self { template, index }
    }
}

impl<B> ExtractLockName<B> for PathParam {
    fn extract(&self, request: &Request<B>) -> Result<Option<Vec<u8>>, ExtractError> {
        let index = *self.index.as_ref().map_err(|wanted| {
            ExtractError::new(format!(
                "the lock layer's route template has no {wanted} segment"
            ))
        })?;
        let mut found = None;
        let mut count = 0;
        for (i, seg) in segments(request.uri().path()).enumerate() {
            let Some(pattern) = self.template.get(i) else {
                return Ok(None);
            };
            let is_param = pattern.starts_with('{') && pattern.ends_with('}');
            let decoded = percent_decode(seg);
            if !is_param && pattern.as_bytes() != decoded.as_slice() {
                return Ok(None);
            }
            if i == index {
                found = Some(decoded);
            }
            count += 1;
        }
        Ok(if count == self.template.len() {
            found
        } else {
            None
        })
    }

    /// `path:{template}#{param}`, such as `path:/accounts/{id}/credit#id`.
    fn namespace(&self) -> Cow<'_, str> {
        let mut out = String::from("path:");
        for segment in &self.template {
            out.push('/');
            out.push_str(segment);
        }
        if self.template.is_empty() {
            out.push('/');
        }
        let wanted = match &self.index {
            Ok(index) => self.template.get(*index).map_or("", String::as_str),
            Err(wanted) => wanted,
        };
        out.push('#');
        out.push_str(
            wanted
                .strip_prefix('{')
                .and_then(|w| w.strip_suffix('}'))
                .unwrap_or(wanted),
        );
        Cow::Owned(out)
    }
}
