//! The commands a round sends: a script call, `SET NX PX`, or the fenced acquisition's
//! `SET NX PX` + `ZADD GT CH` (+ for a replay `GET` and `PTTL`, + now and then the counter
//! set's `PEXPIRE`), packed
//! as RESP once per round for every node ([`Call`]), the `NOSCRIPT` fallback to `EVAL`,
//! and the batched release.
//!
//! ```text
//! Request::Script(RELEASE, keys, args)  ->  Call { packed: "*5\r\n$7\r\nEVALSHA\r\n..." }
//! Request::FencedSetNx { .. }           ->  Call { packed: "*6\r\n$3\r\nSET..*6\r\n$4\r\nZADD..", 2 replies }
//! ```
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! // The commands are internal; each operation sends one to every node.
//! let redlock = tower_redlock::Redlock::builder(["redis://127.0.0.1:6379"]).build()?;
//! let lock = redlock.lock("invoice:42").await?;
//! let _ = redlock.unlock(&lock).await;
//! # Ok(()) }
//! ```

use std::sync::OnceLock;

use redis::aio::ConnectionLike;
use redis::{Cmd, Value};

use super::lua::{HELD_OR_RECORD_SCRIPT, HOLDER_TTL_SCRIPT, RECORD_MARKER, RELEASE_SCRIPT, Script};
use super::pack::{Packer, Words};
use super::run::{eval_instead, no_script, run_script};
use crate::name::CLIENT_ID_LEN;

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

/// The renewal of a fenced acquisition's counter set (`docs/fencing.md`): its expiry.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Renewal {
    /// The set's new expiry, in ms.
    pub(crate) expire_ms: u64,
}

/// What a fenced acquisition sends: its lock, its proposal, and the counter's renewal.
pub(crate) struct FencedSet<'a> {
    pub(crate) key: &'a [u8],
    pub(crate) counters: &'a [u8],
    /// The name's member in `counters`, whose score is its counter.
    pub(crate) member: &'a [u8],
    pub(crate) value: &'a [u8],
    pub(crate) ttl_ms: u64,
    pub(crate) proposal: u64,
    pub(crate) renew: Renewal,
    /// Which of the client's sets of counters `counters` is.
    pub(crate) set: u16,
}

impl FencedSet<'_> {
    /// `SET NX PX`, `ZADD GT CH`, for a replay `GET` and `PTTL` of the key, and `PEXPIRE`.
    fn call(&self, replay: bool) -> Call {
        // Room for the other commands' words and headers.
        let reads = if replay { read_key_size(self.key) } else { 0 };
        let more = 2 * self.counters.len() + self.member.len() + 9 * 16 + 2 * 8 + reads;
        let (mut cmd, key, value) = set_nx(self.key, self.value, self.ttl_ms, more);
        cmd.next_command(6);
        cmd.bytes(b"ZADD");
        cmd.bytes(self.counters);
        cmd.bytes(b"GT");
        cmd.bytes(b"CH");
        cmd.int(self.proposal);
        cmd.bytes(self.member);
        if replay {
            read_key(&mut cmd, self.key);
        }
        cmd.next_command(3);
        cmd.bytes(b"PEXPIRE");
        cmd.bytes(self.counters);
        cmd.int(self.renew.expire_ms);
        let kind = CallKind::FencedSetNx {
            key,
            value,
            set: self.set,
            replay,
        };
        Call::of(cmd, None, kind)
    }
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
    /// An unfenced replay's acquisition: `SET key value NX PX ttl`, `GET key` and `PTTL
    /// key` in one request, settled as [`FencedSetNxOrReplay`](Self::FencedSetNxOrReplay)
    /// is (a refused `SET`'s key tells at once whether it holds a completion record).
    SetNxOrReplay {
        key: &'a [u8],
        value: &'a [u8],
        ttl_ms: u64,
    },
    /// A fenced acquisition (phase 1, `docs/fencing.md`): `SET key value NX PX ttl`, then
    /// `ZADD counters GT CH proposal member` (the name's counter is its member's score in
    /// the sorted set of counters: raised to the proposal only if below it, answering 1
    /// when it was), and `PEXPIRE counters expire` (the set's renewal, `set`, which a node
    /// leaves out where its connection renewed the set recently: see `node::renewals`),
    /// pipelined as one request with a reply each. No script: a script's
    /// `redis.call`s cost the node several times the commands sent on their own. Where the
    /// key is taken, [`HELD_OR_RECORD`](super::lua::HELD_OR_RECORD) follows, for the
    /// holder's TTL or the completion record.
    FencedSetNx(FencedSet<'a>),
    /// A fenced replay's acquisition: [`FencedSetNx`](Self::FencedSetNx)'s commands with
    /// `GET key` and `PTTL key` before the renewal, so that a key found taken tells in the
    /// same round trip whether it holds a completion record, another holder's value, or
    /// nothing by now ([`Call::settled`]); no follow-up, and no script (a script costs a
    /// node several times these reads: `docs/fencing.md`, *Phase 1 of a replay*).
    FencedSetNxOrReplay(FencedSet<'a>),
    /// The release of one lock ([`RELEASE`](super::lua::RELEASE)): `key` deleted where it
    /// holds `value`, the waiters told with this client's `id` where the node's `waiting`
    /// key says some may be. A node may send it together with others ([`release_many`]).
    Release {
        key: &'a [u8],
        waiting: Option<&'a [u8]>,
        value: &'a [u8],
        id: &'a [u8],
    },
}

impl Request<'_> {
    /// The call sent to every node of a round: built once per round and shared by every
    /// node's call, owned so that calls still in flight can finish after the round.
    pub(crate) fn call(&self) -> Call {
        match self {
            Self::Script(inv) => inv.call(CallKind::Script),
            Self::SetNx { key, value, ttl_ms } => {
                let (cmd, key, value) = set_nx(key, value, *ttl_ms, 0);
                let kind = CallKind::SetNx {
                    key,
                    value,
                    replay: false,
                };
                Call::of(cmd, None, kind)
            }
            Self::SetNxOrReplay {
                key: lock_key,
                value,
                ttl_ms,
            } => {
                let (mut cmd, key, value) =
                    set_nx(lock_key, value, *ttl_ms, read_key_size(lock_key));
                read_key(&mut cmd, lock_key);
                let kind = CallKind::SetNx {
                    key,
                    value,
                    replay: true,
                };
                Call::of(cmd, None, kind)
            }
            Self::FencedSetNx(fenced) => fenced.call(false),
            Self::FencedSetNxOrReplay(fenced) => fenced.call(true),
            Self::Release {
                key,
                waiting,
                value,
                id,
            } => release(key, *waiting, value, id),
        }
    }
}

/// A lock key, then the nodes' waiting key where there is one: the keys of a script that
/// tells the waiters ([`RELEASE`](super::lua::RELEASE), [`COMPLETE`](super::lua::COMPLETE)).
pub(crate) struct LockKeys<'a> {
    keys: [&'a [u8]; 2],
}

impl<'a> LockKeys<'a> {
    /// `key`, then `waiting` if there is one.
    pub(crate) fn new(key: &'a [u8], waiting: Option<&'a [u8]>) -> Self {
        Self {
            keys: [key, waiting.unwrap_or_default()],
        }
    }

    /// The keys, as a script call takes them.
    pub(crate) fn as_slice(&self) -> &[&'a [u8]] {
        let n = if self.keys[1].is_empty() { 1 } else { 2 };
        &self.keys[..n]
    }
}

/// The [`RELEASE`](super::lua::RELEASE) of `key` holding `value`, by client `id`, with the
/// node's `waiting` key if there is one.
fn release(key: &[u8], waiting: Option<&[u8]>, value: &[u8], id: &[u8]) -> Call {
    let keys = LockKeys::new(key, waiting);
    let keys = keys.as_slice();
    let inv = Invocation {
        script: &RELEASE_SCRIPT,
        keys,
        args: &[Arg::Bytes(value), Arg::Bytes(id)],
    };
    // `EVALSHA sha 2 key waiting value id`: the words at 3 to 6 (without the waiting key,
    // `EVALSHA sha 1 key value id`).
    let after = keys.len() + 3;
    inv.call(CallKind::Release {
        key: 3,
        waiting: waiting.map(|_| 4),
        value: after,
        id: after + 1,
    })
}

/// How many bytes [`read_key`] writes for `key`, about.
fn read_key_size(key: &[u8]) -> usize {
    2 * key.len() + 4 * 16
}

/// A replay's reads of the lock key after its `SET`: `GET key`, `PTTL key`.
fn read_key(cmd: &mut Packer, key: &[u8]) {
    for read in [&b"GET"[..], b"PTTL"] {
        cmd.next_command(2);
        cmd.bytes(read);
        cmd.bytes(key);
    }
}

/// `SET key value NX PX ttl` packed, with room for `more` bytes after it; where its key
/// and value are among the words.
fn set_nx(key: &[u8], value: &[u8], ttl_ms: u64, more: usize) -> (Packer, usize, usize) {
    let mut cmd = Packer::new(6, key.len() + value.len() + more);
    cmd.bytes(b"SET");
    let key = cmd.bytes(key);
    let value = cmd.bytes(value);
    cmd.bytes(b"NX");
    cmd.bytes(b"PX");
    cmd.int(ttl_ms);
    (cmd, key, value)
}

/// What a [`Call`] is, with where its typed fields are among its words.
#[derive(Clone, Copy)]
enum CallKind {
    /// `SET key value NX PX ttl`, for a `replay` with `GET key` and `PTTL key`.
    SetNx {
        key: usize,
        value: usize,
        replay: bool,
    },
    /// `SET key value NX PX ttl`, `ZADD counters GT CH proposal member`, for a `replay`
    /// `GET key` and `PTTL key`, and `PEXPIRE counters expire`, the renewal of counter set
    /// `set`, which may be left out.
    FencedSetNx {
        key: usize,
        value: usize,
        set: u16,
        replay: bool,
    },
    /// A [`RELEASE`](super::lua::RELEASE) of one lock.
    Release {
        key: usize,
        waiting: Option<usize>,
        value: usize,
        id: usize,
    },
    /// Any other script call.
    Script,
}

impl CallKind {
    /// Where each command after the first starts among the words (none for one command):
    /// a fenced acquisition's renewal (`PEXPIRE`) is its last.
    fn command_starts(self) -> &'static [usize] {
        match self {
            Self::SetNx { replay: true, .. } => &[6, 8],
            Self::FencedSetNx { replay: false, .. } => &[6, 12],
            // ... ZADD, then GET key and PTTL key.
            Self::FencedSetNx { replay: true, .. } => &[6, 12, 14, 16],
            _ => &[],
        }
    }

    /// For a replay, which reply is its `GET` of the key (its `PTTL`'s is the next), and
    /// where its value is among the words; `None` otherwise.
    fn reads(self) -> Option<(usize, usize)> {
        match self {
            Self::SetNx {
                value,
                replay: true,
                ..
            } => Some((1, value)),
            Self::FencedSetNx {
                value,
                replay: true,
                ..
            } => Some((2, value)),
            _ => None,
        }
    }

    /// Whether `replies` carry a replay's reads (a Redis Cluster node's answer does not).
    fn has_reads(self, replies: &[Value]) -> bool {
        self.reads()
            .is_some_and(|(get, _)| replies.len() >= get + 2)
    }

    /// Where the renewal (`PEXPIRE counters expire`) starts among the words.
    fn renewal_word(self) -> Option<usize> {
        match self {
            Self::FencedSetNx { .. } => self.command_starts().last().copied(),
            _ => None,
        }
    }
}

/// One round's command, owned: a script's `EVALSHA` (with the script, for the `EVAL`
/// fallback) or `SET key value NX PX ttl`, packed, with where its words are.
pub(crate) struct Call {
    /// The command as RESP, encoded once per round for the nodes' own connections.
    packed: Vec<u8>,
    /// Where each word is in `packed`.
    words: Words,
    /// What the command is, and where its typed fields are among the words.
    kind: CallKind,
    /// The same as a redis-rs command, built when first needed (redis-rs's connections and
    /// the rare follow-ups).
    cmd: OnceLock<Cmd>,
    /// The script behind `EVALSHA`; `None` for `SET NX PX`.
    script: Option<&'static Script>,
}

impl Call {
    /// The commands `packer` wrote, as a call of `kind` to `script` (none for plain
    /// commands).
    fn of(packer: Packer, script: Option<&'static Script>, kind: CallKind) -> Self {
        let (packed, words) = packer.finish();
        Self {
            packed,
            words,
            kind,
            cmd: OnceLock::new(),
            script,
        }
    }

    /// Word `i` of the command.
    fn word(&self, i: usize) -> &[u8] {
        self.words
            .get(i)
            .and_then(|r| self.packed.get(r))
            .unwrap_or_default()
    }

    /// How many commands the call sends (each has its reply).
    pub(crate) fn commands(&self) -> usize {
        self.kind.command_starts().len() + 1
    }

    /// A fenced acquisition's set of counters, whose renewal ends the call: a node may
    /// leave it out ([`without_renewal`](Self::without_renewal)).
    pub(crate) fn renews(&self) -> Option<u16> {
        match self.kind {
            CallKind::FencedSetNx { set, .. } => Some(set),
            _ => None,
        }
    }

    /// The call without its renewal (a fenced acquisition's last command): the packed
    /// bytes of the commands before it, and how many they are; the whole call otherwise.
    pub(crate) fn without_renewal(&self) -> (&[u8], usize) {
        let end = self
            .kind
            .renewal_word()
            .and_then(|renewal| self.words.get(renewal.checked_sub(1)?))
            .and_then(|last| self.packed.get(..last.end + 2));
        match end {
            Some(bytes) => (bytes, self.commands() - 1),
            None => (&self.packed, self.commands()),
        }
    }

    /// The first `commands` commands for redis-rs, as a pipeline whose errors come back as
    /// values, as on our own connection.
    fn pipeline_of(&self, commands: usize) -> redis::Pipeline {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        let starts = self.kind.command_starts();
        let ends = starts.iter().copied().chain([self.words.len()]);
        let all = [0].into_iter().chain(starts.iter().copied()).zip(ends);
        for (start, end) in all.take(commands) {
            let cmd = pipe.cmd(std::str::from_utf8(self.word(start)).unwrap_or_default());
            for i in start + 1..end {
                cmd.arg(self.word(i));
            }
        }
        pipe
    }

    /// The call for a Redis Cluster node: its first command as a pipeline, errors as values
    /// (for a call that carries more commands after its own, none keyed: see
    /// [`first_of`](Self::first_of)), and for a fenced acquisition the counter's raise and
    /// renewal after it, as one script call on the set's key
    /// ([`RAISE_COUNTER`](super::lua::RAISE_COUNTER)); a replay's reads are left out (the
    /// holder script follows a refused `SET` there). Each request has one keyed command:
    /// redis-rs follows a resharding's `ASK` with one `ASKING` before a whole pipeline,
    /// which lets only its first command through, and a multi-key command in a slot being
    /// resharded meets `TRYAGAIN`.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub(crate) fn for_cluster(&self) -> (redis::Pipeline, Option<Cmd>) {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        if let Some(renewal) = self.kind.renewal_word() {
            // SET key value NX PX ttl / ZADD counters GT CH proposal member / (GET key /
            // PTTL key) / PEXPIRE counters ms
            let set = pipe.cmd("SET");
            for i in 1..6 {
                set.arg(self.word(i));
            }
            let mut raise = redis::cmd("EVAL");
            raise.arg(super::lua::RAISE_COUNTER).arg(1);
            for i in [7, 10, 11, renewal + 2] {
                raise.arg(self.word(i));
            }
            return (pipe, Some(raise));
        }
        pipe.add_command(self.cmd().clone());
        (pipe, None)
    }

    /// The call's own answer from the `replies` to [`for_cluster`](Self::for_cluster)'s
    /// pipeline (without what was added after it) and its second request's reply
    /// (`then`), as [`run`](Self::run) takes its first answer: for a fenced acquisition,
    /// the replies of its three commands.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub(crate) fn first_of(
        &self,
        mut replies: Vec<Value>,
        then: Option<Value>,
    ) -> redis::RedisResult<Value> {
        replies.truncate(1);
        if let Some(then) = then {
            let mut all = replies;
            match then.extract_error()? {
                Value::Array(counter) => all.extend(counter),
                other => all.push(other),
            }
            return Ok(Value::Array(all));
        }
        match replies.pop() {
            Some(reply) => reply.extract_error(),
            None => Err(redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "no reply to the command",
            ))),
        }
    }

    /// The key the call is about (its first key: every script's `KEYS[1]` is its lock's
    /// key), by which a cluster routes it and our connection orders releases after it.
    pub(crate) fn key(&self) -> &[u8] {
        match self.kind {
            CallKind::SetNx { key, .. }
            | CallKind::FencedSetNx { key, .. }
            | CallKind::Release { key, .. } => self.word(key),
            // `EVALSHA sha numkeys key ...`
            CallKind::Script => self.word(3),
        }
    }

    /// Whether `answer`, to the whole call with its renewal, says that the renewal ran:
    /// the pipeline's third reply (its `PEXPIRE`'s, as [`finish`](Self::finish) leaves a
    /// replay's answer).
    pub(crate) fn renewal_ran(&self, answer: &redis::RedisResult<Value>) -> bool {
        self.renews().is_some()
            && matches!(answer, Ok(Value::Array(replies)) if matches!(replies.get(2), Some(Value::Int(_))))
    }

    /// A replay's answer as the path of the same acquisition without replay gives it, from
    /// the replies of its reads: `OK`, or the fenced `[OK, changed]` (and the renewal's
    /// reply), where the `SET` set the key; where it found the key taken, `{2, record}`
    /// for a completion record, `{0, pttl, ours}` for another value (`ours`: it starts
    /// with the client id ours starts with, as
    /// [`HELD_OR_RECORD`](super::lua::HELD_OR_RECORD) says), and `{0, -2, 1}` for a key
    /// gone by now. Replies with an error, or without the reads (a Redis Cluster node's),
    /// are left as they are; so is every other call's answer.
    pub(crate) fn settled(&self, first: redis::RedisResult<Value>) -> redis::RedisResult<Value> {
        let Some((get, value)) = self.kind.reads() else {
            return first;
        };
        let Ok(Value::Array(mut replies)) = first else {
            return first;
        };
        if !self.kind.has_reads(&replies)
            || replies.iter().any(|r| matches!(r, Value::ServerError(_)))
        {
            return Ok(Value::Array(replies));
        }
        if let Some(Value::Okay) = replies.first() {
            // SET, (ZADD, PEXPIRE): the reads say nothing more.
            replies.drain(get..get + 2);
            if replies.len() == 1 {
                return Ok(Value::Okay);
            }
            return Ok(Value::Array(replies));
        }
        let pttl = replies.swap_remove(get + 1);
        let settled = match replies.swap_remove(get) {
            Value::BulkString(held) if held.starts_with(RECORD_MARKER) => {
                vec![Value::Int(2), Value::BulkString(held)]
            }
            Value::BulkString(held) => {
                let ours = prefix(&held) == prefix(self.word(value));
                vec![Value::Int(0), pttl, Value::Int(i64::from(ours))]
            }
            Value::Nil => vec![Value::Int(0), Value::Int(-2), Value::Int(1)],
            other => vec![other],
        };
        Ok(Value::Array(settled))
    }

    /// The call's first command for redis-rs: the whole call when it has one command.
    fn cmd(&self) -> &Cmd {
        self.cmd.get_or_init(|| {
            let end = self.kind.command_starts().first().copied();
            let mut cmd = Cmd::new();
            for i in 0..end.unwrap_or(self.words.len()) {
                cmd.arg(self.word(i));
            }
            cmd
        })
    }

    /// Whether this is a [`RELEASE`](super::lua::RELEASE), which can go out in one
    /// [`release_many`] with others.
    pub(crate) fn is_release(&self) -> bool {
        matches!(self.kind, CallKind::Release { .. })
    }

    /// A release's key, the node's waiting key (empty if none), its value and the client
    /// id.
    pub(super) fn release(&self) -> Option<[&[u8]; 4]> {
        match self.kind {
            CallKind::Release {
                key,
                waiting,
                value,
                id,
            } => Some([
                self.word(key),
                waiting.map_or(&[][..], |w| self.word(w)),
                self.word(value),
                self.word(id),
            ]),
            _ => None,
        }
    }

    /// The command as RESP, encoded once per round for the nodes' own connections.
    pub(crate) fn packed(&self) -> &[u8] {
        &self.packed
    }

    /// Runs the call on one connection. A script the node no longer has (`NOSCRIPT`) is
    /// sent again with `EVAL`; a `SET NX PX` that finds the key taken asks for the
    /// holder's TTL ([`HOLDER_TTL`](super::lua::HOLDER_TTL)).
    pub(crate) async fn run<C: ConnectionLike>(&self, conn: &mut C) -> redis::RedisResult<Value> {
        self.run_renewing(conn, true).await
    }

    /// [`run`](Self::run), without a fenced acquisition's renewal unless `renew`.
    pub(crate) async fn run_renewing<C: ConnectionLike>(
        &self,
        conn: &mut C,
        renew: bool,
    ) -> redis::RedisResult<Value> {
        let commands = match self.renews() {
            Some(_) if !renew => self.commands() - 1,
            _ => self.commands(),
        };
        let first = if commands == 1 {
            self.cmd().query_async::<Value>(conn).await
        } else {
            let replies = self
                .pipeline_of(commands)
                .query_async::<Vec<Value>>(conn)
                .await;
            replies.map(Value::Array)
        };
        self.finish(first, conn).await
    }

    /// Whether the node's answer `first` needs [`finish`](Self::finish): a script the
    /// node does not have, or a `SET NX PX` that found the key taken (but a replay's,
    /// whose reads answered with it).
    pub(crate) fn needs_more(&self, first: &redis::RedisResult<Value>) -> bool {
        match (self.script, first) {
            (Some(_), Err(e)) => no_script(e),
            (None, Ok(Value::Nil)) => true,
            (None, Ok(Value::Array(replies))) => match self.kind {
                CallKind::FencedSetNx { .. } => {
                    matches!(replies.first(), Some(Value::Nil)) && !self.kind.has_reads(replies)
                }
                _ => false,
            },
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
            return self.settled(first);
        }
        let (script, key, value) = match (self.script, self.kind) {
            (Some(script), _) => return eval_instead(self.cmd(), script, conn).await,
            (None, CallKind::SetNx { key, value, replay }) if !replay => {
                (&*HOLDER_TTL_SCRIPT, key, value)
            }
            // A replay's `SET` without its reads (a Redis Cluster node's).
            (None, CallKind::SetNx { key, value, .. }) => (&*HELD_OR_RECORD_SCRIPT, key, value),
            (None, CallKind::FencedSetNx { key, value, .. }) => {
                (&*HELD_OR_RECORD_SCRIPT, key, value)
            }
            _ => return first,
        };
        let holder = Invocation {
            script,
            keys: &[self.word(key)],
            args: &[Arg::Bytes(self.word(value))],
        };
        run_script(&holder.cmd(), script, conn).await
    }
}

/// What a held value is known by: its client id, the first [`CLIENT_ID_LEN`] bytes of every
/// value of ours (the whole value when shorter, as Lua's `string.sub` takes it).
fn prefix(value: &[u8]) -> &[u8] {
    value.get(..CLIENT_ID_LEN).unwrap_or(value)
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

    /// The command packed as RESP ([`cmd`](Self::cmd), without building it first), as a
    /// call of `kind`.
    fn call(&self, kind: CallKind) -> Call {
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
        Call::of(cmd, Some(self.script), kind)
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

#[cfg(test)]
#[path = "command_tests.rs"]
mod tests;
