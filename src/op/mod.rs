//! The operations, as values over the [`Core`](crate::core::Core): each takes the core and
//! its other collaborators (the fencing clock, the waiters, who releases in the background)
//! explicitly, owns its loop and its decision, and knows nothing of the client that built
//! it. The client's public methods each build one and run it.
//!
//! ```text
//! lock()    -> Retry { Acquire { core, fencing, waiters, background }, waiters, policy }.run
//! try_lock  -> Acquire { .. }.attempt                 (observed: the redlock.acquire span)
//! extend()  -> Extend { core }.observed               (the redlock.extend span)
//! unlock()  -> Release { core, waiters }.unlock        (the redlock.release span)
//! health(), inspect() -> inspect::{health, inspect}(core, ..)
//! ```

pub(crate) mod acquire;
mod acquire_replay;
pub(crate) mod announce;
pub(crate) mod extend;
pub(crate) mod inspect;
mod mark;
pub(crate) mod observe;
pub(crate) mod release;
pub(crate) mod retry;
mod set_replies;
