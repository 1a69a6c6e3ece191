//! A header value as an RFC 8941 structured-field string, the form of the IETF
//! `Idempotency-Key` header (draft-ietf-httpapi-idempotency-key-header):
//! `Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"`.
//!
//! The value is an Item whose bare item is a String: `"..."` holding printable ASCII
//! (0x20 to 0x7E), with `\"` and `\\` the only escapes. Parameters after it (`"k";a=1`)
//! are parsed (they must be well formed) and ignored. Spaces and tabs around the value are
//! trimmed, as HTTP and RFC 8941 trim them; inside, RFC 8941's grammar is followed exactly
//! (`"k" ;a=1` is malformed).
//!
//! For clients that send the key unquoted, a value that does not start with `"` is the
//! key as it is when it is made of visible ASCII (0x21 to 0x7E) without `"`, `,` or `;`:
//! every sf-token (`k-1`, `abc/def`), and also keys such as `12` or `{id}`. So `"k"` and
//! `k` are the same key. A value with `,` is a list (two keys), refused either way.

/// Why a header value is not a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyError {
    /// Nothing but spaces, or the empty string `""`.
    Empty,
    /// Not a string item nor an unquoted key: what is wrong, and at which byte (from 0)
    /// of the value.
    Malformed { problem: &'static str, at: usize },
}

const UNTERMINATED: &str = "the string has no closing quote";
const BAD_ESCAPE: &str = r#"a backslash may only escape '"' or '\'"#;
const NOT_PRINTABLE: &str = "a string holds only printable ASCII";
const LIST: &str = "it is a list; send one key";
const TRAILING: &str = "there is something after the string";
const BAD_BARE: &str = r#"an unquoted key holds only visible ASCII without '"', ',', ';' or spaces; quote it as a string"#;
const BAD_PARAM_KEY: &str = "a parameter's name starts with a lowercase letter or '*'";
const BAD_PARAM_VALUE: &str = "a parameter's value is not a structured-field bare item";

/// The key in `value`: the string of an RFC 8941 string Item, or an unquoted value as it
/// is (see the [module docs](self)).
pub(crate) fn string_item(value: &[u8]) -> Result<Vec<u8>, KeyError> {
    let is_ows = |b: &u8| *b == b' ' || *b == b'\t';
    let Some(start) = value.iter().position(|b| !is_ows(b)) else {
        return Err(KeyError::Empty);
    };
    let end = value
        .iter()
        .rposition(|b| !is_ows(b))
        .map_or(start, |i| i + 1);
    let trimmed = value.get(start..end).unwrap_or_default();
    let key = if trimmed.first() == Some(&b'"') {
        let mut c = Cursor {
            bytes: value.get(..end).unwrap_or_default(),
            pos: start,
        };
        let key = c.string()?;
        c.parameters()?;
        c.skip_ows();
        match c.peek() {
            None => key,
            Some(b',') => return Err(c.malformed(LIST)),
            Some(_) => return Err(c.malformed(TRAILING)),
        }
    } else {
        unquoted(trimmed, start)?
    };
    if key.is_empty() {
        return Err(KeyError::Empty);
    }
    Ok(key)
}

/// An unquoted key starting at byte `offset` of the value.
fn unquoted(key: &[u8], offset: usize) -> Result<Vec<u8>, KeyError> {
    for (i, &b) in key.iter().enumerate() {
        let problem = match b {
            b',' => LIST,
            b'"' | b';' => BAD_BARE,
            0x21..=0x7e => continue,
            _ => BAD_BARE,
        };
        return Err(KeyError::Malformed {
            problem,
            at: offset + i,
        });
    }
    Ok(key.to_vec())
}

/// A position in a value being parsed.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Cursor<'_> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn malformed(&self, problem: &'static str) -> KeyError {
        KeyError::Malformed {
            problem,
            at: self.pos,
        }
    }

    fn skip_ows(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.pos += 1;
        }
    }

    /// Takes bytes while `pred` holds.
    fn take_while(&mut self, pred: impl Fn(u8) -> bool) {
        while self.peek().is_some_and(&pred) {
            self.pos += 1;
        }
    }

    /// A String (RFC 8941 section 4.2.5), the cursor on its opening quote.
    fn string(&mut self) -> Result<Vec<u8>, KeyError> {
        let open = self.pos;
        self.pos += 1;
        let mut out = Vec::new();
        loop {
            let Some(b) = self.peek() else {
                return Err(KeyError::Malformed {
                    problem: UNTERMINATED,
                    at: open,
                });
            };
            match b {
                b'\\' => {
                    self.pos += 1;
                    match self.peek() {
                        Some(e @ (b'"' | b'\\')) => out.push(e),
                        None => {
                            return Err(KeyError::Malformed {
                                problem: UNTERMINATED,
                                at: open,
                            });
                        }
                        Some(_) => return Err(self.malformed(BAD_ESCAPE)),
                    }
                }
                b'"' => {
                    self.pos += 1;
                    return Ok(out);
                }
                0x20..=0x7e => out.push(b),
                _ => return Err(self.malformed(NOT_PRINTABLE)),
            }
            self.pos += 1;
        }
    }

    /// Parameters (section 4.2.3.2), checked and dropped.
    fn parameters(&mut self) -> Result<(), KeyError> {
        while self.peek() == Some(b';') {
            self.pos += 1;
            self.take_while(|b| b == b' ');
            if !matches!(self.peek(), Some(b'a'..=b'z' | b'*')) {
                return Err(self.malformed(BAD_PARAM_KEY));
            }
            self.take_while(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' | b'*'));
            if self.peek() == Some(b'=') {
                self.pos += 1;
                self.bare_item()?;
            }
        }
        Ok(())
    }

    /// A parameter's value (section 4.2.3.1), checked and dropped.
    fn bare_item(&mut self) -> Result<(), KeyError> {
        match self.peek() {
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b'"') => self.string().map(drop),
            Some(b'A'..=b'Z' | b'a'..=b'z' | b'*') => {
                self.pos += 1;
                self.take_while(|b| is_tchar(b) || b == b':' || b == b'/');
                Ok(())
            }
            Some(b':') => {
                self.pos += 1;
                self.take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='));
                if self.peek() != Some(b':') {
                    return Err(self.malformed(BAD_PARAM_VALUE));
                }
                self.pos += 1;
                Ok(())
            }
            Some(b'?') => {
                self.pos += 1;
                if !matches!(self.peek(), Some(b'0' | b'1')) {
                    return Err(self.malformed(BAD_PARAM_VALUE));
                }
                self.pos += 1;
                Ok(())
            }
            _ => Err(self.malformed(BAD_PARAM_VALUE)),
        }
    }

    /// An Integer or Decimal (section 4.2.4): at most 15 digits, or 12 before the point
    /// and 1 to 3 after it.
    fn number(&mut self) -> Result<(), KeyError> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        if !self.peek().is_some_and(|b| b.is_ascii_digit()) {
            return Err(self.malformed(BAD_PARAM_VALUE));
        }
        let digits = self.pos;
        self.take_while(|b| b.is_ascii_digit());
        let whole = self.pos - digits;
        if self.peek() != Some(b'.') {
            return if whole > 15 {
                Err(KeyError::Malformed {
                    problem: BAD_PARAM_VALUE,
                    at: start,
                })
            } else {
                Ok(())
            };
        }
        self.pos += 1;
        let point = self.pos;
        self.take_while(|b| b.is_ascii_digit());
        let fraction = self.pos - point;
        if whole > 12 || fraction == 0 || fraction > 3 {
            return Err(KeyError::Malformed {
                problem: BAD_PARAM_VALUE,
                at: start,
            });
        }
        Ok(())
    }
}

/// `tchar` of RFC 9110.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn malformed(problem: &'static str, at: usize) -> Result<Vec<u8>, KeyError> {
        Err(KeyError::Malformed { problem, at })
    }

    #[test]
    fn values_parse_to_their_keys_or_say_what_is_wrong() {
        let ok = |k: &str| Ok(k.as_bytes().to_vec());
        let cases: &[(&str, Result<Vec<u8>, KeyError>)] = &[
            // Strings, as the draft sends them.
            (
                r#""8e03978e-40d5-43e8-bc93-6894a57f9324""#,
                ok("8e03978e-40d5-43e8-bc93-6894a57f9324"),
            ),
            (r#""k""#, ok("k")),
            (r#""a b""#, ok("a b")),
            (r#"" ""#, ok(" ")),
            (r#""a\"b""#, ok(r#"a"b"#)),
            (r#""a\\b""#, ok(r"a\b")),
            (r#""\\""#, ok(r"\")),
            (r#""a,b;c=d""#, ok("a,b;c=d")),
            (
                r#""~!@#$%^&*()_+{}|:<>?`-=[]\\;',./""#,
                ok(r"~!@#$%^&*()_+{}|:<>?`-=[]\;',./"),
            ),
            // Spaces and tabs around the value are trimmed.
            (r#"  "k"  "#, ok("k")),
            ("\t\"k\"\t", ok("k")),
            // Parameters are checked and ignored.
            (r#""k";a=1"#, ok("k")),
            (r#""k";a"#, ok("k")),
            (r#""k"; a=1;b=?0"#, ok("k")),
            (r#""k";*x=tok/en:1;y="s \"q\"";z=:aGk=:"#, ok("k")),
            (
                r#""k";n=-1.5;m=123456789012345;d=123456789012.123"#,
                ok("k"),
            ),
            (r#""k";a=1;a=2"#, ok("k")),
            (r#""k";a=1  "#, ok("k")),
            // Unquoted keys, as they are.
            ("k", ok("k")),
            ("k-1", ok("k-1")),
            (
                "8e03978e-40d5-43e8-bc93-6894a57f9324",
                ok("8e03978e-40d5-43e8-bc93-6894a57f9324"),
            ),
            ("*tok:en/x", ok("*tok:en/x")),
            ("12", ok("12")),
            ("{id}=[x]\\", ok("{id}=[x]\\")),
            ("  k  ", ok("k")),
            // Empty.
            ("", Err(KeyError::Empty)),
            ("   ", Err(KeyError::Empty)),
            ("\t", Err(KeyError::Empty)),
            (r#""""#, Err(KeyError::Empty)),
            (r#" "";a=1 "#, Err(KeyError::Empty)),
            // Malformed strings.
            (r#""k"#, malformed(UNTERMINATED, 0)),
            (r#"  "k"#, malformed(UNTERMINATED, 2)),
            (r#"""#, malformed(UNTERMINATED, 0)),
            (r#""k\"#, malformed(UNTERMINATED, 0)),
            (r#""k\""#, malformed(UNTERMINATED, 0)),
            (r#""a\nb""#, malformed(BAD_ESCAPE, 3)),
            (r#""a\'b""#, malformed(BAD_ESCAPE, 3)),
            ("\"a\tb\"", malformed(NOT_PRINTABLE, 2)),
            ("\"a\x7fb\"", malformed(NOT_PRINTABLE, 2)),
            ("\"a\x00b\"", malformed(NOT_PRINTABLE, 2)),
            ("\"caf\u{e9}\"", malformed(NOT_PRINTABLE, 4)),
            // Lists and trailing garbage.
            (r#""a", "b""#, malformed(LIST, 3)),
            (r#""a","b""#, malformed(LIST, 3)),
            (r#""a" , "b""#, malformed(LIST, 4)),
            (r#""a",b"#, malformed(LIST, 3)),
            ("a,b", malformed(LIST, 1)),
            ("a, b", malformed(LIST, 1)),
            (r#""a"b"#, malformed(TRAILING, 3)),
            (r#""a" "b""#, malformed(TRAILING, 4)),
            (r#""a""b""#, malformed(TRAILING, 3)),
            (r#""a" ;x=1"#, malformed(TRAILING, 4)),
            (r#""a"=1"#, malformed(TRAILING, 3)),
            // Bad parameters.
            (r#""k";"#, malformed(BAD_PARAM_KEY, 4)),
            (r#""k";A=1"#, malformed(BAD_PARAM_KEY, 4)),
            (r#""k";1=1"#, malformed(BAD_PARAM_KEY, 4)),
            (r#""k";a="#, malformed(BAD_PARAM_VALUE, 6)),
            (r#""k";a=@1"#, malformed(BAD_PARAM_VALUE, 6)),
            (r#""k";a=?2"#, malformed(BAD_PARAM_VALUE, 7)),
            (r#""k";a=:abc"#, malformed(BAD_PARAM_VALUE, 10)),
            (r#""k";a=:a b:"#, malformed(BAD_PARAM_VALUE, 8)),
            (r#""k";a=-"#, malformed(BAD_PARAM_VALUE, 7)),
            (r#""k";a=1."#, malformed(BAD_PARAM_VALUE, 6)),
            (r#""k";a=1.2345"#, malformed(BAD_PARAM_VALUE, 6)),
            (r#""k";a=1234567890123456"#, malformed(BAD_PARAM_VALUE, 6)),
            (r#""k";a=1234567890123.1"#, malformed(BAD_PARAM_VALUE, 6)),
            (r#""k";a="x"#, malformed(UNTERMINATED, 6)),
            (r#""k";a=1 ;b"#, malformed(TRAILING, 8)),
            // Unquoted values that are not keys.
            ("a b", malformed(BAD_BARE, 1)),
            ("a\tb", malformed(BAD_BARE, 1)),
            ("k;a=1", malformed(BAD_BARE, 1)),
            ("k\"", malformed(BAD_BARE, 1)),
            ("caf\u{e9}", malformed(BAD_BARE, 3)),
            ("a\x7f", malformed(BAD_BARE, 1)),
        ];
        for (value, want) in cases {
            assert_eq!(&string_item(value.as_bytes()), want, "value {value:?}");
        }
    }

    /// `key` serialized as an sf-string (section 4.1.6).
    fn serialize(key: &str) -> String {
        let mut out = String::from("\"");
        for c in key.chars() {
            if c == '"' || c == '\\' {
                out.push('\\');
            }
            out.push(c);
        }
        out.push('"');
        out
    }

    proptest! {
        #[test]
        fn every_serialized_printable_key_parses_back(
            key in "[ -~]{1,64}",
            before in "[ \t]{0,3}",
            after in "[ \t]{0,3}",
            params in "(;[a-z*][a-z0-9_.*-]{0,4}(=([0-9]{1,5}|\\?[01]|[a-zA-Z][a-z0-9]{0,5}|\"[a-z ]{0,5}\"))?){0,3}",
        ) {
            let value = format!("{before}{}{params}{after}", serialize(&key));
            prop_assert_eq!(string_item(value.as_bytes()), Ok(key.into_bytes()));
        }

        #[test]
        fn an_unquoted_key_is_the_key_as_it_is(key in "[!#-+\\--:<-~][!#-+\\--:<-~]{0,63}") {
            prop_assert_eq!(string_item(key.as_bytes()), Ok(key.clone().into_bytes()));
            prop_assert_eq!(string_item(serialize(&key).as_bytes()), Ok(key.into_bytes()));
        }

        #[test]
        fn any_bytes_parse_to_a_printable_key_or_an_error_within_the_value(
            value in proptest::collection::vec(any::<u8>(), 0..48),
        ) {
            match string_item(&value) {
                Ok(key) => prop_assert!(!key.is_empty() && key.iter().all(|b| (0x20..=0x7e).contains(b))),
                Err(KeyError::Empty) => {}
                Err(KeyError::Malformed { at, .. }) => prop_assert!(at <= value.len()),
            }
        }
    }
}
