//! A simulated server's keys: the commands and reply shapes the crate relies on (`GET`,
//! `MGET`, `SET NX PX`, `DEL`, `PTTL`, `PEXPIRE`, `ZADD GT CH`, `ZSCORE`, `PUBLISH`, `TIME`,
//! `FLUSHALL`), keys expiring on the node's own clock (passed in: a key is gone once the
//! clock is past its expiry, as in Redis).
//!
//! ```text
//! command("SET", ["k", "v", "NX", "PX", "100"], t)  -> Okay
//! command("GET", ["k"], t + 100)                    -> "v"
//! command("GET", ["k"], t + 101)                    -> Nil
//! ```

use std::collections::BTreeMap;

use redis::Value;

/// What a key holds.
#[derive(Debug, Clone, PartialEq)]
enum Data {
    Str(Vec<u8>),
    ZSet(BTreeMap<Vec<u8>, f64>),
}

/// A key's data and its expiry on the node's clock (ms since the Unix epoch).
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    data: Data,
    expires_ms: Option<u64>,
}

/// The keys of a server, as of one moment of its clock.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Keyspace {
    keys: BTreeMap<Vec<u8>, Entry>,
}

/// The error reply `message` (`ERR ...`, `WRONGTYPE ...`).
pub(crate) fn error(message: &str) -> Value {
    redis::parse_redis_value(format!("-{message}\r\n").as_bytes())
        .unwrap_or_else(|_| Value::SimpleString(message.to_owned()))
}

const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
const SYNTAX: &str = "ERR syntax error";
/// The error of an argument that should be an integer.
pub(crate) const NOT_INT: &str = "ERR value is not an integer or out of range";

/// A score as Redis writes it: integers below 2^52 as integers, others with 17 digits.
pub(crate) fn score_text(score: f64) -> String {
    if score.fract() == 0.0 && score.abs() < 4_503_599_627_370_496.0 {
        #[expect(clippy::cast_possible_truncation, reason = "integral and below 2^52")]
        return (score as i64).to_string();
    }
    let text = format!("{score:.16e}");
    // `%.17g`: 17 significant digits, the exponent form only where it is shorter.
    match text.split_once('e') {
        Some((mantissa, exp)) => {
            let exp: i32 = exp.parse().unwrap_or(0);
            if (0..17).contains(&exp) {
                let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
                let (int, frac) = digits.split_at(usize::try_from(exp + 1).unwrap_or(0));
                let frac = frac.trim_end_matches('0');
                let sign = if score < 0.0 { "-" } else { "" };
                if frac.is_empty() {
                    format!("{sign}{int}")
                } else {
                    format!("{sign}{int}.{frac}")
                }
            } else {
                let mantissa = mantissa.trim_end_matches('0').trim_end_matches('.');
                format!(
                    "{mantissa}e{}{:02}",
                    if exp < 0 { '-' } else { '+' },
                    exp.abs()
                )
            }
        }
        None => text,
    }
}

/// `arg` as an integer, if it is one.
pub(crate) fn int(arg: &[u8]) -> Option<i64> {
    std::str::from_utf8(arg).ok()?.parse().ok()
}

impl Keyspace {
    /// Every key, in order: its name, its value (a string's, or a sorted set's members and
    /// scores as `ZRANGE .. WITHSCORES` answers, by score) and its `PTTL` at `now`.
    pub(crate) fn each(&self, now: u64) -> Vec<(Vec<u8>, Value, i64)> {
        self.keys
            .iter()
            .map(|(name, entry)| {
                let value = match &entry.data {
                    Data::Str(v) => Value::BulkString(v.clone()),
                    Data::ZSet(set) => {
                        let mut by_score: Vec<_> = set.iter().collect();
                        by_score.sort_by(|a, b| a.1.total_cmp(b.1).then_with(|| a.0.cmp(b.0)));
                        let pairs = by_score.into_iter().flat_map(|(m, s)| {
                            [
                                Value::BulkString(m.clone()),
                                Value::BulkString(score_text(*s).into_bytes()),
                            ]
                        });
                        Value::Array(pairs.collect())
                    }
                };
                (name.clone(), value, self.pttl(name, now))
            })
            .collect()
    }

    /// Drops the keys expired at `now`.
    pub(crate) fn expire(&mut self, now: u64) {
        self.keys
            .retain(|_, e| e.expires_ms.is_none_or(|t| now <= t));
    }

    /// A command on the keys (what `redis.call` may run), at `now` on the node's clock.
    pub(crate) fn command(&mut self, name: &[u8], args: &[Vec<u8>], now: u64) -> Value {
        self.expire(now);
        match (name, args) {
            (b"PING", []) => Value::SimpleString("PONG".into()),
            (b"GET", [key]) => match self.keys.get(key) {
                None => Value::Nil,
                Some(Entry {
                    data: Data::Str(v), ..
                }) => Value::BulkString(v.clone()),
                Some(_) => error(WRONGTYPE),
            },
            (b"MGET", keys) if !keys.is_empty() => self.mget(keys),
            (b"SET", [key, value, options @ ..]) => self.set(key, value, options, now),
            (b"DEL", keys) if !keys.is_empty() => {
                let n = keys
                    .iter()
                    .filter(|k| self.keys.remove(*k).is_some())
                    .count();
                Value::Int(i64::try_from(n).unwrap_or(i64::MAX))
            }
            (b"PTTL", [key]) => Value::Int(self.pttl(key, now)),
            (b"PEXPIRE", [key, ms]) => self.pexpire(key, ms, now),
            (b"ZADD", [key, rest @ ..]) => self.zadd(key, rest),
            (b"ZSCORE", [key, member]) => match self.keys.get(key) {
                None => Value::Nil,
                Some(Entry {
                    data: Data::ZSet(set),
                    ..
                }) => set.get(member).map_or(Value::Nil, |s| {
                    Value::BulkString(score_text(*s).into_bytes())
                }),
                Some(_) => error(WRONGTYPE),
            },
            (b"PUBLISH", [_, _]) => Value::Int(0),
            (b"FLUSHALL", []) => {
                self.keys.clear();
                Value::Okay
            }
            (b"TIME", []) => {
                let us = now.saturating_mul(1_000);
                Value::Array(vec![
                    Value::BulkString((us / 1_000_000).to_string().into_bytes()),
                    Value::BulkString((us % 1_000_000).to_string().into_bytes()),
                ])
            }
            _ => error(&format!(
                "ERR unknown command '{}', with args beginning with: ",
                String::from_utf8_lossy(name)
            )),
        }
    }

    /// `MGET`: a key that is not a string reads as nil, as in Redis.
    fn mget(&self, keys: &[Vec<u8>]) -> Value {
        let each = keys.iter().map(|key| match self.keys.get(key) {
            Some(Entry {
                data: Data::Str(v), ..
            }) => Value::BulkString(v.clone()),
            _ => Value::Nil,
        });
        Value::Array(each.collect())
    }

    fn pttl(&self, key: &[u8], now: u64) -> i64 {
        match self.keys.get(key) {
            None => -2,
            Some(Entry {
                expires_ms: None, ..
            }) => -1,
            Some(Entry {
                expires_ms: Some(t),
                ..
            }) => i64::try_from(t.saturating_sub(now)).unwrap_or(i64::MAX),
        }
    }

    fn pexpire(&mut self, key: &[u8], ms: &[u8], now: u64) -> Value {
        let Some(ms) = int(ms) else {
            return error(NOT_INT);
        };
        let Some(entry) = self.keys.get_mut(key) else {
            return Value::Int(0);
        };
        if ms <= 0 {
            self.keys.remove(key);
        } else {
            entry.expires_ms = Some(now.saturating_add(ms.unsigned_abs()));
        }
        Value::Int(1)
    }

    fn set(&mut self, key: &[u8], value: &[u8], options: &[Vec<u8>], now: u64) -> Value {
        let (mut nx, mut xx, mut px) = (false, false, None);
        let mut it = options.iter();
        while let Some(option) = it.next() {
            match option.to_ascii_uppercase().as_slice() {
                b"NX" => nx = true,
                b"XX" => xx = true,
                b"PX" => match it.next().and_then(|ms| int(ms)) {
                    Some(ms) if ms > 0 => px = Some(ms.unsigned_abs()),
                    Some(_) => return error("ERR invalid expire time in 'set' command"),
                    None => return error(NOT_INT),
                },
                _ => return error(SYNTAX),
            }
        }
        if nx && xx {
            return error(SYNTAX);
        }
        let exists = self.keys.contains_key(key);
        if (nx && exists) || (xx && !exists) {
            return Value::Nil;
        }
        self.keys.insert(
            key.to_vec(),
            Entry {
                data: Data::Str(value.to_vec()),
                expires_ms: px.map(|ms| now.saturating_add(ms)),
            },
        );
        Value::Okay
    }

    fn zadd(&mut self, key: &[u8], args: &[Vec<u8>]) -> Value {
        let (mut gt, mut ch, mut at) = (false, false, 0);
        while let Some(flag) = args.get(at) {
            match flag.to_ascii_uppercase().as_slice() {
                b"GT" => gt = true,
                b"CH" => ch = true,
                _ => break,
            }
            at += 1;
        }
        let pairs = &args[at..];
        if pairs.is_empty() || !pairs.len().is_multiple_of(2) {
            return error(SYNTAX);
        }
        let mut scores = Vec::new();
        for pair in pairs.chunks(2) {
            let score = std::str::from_utf8(&pair[0])
                .ok()
                .and_then(|s| s.parse::<f64>().ok())
                .filter(|s| !s.is_nan());
            let Some(score) = score else {
                return error("ERR value is not a valid float");
            };
            scores.push((score, pair[1].clone()));
        }
        let entry = self.keys.entry(key.to_vec()).or_insert(Entry {
            data: Data::ZSet(BTreeMap::new()),
            expires_ms: None,
        });
        let Data::ZSet(set) = &mut entry.data else {
            return error(WRONGTYPE);
        };
        let mut counted = 0;
        for (score, member) in scores {
            match set.get(&member) {
                None => {
                    set.insert(member, score);
                    counted += 1;
                }
                Some(old) if (!gt || score > *old) && score != *old => {
                    set.insert(member, score);
                    counted += usize::from(ch);
                }
                Some(_) => {}
            }
        }
        Value::Int(i64::try_from(counted).unwrap_or(i64::MAX))
    }
}
