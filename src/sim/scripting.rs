//! The simulated server's scripts: the crate's Lua run by a real Lua 5.1 (Redis's), with
//! `redis.call` and `redis.pcall` answered by the simulated server, and replies converted
//! both ways as Redis converts them.
//!
//! ```text
//! EVAL "return redis.call('GET', KEYS[1])" 1 k   -> server.command("GET", ["k"])
//! Redis -> Lua: integer -> number, bulk -> string, nil -> false, array -> table,
//!               status -> {ok = ..}, error -> raised (call) or {err = ..} (pcall)
//! Lua -> Redis: number -> integer (truncated), string -> bulk, true -> 1, false/nil -> nil,
//!               {ok = ..} -> status, {err = ..} -> error, table -> array up to the first nil
//! ```

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};

use mlua::{Function, Lua, MultiValue, Table, Value as Lua_};
use redis::Value;

use super::keyspace::{Keyspace, error, score_text};

/// The scripts a server process loaded, by SHA1.
#[derive(Debug, Default)]
pub(crate) struct Scripts {
    loaded: BTreeMap<String, Vec<u8>>,
}

impl Scripts {
    /// Loads `source`: its SHA1 (hex).
    pub(crate) fn load(&mut self, source: &[u8]) -> String {
        let sha = SHAS.with(|shas| {
            shas.borrow_mut()
                .entry(source.to_vec())
                .or_insert_with(|| {
                    redis::Script::new(&String::from_utf8_lossy(source))
                        .get_hash()
                        .to_owned()
                })
                .clone()
        });
        self.loaded.insert(sha.clone(), source.to_vec());
        sha
    }

    /// The source of the script whose SHA1 is `sha`, if loaded.
    pub(crate) fn source(&self, sha: &[u8]) -> Option<Vec<u8>> {
        let sha = std::str::from_utf8(sha).ok()?.to_ascii_lowercase();
        self.loaded.get(&sha).cloned()
    }
}

/// The Lua state of a thread: the crate's scripts compiled in it (by source), and the
/// keys a script runs on while it runs (moved in and out around each call).
struct State {
    lua: Lua,
    compiled: RefCell<HashMap<Vec<u8>, Function>>,
}

thread_local! {
    static STATE: State = State::new();
    /// The keys (and the node's clock) of the script that runs now.
    static RUNNING: RefCell<Option<(Keyspace, u64)>> = const { RefCell::new(None) };
    /// The SHA1 of each script seen.
    static SHAS: RefCell<HashMap<Vec<u8>, String>> = RefCell::default();
}

impl State {
    /// A Lua state whose `redis.call` and `redis.pcall` run on the keys of the script that
    /// runs now.
    fn new() -> Self {
        let lua = Lua::new();
        let install = || -> mlua::Result<()> {
            let call = lua.create_function(|lua, args: MultiValue| command(lua, args, true))?;
            let pcall = lua.create_function(|lua, args: MultiValue| command(lua, args, false))?;
            let redis = lua.create_table()?;
            redis.set("call", call)?;
            redis.set("pcall", pcall)?;
            lua.globals().set("redis", redis)
        };
        if let Err(e) = install() {
            panic!("the simulation's Lua state: {e}");
        }
        Self {
            lua,
            compiled: RefCell::default(),
        }
    }

    fn function(&self, source: &[u8]) -> mlua::Result<Function> {
        if let Some(f) = self.compiled.borrow().get(source) {
            return Ok(f.clone());
        }
        let f = self.lua.load(source).into_function()?;
        self.compiled
            .borrow_mut()
            .insert(source.to_vec(), f.clone());
        Ok(f)
    }
}

/// Runs `source` on `keys` (at `now` on the node's clock) with `KEYS` and `ARGV`: its
/// reply.
pub(crate) fn eval(
    keys: &mut Keyspace,
    now: u64,
    source: &[u8],
    (names, argv): (&[Vec<u8>], &[Vec<u8>]),
) -> Value {
    RUNNING.with(|r| *r.borrow_mut() = Some((std::mem::take(keys), now)));
    let reply = STATE.with(|state| run(state, source, names, argv));
    if let Some((back, _)) = RUNNING.with(|r| r.borrow_mut().take()) {
        *keys = back;
    }
    reply.unwrap_or_else(|e| script_error(&e))
}

fn run(state: &State, source: &[u8], keys: &[Vec<u8>], argv: &[Vec<u8>]) -> mlua::Result<Value> {
    let lua = &state.lua;
    let function = state.function(source)?;
    let strings = |all: &[Vec<u8>]| -> mlua::Result<Table> {
        let t = lua.create_table_with_capacity(all.len(), 0)?;
        for (i, a) in all.iter().enumerate() {
            t.raw_set(i + 1, lua.create_string(a)?)?;
        }
        Ok(t)
    };
    let globals = lua.globals();
    globals.set("KEYS", strings(keys)?)?;
    globals.set("ARGV", strings(argv)?)?;
    let out: Lua_ = function.call(())?;
    from_lua(out)
}

/// `redis.call` (`raise`) or `redis.pcall` with `args`, on the running script's keys.
fn command(lua: &Lua, args: MultiValue, raise: bool) -> mlua::Result<Lua_> {
    let mut words = Vec::with_capacity(args.len());
    for arg in args {
        words.push(match arg {
            Lua_::String(s) => s.as_bytes().to_vec(),
            Lua_::Integer(i) => i.to_string().into_bytes(),
            Lua_::Number(n) => lua_number(n).into_bytes(),
            _ => {
                return Err(mlua::Error::runtime(
                    "Lua redis lib command arguments must be strings or integers",
                ));
            }
        });
    }
    let Some((name, rest)) = words.split_first() else {
        return Err(mlua::Error::runtime(
            "Please specify at least one argument for this redis lib call",
        ));
    };
    let reply = RUNNING.with(|r| match r.borrow_mut().as_mut() {
        Some((keys, now)) => Ok(keys.command(&name.to_ascii_uppercase(), rest, *now)),
        None => Err(mlua::Error::runtime("redis.call outside a script")),
    })?;
    match reply {
        Value::ServerError(e) => {
            let message = format!("{} {}", e.code(), e.details().unwrap_or_default());
            if raise {
                return Err(mlua::Error::runtime(message));
            }
            let t = lua.create_table()?;
            t.set("err", message)?;
            Ok(Lua_::Table(t))
        }
        other => to_lua(lua, other),
    }
}

/// The reply to a script that raised `e`: a command's error as the command gave it (its
/// code first), any other as `ERR`.
fn script_error(e: &mlua::Error) -> Value {
    let mut cause = e;
    while let mlua::Error::CallbackError { cause: inner, .. } = cause {
        cause = inner;
    }
    match cause {
        mlua::Error::RuntimeError(m) if m.split(' ').next().is_some_and(is_code) => error(m),
        other => error(&format!("ERR Error running script: {other}")),
    }
}

/// Whether `word` is an error code (`ERR`, `WRONGTYPE`, `NOSCRIPT`, ...).
fn is_code(word: &str) -> bool {
    !word.is_empty() && word.bytes().all(|b| b.is_ascii_uppercase())
}

/// A Lua number as Redis passes it to a command (`%.17g`, integers without a point).
fn lua_number(n: f64) -> String {
    score_text(n)
}

fn to_lua(lua: &Lua, value: Value) -> mlua::Result<Lua_> {
    Ok(match value {
        Value::Nil => Lua_::Boolean(false),
        Value::Int(i) => Lua_::Integer(i),
        Value::BulkString(b) => Lua_::String(lua.create_string(b)?),
        Value::Okay => status(lua, "OK")?,
        Value::SimpleString(s) => status(lua, &s)?,
        Value::Array(items) => {
            let t = lua.create_table()?;
            for (i, item) in items.into_iter().enumerate() {
                t.raw_set(i + 1, to_lua(lua, item)?)?;
            }
            Lua_::Table(t)
        }
        other => return Err(mlua::Error::runtime(format!("no Lua value for {other:?}"))),
    })
}

fn status(lua: &Lua, s: &str) -> mlua::Result<Lua_> {
    let t = lua.create_table()?;
    t.set("ok", s)?;
    Ok(Lua_::Table(t))
}

fn from_lua(value: Lua_) -> mlua::Result<Value> {
    Ok(match value {
        Lua_::Nil | Lua_::Boolean(false) => Value::Nil,
        Lua_::Boolean(true) => Value::Int(1),
        Lua_::Integer(i) => Value::Int(i),
        #[expect(
            clippy::cast_possible_truncation,
            reason = "Redis truncates a Lua number"
        )]
        Lua_::Number(n) => Value::Int(n as i64),
        Lua_::String(s) => Value::BulkString(s.as_bytes().to_vec()),
        Lua_::Table(t) => {
            if let Ok(Lua_::String(e)) = t.raw_get::<Lua_>("err") {
                return Ok(error(&e.to_string_lossy()));
            }
            if let Ok(Lua_::String(ok)) = t.raw_get::<Lua_>("ok") {
                let ok = ok.to_string_lossy();
                return Ok(if ok == "OK" {
                    Value::Okay
                } else {
                    Value::SimpleString(ok)
                });
            }
            let mut items = Vec::new();
            for i in 1.. {
                match t.raw_get::<Lua_>(i)? {
                    Lua_::Nil => break,
                    item => items.push(from_lua(item)?),
                }
            }
            Value::Array(items)
        }
        other => return Err(mlua::Error::runtime(format!("no reply for {other:?}"))),
    })
}
