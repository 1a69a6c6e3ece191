//! The Lua scripts that run on every node ([`lua`]), the commands that invoke them
//! ([`command`]), and the parsing of their replies ([`reply`]).
//!
//! Each script is loaded with `SCRIPT LOAD` when a node connects and then run with
//! `EVALSHA`, so an operation is one round trip. The hot paths send plain commands
//! instead: `SET NX PX` for a lock, with `ZADD GT CH` (and now and then `PEXPIRE`)
//! pipelined behind it when fenced. If a node answers `NOSCRIPT` (its script
//! cache was flushed), the call falls back to `EVAL`, which also caches the script again.
//!
//! ```text
//! EVALSHA <sha of RELEASE> 1 redlock:invoice:42 <value> <client id>  ->  1 (deleted) or 0
//! ```

mod command;
mod lua;
mod pack;
mod release_many;
mod reply;
mod run;

pub(crate) use command::{Arg, Call, FencedSet, Invocation, LockKeys, Renewal, Request};
pub(crate) use lua::{
    COMPLETE_SCRIPT, EXTEND_SCRIPT, FENCE_SCRIPT, HELD_OR_RECORD_SCRIPT, INSPECT_SCRIPT,
    MARK_WAITING_SCRIPT, RECORD_MARKER, all,
};
pub(crate) use release_many::{
    answers as release_many_answers, pack_into as pack_release_many, release_many,
};
pub(crate) use reply::{
    AcquireReply, Deleted, FenceRead, MAX_NUMBER, parse_acquire, parse_deleted, parse_flag,
    parse_inspect,
};
