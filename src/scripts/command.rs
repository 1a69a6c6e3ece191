//! The commands a round sends: a script call or `SET NX PX`, packed as RESP once per round
//! for every node ([`Call`]), the `NOSCRIPT` fallback to `EVAL`, and the batched release.
//!
//! ```text
//! Request::Script(RELEASE, keys, args)  ->  Call { packed: "*5\r\n$7\r\nEVALSHA\r\n..." }
//! ```
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! // The commands are internal; each operation sends one to every node.
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let lock = redlock.lock("invoice:42").await?;
//! redlock.unlock(&lock).await;
//! # Ok(()) }
//! ```

use std::sync::OnceLock;

use redis::aio::ConnectionLike;
use redis::{Cmd, Value};

use super::lua::{HOLDER_TTL_SCRIPT, RELEASE_MANY_SCRIPT, RELEASE_SCRIPT, Script};
use super::reply::key_answer;

/// One argument of a script call.
#[derive(Clone, Copy)]
pub(crate) enum Arg<'a> {
    Bytes(&'a [u8]),
    Int(u64),
}

/// One script call: the script, its keys and its arguments.
pub(crate) struct Invocation<'a> {
    pub(crate) script: &'static Script,
    pub(crate) keys: &'a [&'a [u8]],
    pub(crate) args: &'a [Arg<'a>],
}

/// What a round sends to every node.
pub(crate) enum Request<'a> {
    /// A script call.
    Script(Invocation<'a>),
    /// An unfenced acquisition: `SET key value NX PX ttl`, then, only where the key is
    /// taken, [`HOLDER_TTL`](super::lua::HOLDER_TTL).
    SetNx {
        key: &'a [u8],
        value: &'a [u8],
        ttl_ms: u64,
    },
}

impl Request<'_> {
    /// The call sent to every node of a round: built once per round and shared by every
    /// node's call, owned so that calls still in flight can finish after the round.
    pub(crate) fn call(&self) -> Call {
        match self {
            Self::Script(inv) => Call::new(
                inv.packed(),
                Some(inv.script),
                std::ptr::eq(inv.script, &*RELEASE_SCRIPT),
            ),
            Self::SetNx { key, value, ttl_ms } => {
                let mut cmd = Packer::new(6, key.len() + value.len());
                cmd.bytes(b"SET")
                    .bytes(key)
                    .bytes(value)
                    .bytes(b"NX")
                    .bytes(b"PX")
                    .int(*ttl_ms);
                Call::new(cmd.done(), None, false)
            }
        }
    }
}

/// One round's command, owned: a script's `EVALSHA` (with the script, for the `EVAL`
/// fallback) or `SET key value NX PX ttl`.
pub(crate) struct Call {
    /// The command as RESP, encoded once per round for the nodes' own connections.
    packed: Vec<u8>,
    /// The same as a redis-rs command, built when first needed (redis-rs's connections and
    /// the rare follow-ups).
    cmd: OnceLock<Cmd>,
    /// The script behind `EVALSHA`; `None` for `SET NX PX`.
    script: Option<&'static Script>,
    /// Whether it is a [`RELEASE`](super::lua::RELEASE), which a node may send together with others
    /// ([`release_many`]).
    release: bool,
    /// Whether the round sends it to one node only (see [`Call::alone`]).
    alone: bool,
}

impl Call {
    fn new(packed: Vec<u8>, script: Option<&'static Script>, release: bool) -> Self {
        Self {
            packed,
            cmd: OnceLock::new(),
            script,
            release,
            alone: false,
        }
    }

    /// The command for redis-rs.
    fn cmd(&self) -> &Cmd {
        self.cmd.get_or_init(|| {
            let mut cmd = Cmd::new();
            for arg in args_of(&self.packed) {
                cmd.arg(arg);
            }
            cmd
        })
    }

    /// Marks the call as sent to one node only.
    pub(crate) fn sent_alone(mut self, alone: bool) -> Self {
        self.alone = alone;
        self
    }

    /// Whether the round sends it to one node only: the caller may then write it to the
    /// connection itself. To several nodes, each connection's task writes it, so that the
    /// writes run side by side instead of one after another on the caller's thread (which
    /// would also delay what the caller does next, such as waking a waiter).
    pub(crate) fn alone(&self) -> bool {
        self.alone
    }

    /// Whether this is a [`RELEASE`](super::lua::RELEASE), which can go out in one [`release_many`] with others.
    pub(crate) fn is_release(&self) -> bool {
        self.release
    }

    /// The argument at `i` of the command (`SET key value NX PX ttl`: the key is at 1, the
    /// value at 2; `EVALSHA sha numkeys key...`: the first key is at 3).
    fn arg(&self, i: usize) -> &[u8] {
        args_of(&self.packed).nth(i).unwrap_or_default()
    }

    /// The command as RESP, encoded once per round for the nodes' own connections.
    pub(crate) fn packed(&self) -> &[u8] {
        &self.packed
    }

    /// Runs the call on one connection. A script the node no longer has (`NOSCRIPT`) is
    /// sent again with `EVAL`; a `SET NX PX` that finds the key taken asks for the
    /// holder's TTL ([`HOLDER_TTL`](super::lua::HOLDER_TTL)).
    pub(crate) async fn run<C: ConnectionLike>(&self, conn: &mut C) -> redis::RedisResult<Value> {
        let first = self.cmd().query_async::<Value>(conn).await;
        self.finish(first, conn).await
    }

    /// Whether the node's answer `first` needs [`finish`](Self::finish): a script the
    /// node does not have, or a `SET NX PX` that found the key taken.
    pub(crate) fn needs_more(&self, first: &redis::RedisResult<Value>) -> bool {
        match (self.script, first) {
            (Some(_), Err(e)) => no_script(e),
            (None, Ok(Value::Nil)) => true,
            _ => false,
        }
    }

    /// The rest of the call once the node answered its command with `first`: the `EVAL`
    /// fallback of a script, or the holder's TTL for a `SET NX PX` that found the key
    /// taken; otherwise `first` itself.
    pub(crate) async fn finish<C: ConnectionLike>(
        &self,
        first: redis::RedisResult<Value>,
        conn: &mut C,
    ) -> redis::RedisResult<Value> {
        if !self.needs_more(&first) {
            return first;
        }
        match self.script {
            Some(script) => eval_instead(self.cmd(), script, conn).await,
            None => {
                // `SET key value NX PX ttl`: the key is at 1, the value at 2.
                let holder = Invocation {
                    script: &HOLDER_TTL_SCRIPT,
                    keys: &[self.arg(1)],
                    args: &[Arg::Bytes(self.arg(2))],
                };
                run_script(&holder.cmd(), &HOLDER_TTL_SCRIPT, conn).await
            }
        }
    }
}

/// Runs the [`RELEASE`](super::lua::RELEASE)s `calls` (all of one client) as one [`RELEASE_MANY`](super::lua::RELEASE_MANY) on `conn`:
/// one answer per call, in order, each as the call alone would have had it.
pub(crate) async fn release_many<C: ConnectionLike>(
    calls: &[impl std::ops::Deref<Target = Call>],
    conn: &mut C,
) -> redis::RedisResult<Vec<redis::RedisResult<Value>>> {
    // Each call's key, value and client id, read in one pass over its command.
    let releases: Vec<[&[u8]; 3]> = calls
        .iter()
        .map(|call| {
            let mut args = args_of(&call.packed).skip(3);
            [(); 3].map(|()| args.next().unwrap_or_default())
        })
        .collect();
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(RELEASE_MANY_SCRIPT.sha.as_str()).arg(calls.len());
    for [key, _, _] in &releases {
        cmd.arg(*key);
    }
    for [_, value, _] in &releases {
        cmd.arg(*value);
    }
    cmd.arg(releases.first().map_or(&[][..], |[_, _, id]| id));
    let reply = run_script(&cmd, &RELEASE_MANY_SCRIPT, conn).await?;
    match reply {
        Value::Array(answers) if answers.len() == calls.len() => {
            Ok(answers.into_iter().map(key_answer).collect())
        }
        other => Err(redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "unexpected reply to the batched release script",
            format!("{other:?}"),
        ))),
    }
}

/// Runs `by_sha` (the `EVALSHA` of `script`), falling back to `EVAL` with the same keys
/// and arguments when the node answers `NOSCRIPT`.
async fn run_script<C: ConnectionLike>(
    by_sha: &Cmd,
    script: &Script,
    conn: &mut C,
) -> redis::RedisResult<Value> {
    match by_sha.query_async::<Value>(conn).await {
        Err(e) if no_script(&e) => eval_instead(by_sha, script, conn).await,
        other => other,
    }
}

/// Whether the node no longer has the script (its cache was flushed): `NOSCRIPT`.
fn no_script(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

/// `by_sha` (the `EVALSHA` of `script`) sent again as `EVAL`, with the same keys and
/// arguments; this also caches the script on the node again.
async fn eval_instead<C: ConnectionLike>(
    by_sha: &Cmd,
    script: &Script,
    conn: &mut C,
) -> redis::RedisResult<Value> {
    // The keys and arguments are those after `EVALSHA sha`.
    let mut eval = redis::cmd("EVAL");
    eval.arg(script.code);
    for arg in by_sha.args_iter().skip(2) {
        if let redis::Arg::Simple(bytes) = arg {
            eval.arg(bytes);
        }
    }
    eval.query_async::<Value>(conn).await
}

impl Invocation<'_> {
    /// The command's arguments: `EVALSHA sha numkeys keys... args...` (a node that lost
    /// the script gets them again as `EVAL`, see `eval_instead`).
    fn words(&self) -> impl Iterator<Item = Arg<'_>> {
        let keys = u64::try_from(self.keys.len()).unwrap_or(u64::MAX);
        let sha = self.script.sha.as_bytes();
        [Arg::Bytes(b"EVALSHA"), Arg::Bytes(sha), Arg::Int(keys)]
            .into_iter()
            .chain(self.keys.iter().map(|key| Arg::Bytes(key)))
            .chain(self.args.iter().copied())
    }

    /// The command as RESP: [`cmd`](Self::cmd) packed, without building it first.
    fn packed(&self) -> Vec<u8> {
        let size = self
            .words()
            .map(|word| match word {
                Arg::Bytes(b) => b.len(),
                Arg::Int(_) => 20,
            })
            .sum();
        let mut cmd = Packer::new(3 + self.keys.len() + self.args.len(), size);
        for word in self.words() {
            match word {
                Arg::Bytes(b) => cmd.bytes(b),
                Arg::Int(n) => cmd.int(n),
            };
        }
        cmd.done()
    }

    /// The command: `EVALSHA sha numkeys keys... args...`.
    pub(crate) fn cmd(&self) -> Cmd {
        let mut cmd = Cmd::new();
        for word in self.words() {
            match word {
                Arg::Bytes(b) => cmd.arg(b),
                Arg::Int(n) => cmd.arg(n),
            };
        }
        cmd
    }
}

/// Writes a command as RESP, an array of bulk strings, straight into one buffer: what
/// `redis::Cmd::get_packed_command` gives, without building a `Cmd` first.
struct Packer(Vec<u8>);

impl Packer {
    /// A command of `count` arguments whose own bytes come to about `size`.
    fn new(count: usize, size: usize) -> Self {
        let mut buf = Vec::with_capacity(
            size.saturating_add(count.saturating_mul(16))
                .saturating_add(16),
        );
        buf.push(b'*');
        buf.extend_from_slice(digits(count as u64, &mut [0; 20]));
        buf.extend_from_slice(b"\r\n");
        Self(buf)
    }

    fn bytes(&mut self, arg: &[u8]) -> &mut Self {
        self.0.push(b'$');
        self.0
            .extend_from_slice(digits(arg.len() as u64, &mut [0; 20]));
        self.0.extend_from_slice(b"\r\n");
        self.0.extend_from_slice(arg);
        self.0.extend_from_slice(b"\r\n");
        self
    }

    fn int(&mut self, n: u64) -> &mut Self {
        self.bytes(digits(n, &mut [0; 20]))
    }

    fn done(self) -> Vec<u8> {
        self.0
    }
}

/// `n` in decimal digits, written to the end of `buf`.
fn digits(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
}

/// The arguments of a command `Packer` wrote (an array of bulk strings), in order.
fn args_of(packed: &[u8]) -> impl Iterator<Item = &[u8]> {
    // After the array's header line come the bulk strings: `$len\r\n` bytes `\r\n`.
    let header = packed
        .iter()
        .position(|&b| b == b'\n')
        .map_or(packed.len(), |at| at + 1);
    let mut rest = &packed[header..];
    std::iter::from_fn(move || {
        let line = rest.strip_prefix(b"$")?;
        let end = line.iter().position(|&b| b == b'\r')?;
        let len = line[..end].iter().try_fold(0usize, |n, &d| {
            let digit = d.checked_sub(b'0').filter(|d| *d <= 9)?;
            n.checked_mul(10)?.checked_add(usize::from(digit))
        })?;
        let start = end.checked_add(2)?;
        let stop = start.checked_add(len)?;
        let arg = line.get(start..stop)?;
        rest = line.get(stop.checked_add(2)?..)?;
        Some(arg)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_packed_as_redis_rs_packs_them_and_read_back() {
        let odd: &[u8] = b"a\r\n$3\r\n*\x00\xff";
        for (key, value, ttl_ms) in [
            (&b"redlock:{k}"[..], &b"v"[..], 10_000),
            (odd, &b""[..], u64::MAX),
            (&b""[..], odd, 0),
        ] {
            let call = Request::SetNx { key, value, ttl_ms }.call();
            let mut cmd = redis::cmd("SET");
            cmd.arg(key).arg(value).arg("NX").arg("PX").arg(ttl_ms);
            assert_eq!(call.packed(), cmd.get_packed_command());
            assert_eq!(call.cmd().get_packed_command(), cmd.get_packed_command());
            assert_eq!(
                (call.arg(1), call.arg(2), call.arg(6)),
                (key, value, &b""[..])
            );
        }
        let keys: [&[u8]; 2] = [b"redlock:{k}", odd];
        let args = [
            Arg::Bytes(odd),
            Arg::Int(0),
            Arg::Int(u64::MAX),
            Arg::Bytes(b""),
        ];
        for (keys, args) in [
            (&keys[..], &args[..]),
            (&keys[..1], &args[..0]),
            (&[][..], &args[..]),
        ] {
            let inv = Invocation {
                script: &RELEASE_SCRIPT,
                keys,
                args,
            };
            let call = Request::Script(Invocation { ..inv }).call();
            let mut by_hand = redis::cmd("EVALSHA");
            by_hand.arg(RELEASE_SCRIPT.sha.as_str()).arg(keys.len());
            for key in keys {
                by_hand.arg(*key);
            }
            for arg in args {
                match arg {
                    Arg::Bytes(b) => by_hand.arg(*b),
                    Arg::Int(n) => by_hand.arg(*n),
                };
            }
            let expected = by_hand.get_packed_command();
            assert_eq!(Invocation { ..inv }.cmd().get_packed_command(), expected);
            assert_eq!(call.packed(), expected);
            assert_eq!(call.cmd().get_packed_command(), expected);
            let read: Vec<&[u8]> = args_of(call.packed()).collect();
            assert_eq!(read.len(), 3 + keys.len() + args.len());
            assert_eq!(read[0], b"EVALSHA");
            assert_eq!(&read[3..3 + keys.len()], keys);
        }
        assert_eq!(args_of(b"").count(), 0);
        assert_eq!(
            args_of(b"*2\r\n$5\r\nab").count(),
            0,
            "a cut bulk string is not read"
        );
    }
}
