//! A simulated Redis server: its keys ([`Keyspace`]), `INFO`, the crate's scripts (run
//! by [`scripting`]), and the process around the data: restarts with or without it,
//! failovers to a lagging replica, a replica attaching, a clock step, an `INFO` without
//! `run_id`. `conformance.rs` plays the same commands against a real `redis-server`.
//!
//! ```text
//! exec(["SET", "k", "v", "NX", "PX", "100"]) -> Okay      (node clock t)
//! exec(["GET", "k"])                         -> "v"       (node clock <= t + 100)
//! exec(["GET", "k"])                         -> Nil       (node clock > t + 100)
//! ```

use std::cell::RefCell;
use std::collections::BTreeMap;

use redis::Value;

use super::keyspace::{Keyspace, error, int};
use super::scripting::{self, Scripts};

/// The process serving the data: what `INFO` says of it.
#[derive(Debug, Clone)]
struct Process {
    run_id: String,
    started_ms: u64,
    replid: String,
    /// `master_replid2` (`None`: cleared, all zeros).
    replid2: Option<String>,
    /// Whether it keeps a replication backlog (it had a replica since it started, or was
    /// one): a replica that attaches then continues its history.
    backlog: bool,
}

/// A simulated Redis server (see the module docs).
pub(crate) struct Server {
    keys: Keyspace,
    /// The node's clock minus the simulation's wall clock, in ms.
    skew_ms: i64,
    process: Process,
    /// Bumped whenever the process changes: connections of an older one are broken.
    generation: u64,
    /// Whether the server keeps an append-only file (`INFO persistence`).
    pub(crate) aof: bool,
    /// Whether `INFO` leaves `run_id` out (as behind some proxies).
    pub(crate) hides_run_id: bool,
    /// Makes the ids of new processes and histories.
    ids: u64,
    /// The scripts loaded (gone with the process).
    scripts: Scripts,
    /// Which server this is, for the commands recorded ([`record`]).
    seed: u64,
}

/// One command: its words.
pub(crate) type Words = Vec<Vec<u8>>;

thread_local! {
    /// The commands each server of this thread ran, by server, while recording.
    static RECORDED: RefCell<Option<BTreeMap<u64, Vec<Words>>>> = const { RefCell::new(None) };
}

/// Starts recording the commands the servers of this thread run (`on`; [`recorded`]
/// takes them and stops).
pub(crate) fn record(on: bool) {
    RECORDED.with(|r| {
        let mut r = r.borrow_mut();
        if on && r.is_none() {
            *r = Some(BTreeMap::new());
        }
    });
}

/// The commands recorded since [`record`] started, one list per server; recording stops.
pub(crate) fn recorded() -> Vec<Vec<Words>> {
    RECORDED
        .with(|r| r.borrow_mut().take())
        .map(|by_server| by_server.into_values().collect())
        .unwrap_or_default()
}

impl Server {
    /// A server that started `up` ago, empty, whose ids derive from `seed`.
    pub(crate) fn new(seed: u64, up: std::time::Duration) -> Self {
        let mut server = Self {
            keys: Keyspace::default(),
            skew_ms: 0,
            process: Process {
                run_id: String::new(),
                started_ms: 0,
                replid: String::new(),
                replid2: None,
                backlog: false,
            },
            generation: 0,
            aof: false,
            hides_run_id: false,
            ids: seed,
            scripts: Scripts::default(),
            seed,
        };
        server.process = server.new_process();
        let up = u64::try_from(up.as_millis()).unwrap_or(u64::MAX);
        server.process.started_ms = server.now_ms().saturating_sub(up);
        server
    }

    /// A fresh 40-hex id, as Redis's.
    fn id(&mut self) -> String {
        self.ids = self.ids.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.ids;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        format!("{:016x}{:024x}", z ^ (z >> 31), self.generation)
    }

    fn new_process(&mut self) -> Process {
        self.generation += 1;
        self.scripts = Scripts::default();
        Process {
            run_id: self.id(),
            started_ms: self.now_ms(),
            replid: self.id(),
            replid2: None,
            backlog: false,
        }
    }

    /// The node's clock, in ms since the Unix epoch.
    pub(crate) fn now_ms(&self) -> u64 {
        crate::clock::wall_ms().saturating_add_signed(self.skew_ms)
    }

    /// Which process serves now: a connection to an older one is broken.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// Every key now (expired ones dropped): its name, its value (a string's, or a sorted
    /// set's members and scores, as `ZRANGE .. WITHSCORES` answers) and its `PTTL`.
    pub(crate) fn keys_now(&mut self) -> Vec<(Vec<u8>, Value, i64)> {
        let now = self.now_ms();
        self.keys.expire(now);
        self.keys.each(now)
    }

    /// Whether `key` holds a completion record now.
    pub(crate) fn holds_record(&mut self, key: &[u8]) -> bool {
        let now = self.now_ms();
        matches!(
            self.keys.command(b"GET", &[key.to_vec()], now),
            Value::BulkString(v) if v.starts_with(crate::scripts::RECORD_MARKER)
        )
    }

    /// The keys now (expired ones dropped).
    pub(crate) fn keyspace(&mut self) -> &Keyspace {
        let now = self.now_ms();
        self.keys.expire(now);
        &self.keys
    }

    /// A restart: a new process, with its data reloaded (`keep`) or without any.
    pub(crate) fn restart(&mut self, keep: bool) {
        if !keep {
            self.keys = Keyspace::default();
        }
        let old = self.process.replid.clone();
        self.process = self.new_process();
        if keep {
            // Reloaded from a file as a master: the old history shifts to replid2.
            self.process.replid2 = Some(old);
        }
    }

    /// A failover: the replica that held `data` (a lagging copy), up since
    /// `replica_started_ms`, is promoted in the server's place; its old history is kept
    /// in `master_replid2` (until [`clear_replid2`](Self::clear_replid2)).
    pub(crate) fn fail_over(&mut self, data: Keyspace, replica_started_ms: u64) {
        let old = self.process.replid.clone();
        self.keys = data;
        self.process = self.new_process();
        self.process.started_ms = replica_started_ms;
        self.process.replid2 = Some(old);
        self.process.backlog = true;
    }

    /// The promoted master freed its backlog, alone for `repl-backlog-ttl`: its
    /// `master_replid2` is cleared (if the process of `generation` still serves).
    pub(crate) fn clear_replid2(&mut self, generation: u64) {
        if self.generation == generation {
            self.process.replid2 = None;
            self.process.backlog = false;
        }
    }

    /// A replica attaches: to a master without a backlog, a new replication id (the data
    /// and the process unchanged); to one with a backlog (a promoted replica keeps its
    /// own), nothing changes that `INFO` shows.
    pub(crate) fn attach_replica(&mut self) {
        if !self.process.backlog {
            self.process.replid = self.id();
            self.process.replid2 = None;
            self.process.backlog = true;
        }
    }

    /// The node's clock jumps by `ms`.
    pub(crate) fn step_clock(&mut self, ms: i64) {
        self.skew_ms = self.skew_ms.saturating_add(ms);
    }

    /// Runs one command.
    pub(crate) fn exec(&mut self, args: &[Vec<u8>]) -> Value {
        RECORDED.with(|r| {
            if let Some(by_server) = r.borrow_mut().as_mut() {
                by_server.entry(self.seed).or_default().push(args.to_vec());
            }
        });
        let Some(name) = args.first() else {
            return error("ERR empty command");
        };
        let name = name.to_ascii_uppercase();
        match (name.as_slice(), &args[1..]) {
            (b"EVAL" | b"EVALSHA", [script, numkeys, rest @ ..]) => {
                let Some(n) = int(numkeys).and_then(|n| usize::try_from(n).ok()) else {
                    return error(super::keyspace::NOT_INT);
                };
                if n > rest.len() {
                    return error("ERR Number of keys can't be greater than number of args");
                }
                let (keys, argv) = rest.split_at(n);
                let source = if name == b"EVALSHA" {
                    match self.scripts.source(script) {
                        Some(source) => source,
                        None => return error("NOSCRIPT No matching script. Please use EVAL."),
                    }
                } else {
                    self.scripts.load(script);
                    script.clone()
                };
                let now = self.now_ms();
                scripting::eval(&mut self.keys, now, &source, (keys, argv))
            }
            (b"SCRIPT", [sub, script]) if sub.eq_ignore_ascii_case(b"LOAD") => {
                Value::BulkString(self.scripts.load(script).into_bytes())
            }
            _ => self.command(&name, &args[1..]),
        }
    }

    /// A command other than a script's.
    pub(crate) fn command(&mut self, name: &[u8], args: &[Vec<u8>]) -> Value {
        match (name, args) {
            (b"INFO", [section]) => {
                Value::BulkString(self.info(&section.to_ascii_lowercase()).into_bytes())
            }
            _ => {
                let now = self.now_ms();
                self.keys.command(name, args, now)
            }
        }
    }

    fn info(&self, section: &[u8]) -> String {
        let p = &self.process;
        let now = self.now_ms();
        let run_id = if self.hides_run_id {
            String::new()
        } else {
            format!("run_id:{}\r\n", p.run_id)
        };
        let zeros = "0".repeat(40);
        match section {
            b"server" => format!(
                "# Server\r\nredis_version:7.0.15\r\n{run_id}uptime_in_seconds:{}\r\nserver_time_usec:{}\r\n",
                now.saturating_sub(p.started_ms) / 1_000,
                now.saturating_mul(1_000)
            ),
            b"replication" => format!(
                "# Replication\r\nrole:master\r\nconnected_slaves:0\r\nmaster_replid:{}\r\nmaster_replid2:{}\r\n",
                p.replid,
                p.replid2.as_deref().unwrap_or(&zeros)
            ),
            b"persistence" => format!("# Persistence\r\naof_enabled:{}\r\n", u8::from(self.aof)),
            b"memory" => {
                "# Memory\r\nused_memory:1000000\r\nmaxmemory:0\r\nmaxmemory_policy:noeviction\r\n"
                    .to_owned()
            }
            _ => String::new(),
        }
    }
}
