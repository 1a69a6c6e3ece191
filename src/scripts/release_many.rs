//! The batched release: the [`RELEASE`](super::lua::RELEASE)s queued for one node sent as
//! one [`RELEASE_MANY`](super::lua::RELEASE_MANY) script call, each answered as it would
//! have been alone.
//!
//! ```text
//! [RELEASE k1 v1, RELEASE k2 v2, RELEASE k3 v3]  ->  EVALSHA <many> 4 k1 k2 k3 w v1 v2 v3 id
//!                                                ->  [1, 0, 1]
//! (w: the node's waiting key, which the three share)
//! ```
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! // Releases to one node that queue behind another go out as one batch.
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let (a, b) = (redlock.lock("a").await?, redlock.lock("b").await?);
//! let _ = tokio::join!(redlock.unlock(&a), redlock.unlock(&b));
//! # Ok(()) }
//! ```

use redis::Value;
use redis::aio::ConnectionLike;

use super::command::Call;
use super::lua::RELEASE_MANY_SCRIPT;
use super::pack;
use super::reply::key_answer;
use super::run::run_script;

/// Runs the [`RELEASE`](super::lua::RELEASE)s `calls` (all of one client) as one [`RELEASE_MANY`](super::lua::RELEASE_MANY) on `conn`:
/// one answer per call, in order, each as the call alone would have had it.
pub(crate) async fn release_many<C: ConnectionLike>(
    calls: &[impl std::ops::Deref<Target = Call>],
    conn: &mut C,
) -> redis::RedisResult<Vec<redis::RedisResult<Value>>> {
    let waiting = shared_waiting(calls);
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(RELEASE_MANY_SCRIPT.sha.as_str())
        .arg(calls.len() + usize::from(waiting.is_some()));
    for_each_word(calls, waiting, |word| {
        cmd.arg(word);
    });
    let reply = run_script(&cmd, &RELEASE_MANY_SCRIPT, conn).await?;
    answers(reply, calls.len())
}

/// The `EVALSHA` of [`RELEASE_MANY`](super::lua::RELEASE_MANY) for the releases `calls`
/// (all of one client), packed as RESP at the end of `out`: what [`release_many`] sends,
/// for our own connection, which merges the releases it has to write into one call.
pub(crate) fn pack_into(calls: &[impl std::ops::Deref<Target = Call>], out: &mut Vec<u8>) {
    let waiting = shared_waiting(calls);
    let keys = calls.len() + usize::from(waiting.is_some());
    pack::array_header(out, 3 + keys + calls.len() + 1);
    pack::bulk(out, b"EVALSHA");
    pack::bulk(out, RELEASE_MANY_SCRIPT.sha.as_bytes());
    pack::bulk(out, pack::digits(keys as u64, &mut [0; 20]));
    for_each_word(calls, waiting, |word| {
        pack::bulk(out, word);
    });
}

/// The keys, the `waiting` key they share ([`shared_waiting`]; none if they do not: the
/// batch then always tells the waiters), the values, then the client id of `calls`: the
/// words of a [`RELEASE_MANY`](super::lua::RELEASE_MANY) after its key count. A call that
/// is not a release has none: it gets the answer of an empty key, 0.
fn for_each_word(
    calls: &[impl std::ops::Deref<Target = Call>],
    waiting: Option<&[u8]>,
    mut word: impl FnMut(&[u8]),
) {
    for call in calls {
        word(call.release().unwrap_or_default()[0]);
    }
    if let Some(waiting) = waiting {
        word(waiting);
    }
    for call in calls {
        word(call.release().unwrap_or_default()[2]);
    }
    let id = calls
        .first()
        .and_then(|call| call.release())
        .map_or(&[][..], |[_, _, _, id]| id);
    word(id);
}

/// The waiting key of every release in `calls`, if they all have the same (on one node
/// they do, unless its names' keys are laid out per slot, where they have none).
fn shared_waiting(calls: &[impl std::ops::Deref<Target = Call>]) -> Option<&[u8]> {
    let mut each = calls
        .iter()
        .map(|call| call.release().map(|[_, w, _, _]| w));
    let first = each.next().flatten().filter(|w| !w.is_empty())?;
    each.all(|w| w == Some(first)).then_some(first)
}

/// The answers of `n` releases sent as one [`RELEASE_MANY`](super::lua::RELEASE_MANY),
/// from its `reply`: each as the release alone would have had it.
pub(crate) fn answers(
    reply: Value,
    n: usize,
) -> redis::RedisResult<Vec<redis::RedisResult<Value>>> {
    match reply {
        Value::Array(answers) if answers.len() == n => {
            Ok(answers.into_iter().map(key_answer).collect())
        }
        other => Err(redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "unexpected reply to the batched release script",
            format!("{other:?}"),
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scripts::Request;

    fn release(key: &str, value: &str) -> Call {
        release_waiting(key, "w", value)
    }

    fn release_waiting(key: &str, waiting: &str, value: &str) -> Call {
        Request::Release {
            key: key.as_bytes(),
            waiting: Some(waiting.as_bytes()),
            value: value.as_bytes(),
            id: b"client-1",
        }
        .call()
    }

    /// The merged call as the server must read it: the keys, the waiting key they share,
    /// then the values, then the client id, after the script and the key count.
    #[test]
    fn releases_pack_as_one_release_many_call() {
        let calls = [release("a", "va"), release("bb", "vb"), release("c", "vc")];
        let mut out = b"before|".to_vec();
        pack_into(&[&calls[0], &calls[1], &calls[2]], &mut out);
        let sha = RELEASE_MANY_SCRIPT.sha.as_str();
        let expected = format!(
            "before|*11\r\n$7\r\nEVALSHA\r\n$40\r\n{sha}\r\n$1\r\n4\r\n$1\r\na\r\n$2\r\nbb\r\n\
             $1\r\nc\r\n$1\r\nw\r\n$2\r\nva\r\n$2\r\nvb\r\n$2\r\nvc\r\n$8\r\nclient-1\r\n"
        );
        assert_eq!(String::from_utf8_lossy(&out), expected);
        // redis-rs's form of the call has the same words.
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(sha).arg(4);
        let all = [&calls[0], &calls[1], &calls[2]];
        for_each_word(&all, shared_waiting(&all), |w| {
            cmd.arg(w);
        });
        assert_eq!(cmd.get_packed_command(), out[b"before|".len()..].to_vec());
    }

    /// Releases with different waiting keys (names laid out per slot) name none: such a
    /// batch tells the waiters whatever the node holds.
    #[test]
    fn releases_without_a_shared_waiting_key_name_none() {
        let calls = [
            release_waiting("a", "w1", "va"),
            release_waiting("b", "w2", "vb"),
        ];
        let mut out = Vec::new();
        pack_into(&[&calls[0], &calls[1]], &mut out);
        let sha = RELEASE_MANY_SCRIPT.sha.as_str();
        let expected = format!(
            "*8\r\n$7\r\nEVALSHA\r\n$40\r\n{sha}\r\n$1\r\n2\r\n$1\r\na\r\n$1\r\nb\r\n\
             $2\r\nva\r\n$2\r\nvb\r\n$8\r\nclient-1\r\n"
        );
        assert_eq!(String::from_utf8_lossy(&out), expected);
    }

    /// Each release gets its own answer, an error of its key as its own error; a reply of
    /// another length is an error for all.
    #[test]
    fn the_reply_splits_into_each_releases_answer() {
        let error = Value::Array(vec![Value::BulkString(b"WRONGTYPE no".to_vec())]);
        let each = answers(Value::Array(vec![Value::Int(1), error, Value::Int(0)]), 3)
            .expect("one answer each");
        assert_eq!(each[0].as_ref().ok(), Some(&Value::Int(1)));
        assert_eq!(
            each[1].as_ref().err().and_then(|e| e.code()),
            Some("WRONGTYPE")
        );
        assert_eq!(each[2].as_ref().ok(), Some(&Value::Int(0)));
        assert!(answers(Value::Array(vec![Value::Int(1)]), 2).is_err());
        assert!(answers(Value::Int(1), 1).is_err());
    }
}
