//! A node's ledger: one key without a TTL, kept on the node itself, that says since when
//! the node's data is whole. Every client of the node reads it, so every client and every
//! app instance reaches the same verdict from the same moment.
//!
//! ```text
//! <prefix>#ledger   "1 <epoch> <since_ms> <why> <run_id> <replid>"   (no TTL)
//! <prefix>#horizon  the longest TTL any client of these nodes announced, in ms (only raised)
//! ```
//!
//! - `epoch` names the dataset: written by the first client that finds no ledger. A node
//!   that answers without its ledger lost everything it held (it restarted empty, was
//!   flushed, is a replica that never synced, or is new: nothing tells these apart).
//! - `since_ms`, on the node's own clock: the latest moment the node may have lost keys.
//!   Every client keeps the node out of acquisitions until the horizon has passed since.
//! - `why`, `run_id`, `replid`: why `since` was last moved, and who the server was at the
//!   last judgement (`-` when `INFO` did not tell), for the judge to compare with `INFO`.
//!
//! The ledger is replaced only by a compare-and-swap ([`SWAP`]) of what was read, so two
//! clients that judge at once agree; the horizon only grows ([`RAISE`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! // Each connect reads the ledger (and makes it, on a node that has none).
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! println!("{:?}", redlock.health().await.nodes()[0].status());
//! # Ok(()) }
//! ```

use redis::Value;

use crate::error::QuarantineReason;

/// Why a node's `since` was last moved: the kinds of loss a ledger records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Why {
    /// The node answered without a ledger: every key it held may be gone (or it is new).
    Empty,
    /// Another server process than at the last judgement, younger than the horizon: a
    /// restart (keys written since its last save may be gone).
    Restarted,
    /// The server became a master (a failover, or a master demoted and promoted again):
    /// writes replication had not carried may be gone.
    Promoted,
}

impl Why {
    fn word(self) -> &'static str {
        match self {
            Self::Empty => "empty",
            Self::Restarted => "restarted",
            Self::Promoted => "promoted",
        }
    }

    fn from_word(word: &str) -> Option<Self> {
        Some(match word {
            "empty" => Self::Empty,
            "restarted" => Self::Restarted,
            "promoted" => Self::Promoted,
            _ => return None,
        })
    }

    /// The reason a quarantine for this loss gives.
    pub(crate) fn reason(self) -> QuarantineReason {
        match self {
            Self::Empty => QuarantineReason::Empty,
            Self::Restarted => QuarantineReason::Restarted,
            Self::Promoted => QuarantineReason::Promoted,
        }
    }
}

/// What a node's ledger says (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ledger {
    pub(crate) epoch: String,
    /// The latest moment the node may have lost keys, in ms on the node's clock.
    pub(crate) since_ms: u64,
    pub(crate) why: Why,
    /// The server process at the last judgement (empty: `INFO` did not tell).
    pub(crate) run_id: String,
    /// The replication id at the last judgement (empty: `INFO` did not tell).
    pub(crate) replid: String,
}

/// The version word that opens a ledger's value.
const VERSION: &str = "1";

impl Ledger {
    /// Reads a ledger's value; `None` for anything else (a key of another program, a
    /// ledger of a later format): the judge then treats the node as without a ledger.
    pub(crate) fn parse(value: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(value).ok()?;
        let mut words = text.split(' ');
        let (Some(VERSION), Some(epoch), Some(since), Some(why), Some(run), Some(repl), None) = (
            words.next(),
            words.next(),
            words.next(),
            words.next(),
            words.next(),
            words.next(),
            words.next(),
        ) else {
            return None;
        };
        let blank = |w: &str| {
            if w == "-" {
                String::new()
            } else {
                w.to_owned()
            }
        };
        (!epoch.is_empty()).then_some(())?;
        Some(Self {
            epoch: epoch.to_owned(),
            since_ms: since.parse().ok()?,
            why: Why::from_word(why)?,
            run_id: blank(run),
            replid: blank(repl),
        })
    }

    /// The ledger as the value stored on the node.
    pub(crate) fn value(&self) -> String {
        let dash = |w: &str| {
            if w.is_empty() {
                "-".to_owned()
            } else {
                w.to_owned()
            }
        };
        format!(
            "{VERSION} {} {} {} {} {}",
            self.epoch,
            self.since_ms,
            self.why.word(),
            dash(&self.run_id),
            dash(&self.replid)
        )
    }
}

/// Where a node's ledger and horizon are: under the client's key prefix (so that the
/// ACL pattern of its keys covers them), in one hash slot on a Redis Cluster shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LedgerKeys {
    pub(crate) ledger: Vec<u8>,
    pub(crate) horizon: Vec<u8>,
}

impl LedgerKeys {
    /// The keys of a node whose client's key prefix is `prefix`.
    pub(crate) fn new(prefix: &[u8]) -> Self {
        Self {
            ledger: [prefix, b"#ledger"].concat(),
            horizon: [prefix, b"#horizon"].concat(),
        }
    }

    /// The keys of a Redis Cluster shard that serves hash slot `slot`.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub(crate) fn in_slot(prefix: &[u8], slot: u16) -> Self {
        let tag = crate::name::slot::tag(slot);
        Self {
            ledger: crate::name::tagged_key(prefix, b"#ledger", &tag),
            horizon: crate::name::tagged_key(prefix, b"#horizon", &tag),
        }
    }

    /// Reads the ledger and raises the horizon to `ttl_ms` (answering the node's horizon),
    /// as two more commands of `pipe`.
    pub(crate) fn read_into(&self, pipe: &mut redis::Pipeline, ttl_ms: u64) {
        pipe.cmd("GET").arg(&self.ledger);
        pipe.cmd("EVAL")
            .arg(RAISE)
            .arg(1)
            .arg(&self.horizon)
            .arg(ttl_ms);
    }

    /// Raises the horizon to `ttl_ms`: the node's horizon after it.
    pub(crate) fn raise(&self, ttl_ms: u64) -> redis::Cmd {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(RAISE).arg(1).arg(&self.horizon).arg(ttl_ms);
        cmd
    }

    /// Replaces the ledger by `new` if it still is `expected` (`None`: no ledger).
    pub(crate) fn swap(&self, expected: Option<&[u8]>, new: &Ledger) -> redis::Cmd {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(SWAP)
            .arg(1)
            .arg(&self.ledger)
            .arg(expected.unwrap_or_default())
            .arg(new.value());
        cmd
    }
}

/// What a ledger read (`GET`) answered: its value, or none.
pub(crate) fn read_value(reply: &Value) -> Result<Option<Vec<u8>>, String> {
    match reply {
        Value::Nil => Ok(None),
        Value::BulkString(bytes) => Ok(Some(bytes.clone())),
        Value::SimpleString(s) => Ok(Some(s.clone().into_bytes())),
        Value::ServerError(e) => Err(format!("{e:?}")),
        other => Err(format!(
            "an unexpected reply to GET of the ledger: {other:?}"
        )),
    }
}

/// What a horizon raise answered: the node's horizon in ms.
pub(crate) fn horizon_value(reply: &Value) -> Result<u64, String> {
    match reply {
        Value::Int(ms) => u64::try_from(*ms).map_err(|_| format!("a negative horizon {ms}")),
        Value::ServerError(e) => Err(format!("{e:?}")),
        other => Err(format!(
            "an unexpected reply to the horizon raise: {other:?}"
        )),
    }
}

/// What a swap answered: `Ok(None)` when the new ledger is in, `Ok(Some(current))` when
/// the ledger was another by then (its value, or `None` for no ledger).
pub(crate) fn swap_outcome(reply: &Value) -> Result<Option<Option<Vec<u8>>>, String> {
    match reply {
        Value::Array(items) => match items.as_slice() {
            [Value::Int(1)] => Ok(None),
            [Value::Int(0), current] => match read_value(current)? {
                Some(v) if v.is_empty() => Ok(Some(None)),
                other => Ok(Some(other)),
            },
            _ => Err(format!("an unexpected reply to the ledger swap: {reply:?}")),
        },
        Value::ServerError(e) => Err(format!("{e:?}")),
        other => Err(format!("an unexpected reply to the ledger swap: {other:?}")),
    }
}

/// Compare-and-swap of a ledger. `KEYS[1]` = the ledger, `ARGV[1]` = the value read (empty
/// for none), `ARGV[2]` = the new value. `{1}` when swapped, `{0, current}` otherwise (an
/// empty string for none).
pub(crate) const SWAP: &str = r#"
local cur = redis.call('GET', KEYS[1]) or ''
if cur == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2])
  return {1}
end
return {0, cur}
"#;

/// Raises a horizon. `KEYS[1]` = the horizon, `ARGV[1]` = a TTL in ms. Answers the
/// horizon after the raise; a value that is not a number counts as none.
pub(crate) const RAISE: &str = r#"
local h = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
local t = tonumber(ARGV[1])
if t > h then
  redis.call('SET', KEYS[1], ARGV[1])
  return t
end
return h
"#;

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger() -> Ledger {
        Ledger {
            epoch: "0a1b2c".into(),
            since_ms: 1_764_115_200_123,
            why: Why::Promoted,
            run_id: "abc".into(),
            replid: String::new(),
        }
    }

    #[test]
    fn a_ledger_reads_back_what_it_wrote() {
        let l = ledger();
        assert_eq!(l.value(), "1 0a1b2c 1764115200123 promoted abc -");
        assert_eq!(Ledger::parse(l.value().as_bytes()), Some(l));
        for why in [Why::Empty, Why::Restarted, Why::Promoted] {
            let l = Ledger { why, ..ledger() };
            assert_eq!(Ledger::parse(l.value().as_bytes()), Some(l));
        }
    }

    #[test]
    fn anything_else_is_no_ledger() {
        for bad in [
            &b""[..],
            b"1",
            b"2 e 1 empty - -",
            b"1 e x empty - -",
            b"1 e 1 lost - -",
            b"1  1 empty - -",
            b"1 e 1 empty - - more",
            b"\xff\xfe",
        ] {
            assert_eq!(Ledger::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn keys_sit_under_the_prefix_and_in_a_slot_on_a_cluster() {
        let keys = LedgerKeys::new(b"redlock:");
        assert_eq!(keys.ledger, b"redlock:#ledger");
        assert_eq!(keys.horizon, b"redlock:#horizon");
        let slotted = LedgerKeys::in_slot(b"redlock:", 7638);
        assert_eq!(crate::name::slot::slot(&slotted.ledger), 7638);
        assert_eq!(crate::name::slot::slot(&slotted.horizon), 7638);
    }

    #[test]
    fn replies_read_as_values() {
        assert_eq!(read_value(&Value::Nil), Ok(None));
        assert_eq!(
            read_value(&Value::BulkString(b"1 e".to_vec())),
            Ok(Some(b"1 e".to_vec()))
        );
        assert!(read_value(&Value::Int(1)).is_err());
        assert_eq!(horizon_value(&Value::Int(30_000)), Ok(30_000));
        assert!(horizon_value(&Value::Int(-1)).is_err());
        let swapped = Value::Array(vec![Value::Int(1)]);
        assert_eq!(swap_outcome(&swapped), Ok(None));
        let other = Value::Array(vec![Value::Int(0), Value::BulkString(b"1 x".to_vec())]);
        assert_eq!(swap_outcome(&other), Ok(Some(Some(b"1 x".to_vec()))));
        let gone = Value::Array(vec![Value::Int(0), Value::BulkString(Vec::new())]);
        assert_eq!(swap_outcome(&gone), Ok(Some(None)));
        assert!(swap_outcome(&Value::Int(1)).is_err());
    }
}
