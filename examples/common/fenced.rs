//! A store that refuses writes from stale lock holders: each record keeps the highest
//! fencing number that wrote it, and a write carrying a lower number is rejected.
//!
//! It lives in Redis here (one hash per record: `fence` and `value`), but the rule is the
//! same in any database: compare and write in one atomic step, e.g. in SQL
//! `UPDATE t SET value = $1, fence = $2 WHERE id = $3 AND fence <= $2`. Writes with the
//! number already stored are accepted, so one holder can write several times.
#![allow(dead_code)]

use redis::aio::MultiplexedConnection;

/// `KEYS[1]` = the record, `ARGV[1]` = fencing number (decimal), `ARGV[2]` = value.
/// Returns `{1}` when written, `{0, highest}` when refused. Numbers are compared as
/// decimal strings (the shorter is smaller; equal lengths compare as strings), which is
/// exact for every `u64`, unlike Lua's floating-point numbers.
const WRITE: &str = r#"
local seen = redis.call('HGET', KEYS[1], 'fence')
local new = ARGV[1]
if seen and (#seen > #new or (#seen == #new and seen > new)) then
  return {0, seen}
end
redis.call('HSET', KEYS[1], 'fence', new, 'value', ARGV[2])
return {1}
"#;

/// The outcome of [`FencedStore::write`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// Written.
    Accepted,
    /// Refused: a holder with a higher number has written.
    Stale {
        /// The highest number the record has seen.
        highest: u64,
    },
}

/// A fenced key-value store in one Redis server (standing in for your database).
#[derive(Clone)]
pub struct FencedStore {
    conn: MultiplexedConnection,
    script: redis::Script,
}

impl FencedStore {
    /// Connects to the Redis server at `url`.
    pub async fn connect(url: &str) -> redis::RedisResult<Self> {
        let conn = redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await?;
        Ok(Self {
            conn,
            script: redis::Script::new(WRITE),
        })
    }

    /// Writes `value` to `record` if `fence` is at least the highest number seen there.
    pub async fn write(&self, record: &str, fence: u64, value: &str) -> redis::RedisResult<Write> {
        let mut conn = self.conn.clone();
        let reply: Vec<String> = self
            .script
            .key(record)
            .arg(fence.to_string())
            .arg(value)
            .invoke_async(&mut conn)
            .await?;
        match reply.as_slice() {
            [ok] if ok == "1" => Ok(Write::Accepted),
            [_, highest] => Ok(Write::Stale {
                highest: highest.parse().unwrap_or(u64::MAX),
            }),
            _ => Err(redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "unexpected reply from the fenced write script",
            ))),
        }
    }

    /// The record's value and the number that wrote it, if any.
    pub async fn read(&self, record: &str) -> redis::RedisResult<Option<(u64, String)>> {
        let mut conn = self.conn.clone();
        let (fence, value): (Option<u64>, Option<String>) = redis::cmd("HMGET")
            .arg(record)
            .arg("fence")
            .arg("value")
            .query_async(&mut conn)
            .await?;
        Ok(fence.zip(value))
    }
}
